// Node-wide route queue caps end to end (issue 39: "`route_queue.global_cap` and caps (a request
// queued on a worker whose lease is empty is admitted when a slot frees anywhere)"): a real
// `edge-proxy serve` with 4 workers on this 2-core machine, the queues' places owned by the
// supervisor's token ledger (docs/overload.md "Queue caps"). `global_inflight_limit: 2` held at
// the backend and `global_cap: 5`: of 40 requests, spread over new connections, on one HTTP/2
// connection and on one HTTP/3 connection, exactly 2 reach the backend, exactly 5 wait on the node
// and 33 are refused 503 queue_full; released, the 5 are served. Route caps 3 and 1: exactly 3
// and 1 wait. A request queued on one worker is admitted by a slot freed on another. A frozen
// supervisor: a request that must ask for a place is shed lease_unavailable after the 1 s wait.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, loadNow, metric, pollUntil, startProxy } from './support/overload.ts';
import { fire, firstAnswers, pools, SHAPES } from './support/bursts.ts';
import { connectionsOnEveryWorker, statuses } from './support/limits.ts';
import type { Answer } from './support/overload.ts';

const files = serviceFiles(t, 'edge-node-queue-caps-');
const WORKERS = 4;
const LIMIT = 2;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const perf = (limit: number): string => `global_inflight_limit: ${limit}, per_upstream_inflight_limit: ${limit}, per_backend_inflight_limit: ${limit}`;
const QUEUE_FULL = '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n';
const UNAVAILABLE = '503 Service Unavailable: node limit service unavailable (EDGE_SHED_LEASE_UNAVAILABLE)\n';
/** How long the refusals may take to come on a loaded machine (each is one or two round trips to the supervisor). */
const REFUSED_WITHIN_MS = 15_000;

/** Of `answers`, how many are the coded queue_full refusal with Retry-After 3. */
const queueFull = (answers: readonly Answer[]): number => answers.filter((a) => a.status === 503 && a.body === QUEUE_FULL && a.headers['retry-after'] === '3').length;

/** The answers that are not the queue_full refusal, for an assertion's message. */
const others = (answers: readonly Answer[]): string => JSON.stringify(answers.filter((a) => a.body !== QUEUE_FULL).map((a) => `${a.status} ${a.error ?? a.body.trim()}`));

t.test(`global_cap 5 on 4 workers, ${LIMIT} held in flight: of 40 requests exactly 5 wait on the node and 33 are refused queue_full, spread, on one HTTP/2 and on one HTTP/3 connection`, async (t) => {
  const be = await controlledBackend(t, 'qg');
  // Two routes, each allowed the whole global cap (a route's cap may not exceed it): only the global cap binds.
  const p = await startProxy(t, files, 'qc-global', { workers: WORKERS, performance: perf(LIMIT), upstream: pools(be, ['a', 'b']), resilience: `{ ${QUIET}, route_queue: { default_cap: 5, global_cap: 5, max_wait_ms: 60000, shed_retry_after_seconds: 3 } }` });
  const shedBefore = await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' });
  for (const shape of SHAPES) {
    be.set({ kind: 'hold' }, '/a/hold').set({ kind: 'hold' }, '/b/hold');
    be.maxInflight = 0;
    const admittedBefore = await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' });
    const arrivedBefore = be.arrivals.length;
    const answers = await fire(t, p, shape, (i) => `/${i % 2 === 0 ? 'a' : 'b'}/hold/${shape}/${i}`, 40, 60_000);
    const refused = await firstAnswers(answers, 33, REFUSED_WITHIN_MS);
    await be.until(() => be.held === LIMIT, `${shape}: ${LIMIT} held`);
    t.equal(refused.length, 33, `${shape}: 33 answered while the rest wait`);
    t.equal(queueFull(refused), 33, `${shape}: each one 503 EDGE_SHED_QUEUE_FULL with Retry-After 3 (others: ${others(refused)})`);
    t.equal(be.held, LIMIT, `${shape}: exactly ${LIMIT} in flight at the backend`);
    t.equal(be.maxInflight, LIMIT, `${shape}: never more`);
    // The workers' queues, read at the scrape (svc_route_queue_depth summed over workers and routes) and in the snapshot.
    const now = await pollUntil(() => loadNow(p), (x) => x.queued === 5, 10_000);
    t.same(now, { inflight: LIMIT, queued: 5 }, `${shape}: exactly 5 waiting on the node (svc_route_queue_depth summed), ${LIMIT} in flight`);
    const a = await pollUntil(() => admission(p), (x) => x.queued === 5 && x.inflight === LIMIT, 10_000);
    t.equal(a.queued, 5, `${shape}: the snapshot shows 5 queued (per worker: ${a.workers.map((w) => `${w.worker}:${w.queued}`).join(' ')})`);
    t.equal(a.workers.reduce((n, w) => n + Object.values(w.queued_by_route).reduce((m, q) => m + q, 0), 0), 5, `${shape}: and the workers' queues by route add up to 5`);
    // Released (and the next ones answered at once): the 5 waiting are served.
    be.set({ kind: 'ok' }, '/a/hold').set({ kind: 'ok' }, '/b/hold');
    be.release();
    const all = await Promise.all(answers);
    t.same(statuses(all), { 200: LIMIT + 5, 503: 33 }, `${shape}: the ${LIMIT} held and the 5 queued answered 200`);
    t.equal(be.arrivals.length - arrivedBefore, LIMIT + 5, `${shape}: ${LIMIT + 5} reached the backend`);
    t.equal(be.maxInflight, LIMIT, `${shape}: never more than ${LIMIT} at once, the queued ones included`);
    t.equal((await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' })) - admittedBefore, 5, `${shape}: 5 admitted after waiting for a global slot`);
    await pollUntil(() => loadNow(p), (x) => x.inflight === 0 && x.queued === 0, 10_000);
  }
  t.equal((await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' })) - shedBefore, 3 * 33, 'svc_overload_shed_by_reason_total{reason="queue_full"} counts every refusal');
  t.equal(await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), 0, 'none shed for want of the supervisor');
});

t.test('route caps 3 and 1 on 4 workers: of 10 requests on each route exactly 3 and 1 wait on the node, spread over new connections', async (t) => {
  const be = await controlledBackend(t, 'qr');
  be.set({ kind: 'hold' }, '/h/hold').set({ kind: 'hold' }, '/a/hold').set({ kind: 'hold' }, '/b/hold');
  const p = await startProxy(t, files, 'qc-routes', { workers: WORKERS, performance: perf(LIMIT), upstream: pools(be, ['h', 'a', 'b']), resilience: `{ ${QUIET}, route_queue: { default_cap: 10, global_cap: 10, caps: { a: 3, b: 1 }, max_wait_ms: 60000, shed_retry_after_seconds: 3 } }` });
  // The 2 slots of the node held by route h, then 10 requests of each capped route.
  const held = await fire(t, p, 'spread', '/h/hold', LIMIT, 60_000);
  await be.until(() => be.held === LIMIT, `${LIMIT} held on route h`);
  be.maxInflight = 0;
  const answers = await fire(t, p, 'spread', (i) => `/${i % 2 === 0 ? 'a' : 'b'}/hold/${i}`, 20, 60_000);
  const refused = await firstAnswers(answers, 16, REFUSED_WITHIN_MS);
  t.equal(refused.length, 16, '16 answered while the rest wait');
  t.equal(queueFull(refused), 16, `each one 503 EDGE_SHED_QUEUE_FULL with Retry-After 3 (others: ${others(refused)})`);
  const depth = async (): Promise<{ a: number; b: number }> => ({ a: await metric(p, 'svc_route_queue_depth', { route: 'a' }), b: await metric(p, 'svc_route_queue_depth', { route: 'b' }) });
  const d = await pollUntil(depth, (x) => x.a === 3 && x.b === 1, 10_000);
  t.same(d, { a: 3, b: 1 }, 'exactly 3 waiting on route a and 1 on route b, node-wide');
  const snap = await pollUntil(() => admission(p), (x) => x.queued === 4, 10_000);
  const byRoute = (route: string): number => snap.workers.reduce((n, w) => n + (w.queued_by_route[route] ?? 0), 0);
  t.same({ a: byRoute('a'), b: byRoute('b') }, { a: 3, b: 1 }, "the snapshot's queues by route say the same");
  t.equal(be.held, LIMIT, 'and only the 2 of route h at the backend');
  be.set({ kind: 'ok' }, '/h/hold').set({ kind: 'ok' }, '/a/hold').set({ kind: 'ok' }, '/b/hold');
  be.release();
  const all = await Promise.all(answers);
  t.same(statuses(all), { 200: 4, 503: 16 }, 'released: the 4 queued answered 200');
  t.same(statuses(await Promise.all(held)), { 200: LIMIT }, 'and the 2 held');
});

t.test('a request queued on one worker is admitted by the slot a request on another worker frees', async (t) => {
  const be = await controlledBackend(t, 'qx');
  be.set({ kind: 'hold' }, '/a/');
  const p = await startProxy(t, files, 'qc-elsewhere', { workers: WORKERS, performance: perf(1), upstream: pools(be, ['a']), resilience: `{ ${QUIET}, route_queue: { default_cap: 2, global_cap: 2, max_wait_ms: 60000, shed_retry_after_seconds: 3 } }` });
  const [y, x] = await connectionsOnEveryWorker(t, p, be, '/a/probe', WORKERS);
  if (y === undefined || x === undefined) throw new Error('no pinned connections');
  t.not(x.worker, y.worker, `two workers: ${y.worker} holds the node's one slot, ${x.worker} queues`);
  const admittedBefore = await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' });
  const onY = y.request({ path: '/a/hold/y', timeoutMs: 60_000 });
  await be.until(() => be.held === 1, 'the request on worker Y held');
  const onX = x.request({ path: '/a/hold/x', timeoutMs: 60_000 });
  // Each worker's entry is its latest heartbeat (one each 100 ms, not in step): read until both show the request.
  const queued = await pollUntil(() => admission(p), (a) => a.workers.find((w) => w.worker === x.worker)?.queued === 1 && a.workers.find((w) => w.worker === y.worker)?.inflight === 1, 10_000);
  t.same(
    queued.workers.filter((w) => w.inflight > 0 || w.queued > 0).map((w) => ({ worker: w.worker, inflight: w.inflight, queued: w.queued })).sort((m, n) => m.worker - n.worker),
    [
      { worker: y.worker, inflight: 1, queued: 0 },
      { worker: x.worker, inflight: 0, queued: 1 },
    ].sort((m, n) => m.worker - n.worker),
    "worker X's request waits in X's queue while worker Y's holds the slot",
  );
  t.equal(be.arrivals.filter((a) => a.path === '/a/hold/x').length, 0, 'it has not reached the backend');
  // Y's request ends: the slot it frees on Y goes to X's waiter.
  be.release();
  t.equal((await onY).status, 200, "worker Y's request answered");
  await be.until(() => be.held === 1 && be.arrivals.some((a) => a.path === '/a/hold/x'), "worker X's request admitted and at the backend");
  const after = await pollUntil(() => admission(p), (a) => a.workers.find((w) => w.worker === x.worker)?.inflight === 1 && a.queued === 0, 10_000);
  t.equal(after.workers.find((w) => w.worker === x.worker)?.inflight, 1, 'now in flight on worker X');
  t.equal((await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' })) - admittedBefore, 1, 'counted as admitted after waiting for a global slot');
  be.release();
  const a = await onX;
  t.equal(a.status, 200, "worker X's request answered 200");
  t.equal(a.body, `${be.name} /a/hold/x released`, 'by the backend');
});

t.test('a supervisor SIGSTOPped: a request that must ask the node for a queue place is shed lease_unavailable after the 1 s wait; the one queued before is served after SIGCONT', async (t) => {
  const be = await controlledBackend(t, 'qf');
  be.set({ kind: 'hold' }, '/a/');
  const p = await startProxy(t, files, 'qc-frozen', { workers: WORKERS, performance: perf(1), upstream: pools(be, ['a']), resilience: `{ ${QUIET}, route_queue: { default_cap: 2, global_cap: 2, max_wait_ms: 60000, shed_retry_after_seconds: 3 } }` });
  const [conn] = await connectionsOnEveryWorker(t, p, be, '/a/probe', 1);
  if (conn === undefined) throw new Error('no connection');
  const first = conn.request({ path: '/a/hold/1', timeoutMs: 60_000 });
  await be.until(() => be.held === 1, 'the node slot held');
  const second = conn.request({ path: '/a/hold/2', timeoutMs: 60_000 });
  await pollUntil(() => loadNow(p), (x) => x.queued === 1, 10_000);
  const pid = p.served.proc.pid as number;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  t.teardown(() => {
    if (!resumed) process.kill(pid, 'SIGCONT');
  });
  // The route has a waiter: the third queues behind it, and its worker must ask the node for a place.
  const third = await conn.request({ path: '/a/hold/3', timeoutMs: 60_000 });
  process.kill(pid, 'SIGCONT');
  resumed = true;
  t.equal(third.status, 503, 'the third: 503');
  t.equal(third.body, UNAVAILABLE, 'coded EDGE_SHED_LEASE_UNAVAILABLE');
  t.equal(third.headers['retry-after'], '3', 'with Retry-After');
  t.ok(third.ms >= 990, `after the 1 s wait for the supervisor (${third.ms.toFixed(0)} ms)`);
  t.equal(be.held, 1, 'nothing more at the backend meanwhile');
  be.set({ kind: 'ok' }, '/a/');
  be.release();
  t.equal((await first).status, 200, 'the first answered');
  t.equal((await second).status, 200, 'the one queued before the stop is served');
  t.equal(await pollUntil(() => metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), (v) => v === 1, 10_000), 1, 'svc_overload_shed_by_reason_total{reason="lease_unavailable"} counts it');
});
