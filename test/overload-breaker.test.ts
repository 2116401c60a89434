// Overload protection end to end (issue 13, "Must show"), continued from overload-e2e.test.ts:
// the circuit breaker per backend with a backend that fails, keeps failing, then recovers (closed
// → open → half-open → open → half-open (one probe at a time) → closed, over HTTP/1.1, HTTP/2
// and HTTP/3), a pool whose other backend takes the traffic while one is open, passive health
// counting every 500 without ejecting, and adaptive admission converging to min_limit under a
// slow backend and back to max_limit after it recovers (on a proxy with the breaker disabled,
// where consecutive 500s then eject nothing), and breaker state kept across a generation swap.
// The breakers here count 500s because the operator listed them (`failure_statuses`); by default
// only gateway failures count (test/breaker-bounds-e2e.test.ts).
import t from 'tap';
import { writeFileSync } from 'node:fs';
import { controlledBackend } from './support/controlled-backend.ts';
import { api } from './support/serve.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, assertShed, breaker, metric, pollUntil, request, send, shedCounters, snapshot, startProxy, SHED_BODY } from './support/overload.ts';
import type { Answer, Proxy, Sent } from './support/overload.ts';

const files = serviceFiles(t, 'edge-breaker-');
const RETRY_AFTER = 7;

t.test('circuit breaker: 3 failures open it, a failed probe after open_ms reopens it, a successful one closes it', async (t) => {
  // Long enough for three shed answers (one a QUIC handshake) to fit inside one open period.
  const OPEN_MS = 2000;
  const bad = await controlledBackend(t, 'bad');
  bad.set({ kind: 'status', status: 500 });
  const pBad = await controlledBackend(t, 'p-bad');
  pBad.set({ kind: 'status', status: 500 });
  const pGood = await controlledBackend(t, 'p-good');
  const p: Proxy = await startProxy(t, files, 'breaker', {
    performance: 'global_inflight_limit: 50, per_upstream_inflight_limit: 50, per_backend_inflight_limit: 50',
    upstream: `{ one: { route: { path_prefix: /one }, backends: [{ id: bad, address: "127.0.0.1:${bad.port}" }] }, pair: { route: { path_prefix: /pair }, load_balancing: { type: round-robin }, backends: [{ id: p-bad, address: "127.0.0.1:${pBad.port}" }, { id: p-good, address: "127.0.0.1:${pGood.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { failure_threshold: 3, open_ms: ${OPEN_MS}, half_open_max_probes: 1, failure_statuses: [500, 502, 503, 504] }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const state = (): Promise<number> => metric(p, 'svc_circuit_breaker_state', { upstream: 'one', backend: 'bad' });
  const isShed = (a: Answer): boolean => a.status === 503 && a.body === SHED_BODY.circuit_open;
  /** Requests /one over HTTP/1.1 every 50 ms while they are shed circuit_open; the first other answer and when it was sent. */
  const firstThrough = async (deadlineMs: number): Promise<{ answer: Answer; sentAt: number; shed: number }> => {
    const deadline = performance.now() + deadlineMs;
    let shed = 0;
    for (;;) {
      const sentAt = performance.now();
      const answer = await request(p, 'h1', { path: '/one/poll' });
      if (!isShed(answer) || performance.now() > deadline) return { answer, sentAt, shed };
      shed++;
      await new Promise((r) => setTimeout(r, 50)); // the breaker's own clock decides: poll with requests, bounded
    }
  };

  const health5xxBefore = await metric(p, 'svc_health_failures_total', { reason: '5xx' });
  let fiveHundreds = 0;
  // closed → open: one failure per protocol.
  let lastFailureSent = 0;
  for (const protocol of PROTOCOLS) {
    lastFailureSent = performance.now();
    const a = await request(p, protocol, { path: `/one/fail-${protocol}` });
    t.same([a.status, a.body], [500, 'bad status 500'], `${protocol}: the backend's 500 passes through (failure ${PROTOCOLS.indexOf(protocol) + 1} of 3)`);
    if (a.status === 500) fiveHundreds++;
  }
  // The state is the supervisor's node breaker; `workers` counts each worker's latest heartbeat (one a
  // second): wait for both, or a read right after the node opened it races the heartbeat.
  const open = await pollUntil(() => breaker(p, 'one', 'bad'), (b) => b?.state === 'open' && b.workers.open === 1, 3000);
  t.equal(open?.state, 'open', 'snapshot: circuit_breakers one/bad is open');
  t.equal(open?.workers.open, 1, 'in the one worker');
  const untilIn = (open?.open_until_unix_ms ?? 0) - Date.now();
  t.ok(untilIn > 0 && untilIn <= OPEN_MS + 1, `open_until_unix_ms: it may probe in ${untilIn} ms (open_ms ${OPEN_MS})`);
  t.equal(await state(), 2, 'svc_circuit_breaker_state{upstream="one",backend="bad"} 2 (open)');

  // Open: every protocol is shed circuit_open, and the backend sees nothing.
  const before = await shedCounters(p, 'circuit_open', 'one');
  const arrivals = bad.arrivals.length;
  for (const protocol of PROTOCOLS) assertShed(t, await request(p, protocol, { path: '/one/x' }), 'circuit_open', RETRY_AFTER, `open, ${protocol}`);
  const after = await shedCounters(p, 'circuit_open', 'one');
  t.same(
    { shed: after.shed - before.shed, byReason: after.byReason - before.byReason, outcome: after.outcome - before.outcome, rejected: after.breakerRejected - before.breakerRejected },
    { shed: 3, byReason: 3, outcome: 3, rejected: 3 },
    'three circuit_open sheds: svc_overload_shed, by reason, outcome overload_shed, svc_circuit_breaker_rejected_total',
  );
  t.equal(bad.arrivals.length, arrivals, 'no request reached the backend while open');

  // open → half-open (after open_ms) → the probe fails → open again.
  const probe = await firstThrough(OPEN_MS + 3000);
  t.same([probe.answer.status, probe.answer.body], [500, 'bad status 500'], `after ${probe.shed} more sheds, a half-open probe reached the failing backend`);
  t.ok(probe.sentAt - lastFailureSent >= OPEN_MS, `the probe went ${(probe.sentAt - lastFailureSent).toFixed(0)} ms after the third failure was sent (open_ms ${OPEN_MS})`);
  t.equal(bad.arrivals.length, arrivals + 1, 'exactly one probe reached it');
  if (probe.answer.status === 500) fiveHundreds++;
  assertShed(t, await request(p, 'h2', { path: '/one/x' }), 'circuit_open', RETRY_AFTER, 'the failed probe reopened it (h2)');
  t.equal((await pollUntil(() => breaker(p, 'one', 'bad'), (b) => b?.state === 'open', 1500))?.state, 'open', 'snapshot: open again');

  // The backend recovers but answers slowly: after open_ms the one probe allowed
  // (half_open_max_probes 1) is held at the backend; meanwhile another request is shed; the
  // probe's success closes the breaker.
  bad.set({ kind: 'hold' });
  const deadline = performance.now() + OPEN_MS + 3000;
  let second: Sent | undefined;
  let secondSentAt = 0;
  let shedMeanwhile = 0;
  while (second === undefined && performance.now() < deadline) {
    secondSentAt = performance.now();
    const s = send(p, 'h1', { path: '/one/probe' });
    const reached = bad.until(() => bad.held === 1, 'the probe held', OPEN_MS + 3000).then(
      () => 'held' as const,
      () => 'not held' as const,
    );
    const first = await Promise.race([s.answer, reached]);
    if (first === 'held' || bad.held === 1) second = s;
    else if (isShed(first as Answer)) {
      shedMeanwhile++;
      await new Promise((r) => setTimeout(r, 50)); // the breaker's own clock decides: poll with requests, bounded
    } else break;
  }
  t.ok(second !== undefined, `after ${shedMeanwhile} more sheds, a second probe reached the recovering backend`);
  t.ok(secondSentAt - probe.sentAt >= OPEN_MS, `it went ${(secondSentAt - probe.sentAt).toFixed(0)} ms after the failed probe (open_ms ${OPEN_MS})`);
  assertShed(t, await request(p, 'h3', { path: '/one/x' }), 'circuit_open', RETRY_AFTER, 'half-open with its one probe in flight: another request is shed (h3)');
  t.equal(await state(), 1, 'svc_circuit_breaker_state 1 (half-open) while the probe is in flight');
  t.equal((await pollUntil(() => breaker(p, 'one', 'bad'), (b) => b?.state === 'half_open', 1500))?.state, 'half_open', 'snapshot: half_open');
  bad.set({ kind: 'ok' });
  bad.release();
  const success = await (second as Sent).answer;
  t.same([success.status, success.body], [200, 'bad /one/probe released'], 'the probe succeeds');
  t.equal((await pollUntil(() => breaker(p, 'one', 'bad'), (b) => b?.state === 'closed', 2000))?.state, 'closed', 'snapshot: closed');
  t.equal(await state(), 0, 'svc_circuit_breaker_state 0 (closed)');
  for (const protocol of PROTOCOLS) t.same((await request(p, protocol, { path: '/one/ok' })).status, 200, `closed: traffic flows over ${protocol}`);

  // Two backends, one failing: once its breaker opens, the other takes every request, no 503.
  const early: Answer[] = [];
  for (let i = 0; i < 6 && pBad.arrivals.length < 3; i++) early.push(await request(p, 'h1', { path: `/pair/${i}` }));
  t.equal(pBad.arrivals.length, 3, 'p-bad failed 3 times');
  t.equal((await pollUntil(() => breaker(p, 'pair', 'p-bad'), (b) => b?.state === 'open', 1500))?.state, 'open', 'p-bad is open');
  t.equal((await breaker(p, 'pair', 'p-good'))?.state, 'closed', 'p-good stays closed');
  const later: Answer[] = [];
  for (let i = 0; i < 9; i++) later.push(await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/pair/after-${i}` }));
  t.same(
    later.filter((a) => a.status === 503),
    [],
    'no 503 while one backend of the pool is open',
  );
  // A half-open probe may fall in these 9 requests if the machine is slow (open_ms elapsed): at most one.
  t.ok(later.filter((a) => a.body.startsWith('p-good ')).length >= 8, `p-good answered ${later.filter((a) => a.body.startsWith('p-good ')).length} of 9`);
  t.ok(
    early.every((a) => a.status === 200 || a.status === 500),
    'before it opened, answers were 200 (p-good) or 500 (p-bad)',
  );
  fiveHundreds += [...early, ...later].filter((a) => a.status === 500).length;
  t.equal(
    (await metric(p, 'svc_health_failures_total', { reason: '5xx' })) - health5xxBefore,
    fiveHundreds,
    `passive health still counts every 500 (${fiveHundreds}) in svc_health_failures_total{reason="5xx"}`,
  );
});

t.test('adaptive admission: the limit falls to min_limit under a slow backend and climbs back to max_limit once it is fast; with the breaker disabled nothing is ejected', async (t) => {
  const be = await controlledBackend(t, 'slow');
  be.set({ kind: 'slow', ms: 250 });
  const p = await startProxy(t, files, 'adaptive', {
    performance: 'global_inflight_limit: 40, per_upstream_inflight_limit: 40, per_backend_inflight_limit: 40',
    upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: slow, address: "127.0.0.1:${be.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: true, min_limit: 4, max_limit: 40, decrease_step: 12, increase_step: 12, high_latency_ms: 100 }, brownout: { enabled: false }, circuit_breaker: { enabled: false } }`,
  });
  const start = await admission(p);
  t.match(start, { adaptive_enabled: true, adaptive_limit: 40, min_limit: 4, max_limit: 40 }, 'starts at max_limit');

  // Four clients in a loop: enough samples per window, never more in flight than min_limit.
  let running = true;
  const statuses: number[] = [];
  const loops = Array.from({ length: 4 }, async (_, i) => {
    for (let n = 0; running; n++) statuses.push((await request(p, 'h1', { path: `/c${i}/${n}` })).status);
  });
  t.teardown(async () => {
    running = false;
    await Promise.all(loops);
  });
  const seen = new Set<number>();
  const watch = (a: { adaptive_limit: number }): boolean => (seen.add(a.adaptive_limit), true);
  const down = await pollUntil(() => admission(p), (a) => watch(a) && a.adaptive_limit === 4, 15_000, 50);
  t.equal(down.adaptive_limit, 4, `slow backend (250 ms > high_latency_ms 100): the limit fell to min_limit (seen ${[...seen].join(' → ')})`);
  t.equal(await metric(p, 'svc_adaptive_admission_limit'), 4, 'svc_adaptive_admission_limit 4');
  t.ok([...seen].every((v) => v === 4 || (v > 4 && v <= 40 && (40 - v) % 12 === 0)), 'every value seen is max_limit minus whole decrease steps, or min_limit');

  be.set({ kind: 'ok' });
  seen.clear();
  const up = await pollUntil(() => admission(p), (a) => watch(a) && a.adaptive_limit === 40, 15_000, 50);
  t.equal(up.adaptive_limit, 40, `fast backend: the limit climbed back to max_limit (seen ${[...seen].join(' → ')})`);
  t.equal(await metric(p, 'svc_adaptive_admission_limit'), 40, 'svc_adaptive_admission_limit 40');
  t.ok([...seen].every((v) => v === 40 || (v >= 4 && (v - 4) % 12 === 0)), 'every value seen is min_limit plus whole increase steps, or max_limit');
  running = false;
  await Promise.all(loops);
  t.same(
    statuses.filter((s) => s !== 200),
    [],
    `all ${statuses.length} requests of the clients were served (the limit never fell below their concurrency)`,
  );

  // This proxy runs with the breaker disabled: consecutive 500s eject nothing (passive health
  // only counts them), so every request still reaches the backend.
  be.set({ kind: 'status', status: 500 });
  const before = be.arrivals.length;
  const answers: number[] = [];
  for (let i = 0; i < 6; i++) answers.push((await request(p, 'h1', { path: `/failing/${i}` })).status);
  t.same(answers, Array(6).fill(500), 'breaker disabled: six consecutive 500s, none turned into a 503');
  t.equal(be.arrivals.length - before, 6, 'all six reached the backend');
});

t.test('breaker state outlives a generation swap: an open backend stays open in the new generation', async (t) => {
  const bad = await controlledBackend(t, 'swap-bad');
  bad.set({ kind: 'status', status: 500 });
  const resilience = (retryAfter: number): string => `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { failure_threshold: 3, open_ms: 60000, failure_statuses: [500, 502, 503, 504] }, route_queue: { shed_retry_after_seconds: ${retryAfter} } }`;
  const p = await startProxy(
    t,
    files,
    'breaker-swap',
    {
      performance: 'global_inflight_limit: 50, per_upstream_inflight_limit: 50, per_backend_inflight_limit: 50',
      upstream: `{ one: { route: { path_prefix: /one }, backends: [{ id: swap-bad, address: "127.0.0.1:${bad.port}" }] } }`,
      resilience: resilience(RETRY_AFTER),
    },
    'operator',
  );
  for (let i = 0; i < 3; i++) t.equal((await request(p, 'h1', { path: `/one/${i}` })).status, 500, `failure ${i + 1}`);
  assertShed(t, await request(p, 'h1', { path: '/one/x' }), 'circuit_open', RETRY_AFTER, 'open before the swap');

  // A new generation that changes something else (Retry-After 9): the backend is the same one.
  writeFileSync(p.configFile, p.configText.replace(resilience(RETRY_AFTER), resilience(9)));
  const activated = await api(p.cport, p.ca, 'POST', '/admin/runtime/activate', { token: p.token }, {});
  t.equal(activated.status, 202, `activated (${JSON.stringify(activated.body).slice(0, 200)})`);
  const generation = activated.body['generation'] as number;
  t.equal((await pollUntil(() => snapshot(p), (s) => s['generation'] === generation))['generation'], generation, `generation ${generation} active`);
  const arrivals = bad.arrivals.length;
  for (const protocol of PROTOCOLS) assertShed(t, await request(p, protocol, { path: '/one/y' }), 'circuit_open', 9, `open after the swap (the new generation's Retry-After), ${protocol}`);
  t.equal(bad.arrivals.length, arrivals, 'no request reached the backend: its breaker stayed open across the swap');
  t.equal((await breaker(p, 'one', 'swap-bad'))?.state, 'open', 'snapshot: still open');
});
