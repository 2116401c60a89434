// `performance.per_backend_inflight_limit` node-wide end to end (issue 39, Deliver 2): a real
// `edge-proxy serve` with 4 workers (on this 2-core machine), each backend's limit a budget of the
// supervisor's lease ledger (`backend:<pool>/<id>`, docs/overload.md "One node, one set of
// limits"). One pool of two backends that hold every request, `per_backend_inflight_limit: 3`,
// the global and upstream limits far above: with route queues at 0, exactly 3 requests are in
// flight at each backend (6 in all) and every other answer is the coded 503 (queue_full), over 40
// requests each on a new HTTP/1.1 connection (the kernel spreads them), 40 at once on one HTTP/2
// connection and 40 at once on one HTTP/3 connection (one worker takes them all). With a route
// queue: a request queued on another worker than the one holding a backend's slots is admitted to
// that backend when one of them frees, exactly one per slot freed.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, metric, pollUntil, startProxy } from './support/overload.ts';
import { fire, firstAnswers, SHAPES } from './support/bursts.ts';
import { connectionsOnEveryWorker, statuses } from './support/limits.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';

const files = serviceFiles(t, 'edge-node-backend-inflight-');
const WORKERS = 4;
const LIMIT = 3;
const PERF = `global_inflight_limit: 64, per_upstream_inflight_limit: 64, per_backend_inflight_limit: ${LIMIT}`;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const QUEUE_FULL = '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n';

/** Pool `app` over backends `a` and `b` (round-robin), and pool `probe` over `a` alone (to find a connection's worker). */
function upstreams(a: ControlledBackend, b: ControlledBackend): string {
  const at = (be: ControlledBackend): string => `{ id: ${be.name}, address: "127.0.0.1:${be.port}" }`;
  return `{ app: { route: { path_prefix: /app }, backends: [${at(a)}, ${at(b)}] }, probe: { route: { path_prefix: /probe }, backends: [${at(a)}] } }`;
}

t.test(`per_backend_inflight_limit ${LIMIT}, queues at 0, 4 workers: exactly ${LIMIT} in flight at each backend and every other answer 503 queue_full, spread, on one HTTP/2 and on one HTTP/3 connection`, async (t) => {
  const a = await controlledBackend(t, 'A');
  const b = await controlledBackend(t, 'B');
  for (const be of [a, b]) be.set({ kind: 'hold' }, '/app');
  const p = await startProxy(t, files, 'nb-exact', { workers: WORKERS, performance: PERF, upstream: upstreams(a, b), resilience: `{ ${QUIET}, route_queue: { default_cap: 0, global_cap: 0, shed_retry_after_seconds: 3 } }` });
  const a0 = await admission(p);
  for (const key of ['backend:app/A', 'backend:app/B', 'backend:probe/A']) t.match(a0.leases.find((l) => l.key === key), { key, limit: LIMIT, block: 1 }, `the snapshot shows the node budget ${key}: limit ${LIMIT}, block 1`);
  const shedBefore = await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' });
  const HELD = 2 * LIMIT;
  for (const shape of SHAPES) {
    a.maxInflight = 0;
    b.maxInflight = 0;
    const answers = await fire(t, p, shape, `/app/${shape}`, 40);
    const refused = await firstAnswers(answers, 40 - HELD);
    await a.until(() => a.held === LIMIT, `${shape}: ${LIMIT} held at A`);
    await b.until(() => b.held === LIMIT, `${shape}: ${LIMIT} held at B`);
    t.equal(a.held, LIMIT, `${shape}: exactly ${LIMIT} requests in flight at backend A`);
    t.equal(b.held, LIMIT, `${shape}: exactly ${LIMIT} requests in flight at backend B`);
    t.equal(a.maxInflight, LIMIT, `${shape}: never more than ${LIMIT} at once at A`);
    t.equal(b.maxInflight, LIMIT, `${shape}: never more than ${LIMIT} at once at B`);
    t.same(statuses(refused), { 503: 40 - HELD }, `${shape}: the other ${40 - HELD} answered 503`);
    t.equal(refused.filter((x) => x.body === QUEUE_FULL && x.headers['retry-after'] === '3').length, 40 - HELD, `${shape}: each one coded EDGE_SHED_QUEUE_FULL with Retry-After 3`);
    if (shape === 'spread') {
      // The snapshot: each backend's budget all granted, held by the workers that hold its requests.
      const s = await pollUntil(() => admission(p), (x) => x.inflight === HELD, 10_000);
      for (const key of ['backend:app/A', 'backend:app/B']) {
        const l = s.leases.find((x) => x.key === key);
        t.equal(l?.granted, LIMIT, `snapshot: ${key} ${LIMIT} granted node-wide`);
        t.equal(l?.free, 0, `snapshot: ${key} none free`);
        t.equal(l?.workers.reduce((n, w) => n + w.in_use, 0), LIMIT, `snapshot: ${key} ${LIMIT} in use over the workers`);
      }
    }
    a.release();
    b.release();
    const served = await Promise.all(answers);
    t.same(statuses(served), { 200: HELD, 503: 40 - HELD }, `${shape}: the ${HELD} held answered 200 once released`);
    await pollUntil(() => metric(p, 'svc_inflight_requests'), (v) => v === 0, 10_000);
  }
  t.equal((await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' })) - shedBefore, 3 * (40 - HELD), 'svc_overload_shed_by_reason_total{reason="queue_full"} counts every refusal');
  t.equal(await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), 0, 'none shed for want of the supervisor');
});

t.test('a route queue: a slot of a backend freed on one worker admits exactly one request queued on another worker, to that backend', async (t) => {
  const a = await controlledBackend(t, 'A');
  const b = await controlledBackend(t, 'B');
  for (const be of [a, b]) be.set({ kind: 'hold' }, '/app');
  a.set({ kind: 'hold' }, '/probe');
  const p = await startProxy(t, files, 'nb-queue', { workers: WORKERS, performance: PERF, upstream: upstreams(a, b), resilience: `{ ${QUIET}, route_queue: { default_cap: 10, global_cap: 10, max_wait_ms: 30000, shed_retry_after_seconds: 3 } }` });
  // One HTTP/2 connection on each of three workers: the first holds both backends' slots, the other two queue.
  const [holder, q1, q2] = await connectionsOnEveryWorker(t, p, a, '/probe/where', WORKERS);
  if (holder === undefined || q1 === undefined || q2 === undefined) throw new Error('connections on three workers');
  t.not(holder.worker, q1.worker, 'the holder and the first queued request are on different workers');
  t.not(holder.worker, q2.worker, 'the holder and the second queued request are on different workers');
  const arrivedA = a.arrivalsUnder('/app').length;
  const arrivedB = b.arrivalsUnder('/app').length;
  const held = Array.from({ length: 2 * LIMIT }, (_, i) => holder.request({ path: `/app/held/${i}`, timeoutMs: 60_000 }));
  await a.until(() => a.held === LIMIT, `${LIMIT} held at A`);
  await b.until(() => b.held === LIMIT, `${LIMIT} held at B`);
  const first = q1.request({ path: '/app/queued/1', timeoutMs: 60_000 });
  await pollUntil(() => admission(p), (x) => x.queued === 1, 10_000);
  const second = q2.request({ path: '/app/queued/2', timeoutMs: 60_000 });
  const s = await pollUntil(() => admission(p), (x) => x.queued === 2, 10_000);
  t.same(
    s.workers.filter((w) => w.queued > 0).map((w) => [w.worker, w.queued]).sort(),
    [
      [q1.worker, 1],
      [q2.worker, 1],
    ].sort(),
    'two requests queued, one on each of the two other workers',
  );
  t.equal(a.held + b.held, 2 * LIMIT, 'nothing more reached the backends');
  // One of A's slots frees on the holder's worker: the first queued request (another worker) is admitted to A, the second stays queued.
  t.equal(a.release(1), 1, 'one request on A released');
  await a.until(() => a.held === LIMIT && a.arrivalsUnder('/app').length === arrivedA + LIMIT + 1, 'the freed slot of A used again');
  t.equal(a.arrivalsUnder('/app/queued').map((x) => x.path).join(' '), '/app/queued/1', 'the request admitted to A is the one queued first, from another worker');
  const after = await pollUntil(() => admission(p), (x) => x.queued === 1, 10_000);
  t.same(after.workers.filter((w) => w.queued > 0).map((w) => [w.worker, w.queued]), [[q2.worker, 1]], 'the second still queued on its worker');
  t.equal(b.arrivalsUnder('/app').length, arrivedB + LIMIT, 'B received nothing more');
  t.equal(a.maxInflight, LIMIT, `never more than ${LIMIT} at A`);
  // One of B's slots frees: the second is admitted, to B.
  t.equal(b.release(1), 1, 'one request on B released');
  await b.until(() => b.held === LIMIT && b.arrivalsUnder('/app/queued').length === 1, 'the freed slot of B used again');
  t.equal(b.arrivalsUnder('/app/queued').map((x) => x.path).join(' '), '/app/queued/2', 'the second queued request admitted to B');
  await pollUntil(() => admission(p), (x) => x.queued === 0, 10_000);
  t.equal(b.maxInflight, LIMIT, `never more than ${LIMIT} at B`);
  a.release();
  b.release();
  const answers = await Promise.all([...held, first, second]);
  t.same(statuses(answers), { 200: 2 * LIMIT + 2 }, 'every request answered 200');
  t.equal(await metric(p, 'svc_inflight_wait_admit_total', { scope: 'backend' }), 2, 'svc_inflight_wait_admit_total{scope="backend"} counts the two admitted from the queue');
});
