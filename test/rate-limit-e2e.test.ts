// Scoped rate limits end to end (issue 15, "Must show"): a real `edge-proxy serve`, a real backend
// (test/support/controlled-backend.ts), clients over HTTP/1.1, HTTP/2 and HTTP/3. Every client
// here is 127.0.0.1, so a `client_ip` limit is one bucket for the node. This file: the answer past
// the burst on each protocol (429, Retry-After, the coded body, the counters) and a client that
// honours Retry-After served again; `header:`, `cookie:` and `query:` keys each giving one bucket
// per value; a limit scoped to one route leaving another alone; and with two workers, what the
// node admits over a fixed time against burst + rate × t. A flood of distinct keys and the
// worker's memory: rate-limit-memory.test.ts.
import t from 'tap';
import { setTimeout as sleep } from 'node:timers/promises';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { connectH2, connectH3, metric, request, startProxy } from './support/overload.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { assertLimited, connectionsOnEveryWorker, statuses } from './support/limits.ts';
import { pools } from './support/bursts.ts';
import type { Answer, Proxy } from './support/overload.ts';
import type { Protocol } from './support/served-by.ts';

const files = serviceFiles(t, 'edge-rate-limit-');

const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const LIMITS = 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000';

/** Pools named after their path prefix (`/<name>`), all on `be`; YAML flow style. */

/** `svc_request_rate_limited` and `svc_upstream_requests_total{upstream,outcome="rate_limited"}` of each of `upstreams`, from one scrape. */
async function limitedCounters(p: Proxy, upstreams: readonly string[]): Promise<Record<string, number>> {
  const text = await scrape(p.mport);
  return {
    svc_request_rate_limited: metricValue(text, 'svc_request_rate_limited'),
    ...Object.fromEntries(upstreams.map((u) => [`outcome rate_limited ${u}`, metricValue(text, 'svc_upstream_requests_total', { upstream: u, outcome: 'rate_limited' })])),
    svc_overload_shed: metricValue(text, 'svc_overload_shed'),
  };
}

const minus = (a: Record<string, number>, b: Record<string, number>): Record<string, number> => Object.fromEntries(Object.entries(a).map(([k, v]) => [k, v - (b[k] ?? 0)]));

t.test('client_ip, 1 req/s burst 5: over h1, h2 and h3 the sixth immediate request gets 429 EDGE_RATE_LIMITED with Retry-After; after Retry-After a request is served', async (t) => {
  const be = await controlledBackend(t, 'rl');
  // One route per protocol, each with its own limit (one bucket each): no protocol waits for the
  // bucket another emptied. 1 req/s: the six requests of a protocol have a whole second before a
  // sixth token comes. Over HTTP/3 they share one connection opened first: six QUIC handshakes of
  // the in-process client took 3 s on a loaded machine (two test files at once).
  const p = await startProxy(t, files, 'rl-basic', {
    performance: LIMITS,
    upstream: pools(be, ['h1', 'h2', 'h3']),
    resilience: `{ ${QUIET}, rate_limits: [${PROTOCOLS.map((pr) => `{ name: per-client-${pr}, routes: [${pr}], key: client_ip, requests_per_second: 1, burst: 5 }`).join(', ')}] }`,
  });
  const before = await limitedCounters(p, PROTOCOLS);
  for (const protocol of PROTOCOLS) {
    const h3 = protocol === 'h3' ? await connectH3(t, p) : undefined;
    const t0 = performance.now();
    const answers: Answer[] = [];
    for (let i = 1; i <= 6; i++) answers.push(await (h3?.request({ path: `/${protocol}/${i}` }) ?? request(p, protocol, { path: `/${protocol}/${i}` })));
    const elapsed = performance.now() - t0;
    t.same(
      answers.slice(0, 5).map((a) => [a.status, a.body]),
      [1, 2, 3, 4, 5].map((i) => [200, `rl /${protocol}/${i}`]),
      `${protocol}: the burst of 5 served by the backend`,
    );
    const sixth = answers[5] as Answer;
    assertLimited(t, sixth, 'EDGE_RATE_LIMITED', `${protocol}: the sixth (${elapsed.toFixed(0)} ms after the first)`, 1);
    t.ok(elapsed < 1000, `${protocol}: the six were sent within the second a token takes (${elapsed.toFixed(0)} ms), so the sixth had none`);
    t.equal(be.arrivalsUnder(`/${protocol}/6`).length, 0, `${protocol}: the limited request never reached the backend`);
    // A client honouring Retry-After finds a token.
    await sleep(Number(sixth.headers['retry-after']) * 1000);
    const again = await request(p, protocol, { path: `/${protocol}/again` });
    t.same([again.status, again.body], [200, `rl /${protocol}/again`], `${protocol}: served ${sixth.headers['retry-after']} s later, as Retry-After said`);
  }
  t.same(
    minus(await limitedCounters(p, PROTOCOLS), before),
    { svc_request_rate_limited: 3, 'outcome rate_limited h1': 1, 'outcome rate_limited h2': 1, 'outcome rate_limited h3': 1, svc_overload_shed: 0 },
    'svc_request_rate_limited +3, outcome rate_limited once per route, nothing counted as shed',
  );
});

t.test('header:, cookie: and query: keys: one bucket per value of the key', async (t) => {
  const be = await controlledBackend(t, 'keys');
  const p = await startProxy(t, files, 'rl-keys', {
    performance: LIMITS,
    upstream: pools(be, ['hk', 'ck', 'qk']),
    resilience: `{ ${QUIET}, rate_limits: [{ name: by-header, routes: [hk], key: "header:x-user", requests_per_second: 1, burst: 1 }, { name: by-cookie, routes: [ck], key: "cookie:session", requests_per_second: 1, burst: 1 }, { name: by-query, routes: [qk], key: "query:user", requests_per_second: 1, burst: 1 }] }`,
  });
  const cases: ReadonlyArray<{ readonly name: string; readonly ask: (value: string, n: number, protocol: Protocol) => Promise<Answer> }> = [
    { name: 'header:x-user', ask: (v, n, pr) => request(p, pr, { path: `/hk/${n}`, headers: { 'x-user': v } }) },
    // Other cookies around it do not change the key.
    { name: 'cookie:session', ask: (v, n, pr) => request(p, pr, { path: `/ck/${n}`, headers: { cookie: `theme=dark${n}; session=${v}; lang=fr` } }) },
    // Other query parameters and the path do not change the key.
    { name: 'query:user', ask: (v, n, pr) => request(p, pr, { path: `/qk/${n}?page=${n}&user=${v}` }) },
  ];
  const before = await limitedCounters(p, ['hk', 'ck', 'qk']);
  for (const c of cases) {
    t.equal((await c.ask('alice', 1, 'h1')).status, 200, `${c.name}: alice's first request served (h1)`);
    assertLimited(t, await c.ask('alice', 2, 'h2'), 'EDGE_RATE_LIMITED', `${c.name}: alice's second (h2, the same bucket)`, 1);
    t.equal((await c.ask('bob', 3, 'h3')).status, 200, `${c.name}: bob's first served (h3): his own bucket`);
    assertLimited(t, await c.ask('bob', 4, 'h1'), 'EDGE_RATE_LIMITED', `${c.name}: bob's second`, 1);
    t.equal((await c.ask('carol', 5, 'h2')).status, 200, `${c.name}: carol's first served`);
  }
  t.same(
    minus(await limitedCounters(p, ['hk', 'ck', 'qk']), before),
    { svc_request_rate_limited: 6, 'outcome rate_limited hk': 2, 'outcome rate_limited ck': 2, 'outcome rate_limited qk': 2, svc_overload_shed: 0 },
    'two denials per key kind, each counted',
  );
});

t.test('a limit scoped to one route leaves another route alone', async (t) => {
  const be = await controlledBackend(t, 'scope');
  const p = await startProxy(t, files, 'rl-scope', {
    performance: LIMITS,
    upstream: pools(be, ['limited', 'free']),
    resilience: `{ ${QUIET}, rate_limits: [{ name: only-limited, routes: [limited], key: client_ip, requests_per_second: 1, burst: 2 }] }`,
  });
  const conn = await connectH2(t, p);
  const limited = await Promise.all([1, 2, 3, 4].map((i) => conn.request({ path: `/limited/${i}` })));
  t.same(statuses(limited), { 200: 2, 429: 2 }, 'the limited route: the burst of 2 served, the other 2 limited');
  for (const a of limited.filter((x) => x.status === 429)) assertLimited(t, a, 'EDGE_RATE_LIMITED', '/limited', 1);
  const free = await Promise.all(Array.from({ length: 20 }, (_, i) => conn.request({ path: `/free/${i}` })));
  t.same(statuses(free), { 200: 20 }, 'the other route, same client, right after: 20 of 20 served');
  t.equal(be.arrivalsUnder('/free/').length, 20, 'all 20 reached the backend');
  t.equal(await metric(p, 'svc_upstream_requests_total', { upstream: 'free', outcome: 'rate_limited' }), 0, 'nothing counted rate_limited on the free route');
});

t.test('two workers: over a fixed time the node admits burst + rate × t within the stated error, one bucket for the node', async (t) => {
  const RATE = 20;
  const BURST = 10;
  const WORKERS = 2;
  const SECONDS = 3;
  /** Offered rate, requests/s: 5 times the rate, so the node is always asked for more than its rate. */
  const OFFERED = 100;
  const be = await controlledBackend(t, 'two');
  be.set({ kind: 'hold' }, '/probe');
  const p = await startProxy(t, files, 'rl-two-workers', {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be, ['app', 'probe']),
    resilience: `{ ${QUIET}, rate_limits: [{ name: node, routes: [app], key: client_ip, requests_per_second: ${RATE}, burst: ${BURST} }] }`,
  });
  // Two connections on each worker, used in turn (worker 0, worker 1, worker 0, ...): each worker
  // gets half of the offered load, known per request.
  const conns = await connectionsOnEveryWorker(t, p, be, '/probe', WORKERS, 2);
  const before = await metric(p, 'svc_request_rate_limited');

  interface Sent {
    readonly worker: number;
    readonly sentAt: number;
    readonly answer: Answer;
    readonly answeredAt: number;
  }
  const pending: Array<Promise<Sent>> = [];
  const start = performance.now();
  const total = OFFERED * SECONDS;
  for (let k = 0; k < total; k++) {
    const due = start + (k * 1000) / OFFERED;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait); // the open-loop schedule, not a synchronisation
    const conn = conns[k % conns.length] as (typeof conns)[number];
    const sentAt = performance.now();
    pending.push(conn.request({ path: `/app/${k}` }).then((answer) => ({ worker: conn.worker, sentAt, answer, answeredAt: performance.now() })));
  }
  const sent = await Promise.all(pending);
  t.same(
    sent.filter((s) => s.answer.status !== 200 && s.answer.status !== 429).map((s) => `${s.answer.status} ${s.answer.error ?? s.answer.body.slice(0, 60)}`),
    [],
    'every answer is a 200 or a 429',
  );

  // The node holds one bucket of BURST tokens refilled at RATE per second (the supervisor's token
  // ledger), leased to both workers. The first request arrived between the first send and the first
  // answer, the last between the last send and the last answer. So the node admitted at most
  // BURST + RATE × (last answer − first send), and, always asked for more than the rate, at least
  // BURST + RATE × (last send − first answer) − 1 − RATE × 0.2: under one token left after the last
  // denial, plus what refilled if the last request came up to 200 ms after the one before. Both
  // workers get the node's tokens, whichever asks when.
  const rows: string[] = [];
  for (let w = 0; w < WORKERS; w++) {
    const mine = sent.filter((s) => s.worker === w);
    const ok = mine.filter((s) => s.answer.status === 200).length;
    rows.push(`worker ${w}: ${mine.length} sent, ${ok} admitted`);
    t.ok(ok > 0, `worker ${w}: admitted ${ok} of the node's tokens`);
  }
  const admitted = sent.filter((s) => s.answer.status === 200).length;
  const firstSend = Math.min(...sent.map((s) => s.sentAt));
  const lastSend = Math.max(...sent.map((s) => s.sentAt));
  const firstAnswer = Math.min(...sent.map((s) => s.answeredAt));
  const lastAnswer = Math.max(...sent.map((s) => s.answeredAt));
  const upper = Math.floor(BURST + (RATE * (lastAnswer - firstSend)) / 1000);
  const lower = BURST + (RATE * (lastSend - firstAnswer)) / 1000 - 1 - RATE * 0.2;
  const nominal = BURST + RATE * SECONDS;
  t.comment(`${rows.join('; ')}; node: ${admitted} admitted of ${total}, nominal burst + rate × t = ${nominal}, bounds [${lower.toFixed(1)}, ${upper}] (${(((admitted - nominal) / nominal) * 100).toFixed(1)} % from nominal)`);
  t.ok(admitted <= upper, `the node admitted ${admitted} ≤ ${upper}: burst + rate × t over ${((lastAnswer - firstSend) / 1000).toFixed(3)} s, one bucket for the node, not ${WORKERS}`);
  t.ok(admitted >= lower, `the node admitted ${admitted} ≥ ${lower.toFixed(1)}: its whole contract, not shares that round down`);
  t.equal(be.arrivalsUnder('/app/').length, admitted, 'the backend saw exactly the admitted requests');
  t.equal((await metric(p, 'svc_request_rate_limited')) - before, total - admitted, `svc_request_rate_limited +${total - admitted}, one per 429`);
});
