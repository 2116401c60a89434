// Overload protection end to end (issue 13, "Must show"): a real `edge-proxy serve` (one worker,
// so the per-worker limits are the node's), real backends whose behaviour the test switches
// (test/support/controlled-backend.ts), and independent clients over HTTP/1.1, HTTP/2 and HTTP/3.
// This file: brownout on and off with a core route served throughout (and with no core route,
// every route shed), and the route queue (FIFO admission, round-robin across routes, queue_full
// at the route's cap, at cap 0 and at global_cap, queue_timeout after max_wait_ms, the scope of
// each admission after a wait). Every shed answer is checked field by field (status,
// Retry-After, content type, cache-control, body) and by the counters it must move. The breaker
// and adaptive admission: overload-breaker.test.ts; limits released on every exit path:
// overload-release.test.ts; the Upgrade path: overload-upgrade.test.ts.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, assertShed, metric, pollUntil, request, send, shedCounters, startProxy } from './support/overload.ts';
import { metricValue, scrape } from './support/exposition.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Answer, Proxy, Sent, ShedCounters } from './support/overload.ts';

const files = serviceFiles(t, 'edge-overload-');
/** Distinct from the default (1), so the header is known to come from the configuration. */
const RETRY_AFTER = 7;

const delta = (after: ShedCounters, before: ShedCounters): ShedCounters => ({
  shed: after.shed - before.shed,
  byReason: after.byReason - before.byReason,
  outcome: after.outcome - before.outcome,
  breakerRejected: after.breakerRejected - before.breakerRejected,
});

t.test('brownout: non-core routes are shed from the trigger percentage until in-flight falls to the recover one; the core route is served throughout', async (t) => {
  const be = await controlledBackend(t, 'bo');
  be.set({ kind: 'hold' }, '/core/hold');
  const p: Proxy = await startProxy(t, files, 'brownout', {
    // Adaptive admission off: the limit in force is global_inflight_limit, 10.
    performance: 'global_inflight_limit: 10, per_upstream_inflight_limit: 10, per_backend_inflight_limit: 10',
    upstream: `{ core: { route: { path_prefix: /core }, backends: [{ id: bo, address: "127.0.0.1:${be.port}" }] }, extra: { route: { path_prefix: /extra }, backends: [{ id: bo, address: "127.0.0.1:${be.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 80, recover_inflight_percent: 40, core_routes: [core] }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const both = async (phase: string, extraStatus: 200 | 'shed'): Promise<void> => {
    for (const protocol of PROTOCOLS) {
      const core = await request(p, protocol, { path: '/core/fast' });
      t.equal(core.status, 200, `${phase}, ${protocol}: the core route is served${core.error === undefined ? '' : ` (${core.error})`}`);
      t.equal(core.body, 'bo /core/fast', `${phase}, ${protocol}: by the backend`);
      const extra = await request(p, protocol, { path: '/extra/x' });
      if (extraStatus === 200) t.same([extra.status, extra.body], [200, 'bo /extra/x'], `${phase}, ${protocol}: the non-core route is served`);
      else assertShed(t, extra, 'brownout', RETRY_AFTER, `${phase}, ${protocol}: /extra`);
    }
  };

  t.match(await admission(p), { adaptive_enabled: false, adaptive_limit: 10, global_inflight_limit: 10, brownout_active: false }, 'snapshot: adaptive admission off, the limit in force is global_inflight_limit');
  await both('idle', 200);
  t.equal(await metric(p, 'svc_brownout_active'), 0, 'svc_brownout_active 0 while idle');

  // 7 requests held on the core route: 70 %, below the trigger (80 %): nothing is shed.
  const held: Sent[] = [];
  for (let i = 0; i < 7; i++) held.push(send(p, 'h1', { path: `/core/hold/${i}` }));
  await be.until(() => be.held === 7, '7 requests held');
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 7 && a.node_inflight === 7)).inflight, 7, 'snapshot: in-flight 7 (and so the node counts, which brownout decides on)');
  t.same((await request(p, 'h1', { path: '/extra/x' })).status, 200, 'in-flight 70 %: the non-core route is served');
  // An eighth: 80 %, the trigger.
  held.push(send(p, 'h1', { path: '/core/hold/7' }));
  await be.until(() => be.held === 8, '8 requests held');
  t.equal(await pollUntil(() => metric(p, 'svc_inflight_requests'), (v) => v === 8), 8, 'svc_inflight_requests 8');
  t.equal((await pollUntil(() => admission(p), (a) => a.node_inflight === 8)).node_inflight, 8, 'the node counts 8 (its worker reports within 10 ms)');
  const before = await shedCounters(p, 'brownout', 'extra');
  await both('in-flight 80 %', 'shed');
  const head = await request(p, 'h1', { path: '/extra/head', method: 'HEAD' });
  assertShed(t, head, 'brownout', RETRY_AFTER, 'in-flight 80 %, HEAD over h1', true);
  t.same(delta(await shedCounters(p, 'brownout', 'extra'), before), { shed: 4, byReason: 4, outcome: 4, breakerRejected: 0 }, 'four sheds counted: svc_overload_shed, by reason brownout, outcome overload_shed of extra');
  t.equal(await metric(p, 'svc_brownout_active'), 1, 'svc_brownout_active 1');
  const on = await pollUntil(() => admission(p), (a) => a.brownout_active);
  t.equal(on.brownout_active, true, 'the snapshot reports brownout_active');
  t.equal(on.workers?.[0]?.brownout_active, true, "and so does the worker's entry");
  t.equal(be.arrivals.filter((a) => a.path.startsWith('/extra/x') || a.path === '/extra/head').length, 4, 'the shed requests never reached the backend (only the 4 served before did)');

  // Hysteresis: 5 held is 50 %, above recover (40 %): still active.
  be.release(3);
  const five = await pollUntil(() => admission(p), (a) => a.inflight === 5 && a.node_inflight === 5);
  t.equal(five.inflight, 5, 'in-flight 5 after 3 releases');
  assertShed(t, await request(p, 'h1', { path: '/extra/x' }), 'brownout', RETRY_AFTER, 'in-flight 50 % (between recover and trigger), h1');
  // 4 held is 40 %, the recover percentage: brownout ends at this sample.
  be.release(1);
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 4 && a.node_inflight === 4)).inflight, 4, 'in-flight 4');
  t.same((await request(p, 'h1', { path: '/extra/x' })).status, 200, 'in-flight 40 % (the recover percentage): the non-core route is served again');
  t.equal(await metric(p, 'svc_brownout_active'), 0, 'svc_brownout_active 0');

  // Everything released: still inactive, on every protocol.
  be.release();
  const answers = await Promise.all(held.map((h) => h.answer));
  t.same(
    answers.map((a) => a.status),
    Array(8).fill(200),
    'the held core requests all completed',
  );
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 0)).inflight, 0, 'in-flight back to 0');
  await both('after release', 200);
  t.equal(await metric(p, 'svc_brownout_active'), 0, 'svc_brownout_active back to 0');
  t.equal((await pollUntil(() => admission(p), (a) => !a.brownout_active)).brownout_active, false, 'the snapshot reports brownout inactive');
});

t.test('brownout with no core_routes sheds every route', async (t) => {
  const be = await controlledBackend(t, 'all');
  be.set({ kind: 'hold' }, '/a/hold');
  const p = await startProxy(t, files, 'brownout-all', {
    performance: 'global_inflight_limit: 2, per_upstream_inflight_limit: 2, per_backend_inflight_limit: 2',
    upstream: `{ a: { route: { path_prefix: /a }, backends: [{ id: all, address: "127.0.0.1:${be.port}" }] }, b: { route: { path_prefix: /b }, backends: [{ id: all, address: "127.0.0.1:${be.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 0 }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const holder = send(p, 'h1', { path: '/a/hold' });
  await be.until(() => be.held === 1, 'one held (50 %)');
  for (const path of ['/a/x', '/b/x']) assertShed(t, await request(p, 'h1', { path }), 'brownout', RETRY_AFTER, `${path} with core_routes empty`);
  be.release();
  t.equal((await holder.answer).status, 200, 'the held request completes');
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 0)).inflight, 0, 'in-flight 0');
  // Each request served is itself 1 of 2 in flight (50 %): the node's brownout turns on while it is
  // in flight and off once its worker reports it done (within 10 ms): wait for that before the next.
  for (const path of ['/a/x', '/b/x']) {
    await pollUntil(() => admission(p), (a) => a.node_inflight === 0 && !a.brownout_active);
    t.equal((await request(p, 'h1', { path })).status, 200, `${path} served once in-flight is back to 0 %`);
  }
});

t.test('route queue: FIFO admission up to the cap, queue_full beyond it (at once on a cap-0 route, and at global_cap), round-robin across routes', async (t) => {
  const be = await controlledBackend(t, 'q');
  be.set({ kind: 'hold' }, '/app/');
  be.set({ kind: 'hold' }, '/other/');
  const p = await startProxy(t, files, 'queue-fifo', {
    performance: 'global_inflight_limit: 2, per_upstream_inflight_limit: 2, per_backend_inflight_limit: 2',
    upstream: `{ app: { route: { path_prefix: /app }, backends: [{ id: q, address: "127.0.0.1:${be.port}" }] }, nowait: { route: { path_prefix: /nowait }, backends: [{ id: q, address: "127.0.0.1:${be.port}" }] }, other: { route: { path_prefix: /other }, backends: [{ id: q, address: "127.0.0.1:${be.port}" }] } }`,
    // max_wait_ms long: this test is about order and caps, the wait has its own test below.
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, route_queue: { default_cap: 3, global_cap: 4, max_wait_ms: 20000, shed_retry_after_seconds: ${RETRY_AFTER}, caps: { nowait: 0 } } }`,
  });
  const depth = (): Promise<number> => metric(p, 'svc_route_queue_depth', { route: 'app' });
  const waitAdmitBefore = await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' });

  const sent: Sent[] = [];
  const go = (seq: number): void => void sent.push(send(p, 'h1', { path: `/app/${seq}`, headers: { 'x-seq': String(seq) } }));
  // 1 and 2 take the two slots, one after the other: sent at once on two connections they could
  // reach the backend in either order (CI, 2026-11-28: 2 before 1), and the order is asserted below.
  go(1);
  await be.until(() => be.held === 1, 'request 1 admitted and held');
  go(2);
  await be.until(() => be.held === 2, 'the two admitted requests held');
  // 3, 4, 5 queue one after another: each is known to wait before the next is sent.
  for (const seq of [3, 4, 5]) {
    go(seq);
    t.equal(await pollUntil(depth, (d) => d === seq - 2), seq - 2, `request ${seq} waits: svc_route_queue_depth{route="app"} ${seq - 2}`);
  }
  const waiting = await pollUntil(() => admission(p), (a) => a.queued === 3);
  t.equal(waiting.queued, 3, 'the snapshot counts 3 queued');
  t.same(waiting.workers?.[0]?.queued_by_route, { app: 3 }, 'queued_by_route names the route');
  t.equal(waiting.inflight, 2, 'and 2 in flight');

  // The queue is at its cap (3): the next request of the route is shed at once, on every protocol.
  const before = await shedCounters(p, 'queue_full', 'app');
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: '/app/6', headers: { 'x-seq': '6' }, timeoutMs: 5000 });
    assertShed(t, a, 'queue_full', RETRY_AFTER, `queue at its cap, ${protocol}`);
    t.ok(a.ms < 2000, `${protocol}: shed at once (${a.ms.toFixed(0)} ms; max_wait_ms is 20000)`);
  }
  t.same(delta(await shedCounters(p, 'queue_full', 'app'), before), { shed: 3, byReason: 3, outcome: 3, breakerRejected: 0 }, 'three queue_full sheds counted');
  // A route whose cap is 0 does not wait at all.
  const nowait = await request(p, 'h1', { path: '/nowait/x', timeoutMs: 5000 });
  assertShed(t, nowait, 'queue_full', RETRY_AFTER, 'cap 0 route with the limit full');
  t.ok(nowait.ms < 2000, `cap 0: shed at once (${nowait.ms.toFixed(0)} ms)`);
  t.same(be.seqs(), ['1', '2'], 'nothing but the two admitted requests reached the backend');

  // One slot frees at a time: the waiters are admitted in their arrival order.
  for (const seq of [3, 4, 5]) {
    be.release(1);
    await be.until(() => be.arrivals.length === seq, `request ${seq} admitted`);
    t.equal(be.arrivals.at(-1)?.seq, String(seq), `the next admitted is request ${seq} (FIFO)`);
  }
  be.release();
  const answers: Answer[] = await Promise.all(sent.map((s) => s.answer));
  t.same(
    answers.map((a) => [a.status, a.body]),
    [1, 2, 3, 4, 5].map((i) => [200, `q /app/${i} released`]),
    'all five answered by the backend',
  );
  t.same(be.seqs(), ['1', '2', '3', '4', '5'], 'arrival order at the backend');
  t.equal((await metric(p, 'svc_inflight_wait_admit_total', { scope: 'global' })) - waitAdmitBefore, 3, 'svc_inflight_wait_admit_total{scope="global"} +3 (the limit they waited for was the global one, checked first)');
  t.equal(await depth(), 0, 'queue depth back to 0');
  const idle = await pollUntil(() => admission(p), (a) => a.inflight === 0 && a.queued === 0);
  t.same([idle.inflight, idle.queued], [0, 0], 'snapshot: nothing in flight or queued');

  // Two routes waiting: freed slots go round-robin across the routes' queues, so the one waiter
  // of `other`, queued after three of `app`, is admitted among the first two, not after all of
  // app's. And the four of them fill global_cap.
  const second: Sent[] = [];
  const go2 = (path: string, seq: string): void => void second.push(send(p, 'h1', { path, headers: { 'x-seq': seq } }));
  go2('/app/h1', 'h1');
  go2('/app/h2', 'h2');
  await be.until(() => be.held === 2, 'two held again');
  for (const [i, seq] of ['a1', 'a2', 'a3'].entries()) {
    go2(`/app/${seq}`, seq);
    t.equal(await pollUntil(depth, (d) => d === i + 1), i + 1, `${seq} waits`);
  }
  go2('/other/o1', 'o1');
  t.equal(await pollUntil(() => metric(p, 'svc_route_queue_depth', { route: 'other' }), (d) => d === 1), 1, 'svc_route_queue_depth{route="other"} 1');
  // 4 waiting in all, the global_cap: `other` (1 of its cap of 3) is full too.
  const overGlobal = await request(p, 'h1', { path: '/other/o2', headers: { 'x-seq': 'o2' }, timeoutMs: 5000 });
  assertShed(t, overGlobal, 'queue_full', RETRY_AFTER, 'all queues together at global_cap (4)');
  const start = be.arrivals.length;
  for (let n = 1; n <= 4; n++) {
    be.release(1);
    await be.until(() => be.arrivals.length === start + n, `waiter ${n} of 4 admitted`);
  }
  const order = be.seqs().slice(start);
  t.ok([0, 1].includes(order.indexOf('o1')), `round-robin across routes: o1 admitted among the first two (order ${order.join(', ')})`);
  t.same(
    order.filter((s) => s.startsWith('a')),
    ['a1', 'a2', 'a3'],
    "app's waiters in their own order",
  );
  be.release();
  t.same(
    (await Promise.all(second.map((s) => s.answer))).map((a) => a.status),
    Array(6).fill(200),
    'all answered',
  );
});

t.test('route queue: a waiter is shed queue_timeout after max_wait_ms, on every protocol', async (t) => {
  const MAX_WAIT = 300;
  const be = await controlledBackend(t, 'w');
  be.set({ kind: 'hold' }, '/app/hold');
  const p = await startProxy(t, files, 'queue-timeout', {
    performance: 'global_inflight_limit: 1, per_upstream_inflight_limit: 1, per_backend_inflight_limit: 1',
    upstream: `{ app: { route: { path_prefix: /app }, backends: [{ id: w, address: "127.0.0.1:${be.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, route_queue: { default_cap: 4, global_cap: 4, max_wait_ms: ${MAX_WAIT}, shed_retry_after_seconds: ${RETRY_AFTER} } }`,
  });
  const holder = send(p, 'h1', { path: '/app/hold' });
  await be.until(() => be.held === 1, 'the one slot taken');
  const before = await shedCounters(p, 'queue_timeout', 'app');
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: '/app/x' });
    assertShed(t, a, 'queue_timeout', RETRY_AFTER, `waiting behind a held request, ${protocol}`);
    // The client's clock starts before the proxy's: its elapsed time bounds the wait from above.
    t.ok(a.ms >= MAX_WAIT - 2 && a.ms < 3 * MAX_WAIT, `${protocol}: shed after ${a.ms.toFixed(0)} ms (max_wait_ms ${MAX_WAIT})`);
  }
  t.same(delta(await shedCounters(p, 'queue_timeout', 'app'), before), { shed: 3, byReason: 3, outcome: 3, breakerRejected: 0 }, 'three queue_timeout sheds counted');
  t.equal(be.arrivals.length, 1, 'none of the waiters reached the backend');
  be.release();
  t.same([(await holder.answer).status, be.arrivals.length], [200, 1], 'the holder completes');
  const idle = await pollUntil(() => admission(p), (a) => a.inflight === 0 && a.queued === 0);
  t.same([idle.inflight, idle.queued], [0, 0], 'snapshot: nothing in flight or queued');
  t.equal(await request(p, 'h1', { path: '/app/after' }).then((a) => a.status), 200, 'the slot serves again');
});

t.test('route queue: svc_inflight_wait_admit_total{scope} names the limit each waiter waited for (backend, upstream, global)', async (t) => {
  const [a1, a2, b1, c1, d1] = await Promise.all(['a1', 'a2', 'b1', 'c1', 'd1'].map(async (n) => (await controlledBackend(t, n)).set({ kind: 'hold' }))) as [ControlledBackend, ControlledBackend, ControlledBackend, ControlledBackend, ControlledBackend];
  const all = [a1, a2, b1, c1, d1];
  const addr = (b: ControlledBackend): string => `{ id: ${b.name}, address: "127.0.0.1:${b.port}" }`;
  const p = await startProxy(t, files, 'queue-scopes', {
    // Per backend 1, per upstream 2, global 4: pool a (two backends) fills its upstream limit
    // before any backend limit; pool b (one backend) its backend limit first; a, b and c together
    // fill the global limit.
    performance: 'global_inflight_limit: 4, per_upstream_inflight_limit: 2, per_backend_inflight_limit: 1',
    upstream: `{ a: { route: { path_prefix: /a }, load_balancing: { type: round-robin }, backends: [${addr(a1)}, ${addr(a2)}] }, b: { route: { path_prefix: /b }, backends: [${addr(b1)}] }, c: { route: { path_prefix: /c }, backends: [${addr(c1)}] }, d: { route: { path_prefix: /d }, backends: [${addr(d1)}] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, route_queue: { default_cap: 4, global_cap: 8, max_wait_ms: 20000 } }`,
  });
  type Scopes = Record<'global' | 'upstream' | 'backend', number>;
  const scopes = async (): Promise<Scopes> => {
    const text = await scrape(p.mport);
    return {
      global: metricValue(text, 'svc_inflight_wait_admit_total', { scope: 'global' }),
      upstream: metricValue(text, 'svc_inflight_wait_admit_total', { scope: 'upstream' }),
      backend: metricValue(text, 'svc_inflight_wait_admit_total', { scope: 'backend' }),
    };
  };
  const sent: Sent[] = [];
  /** Resolves once some backend received `path`. */
  const arrived = (path: string): Promise<void> => Promise.any(all.map((b) => b.until(() => b.arrivals.some((x) => x.path === path), `${path} arrived`, 5000)));
  const hold = async (path: string): Promise<void> => {
    sent.push(send(p, 'h1', { path }));
    await arrived(path);
  };
  /** Sends `path` (of `route`), waits until it is queued, frees the oldest request held by `free`; how each scope's count moved. */
  const waitThenFree = async (route: string, path: string, free: ControlledBackend, what: string): Promise<Scopes> => {
    const before = await scopes();
    sent.push(send(p, 'h1', { path }));
    // The gauge, read from the worker at the scrape; the snapshot's `queued` may still show the previous phase's waiter.
    const depth = (): Promise<number> => metric(p, 'svc_route_queue_depth', { route });
    t.equal(await pollUntil(depth, (d) => d === 1), 1, `${what}: the request waits`);
    free.release(1);
    t.ok(await arrived(path).then(() => true, () => false), `${what}: admitted once a slot freed`);
    const after = await scopes();
    return { global: after.global - before.global, upstream: after.upstream - before.upstream, backend: after.backend - before.backend };
  };

  // Backend: b's one backend holds one request; the next of b waits for it.
  await hold('/b/1');
  t.same(await waitThenFree('b', '/b/2', b1, 'b at its backend limit'), { global: 0, upstream: 0, backend: 1 }, 'scope backend');
  // Upstream: a's two backends hold one each (its upstream limit, 2); the next of a waits for the pool.
  await hold('/a/1');
  await hold('/a/2');
  t.same([a1.held, a2.held], [1, 1], 'round-robin put one on each of a\'s backends');
  t.same(await waitThenFree('a', '/a/3', a1, 'a at its upstream limit'), { global: 0, upstream: 1, backend: 0 }, 'scope upstream');
  // Global: a 2 + b 1 + c 1 = 4 held; d's idle backend waits for the global limit.
  await hold('/c/1');
  t.same(await waitThenFree('d', '/d/1', c1, 'the global limit full'), { global: 1, upstream: 0, backend: 0 }, 'scope global');
  for (const b of all) b.release();
  t.same(
    (await Promise.all(sent.map((s) => s.answer))).map((a) => a.status),
    sent.map(() => 200),
    'every request answered',
  );
  const idle = await pollUntil(() => admission(p), (a) => a.inflight === 0 && a.queued === 0);
  t.same([idle.inflight, idle.queued], [0, 0], 'snapshot: nothing in flight or queued');
});
