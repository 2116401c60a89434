// Node-wide in-flight limits end to end (issue 39, Deliver 1, 2, 4, 5 and "Must show"): a real
// `edge-proxy serve` with 4 workers (on this 2-core machine), `global_inflight_limit` owned by
// the supervisor's lease ledger and leased to the workers (docs/overload.md "One node, one set of
// limits"). With route queues at 0, `global_inflight_limit: 8` gives exactly 8 requests in flight
// at a backend that holds them, and every other answer the coded 503 (queue_full), over 40
// requests each on a new HTTP/1.1 connection (the kernel spreads them), 40 at once on one HTTP/2
// connection and 40 at once on one HTTP/3 connection (one worker takes them all); the snapshot
// shows the node's lease and each worker's. A worker SIGKILLed while it holds slots: the node
// admits exactly 8 again within 2 s. A supervisor SIGSTOPped for 3 s: workers keep answering
// within their leases and shed the rest with 503 lease_unavailable, never more than 8 at the
// backend; full service after SIGCONT.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, connectH2, connectH3, metric, pollUntil, startProxy } from './support/overload.ts';
import { fire, firstAnswers as settled, pools, SHAPES } from './support/bursts.ts';
import { statuses } from './support/limits.ts';
import { workers as workerFacts } from './support/workers.ts';
import type { Answer } from './support/overload.ts';

const files = serviceFiles(t, 'edge-node-inflight-');
const WORKERS = 4;
const LIMIT = 8;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, route_queue: { default_cap: 0, global_cap: 0, shed_retry_after_seconds: 3 }';
const PERF = `global_inflight_limit: ${LIMIT}, per_upstream_inflight_limit: ${LIMIT}, per_backend_inflight_limit: ${LIMIT}`;
const QUEUE_FULL = '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n';
const UNAVAILABLE = '503 Service Unavailable: node limit service unavailable (EDGE_SHED_LEASE_UNAVAILABLE)\n';


t.test(`global_inflight_limit ${LIMIT}, queues at 0, 4 workers: exactly ${LIMIT} in flight at the backend and every other answer 503 queue_full, spread, on one HTTP/2 and on one HTTP/3 connection`, async (t) => {
  const be = await controlledBackend(t, 'ni');
  const shapes = SHAPES;
  for (const s of shapes) be.set({ kind: 'hold' }, `/${s}/hold`);
  const p = await startProxy(t, files, 'ni-exact', { workers: WORKERS, performance: PERF, upstream: pools(be, shapes), resilience: `{ ${QUIET} }` });
  const a0 = await admission(p);
  t.match(a0.leases.find((l) => l.key === 'global'), { key: 'global', limit: LIMIT, block: 1 }, 'the snapshot shows the node budget: limit 8, block 1');
  const shedBefore = await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' });
  for (const shape of shapes) {
    be.maxInflight = 0;
    const answers = await fire(t, p, shape, `/${shape}/hold`, 40);
    const refused = await settled(answers, 40 - LIMIT);
    await be.until(() => be.held === LIMIT, `${shape}: ${LIMIT} held`);
    t.equal(be.held, LIMIT, `${shape}: exactly ${LIMIT} requests in flight at the backend`);
    t.equal(be.maxInflight, LIMIT, `${shape}: never more than ${LIMIT} at once`);
    t.same(statuses(refused), { 503: 40 - LIMIT }, `${shape}: the other ${40 - LIMIT} answered 503`);
    t.equal(refused.filter((a) => a.body === QUEUE_FULL && a.headers['retry-after'] === '3').length, 40 - LIMIT, `${shape}: each one coded EDGE_SHED_QUEUE_FULL with Retry-After 3`);
    if (shape === 'spread') {
      // The snapshot: the node's lease of `global` is all granted, spread over the workers that hold the requests.
      const a = await pollUntil(() => admission(p), (x) => x.inflight === LIMIT, 10_000);
      const g = a.leases.find((l) => l.key === 'global');
      t.equal(g?.granted, LIMIT, 'snapshot: 8 granted node-wide');
      t.equal(g?.free, 0, 'snapshot: none free');
      t.equal(g?.workers.reduce((n, w) => n + w.granted, 0), LIMIT, "snapshot: the workers' leases add up to 8");
      t.equal(a.inflight, LIMIT, 'snapshot: 8 in flight node-wide');
    }
    be.release();
    const served = await Promise.all(answers);
    t.same(statuses(served), { 200: LIMIT, 503: 40 - LIMIT }, `${shape}: the ${LIMIT} held answered 200 once released`);
    await pollUntil(() => metric(p, 'svc_inflight_requests'), (v) => v === 0, 10_000);
  }
  t.equal((await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'queue_full' })) - shedBefore, 3 * (40 - LIMIT), 'svc_overload_shed_by_reason_total{reason="queue_full"} counts every refusal');
  t.equal(await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), 0, 'none shed for want of the supervisor');
});

t.test('a worker SIGKILLed while it holds slots: its slots come back, the node admits exactly 8 again within 2 s', async (t) => {
  const be = await controlledBackend(t, 'nk');
  be.set({ kind: 'hold' }, '/app/hold');
  const p = await startProxy(t, files, 'ni-kill', { workers: WORKERS, performance: PERF, upstream: pools(be, ['app']), resilience: `{ ${QUIET} }` });
  // 8 held over several workers (new connections spread).
  const first = await fire(t, p, 'spread', '/app/hold/a', 24);
  await settled(first, 24 - LIMIT);
  await be.until(() => be.held === LIMIT, '8 held');
  const a = await pollUntil(() => admission(p), (x) => (x.leases.find((l) => l.key === 'global')?.workers.filter((w) => w.in_use > 0).length ?? 0) >= 1 && x.inflight === LIMIT, 10_000);
  const victim = a.leases.find((l) => l.key === 'global')?.workers.filter((w) => w.in_use > 0).sort((x, y) => y.in_use - x.in_use)[0];
  t.ok(victim !== undefined && victim.in_use > 0, `a worker holds slots in use (worker ${victim?.worker}: ${victim?.in_use})`);
  const facts = await workerFacts(p);
  const pid = facts.find((w) => w.index === victim?.worker)?.pid as number;
  const t0 = performance.now();
  process.kill(pid, 'SIGKILL');
  // Its held requests end with its connections; the others stay held.
  await be.until(() => be.held === LIMIT - (victim?.in_use ?? 0), `the killed worker's ${victim?.in_use} requests gone`);
  // A fresh load (new connections) while the rest stay held: exactly the 8 − held the node has free are admitted...
  const stillHeld = be.held;
  const second = await fire(t, p, 'spread', '/app/hold/b', 24);
  await settled(second, 24 - (LIMIT - stillHeld));
  await be.until(() => be.held === LIMIT, '8 held again');
  const elapsed = performance.now() - t0;
  t.equal(be.held, LIMIT, `exactly 8 in flight again (${stillHeld} from before, ${LIMIT - stillHeld} new)`);
  t.ok(elapsed < 2000, `within 2 s of the kill (${elapsed.toFixed(0)} ms)`);
  const g = (await pollUntil(() => admission(p), (x) => x.leases.find((l) => l.key === 'global')?.workers.every((w) => w.worker !== victim?.worker || w.granted === 0) ?? false, 10_000)).leases.find((l) => l.key === 'global');
  t.equal(g?.granted, LIMIT, 'the ledger: 8 granted, none to the dead worker (a re-forked one starts empty)');
  be.release();
  await Promise.all([...first, ...second]);
  // And all 8 free: a third load gets exactly 8.
  be.maxInflight = 0;
  const third = await fire(t, p, 'spread', '/app/hold/c', 24);
  const refused = await settled(third, 24 - LIMIT);
  await be.until(() => be.held === LIMIT, '8 held, third load');
  t.same(statuses(refused), { 503: 24 - LIMIT }, 'the others refused, coded');
  t.equal(be.maxInflight, LIMIT, 'not fewer, not more');
  be.release();
  await Promise.all(third);
});

t.test('a supervisor SIGSTOPped for 3 s: workers answer within their leases and shed the rest with 503 lease_unavailable; never more than 8 at the backend; full service after SIGCONT', async (t) => {
  const be = await controlledBackend(t, 'nf');
  be.set({ kind: 'hold' }, '/app/hold');
  const p = await startProxy(t, files, 'ni-frozen', { workers: WORKERS, performance: PERF, upstream: pools(be, ['app']), resilience: `{ ${QUIET} }` });
  // Connections opened before the stop (a new connection needs a node connection slot, which a stopped supervisor cannot lease).
  const conn = await connectH2(t, p);
  const quic = await connectH3(t, p);
  // Warm up the connections' workers: each holds a slot of headroom after a few requests.
  for (let i = 0; i < 5; i++) {
    t.equal((await conn.request({ path: `/app/warm/${i}` })).status, 200, `warm-up ${i} over HTTP/2`);
    t.equal((await quic.request({ path: `/app/warm3/${i}` })).status, 200, `warm-up ${i} over HTTP/3`);
  }
  await pollUntil(() => admission(p), (x) => (x.leases.find((l) => l.key === 'global')?.granted ?? 0) > 0, 10_000);
  const pid = p.served.proc.pid as number;
  be.maxInflight = 0;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  const stoppedAt = performance.now();
  t.teardown(() => {
    if (!resumed) process.kill(pid, 'SIGCONT');
  });
  // While stopped: 12 requests at once on each connection.
  const onConn = Array.from({ length: 12 }, (_, i) => conn.request({ path: `/app/hold/c${i}`, timeoutMs: 30_000 }));
  const onQuic = Array.from({ length: 12 }, (_, i) => quic.request({ path: `/app/hold/q${i}`, timeoutMs: 30_000 }));
  const all = [...onConn, ...onQuic];
  const heldNow = (): number => be.held;
  // Every request is decided while the supervisor is stopped: held (within a lease) or shed after the 1 s wait.
  const shed = await new Promise<Answer[]>((resolve) => {
    const got: Answer[] = [];
    const check = (): void => {
      if (got.length + heldNow() === all.length) resolve([...got]);
    };
    for (const a of all)
      void a.then((x) => {
        got.push(x);
        check();
      });
    be.until(() => {
      check();
      return got.length + heldNow() === all.length;
    }, 'every request decided', 2500).catch(() => resolve([...got]));
  });
  const decidedIn = performance.now() - stoppedAt;
  t.ok(decidedIn < 3000, `all ${all.length} decided while the supervisor is stopped (${decidedIn.toFixed(0)} ms)`);
  const held = be.held;
  t.ok(held >= 1, `requests within the workers' leases are served (${held} at the backend)`);
  t.ok(be.maxInflight <= LIMIT, `never more than ${LIMIT} at the backend (${be.maxInflight})`);
  t.equal(shed.length, all.length - held, 'the rest answered');
  t.same(statuses(shed), { 503: all.length - held }, 'each with a 503');
  t.equal(shed.filter((a) => a.body === UNAVAILABLE && a.headers['retry-after'] === '3').length, shed.length, 'each one coded EDGE_SHED_LEASE_UNAVAILABLE with Retry-After (no other 5xx)');
  // Resume after 3 s in all.
  await new Promise((r) => setTimeout(r, Math.max(0, 3000 - (performance.now() - stoppedAt))));
  process.kill(pid, 'SIGCONT');
  resumed = true;
  be.release();
  await Promise.all(all);
  t.equal(await pollUntil(() => metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), (v) => v === shed.length, 10_000), shed.length, 'svc_overload_shed_by_reason_total{reason="lease_unavailable"} counts them');
  // Full service: 8 held again, all on the HTTP/2 connection's worker (the others give their slots back), the others coded queue_full.
  await pollUntil(() => metric(p, 'svc_inflight_requests'), (v) => v === 0, 10_000);
  be.maxInflight = 0;
  const after = Array.from({ length: 20 }, (_, i) => conn.request({ path: `/app/hold/after/${i}`, timeoutMs: 30_000 }));
  const refused = await settled(after, 20 - LIMIT);
  await be.until(() => be.held === LIMIT, '8 held after SIGCONT');
  t.equal(be.maxInflight, LIMIT, 'after SIGCONT: exactly 8 in flight');
  t.same(refused.filter((a) => a.body !== QUEUE_FULL).map((a) => `${a.status} ${a.error ?? a.body}`), [], 'and the rest refused queue_full');
  be.release();
  await Promise.all(after);
});
