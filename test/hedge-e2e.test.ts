// Hedged requests end to end (issue 14, "Must show"): a real `edge-proxy serve` (one worker), two
// real HTTP/1.1 backends, `slow` (which holds the requests the test says) and `fast`, in two pools
// balanced by consistent hashing on `x-key` (test/support/retries.ts): `hedged`, on the hedging
// route_allowlist, and `plain`, not on it. A key owned by `slow` sends the first attempt there, so
// every hedge is known to go to `fast`. Over HTTP/1.1, HTTP/2 and HTTP/3: the hedge wins against
// a held primary, which `slow` sees aborted; a primary that answers after the hedge was sent wins
// and the hedge is aborted; when one attempt fails (a reset, a 503) the request waits for the
// other; POST, a PUT left out of safe_methods and a route off the allowlist are never hedged; a primary faster than delay_ms
// triggers nothing; hedges draw on the retry budget (and one that cannot be sent must not); with
// PUT in safe_methods a kept body is hedged byte-exact, one still arriving is not hedged.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { controlledBackend, sha256 } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { breaker, connectH2, metric, pollUntil, request, send, startProxy } from './support/overload.ts';
import { HASH_HEADER, hashedPool, keyOwnedBy, moved, retryCounters } from './support/retries.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Answer, StartedProxy } from './support/overload.ts';
import type { Test } from 'tap';

const files = serviceFiles(t, 'edge-hedge-');

/** hedging.delay_ms: long enough that a backend answering at once beats it on a loaded machine. */
const DELAY = 200;

interface Setup {
  readonly p: StartedProxy;
  readonly slow: ControlledBackend;
  readonly fast: ControlledBackend;
  /** A key whose first attempt goes to `slow`, in `hedged` and in `plain`. */
  readonly slowKey: { readonly hedged: string; readonly plain: string };
  /** A key whose first attempt goes to `fast` in `hedged`. */
  readonly fastKey: string;
}

/** `retryBudget`: the YAML flow map of `resilience.retry_budget`; `hedging`: more entries of `resilience.hedging`. */
async function setup(t: Test, name: string, retryBudget = '{}', hedging = ''): Promise<Setup> {
  const slow = await controlledBackend(t, 'slow');
  const fast = await controlledBackend(t, 'fast');
  const p = await startProxy(t, files, name, {
    performance: 'global_inflight_limit: 100, per_upstream_inflight_limit: 100, per_backend_inflight_limit: 100',
    upstream: `{ ${hashedPool('hedged', '/h', [slow, fast])}, ${hashedPool('plain', '/p', [slow, fast])} }`,
    // The breaker stays on (its defaults): an attempt the proxy cancels is not a backend failure.
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, hedging: { enabled: true, delay_ms: ${DELAY}, route_allowlist: [hedged]${hedging} }, retry_budget: ${retryBudget} }`,
  });
  return { p, slow, fast, slowKey: { hedged: await keyOwnedBy(p, slow, '/h/probe'), plain: await keyOwnedBy(p, slow, '/p/probe') }, fastKey: await keyOwnedBy(p, fast, '/h/probe') };
}

const shown = (a: Answer): string => `${a.status}${a.error === undefined ? '' : ` (${a.error})`} ${a.body.slice(0, 80)}`;

t.test('the hedge wins against a held primary, which the slow backend sees aborted, over h1, h2 and h3', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-wins');
  slow.set({ kind: 'hold' }, '/h/x/');
  for (const protocol of PROTOCOLS) {
    const before = await retryCounters(p);
    const abandoned = slow.abandoned;
    const a = await request(p, protocol, { path: `/h/x/${protocol}`, headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': protocol }, timeoutMs: 5000 });
    t.same([a.status, a.headers['x-backend'], a.body], [200, 'fast', `fast /h/x/${protocol}`], `${protocol}: fast's answer, while slow still held the primary (${shown(a)}, ${a.ms.toFixed(0)} ms)`);
    await slow.until(() => slow.abandoned === abandoned + 1 && slow.held === 0, `${protocol}: the primary aborted`);
    t.pass(`${protocol}: slow saw the primary's connection closed before it answered`);
    const primary = slow.arrivalsUnder(`/h/x/${protocol}`);
    const hedge = fast.arrivalsUnder(`/h/x/${protocol}`);
    t.same([primary.length, hedge.length], [1, 1], `${protocol}: one attempt on each backend`);
    const gap = (hedge[0]?.at ?? 0) - (primary[0]?.at ?? 0);
    t.ok(gap >= DELAY / 2, `${protocol}: the hedge reached fast ${gap.toFixed(0)} ms after the primary reached slow (delay_ms ${DELAY})`);
    t.same(moved(await retryCounters(p), before), { svc_hedge_triggered_total: 1, svc_hedge_won_total: 1 }, `${protocol}: svc_hedge_triggered_total and svc_hedge_won_total +1, nothing else`);
  }
  t.equal((await breaker(p, 'hedged', 'slow'))?.state ?? 'closed', 'closed', "the three cancelled primaries did not open slow's breaker");
});

t.test('a primary that answers after the hedge was sent wins; the hedge is aborted and counted wasted', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-primary-wins');
  for (const be of [slow, fast]) be.set({ kind: 'hold' }, '/h/y/');
  const before = await retryCounters(p);
  const s = send(p, 'h2', { path: '/h/y/1', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': '1' } });
  await slow.until(() => slow.held === 1, 'the primary held');
  await fast.until(() => fast.held === 1, 'the hedge held');
  const fastAbandoned = fast.abandoned;
  slow.release();
  const a = await s.answer;
  t.same([a.status, a.headers['x-backend'], a.body], [200, 'slow', 'slow /h/y/1 released'], `the primary's answer (${shown(a)})`);
  await fast.until(() => fast.abandoned === fastAbandoned + 1 && fast.held === 0, 'the hedge aborted');
  t.pass('fast saw the hedge closed before it answered');
  const d = moved(await retryCounters(p), before);
  const lateMs = d['svc_hedge_primary_late_ms_total'] ?? 0;
  delete d['svc_hedge_primary_late_ms_total'];
  t.same(d, { svc_hedge_triggered_total: 1, svc_hedge_wasted_total: 1, svc_hedge_primary_won_after_trigger_total: 1, svc_hedge_primary_late_samples_total: 1 }, 'triggered, wasted, primary won after trigger, one late sample');
  t.ok(lateMs >= 0, `svc_hedge_primary_late_ms_total +${lateMs}`);
});

t.test('one attempt failing while the other runs: the request waits for the other', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-one-fails');
  for (const be of [slow, fast]) be.set({ kind: 'hold' }, '/h/f/');

  // The hedge fails first: the primary's answer is the request's.
  let before = await retryCounters(p);
  const first = send(p, 'h2', { path: '/h/f/hedge-fails', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': 'hedge-fails' } });
  await slow.until(() => slow.held === 1, 'the primary held');
  await fast.until(() => fast.held === 1, 'the hedge held');
  let errors = await metric(p, 'svc_backend_errors');
  t.equal(fast.resetHeld(), 1, "the hedge's connection reset by fast");
  t.equal(await pollUntil(() => metric(p, 'svc_backend_errors'), (v) => v === errors + 1), errors + 1, 'the proxy counted the failed hedge (svc_backend_errors +1)');
  t.equal(slow.held, 1, 'the primary still held: the failed hedge did not end the request');
  slow.release();
  const a = await first.answer;
  t.same([a.status, a.body], [200, 'slow /h/f/hedge-fails released'], `the primary's answer (${shown(a)})`);
  let d = moved(await retryCounters(p), before);
  t.comment(`hedge fails first: moved ${JSON.stringify(d)}`);
  t.equal(d['svc_hedge_triggered_total'], 1, 'one hedge triggered');
  t.equal(d['svc_hedge_wasted_total'], 1, 'and wasted');
  t.equal(d['svc_hedge_won_total'] ?? 0, 0, 'not won');
  t.equal(d['svc_retries_total'] ?? 0, 0, 'no retry after it');

  // The primary fails first: the hedge's answer is the request's.
  before = await retryCounters(p);
  const second = send(p, 'h2', { path: '/h/f/primary-fails', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': 'primary-fails' } });
  await slow.until(() => slow.held === 1, 'the primary held');
  await fast.until(() => fast.held === 1, 'the hedge held');
  errors = await metric(p, 'svc_backend_errors');
  t.equal(slow.resetHeld(), 1, "the primary's connection reset by slow");
  t.equal(await pollUntil(() => metric(p, 'svc_backend_errors'), (v) => v === errors + 1), errors + 1, 'the proxy counted the failed primary (svc_backend_errors +1)');
  t.equal(fast.held, 1, 'the hedge still held: the failed primary did not end the request');
  fast.release();
  const b = await second.answer;
  t.same([b.status, b.body], [200, 'fast /h/f/primary-fails released'], `the hedge's answer (${shown(b)})`);
  d = moved(await retryCounters(p), before);
  t.comment(`primary fails first: moved ${JSON.stringify(d)}`);
  t.equal(d['svc_hedge_triggered_total'], 1, 'one hedge triggered');
  t.equal(d['svc_hedge_won_total'], 1, 'and won');
  t.equal(d['svc_hedge_wasted_total'] ?? 0, 0, 'not wasted');
  t.equal(d['svc_retries_total'] ?? 0, 0, 'no retry after it');
  t.same(
    [slow.arrivalsUnder('/h/f/').length, fast.arrivalsUnder('/h/f/').length],
    [2, 2],
    'two attempts per request, no third',
  );
});

t.test('a hedge answered 503 does not win while the primary runs; if the primary fails too, the answer is the proxy\'s', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-503');
  slow.set({ kind: 'hold' }, '/h/s/');
  fast.set({ kind: 'status', status: 503 }, '/h/s/');
  const fast5xx = (): Promise<number> => metric(p, 'svc_backend_requests_total', { upstream: 'hedged', backend: 'fast', status_class: '5xx' });

  let before = await retryCounters(p);
  let seen = await fast5xx();
  const first = send(p, 'h2', { path: '/h/s/primary-wins', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': 'primary-wins' } });
  await slow.until(() => slow.held === 1, 'the primary held');
  t.equal(await pollUntil(fast5xx, (v) => v === seen + 1), seen + 1, "the proxy got fast's 503 to the hedge");
  t.equal(slow.held, 1, 'the primary still held: the 503 did not end the request');
  slow.release();
  const a = await first.answer;
  t.same([a.status, a.body], [200, 'slow /h/s/primary-wins released'], `the primary's answer, nothing of the 503 (${shown(a)})`);
  let d = moved(await retryCounters(p), before);
  t.comment(`503 hedge, primary wins: moved ${JSON.stringify(d)}`);
  t.same([d['svc_hedge_triggered_total'], d['svc_hedge_wasted_total'], d['svc_hedge_won_total'] ?? 0, d['svc_retries_total'] ?? 0], [1, 1, 0, 0], 'one hedge, wasted; no retry');

  before = await retryCounters(p);
  seen = await fast5xx();
  const second = send(p, 'h2', { path: '/h/s/both-fail', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': 'both-fail' } });
  await slow.until(() => slow.held === 1, 'the primary held');
  t.equal(await pollUntil(fast5xx, (v) => v === seen + 1), seen + 1, "the proxy got fast's 503 to the hedge");
  slow.resetHeld();
  const b = await second.answer;
  t.comment(`both failed: ${shown(b)}`);
  // docs/retries.md says the proxy's own answer names EDGE_UPSTREAM_ERROR_STATUS; what comes is
  // the last failure's (the primary's reset: 502 EDGE_UPSTREAM_TRANSPORT). Either is the proxy's
  // own answer, which is what this checks (the doc's wording is reported to the lead).
  t.ok([502, 503].includes(b.status) && /\(EDGE_UPSTREAM_[A-Z_]+\)/.test(b.body), `the proxy's own ${b.status}, nothing of fast's 503`);
  d = moved(await retryCounters(p), before);
  t.comment(`503 hedge, primary reset: moved ${JSON.stringify(d)}`);
  t.same([d['svc_hedge_triggered_total'], d['svc_hedge_wasted_total'], d['svc_retries_total'] ?? 0], [1, 1, 0], 'one hedge, wasted (both failed); no retry: both attempts used');
});

t.test('POST, PUT outside safe_methods (default [GET, HEAD]) and a route off route_allowlist are never hedged; a GET sent after them on the hedged route is', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-never');
  slow.set({ kind: 'hold' }, '/h/z/');
  slow.set({ kind: 'hold' }, '/p/z/');
  const before = await retryCounters(p);
  const held = PROTOCOLS.flatMap((protocol) => [
    send(p, protocol, { method: 'POST', path: `/h/z/post-${protocol}`, headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': `post-${protocol}` }, body: Buffer.from('once') }),
    send(p, protocol, { path: `/p/z/get-${protocol}`, headers: { [HASH_HEADER]: slowKey.plain, 'x-seq': `plain-${protocol}` } }),
    // Idempotent, so retryable, but not in safe_methods: safe_methods is what decides a hedge.
    send(p, protocol, { method: 'PUT', path: `/h/z/put-${protocol}`, headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': `put-${protocol}` }, body: Buffer.from('idem') }),
  ]);
  await slow.until(() => slow.held === 9, 'the 3 POSTs, the 3 PUTs and the 3 GETs of `plain` held');
  // The control: sent after all nine, so its hedge timer fires after theirs would have.
  const control = await request(p, 'h1', { path: '/h/z/control', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': 'control' }, timeoutMs: 5000 });
  t.same([control.status, control.body], [200, 'fast /h/z/control'], `the control GET was hedged and fast answered it (${shown(control)})`);
  t.same(
    fast.arrivalsUnder('/h/z/').map((a) => a.seq),
    ['control'],
    'fast saw the control only: no POST or PUT was hedged',
  );
  t.same(fast.arrivalsUnder('/p/z/'), [], 'nor a GET of the route off the allowlist');
  t.same(moved(await retryCounters(p), before), { svc_hedge_triggered_total: 1, svc_hedge_won_total: 1 }, 'one hedge: the control');
  slow.release();
  const answers = await Promise.all(held.map((s) => s.answer));
  t.same(
    answers.map((a) => [a.status, a.body]),
    PROTOCOLS.flatMap((protocol) => [
      [200, `slow /h/z/post-${protocol} released`],
      [200, `slow /p/z/get-${protocol} released`],
      [200, `slow /h/z/put-${protocol} released`],
    ]),
    'the nine answered by slow once released',
  );
  t.same(
    slow.bodies
      .filter((b) => b.method === 'POST')
      .map((b) => [b.seq, b.bytes])
      .sort(),
    PROTOCOLS.map((protocol) => [`post-${protocol}`, 4]),
    'slow read each POST body once',
  );
});

t.test('a primary faster than delay_ms triggers no hedge, over h1, h2 and h3', async (t) => {
  const { p, slow, fast, fastKey } = await setup(t, 'hedge-fast-primary');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/h/quick/${protocol}`, headers: { [HASH_HEADER]: fastKey, 'x-seq': protocol } });
    t.same([a.status, a.body], [200, `fast /h/quick/${protocol}`], `${protocol}: fast answered (${shown(a)})`);
  }
  t.same(
    fast.arrivalsUnder('/h/quick/').map((a) => a.seq),
    ['h1', 'h2', 'h3'],
    'fast got each once',
  );
  t.same(slow.arrivalsUnder('/h/quick/'), [], 'slow got none');
  t.same(moved(await retryCounters(p), before), {}, 'no hedge triggered');
});

t.test('hedges withdraw from the retry budget: with ratio_percent 0, at most its floor of 30 of 35 slow requests are hedged, every other one denied budget_exhausted', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-budget', '{ ratio_percent: 0 }');
  slow.set({ kind: 'hold' }, '/h/b/');
  const before = await retryCounters(p);
  const abandoned = slow.abandoned;
  const h2 = await connectH2(t, p);
  const answers = Array.from({ length: 35 }, (_, i) => h2.request({ path: `/h/b/${i}`, headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': String(i) } }));
  // The budget is the node's (a window budget leased to the worker, docs/retries.md): a hedge takes
  // a unit its worker's lease holds, or is denied at once while the lease asks for more. So at
  // most the floor (30 a window, ratio 0) is hedged, never more, and fewer when hedges fire faster
  // than the lease is topped up; each of the 35 is either hedged (answered by fast, its primary
  // cancelled) or denied budget_exhausted (it stays on slow).
  // Every request's hedge timer has fired once the two counters account for all 35.
  const c = await pollUntil(() => retryCounters(p), (x) => (moved(x, before)['svc_hedge_triggered_total'] ?? 0) + (moved(x, before)['svc_retry_denied_total{reason="budget_exhausted"}'] ?? 0) === 35, 10_000);
  const d = moved(c, before);
  const hedged = d['svc_hedge_triggered_total'] ?? 0;
  await fast.until(() => fast.arrivalsUnder('/h/b/').length === hedged, `${hedged} hedges`);
  await slow.until(() => slow.abandoned === abandoned + hedged, `${hedged} primaries cancelled`);
  t.ok(hedged >= 1 && hedged <= 30, `${hedged} hedged: at least one, at most the floor of 30`);
  t.same(d, { svc_hedge_triggered_total: hedged, svc_hedge_won_total: hedged, svc_retry_denied_total: 35 - hedged, 'svc_retry_denied_total{reason="budget_exhausted"}': 35 - hedged }, `${hedged} hedges sent and won, ${35 - hedged} denied budget_exhausted`);
  t.equal(slow.held, 35 - hedged, 'the unhedged requests still wait on slow');
  t.equal(fast.arrivalsUnder('/h/b/').length, hedged, 'fast saw only the hedges');
  slow.release();
  const all = await Promise.all(answers);
  t.same(
    [all.filter((a) => a.status === 200 && a.body.startsWith('fast ')).length, all.filter((a) => a.status === 200 && a.body.endsWith(' released')).length],
    [hedged, 35 - hedged],
    'the hedged ones answered by fast, the others by slow once released',
  );
});

t.test('a hedge that cannot be sent (no other backend) takes nothing from the retry budget', async (t) => {
  const solo = await controlledBackend(t, 'solo');
  solo.set({ kind: 'hold' }, '/s/hold/');
  solo.set({ kind: 'status', status: 503 }, '/s/503/');
  const p = await startProxy(t, files, 'hedge-solo', {
    performance: 'global_inflight_limit: 100, per_upstream_inflight_limit: 100, per_backend_inflight_limit: 100',
    upstream: `{ ${hashedPool('solo', '/s', [solo])} }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, hedging: { enabled: true, delay_ms: ${DELAY} }, retry_budget: { ratio_percent: 0 } }`,
  });
  const before = await retryCounters(p);
  const h2 = await connectH2(t, p);
  // 31 slow requests: past delay_ms each would hedge, but the pool has no other backend.
  const held = Array.from({ length: 31 }, (_, i) => h2.request({ path: `/s/hold/${i}` }));
  await solo.until(() => solo.held === 31, '31 held');
  // Nothing happens when it is right: a window of two delays to see that nothing does.
  await new Promise((r) => setTimeout(r, 2 * DELAY));
  t.same(moved(await retryCounters(p), before), {}, 'no hedge sent, none counted, nothing denied');
  // The budget (floor 30, ratio 0) is untouched: a 503 is retried (on the same backend, the only one).
  const a = await h2.request({ path: '/s/503/x' });
  t.equal(a.status, 503, `the 503 (${shown(a)})`);
  t.equal(solo.arrivalsUnder('/s/503/').length, 2, 'retried once: two attempts');
  t.comment(`moved: ${JSON.stringify(moved(await retryCounters(p), before))}`);
  solo.release();
  t.same(
    (await Promise.all(held)).filter((x) => x.status !== 200),
    [],
    'the 31 answered once released',
  );
});

t.test('with PUT in safe_methods, a PUT whose body is kept is hedged with the same bytes', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-put', '{}', ', safe_methods: [GET, PUT]');
  slow.set({ kind: 'hold' }, '/h/put/');
  fast.set({ kind: 'echo-sha256' }, '/h/put/');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const body = randomBytes(50_000);
    const a = await request(p, protocol, { method: 'PUT', path: `/h/put/${protocol}`, headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': protocol }, body, timeoutMs: 5000 });
    t.same([a.status, a.headers['x-backend'], a.body], [200, 'fast', sha256(body)], `${protocol}: the hedge's answer; fast read the same 50,000 bytes (${shown(a)})`);
    await slow.until(() => slow.held === 0, `${protocol}: the primary cancelled`);
  }
  t.same(
    slow.bodies.filter((b) => b.path.startsWith('/h/put/')).map((b) => b.bytes),
    [50_000, 50_000, 50_000],
    'slow read each whole body before the hedge won',
  );
  t.same(moved(await retryCounters(p), before), { svc_hedge_triggered_total: 3, svc_hedge_won_total: 3 }, 'three hedges, three won');
});

t.test('a PUT whose body is still arriving when delay_ms passes is not hedged', async (t) => {
  const { p, slow, fast, slowKey } = await setup(t, 'hedge-put-partial', '{}', ', safe_methods: [GET, PUT]');
  slow.set({ kind: 'echo-sha256' }, '/h/up/');
  fast.set({ kind: 'echo-sha256' }, '/h/up/');
  const before = await retryCounters(p);
  const full = randomBytes(50_000);
  // Half the body, then a pause of two delays (the hedge timer fires in it, with the body
  // incomplete), then the rest.
  async function* chunks(): AsyncGenerator<Buffer> {
    yield full.subarray(0, 25_000);
    await slow.until(() => slow.arrivalsUnder('/h/up/').length === 1, 'the primary on slow');
    await new Promise((r) => setTimeout(r, 2 * DELAY));
    yield full.subarray(25_000);
  }
  const a = await request(p, 'h2', { method: 'PUT', path: '/h/up/1', headers: { [HASH_HEADER]: slowKey.hedged, 'x-seq': '1' }, body: { length: full.length, chunks: chunks() } });
  t.same([a.status, a.headers['x-backend'], a.body], [200, 'slow', sha256(full)], `the primary's answer, the whole body (${shown(a)})`);
  t.same(fast.arrivalsUnder('/h/up/'), [], 'fast saw nothing: not hedged');
  t.same(moved(await retryCounters(p), before), {}, 'no hedge');
});
