// Adaptive admission and brownout are the node's (issue 39: "adaptive admission (one node limit
// moving between min_limit and max_limit), brownout on the node's in-flight percent"), end to end:
// a real `edge-proxy serve` with 4 workers on this 2-core machine (docs/overload.md "Adaptive
// admission", "Brownout").
// - Adaptive: a backend slower than high_latency_ms drives the ONE node limit from max_limit 16 down
//   to min_limit 4 (steps of 4); then 20 held requests spread over new connections (so over the
//   workers) put exactly 4 at the backend, never more, and the other 16 are answered 503
//   queue_full: the limit is the node's, not 4 per worker (which would let 16 through). The
//   snapshot shows the one limit at the node, in the `global` budget and in every worker's entry.
//   Fast again, the limit climbs back to 16, and 20 held requests put exactly 16 at the backend.
// - Brownout: global_inflight_limit 10, trigger 50, recover 20. 5 requests held on the core route
//   spread over the 4 workers (2, 1, 1, 1: each worker alone at 10-20 %) turn the node's brownout on;
//   a non-core request on every worker is shed 503 EDGE_SHED_BROWNOUT, a core request on every
//   worker is served; released to 2 (20 %), non-core requests are served on every worker again.
//   The same with the 5 held on one HTTP/2 connection (one worker). The time from the client
//   sending the 5th to the last worker applying the node's state is measured and bounded.
// - A frozen supervisor (SIGSTOP): every worker keeps shedding non-core routes, even once nothing
//   is in flight (no fail open); after SIGCONT the node counts 0 and ends it everywhere. A worker
//   SIGKILLed holding the 5: its requests stop counting at once, the brownout ends.
import { cpus, loadavg } from 'node:os';
import t from 'tap';
import { INUSE_REPORT_MS } from '@edge-proxy/ipc';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, assertShed, metric, pollUntil, startProxy } from './support/overload.ts';
import { fire, firstAnswers, pools } from './support/bursts.ts';
import { connectionsOnEveryWorker, statuses } from './support/limits.ts';
import type { Admission, Answer } from './support/overload.ts';
import type { PinnedConnection } from './support/limits.ts';
import { workers as workerFacts } from './support/workers.ts';

const files = serviceFiles(t, 'edge-node-admission-');
const WORKERS = 4;
const QUEUE_FULL = '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n';
const RETRY_AFTER = 3;

const globalBudget = (a: Admission): { limit: number; granted: number } | undefined => a.leases.find((l) => l.key === 'global');

t.test('adaptive admission: one node limit, driven down to min_limit by a slow backend and back up to max_limit when it is fast; the backend never sees more than it', async (t) => {
  const be = await controlledBackend(t, 'ad');
  be.set({ kind: 'slow', ms: 500 }, '/app/slow');
  be.set({ kind: 'hold' }, '/app/hold');
  const p = await startProxy(t, files, 'na-adaptive', {
    workers: WORKERS,
    performance: 'global_inflight_limit: 16, per_upstream_inflight_limit: 16, per_backend_inflight_limit: 16',
    upstream: pools(be, ['app']),
    resilience: `{ adaptive_admission: { min_limit: 4, max_limit: 16, decrease_step: 4, increase_step: 4, high_latency_ms: 200 }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, route_queue: { default_cap: 0, global_cap: 0, shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const a0 = await admission(p);
  t.same([a0.adaptive_limit, a0.min_limit, a0.max_limit, globalBudget(a0)?.limit], [16, 4, 16, 16], 'the node starts at max_limit 16; the global budget is 16');

  // Slow responses (500 ms > high_latency_ms 200): each node window is high, one step of 4 down.
  const seen = new Set<number>();
  let a = a0;
  for (let round = 0; round < 30 && a.adaptive_limit > 4; round++) {
    await Promise.all(await fire(t, p, 'spread', `/app/slow/${round}`, 8));
    a = await admission(p);
    seen.add(a.adaptive_limit);
  }
  a = await pollUntil(() => admission(p), (x) => x.adaptive_limit === 4 && globalBudget(x)?.limit === 4 && x.workers.every((w) => w.adaptive_limit === 4), 10_000);
  t.equal(a.adaptive_limit, 4, `the node's limit fell to min_limit 4 (seen on the way: ${[...seen].join(', ')})`);
  t.ok([...seen].every((l) => [4, 8, 12, 16].includes(l)), 'only in steps of 4 within [4, 16]');
  t.equal(globalBudget(a)?.limit, 4, "the global budget's limit in the lease ledger is the node's limit");
  t.same(a.workers.map((w) => w.adaptive_limit), [4, 4, 4, 4], 'every worker applies the one limit (no limit of its own)');

  // 20 held requests spread over new connections: exactly 4 at the backend, the rest queue_full.
  be.maxInflight = 0;
  const held = await fire(t, p, 'spread', '/app/hold/low', 20);
  const refused = await firstAnswers(held, 16);
  await be.until(() => be.held === 4, '4 held');
  t.equal(be.held, 4, 'exactly 4 (the node limit) in flight at the backend');
  t.equal(be.maxInflight, 4, 'never more than 4 at once (4 workers with a limit each would have let 16 through)');
  t.same(statuses(refused), { 503: 16 }, 'the other 16 answered 503');
  t.equal(refused.filter((x) => x.body === QUEUE_FULL && x.headers['retry-after'] === String(RETRY_AFTER)).length, 16, 'each coded EDGE_SHED_QUEUE_FULL with Retry-After');
  const during = await pollUntil(() => admission(p), (x) => x.inflight === 4, 10_000);
  t.same([during.adaptive_limit, during.inflight, globalBudget(during)?.granted], [4, 4, 4], 'snapshot: limit 4, 4 in flight, 4 granted node-wide');
  be.release();
  t.same(statuses(await Promise.all(held)), { 200: 4, 503: 16 }, 'the 4 held answered once released');

  // Fast responses: healthy windows, one step of 4 up per window, back to max_limit.
  for (let round = 0; round < 400; round++) {
    await Promise.all(await fire(t, p, 'spread', `/app/fast/${round}`, 4));
    if (round % 5 === 4 && (await admission(p)).adaptive_limit === 16) break;
  }
  a = await pollUntil(() => admission(p), (x) => x.adaptive_limit === 16 && globalBudget(x)?.limit === 16 && x.workers.every((w) => w.adaptive_limit === 16), 10_000);
  t.same([a.adaptive_limit, globalBudget(a)?.limit, a.workers.map((w) => w.adaptive_limit)], [16, 16, [16, 16, 16, 16]], 'recovered to max_limit 16: the node, its global budget and every worker');
  be.maxInflight = 0;
  const again = await fire(t, p, 'spread', '/app/hold/high', 20);
  const refused2 = await firstAnswers(again, 4);
  await be.until(() => be.held === 16, '16 held');
  t.same([be.held, be.maxInflight, statuses(refused2)], [16, 16, { 503: 4 }], 'exactly 16 at the backend at the raised limit, 4 refused');
  be.release();
  await Promise.all(again);
  t.equal(await metric(p, 'svc_adaptive_admission_limit'), 16, "svc_adaptive_admission_limit: the node's one limit (not a sum over workers)");
});

t.test('brownout on the node: 5 of 10 in flight spread over the workers (none alone at 50 %) sheds non-core routes on every worker and serves core ones; at 2 of 10 non-core is served again; over spread connections and over one HTTP/2 connection', async (t) => {
  const be = await controlledBackend(t, 'bo');
  be.set({ kind: 'hold' }, '/core/hold');
  const p = await startProxy(t, files, 'na-brownout', {
    workers: WORKERS,
    performance: 'global_inflight_limit: 10, per_upstream_inflight_limit: 10, per_backend_inflight_limit: 10',
    upstream: pools(be, ['core', 'extra']),
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 20, core_routes: [core] }, circuit_breaker: { enabled: false }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  // One HTTP/2 connection served by each worker (found by holding a probe on it).
  const conns: PinnedConnection[] = await connectionsOnEveryWorker(t, p, be, '/core/hold/probe', WORKERS);
  t.same(conns.map((c) => c.worker).sort(), [0, 1, 2, 3], 'a connection on each of the 4 workers');
  // One request on each worker: all at once (answers that hold no slot: sheds; or core requests,
  // which may push in-flight up), or one after another, each once the node has counted the one
  // before as done (its worker reports the release within 10 ms): so each served request adds
  // only itself to the node's count, never a predecessor's slot not yet reported free. The node
  // must come back to `base` each time: a worker whose lease ask carried the slot and whose
  // report then skipped the release (the count equal to its previous report's) left the node one
  // too high until that worker's next change.
  const everyWorker = (path: string): Promise<Answer[]> => Promise.all(conns.map((c) => c.request({ path: `${path}/w${c.worker}` })));
  const eachWorker = async (path: string, base: number): Promise<Answer[]> => {
    const out: Answer[] = [];
    for (const c of conns) {
      out.push(await c.request({ path: `${path}/w${c.worker}` }));
      const a = await pollUntil(() => admission(p), (x) => x.node_inflight === base, 10_000, 5);
      t.equal(a.node_inflight, base, `${path} on worker ${c.worker} done: the node counts ${base} in flight again (workers: ${a.workers.map((w) => w.inflight).join(', ')})`);
    }
    return out;
  };
  const lags: number[] = [];

  const shapes: { name: string; on: (i: number) => PinnedConnection }[] = [
    // 2, 1, 1, 1 over the four workers: each alone at most 20 % of the node's 10.
    { name: 'spread over the workers', on: (i) => conns[i % WORKERS] as PinnedConnection },
    // All 5 on one HTTP/2 connection: one worker holds them, the others hear the node's state.
    { name: 'one HTTP/2 connection', on: () => conns[0] as PinnedConnection },
  ];
  for (const [k, shape] of shapes.entries()) {
    const idle = await eachWorker('/extra/idle', 0);
    t.same(idle.map((x) => x.status), [200, 200, 200, 200], `${shape.name}: idle, non-core served on every worker`);
    const held: Promise<Answer>[] = [];
    for (let i = 0; i < 2; i++) held.push(shape.on(i).request({ path: `/core/hold/${k}-${i}`, timeoutMs: 30_000 }));
    await be.until(() => be.held === 2, '2 held');
    const two = await pollUntil(() => admission(p), (x) => x.node_inflight === 2, 10_000);
    t.same([two.node_inflight, two.brownout_active], [2, false], `${shape.name}: 2 of 10 (20 %): no brownout`);
    // (At 20 % a request served is 30 %, and a slot its worker just freed, not yet reported, 40 %:
    // below the trigger either way. The supervisor may read a worker's report after it answered a
    // snapshot, so one freed slot can count twice for a moment.)
    t.same((await eachWorker('/extra/twenty', 2)).map((x) => x.status), [200, 200, 200, 200], `${shape.name}: 20 %: non-core served on every worker`);
    for (let i = 2; i < 4; i++) held.push(shape.on(i).request({ path: `/core/hold/${k}-${i}`, timeoutMs: 30_000 }));
    await be.until(() => be.held === 4, '4 held');
    t.equal((await pollUntil(() => admission(p), (x) => x.node_inflight === 4, 10_000)).brownout_active, false, `${shape.name}: 4 of 10 (40 %): no brownout`);
    // The 5th (on worker 0's connection): 50 %, the trigger. The staleness: from the client sending
    // it to the last of the 4 workers applying the node's state (each logs when, on the node's clock).
    const mark = p.served.lines.length;
    const fifthSent = performance.timeOrigin + performance.now();
    held.push(shape.on(4).request({ path: `/core/hold/${k}-4`, timeoutMs: 30_000 }));
    const appliedOn = (): Record<string, unknown>[] => p.served.lines.slice(mark).filter((l) => l['msg'] === 'brownout state applied from the node' && l['active'] === true);
    await p.served.waitFor(() => new Set(appliedOn().map((l) => l['worker'])).size === WORKERS, 10_000).catch(() => undefined);
    t.same([...new Set(appliedOn().map((l) => l['worker']))].sort(), [0, 1, 2, 3], `${shape.name}: all 4 workers applied the node's brownout`);
    const lag = Math.max(...appliedOn().map((l) => Number(l['applied_at']))) - fifthSent;
    lags.push(lag);
    await be.until(() => be.held === 5, '5 held');
    const on = await pollUntil(() => admission(p), (x) => x.brownout_active && x.workers.every((w) => w.brownout_active) && x.inflight === 5 && x.node_inflight === 5, 10_000);
    t.same([on.brownout_active, on.node_inflight, on.workers.map((w) => w.brownout_active)], [true, 5, [true, true, true, true]], `${shape.name}: snapshot: the node's brownout, 5 in flight node-wide, every worker applying it`);
    if (shape.name.startsWith('spread')) t.same(on.workers.map((w) => w.inflight).sort(), [1, 1, 1, 2], 'each worker alone holds 1 or 2 of the 5 (10-20 %, below the trigger)');
    t.equal(await metric(p, 'svc_brownout_active'), 1, `${shape.name}: svc_brownout_active 1 (the node's state, served by the supervisor)`);
    const shed = await everyWorker('/extra/shed');
    for (const [i, x] of shed.entries()) assertShed(t, x, 'brownout', RETRY_AFTER, `${shape.name}: non-core on worker ${conns[i]?.worker}`);
    const core = await everyWorker('/core/fast');
    t.same(core.map((x) => [x.status, x.body.startsWith('bo /core/fast')]), Array(WORKERS).fill([200, true]), `${shape.name}: core served on every worker`);
    // Hysteresis: 3 held (30 %, above recover 20 %): still active.
    be.release(2);
    t.equal((await pollUntil(() => admission(p), (x) => x.node_inflight === 3, 10_000)).brownout_active, true, `${shape.name}: 3 of 10 (30 %): still active`);
    for (const [i, x] of (await everyWorker('/extra/still')).entries()) assertShed(t, x, 'brownout', RETRY_AFTER, `${shape.name}: 30 %, non-core on worker ${conns[i]?.worker}`);
    // 2 held: 20 %, the recover percentage.
    be.release(1);
    const off = await pollUntil(() => admission(p), (x) => !x.brownout_active && x.workers.every((w) => !w.brownout_active), 10_000);
    t.same([off.brownout_active, off.node_inflight], [false, 2], `${shape.name}: 2 of 10 (20 %): the node's brownout ended`);
    t.same((await eachWorker('/extra/after', 2)).map((x) => [x.status, x.body.startsWith('bo /extra/after')]), Array(WORKERS).fill([200, true]), `${shape.name}: non-core served on every worker again`);
    t.equal(await metric(p, 'svc_brownout_active'), 0, `${shape.name}: svc_brownout_active 0`);
    be.release();
    t.same((await Promise.all(held)).map((x) => x.status), [200, 200, 200, 200, 200], `${shape.name}: the held core requests all completed`);
    await pollUntil(() => admission(p), (x) => x.node_inflight === 0 && x.inflight === 0, 10_000);
  }
  // The node hears a worker's change within INUSE_REPORT_MS (10 ms) plus one message each way (and
  // here the request's own way in). On a machine with more runnable processes than cores a process
  // can wait for a CPU longer than all of that, which no design of ours removes: the tight bound
  // is asserted when the machine is not oversubscribed, a loose one otherwise (figures either way).
  const perCore = (loadavg()[0] ?? 0) / cpus().length;
  const bound = INUSE_REPORT_MS + (perCore <= 1 ? 15 : 150);
  t.ok(lags.every((l) => l >= 0 && l <= bound), `every worker applied the node's brownout within ${bound} ms of the 5th request being sent (load ${perCore.toFixed(1)} per core): ${lags.map((l) => l.toFixed(1)).join(', ')} ms`);
});

t.test("brownout with a frozen supervisor: every worker keeps the state it last heard; a dead worker's in-flight stops counting at once", async (t) => {
  const be = await controlledBackend(t, 'bf');
  be.set({ kind: 'hold' }, '/core/hold');
  const p = await startProxy(t, files, 'na-brownout-frozen', {
    workers: WORKERS,
    performance: 'global_inflight_limit: 10, per_upstream_inflight_limit: 10, per_backend_inflight_limit: 10',
    upstream: pools(be, ['core', 'extra']),
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 20, core_routes: [core] }, circuit_breaker: { enabled: false }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const conns: PinnedConnection[] = await connectionsOnEveryWorker(t, p, be, '/core/hold/probe', WORKERS);
  const [holder, ...others] = conns as [PinnedConnection, ...PinnedConnection[]];
  const holdFive = (tag: string): Promise<Answer>[] => Array.from({ length: 5 }, (_, i) => holder.request({ path: `/core/hold/${tag}-${i}`, timeoutMs: 30_000 }));
  let n = 0;
  const shedOnOthers = async (what: string): Promise<void> => {
    for (const c of others) assertShed(t, await c.request({ path: `/extra/${n++}/w${c.worker}` }), 'brownout', RETRY_AFTER, `${what}: non-core on worker ${c.worker}`);
  };

  // 5 held on worker `holder.worker`: the node's brownout is on.
  const first = holdFive('frozen');
  await be.until(() => be.held === 5, '5 held');
  await pollUntil(() => admission(p), (x) => x.brownout_active && x.node_inflight === 5 && x.workers.every((w) => w.brownout_active), 10_000);
  const pid = p.served.proc.pid as number;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  t.teardown(() => {
    if (!resumed) process.kill(pid, 'SIGCONT');
  });
  await shedOnOthers('supervisor stopped');
  // The 5 end while the supervisor is stopped: nobody can tell the workers, so they keep the state (no fail open).
  be.release();
  t.same((await Promise.all(first)).map((x) => x.status), [200, 200, 200, 200, 200], 'the held requests completed');
  await shedOnOthers('supervisor stopped, nothing in flight any more');
  process.kill(pid, 'SIGCONT');
  resumed = true;
  const resumedState = await pollUntil(() => admission(p), (x) => !x.brownout_active && x.workers.every((w) => !w.brownout_active), 10_000);
  t.same([resumedState.brownout_active, resumedState.node_inflight], [false, 0], 'after SIGCONT the node counts 0 and ends the brownout on every worker');
  for (const c of conns) t.equal((await c.request({ path: `/extra/resumed/w${c.worker}` })).status, 200, `after SIGCONT: non-core served on worker ${c.worker}`);

  // 5 held on one worker again, then that worker is SIGKILLed: its 5 stop counting at once.
  await pollUntil(() => admission(p), (x) => x.node_inflight === 0, 10_000);
  const second = holdFive('killed');
  await be.until(() => be.held === 5, '5 held again');
  await pollUntil(() => admission(p), (x) => x.brownout_active && x.node_inflight === 5, 10_000);
  const victim = (await workerFacts(p)).find((w) => w.index === holder.worker)?.pid as number;
  const mark = p.served.lines.length;
  process.kill(victim, 'SIGKILL');
  const after = await pollUntil(() => admission(p), (x) => !x.brownout_active && x.node_inflight === 0, 10_000);
  t.same([after.brownout_active, after.node_inflight], [false, 0], `worker ${holder.worker} killed holding the 5: the node counts 0 and the brownout ended`);
  // At once: in the supervisor's handling of the exit, not once a re-forked worker reports (which
  // takes the fork and the worker's start, a second or so here): the two lines' times.
  const since = (): Record<string, unknown>[] => p.served.lines.slice(mark);
  await p.served.waitFor(() => since().some((l) => l['msg'] === 'brownout ended on the node'), 10_000).catch(() => undefined);
  const exited = since().find((l) => l['msg'] === 'worker exited' && l['worker'] === holder.worker);
  const endedLine = since().find((l) => l['msg'] === 'brownout ended on the node');
  const gap = Date.parse(String(endedLine?.['time'])) - Date.parse(String(exited?.['time']));
  t.ok(gap >= 0 && gap <= 50, `the supervisor ended the brownout ${gap} ms after it logged the worker's exit (at most 50), with the dead worker's count: ${JSON.stringify({ inflight: endedLine?.['inflight'], limit: endedLine?.['limit'] })}`);
  t.equal(endedLine?.['inflight'], 0, 'the node counted 0 in flight when it ended');
  await Promise.allSettled(second);
  for (const c of others) t.equal((await c.request({ path: `/extra/killed/w${c.worker}` })).status, 200, `non-core served on worker ${c.worker}`);
});
