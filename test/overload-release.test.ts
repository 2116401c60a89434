// Overload protection end to end (issue 13, "Must show"): in-flight limits are released exactly
// once on every exit path. A real `edge-proxy serve` with a global limit of 3 and held requests
// abandoned in every way a client or backend can abandon them: HTTP/1.1 socket destroyed, HTTP/2
// stream reset, HTTP/3 stream reset (the client's response-head deadline) and QUIC connection
// closed, the backend resetting the connection or not answering in time, and queue waiters that
// go away. After each, the snapshot must show nothing in flight or queued, and at the end exactly
// 3 requests are admitted at once (a slot released twice would admit a fourth; one never released
// would admit two). Defects of our own on the request path cannot be injected into a real worker
// (the worker's test hook, worker/test-hook.ts, holds or fails activation steps only): they are
// injected in packages/dataplane/test/handler.test.ts ("defects injected at every phase that holds
// a slot").
import t from 'tap';
import type { Test } from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, breaker, loadNow, metric, pollUntil, request, send, startProxy } from './support/overload.ts';
import type { Proxy, Sent } from './support/overload.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Protocol } from './support/served-by.ts';

const files = serviceFiles(t, 'edge-release-');
const LIMIT = 3;

const be: ControlledBackend = await controlledBackend(t, 'r');
be.set({ kind: 'hold' }, '/app/hold');
// Resets and timeouts on a backend of their own: they are breaker failures, and `app`'s backend
// must stay closed whatever the breaker's notion of backend identity.
const failing: ControlledBackend = await controlledBackend(t, 'f');
failing.set({ kind: 'reset' }, '/flaky/');
failing.set({ kind: 'slow', ms: 10_000 }, '/late/');
const p: Proxy = await startProxy(t, files, 'release', {
  performance: `global_inflight_limit: ${LIMIT}, per_upstream_inflight_limit: ${LIMIT}, per_backend_inflight_limit: ${LIMIT}`,
  // The breaker stays on (defaults: 3 failures, open 30 s): a client abort is neutral, so `app`
  // must still be closed at the end; resets and timeouts go to pools of their own.
  upstream: `{ app: { route: { path_prefix: /app }, backends: [{ id: r, address: "127.0.0.1:${be.port}" }] }, flaky: { route: { path_prefix: /flaky }, backends: [{ id: f, address: "127.0.0.1:${failing.port}" }] }, late: { route: { path_prefix: /late }, timeouts: { backend_request_ms: 400, connect_ms: 300 }, backends: [{ id: f, address: "127.0.0.1:${failing.port}" }] } }`,
  // One attempt per request: each failure below is one breaker failure (retries: retry-e2e.test.ts).
  resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, route_queue: { default_cap: 5, global_cap: 5, max_wait_ms: 20000 }, retry_budget: { max_attempts: 1 } }`,
});

/** Nothing in flight or queued, in the proxy (snapshot) and at the backends; asserted. */
async function settled(t: Test, what: string): Promise<void> {
  for (const b of [be, failing]) {
    await b.until(() => b.inflight === 0, `idle after ${what}`).catch(() => undefined);
    t.equal(b.inflight, 0, `${what}: backend ${b.name} has no request left open (the proxy gave up on the abandoned ones)`);
  }
  t.same(await pollUntil(() => loadNow(p), (x) => x.inflight === 0 && x.queued === 0), { inflight: 0, queued: 0 }, `${what}: svc_inflight_requests 0, svc_route_queue_depth 0`);
  const a = await pollUntil(() => admission(p), (x) => x.inflight === 0 && x.queued === 0);
  t.same({ inflight: a.inflight, queued: a.queued }, { inflight: 0, queued: 0 }, `${what}: snapshot admission inflight 0, queued 0`);
}

/** `LIMIT` requests held at the backend over `protocol`. */
async function holdAll(protocol: Protocol, o: { timeoutMs?: number } = {}): Promise<Sent[]> {
  const heldBefore = be.held;
  const sent = Array.from({ length: LIMIT }, (_, i) => send(p, protocol, { path: `/app/hold/${protocol}-${i}`, ...o }));
  await be.until(() => be.held === heldBefore + LIMIT, `${LIMIT} held over ${protocol}`);
  // The snapshot has seen them (else its 0 after the abort would prove nothing).
  await pollUntil(() => admission(p), (a) => a.inflight === LIMIT);
  return sent;
}

t.test('HTTP/1.1: the client destroys its sockets mid-request', async (t) => {
  const sent = await holdAll('h1');
  for (const s of sent) s.abort();
  t.ok((await Promise.all(sent.map((s) => s.answer))).every((a) => a.status === 0), 'the clients got no answer');
  await settled(t, 'h1 aborts');
});

t.test('HTTP/2: the client resets its streams (CANCEL)', async (t) => {
  const sent = await holdAll('h2');
  for (const s of sent) s.abort();
  t.ok((await Promise.all(sent.map((s) => s.answer))).every((a) => a.status === 0), 'the clients got no answer');
  await settled(t, 'h2 stream resets');
});

t.test('HTTP/3: the client resets its streams (response-head deadline), then closes QUIC connections', async (t) => {
  // The project's HTTP/3 client resets the stream when its response-head deadline passes.
  const reset = await holdAll('h3', { timeoutMs: 1500 });
  const answers = await Promise.all(reset.map((s) => s.answer));
  t.ok(
    answers.every((a) => a.status === 0 && /no response within/.test(a.error ?? '')),
    `the streams were reset by the client's deadline (${answers.map((a) => a.error).join('; ')})`,
  );
  await settled(t, 'h3 stream resets');
  const closed = await holdAll('h3');
  for (const s of closed) s.abort();
  await Promise.all(closed.map((s) => s.answer));
  await settled(t, 'h3 connection closes');
});

t.test('the backend resets the connection', async (t) => {
  for (const protocol of ['h1', 'h2', 'h3'] as const) {
    const a = await request(p, protocol, { path: `/flaky/${protocol}` });
    t.equal(a.status, 502, `${protocol}: 502 for a reset upstream`);
  }
  await settled(t, 'upstream resets');
});

t.test('the backend does not answer within backend_request_ms', async (t) => {
  for (const protocol of ['h1', 'h2', 'h3'] as const) {
    const a = await request(p, protocol, { path: `/late/${protocol}` });
    t.equal(a.status, 504, `${protocol}: 504 for an upstream timeout`);
  }
  await settled(t, 'upstream timeouts');
});

t.test('queue waiters that go away leave the queue and are never sent upstream', async (t) => {
  const holders = await holdAll('h1');
  const arrivals = be.arrivals.length;
  const waiters = [send(p, 'h1', { path: '/app/hold/waiter-h1' }), send(p, 'h2', { path: '/app/hold/waiter-h2' })];
  const queued = await pollUntil(() => admission(p), (a) => a.queued === 2);
  t.equal(queued.queued, 2, 'two waiters queued');
  t.equal(await metric(p, 'svc_route_queue_depth', { route: 'app' }), 2, 'svc_route_queue_depth{route="app"} 2');
  for (const w of waiters) w.abort();
  await Promise.all(waiters.map((w) => w.answer));
  const gone = await pollUntil(() => admission(p), (a) => a.queued === 0);
  t.equal(gone.queued, 0, 'the queue is empty once they went away');
  t.equal(gone.inflight, LIMIT, 'the holders still hold their slots');
  be.release();
  t.same(
    (await Promise.all(holders.map((h) => h.answer))).map((a) => a.status),
    Array(LIMIT).fill(200),
    'the holders complete',
  );
  await settled(t, 'aborted waiters');
  t.equal(be.arrivals.length, arrivals, 'the aborted waiters were not sent upstream when the slots freed');
});

t.test('after all that, exactly the full limit is admitted at once', async (t) => {
  const arrivals = be.arrivals.length;
  const holders = [send(p, 'h1', { path: '/app/hold/full-1' }), send(p, 'h2', { path: '/app/hold/full-2' }), send(p, 'h3', { path: '/app/hold/full-3' })];
  await be.until(() => be.held === LIMIT, `${LIMIT} admitted`);
  const fourth = send(p, 'h1', { path: '/app/hold/full-4' });
  const waiting = await pollUntil(() => admission(p), (a) => a.queued === 1);
  t.same({ inflight: waiting.inflight, queued: waiting.queued }, { inflight: LIMIT, queued: 1 }, `${LIMIT} in flight, the fourth waits`);
  t.equal(be.arrivals.length, arrivals + LIMIT, 'the backend saw exactly the limit, not one more');
  be.release(1);
  await be.until(() => be.held === LIMIT, 'the fourth admitted when one slot freed');
  be.release();
  t.same(
    (await Promise.all([...holders, fourth].map((h) => h.answer))).map((a) => a.status),
    [200, 200, 200, 200],
    'all four answered',
  );
  await settled(t, 'the full-limit round');
  t.equal((await breaker(p, 'app', 'r'))?.state, 'closed', "client aborts are neutral: app's breaker is still closed");
});

t.test('per-backend slots leased from the node (per_backend_inflight_limit below the pool limit): given back on client aborts, backend resets, retries and hedges', async (t) => {
  const BACKEND_LIMIT = 3;
  // x answers at once (holds under /rt/hold); y holds too, resets under /rt/reset, answers late under /rt/slow.
  const x = await controlledBackend(t, 'x');
  x.set({ kind: 'hold' }, '/rt/hold');
  const y = await controlledBackend(t, 'y');
  y.set({ kind: 'hold' }, '/rt/hold');
  y.set({ kind: 'reset' }, '/rt/reset');
  y.set({ kind: 'slow', ms: 3000 }, '/rt/slow');
  const q = await startProxy(t, files, 'release-backend', {
    performance: `global_inflight_limit: 64, per_upstream_inflight_limit: 64, per_backend_inflight_limit: ${BACKEND_LIMIT}`,
    upstream: `{ rt: { route: { path_prefix: /rt }, backends: [{ id: x, address: "127.0.0.1:${x.port}" }, { id: y, address: "127.0.0.1:${y.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, route_queue: { default_cap: 5, global_cap: 5, max_wait_ms: 20000 }, retry_budget: { max_attempts: 2 }, hedging: { enabled: true, delay_ms: 50 } }`,
  });
  t.match((await admission(q)).leases.find((l) => l.key === 'backend:rt/x'), { limit: BACKEND_LIMIT }, 'the backend budget exists');
  const idle = async (what: string): Promise<void> => {
    for (const b of [x, y]) await b.until(() => b.inflight === 0, `idle after ${what}`);
    t.same(await pollUntil(() => loadNow(q), (v) => v.inflight === 0 && v.queued === 0), { inflight: 0, queued: 0 }, `${what}: nothing in flight or queued`);
  };
  // Client aborts: 2 held (one at each backend, round-robin) and abandoned, over HTTP/1.1 and HTTP/2.
  for (const protocol of ['h1', 'h2'] as const) {
    const held = [x.held, y.held];
    const sent = [0, 1].map((i) => send(q, protocol, { path: `/rt/hold/abort-${protocol}-${i}` }));
    await pollUntil(async () => x.held + y.held, (n) => n === held[0]! + held[1]! + 2, 10_000);
    for (const s of sent) s.abort();
    await Promise.all(sent.map((s) => s.answer));
    await idle(`${protocol} aborts`);
  }
  // Backend resets: the attempts on y fail and are retried on x (two attempts, two slots, each given back).
  const resets = await Promise.all([0, 1, 2, 3].map((i) => request(q, 'h1', { path: `/rt/reset/${i}` })));
  t.same(resets.map((a) => a.status), [200, 200, 200, 200], 'every reset on y retried on x');
  t.ok(y.arrivalsUnder('/rt/reset').length >= 1, `some attempts were reset by y (${y.arrivalsUnder('/rt/reset').length})`);
  await idle('resets retried');
  // Hedges: a primary on y answers late; the hedge on x wins and the primary is cancelled.
  const hedged = await Promise.all([0, 1, 2, 3].map((i) => request(q, 'h2', { path: `/rt/slow/${i}` })));
  t.same(hedged.map((a) => a.status), [200, 200, 200, 200], 'every request answered');
  t.ok((await metric(q, 'svc_hedge_triggered_total')) >= 1, 'hedges were sent');
  await idle('hedges');
  // After all that: exactly the limit at each backend at once, and the next one waits (a slot leaked would admit fewer, one given back twice more).
  x.maxInflight = 0;
  y.maxInflight = 0;
  const holders = Array.from({ length: 2 * BACKEND_LIMIT }, (_, i) => send(q, 'h1', { path: `/rt/hold/full-${i}` }));
  await x.until(() => x.held === BACKEND_LIMIT, `${BACKEND_LIMIT} at x`);
  await y.until(() => y.held === BACKEND_LIMIT, `${BACKEND_LIMIT} at y`);
  const next = send(q, 'h1', { path: '/rt/hold/full-next' });
  t.equal((await pollUntil(() => admission(q), (a) => a.queued === 1)).queued, 1, 'the next one waits in the queue');
  t.same([x.held, y.held, x.maxInflight, y.maxInflight], [BACKEND_LIMIT, BACKEND_LIMIT, BACKEND_LIMIT, BACKEND_LIMIT], `exactly ${BACKEND_LIMIT} at each backend`);
  x.release();
  y.release();
  await pollUntil(async () => x.held + y.held, (n) => n === 1, 10_000);
  x.release();
  y.release();
  t.same(
    (await Promise.all([...holders, next].map((h) => h.answer))).map((a) => a.status),
    Array(2 * BACKEND_LIMIT + 1).fill(200),
    'all answered',
  );
  await idle('the full round');
});
