// `per_backend_inflight_limit` leased from the node (docs/overload.md "One node, one set of
// limits"): a worker's data plane joined to a scripted supervisor (its asks recorded, its grants
// sent by the test), requests driven through the handler to two real backends. Backend selection
// takes a slot the worker holds first (round-robin passes over a backend whose lease is empty),
// waits for its worker's ask when every usable backend's lease is empty, passes over a backend
// the node answered `exhausted` for, and is queued (here: refused, queue_full) only once the node
// has no slot for any; a consistent-hash key waits for its owner's slot rather than move; the
// binding rule (`backendLimitBinds`) decides where a backend lease exists; every slot taken is
// given back once; solo (no supervisor) the lease holds the whole limit.
import t from 'tap';
import http from 'node:http';
import { once } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { Metrics } from '@edge-proxy/telemetry';
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { handleRequest } from '../src/proxy/handler.ts';
import type { DownstreamRequest } from '../src/proxy/handler.ts';
import type { DownstreamResponse } from '../src/proxy/forward.ts';
import type { ConsistentHashSelector } from '../src/balancing/consistent-hash.ts';
import type { UpstreamRuntime } from '../src/runtime/provision.ts';
import { resolvedForTest } from './support/resolved-config.ts';

/** A backend answering its name, or holding requests under `/hold` until `release`. */
async function backend(name: string): Promise<{ port: number; held: http.ServerResponse[]; release(): void }> {
  const held: http.ServerResponse[] = [];
  const server = http.createServer((req, res) => {
    if (req.url?.includes('/hold') === true) held.push(res);
    else res.end(name);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  return { port: (server.address() as AddressInfo).port, held, release: () => held.splice(0).forEach((r) => r.end(name)) };
}

const A = await backend('a');
const B = await backend('b');

class FakeResponse extends Writable {
  headersSent = false;
  status = 0;
  body = '';
  writeHead(status: number): this {
    this.status = status;
    this.headersSent = true;
    return this;
  }
  override _write(c: Buffer, _e: BufferEncoding, cb: () => void): void {
    this.body += c.toString();
    cb();
  }
}

function request(path: string, headers: Record<string, string> = {}): DownstreamRequest {
  return { method: 'GET', path, authority: 'x.example.com', host: undefined, headers, headerCount: 1, headerBytes: 10, remoteAddress: '127.0.0.1', protocol: '3', ingress: 'quic', listener: 'l', scheme: 'https', earlyData: false, affinityKey: 'cid', upgrade: false, body: new PassThrough(), hasBody: false };
}

const pool = (name: string, lb = 'round-robin'): Record<string, unknown> => ({
  route: { path_prefix: `/${name}` },
  load_balancing: lb === 'consistent-hash' ? { type: lb, key: 'header:x-k' } : { type: lb },
  backends: [
    { id: 'a', address: `127.0.0.1:${A.port}` },
    { id: 'b', address: `127.0.0.1:${B.port}` },
  ],
});

interface Node {
  readonly dp: Dataplane;
  /** Every lease message the worker sent, entries of backend keys only. */
  readonly asks: LeaseAsk[][];
  grant(key: string, g?: Partial<LeaseGrant>): void;
  /** Resolves after the worker's flush of this turn went out. */
  turn(): Promise<void>;
  inUse(key: string): number;
  upstream(name: string): UpstreamRuntime;
}

/** A data plane with pools `rr1`, `rr2`, `rr3` (round-robin) and `ch` (consistent-hash), led by the test (`led`) or solo. */
async function setup(limits: Record<string, number>, led = true): Promise<Node> {
  const resolved = await resolvedForTest({
    listen: { tls: { cert: 'c', key: 'k' } },
    performance: limits,
    resilience: { adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, route_queue: { default_cap: 0, global_cap: 0 } },
    upstream: { rr1: pool('rr1'), rr2: pool('rr2'), rr3: pool('rr3'), ch: pool('ch', 'consistent-hash') },
    observability: { control_api: { enabled: false } },
  });
  const dp = new Dataplane(new Metrics('worker'));
  const asks: LeaseAsk[][] = [];
  if (led) dp.deps.overload.joinNode((a) => asks.push(a.filter((x) => x.key.startsWith('backend:'))));
  dp.commit(dp.prepare(resolved, 1));
  t.teardown(() => dp.close());
  const ov = dp.deps.overload;
  const node: Node = {
    dp,
    asks,
    grant: (key, g = {}) => ov.leaseGrants([{ key, add: 0, revoke: 0, contended: false, reply: false, exhausted: false, block: 1, limit: limits['per_backend_inflight_limit'] ?? 0, nodeHeld: 0, ...g }]),
    turn: () => new Promise((r) => setImmediate(r)),
    inUse: (key) => ov.leaseTable.lease(key).inUse,
    upstream: (name) => dp.acquire().upstreams.get(name) as UpstreamRuntime,
  };
  if (led) {
    // The first asks (headroom of every new lease) answered: plenty of global slots, no backend slot.
    await node.turn();
    // (a block of 64: the worker keeps them all, the test answers no global ask)
    ov.leaseGrants([{ key: 'global', add: 64, revoke: 0, contended: false, reply: true, exhausted: false, block: 64, limit: 64, nodeHeld: 0 }]);
    // As the ledger answers a headroom ask when nothing is free: nothing, no need unmet (not asked again).
    for (const u of ['rr1', 'rr2', 'rr3', 'ch']) for (const b of ['a', 'b']) node.grant(`backend:${u}/${b}`, { reply: true });
    await node.turn();
    asks.length = 0;
  }
  return node;
}

const LIMITS = { global_inflight_limit: 64, per_upstream_inflight_limit: 64, per_backend_inflight_limit: 3 };

/** One request through the handler; its response once it ended. */
function send(dp: Dataplane, path: string, headers?: Record<string, string>): { res: FakeResponse; done: Promise<void> } {
  const res = new FakeResponse();
  return { res, done: handleRequest(dp.acquire(), request(path, headers), res as unknown as DownstreamResponse) };
}

/** The backend asks for waiting requests of the messages sent since `from` (entries expecting an answer, need above 0), as `key need` strings. */
function asked(n: Node, from = 0): string[] {
  return n.asks.slice(from).flatMap((m) => m.filter((a) => a.asks && a.need > 0).map((a) => `${a.key} ${a.need}`));
}

t.test('the binding rule: a backend lease exists only below the pool limit (the supervisor defines the budget by the same function)', async (t) => {
  const cases: [Record<string, number>, boolean][] = [
    [LIMITS, true],
    [{ global_inflight_limit: 64, per_upstream_inflight_limit: 3, per_backend_inflight_limit: 3 }, false],
    [{ global_inflight_limit: 3, per_upstream_inflight_limit: 3, per_backend_inflight_limit: 3 }, false],
    [{ global_inflight_limit: 64, per_upstream_inflight_limit: 4, per_backend_inflight_limit: 3 }, true],
  ];
  for (const [p, binds] of cases) {
    const n = await setup(p, false);
    const keys = n.upstream('rr1').backends.map((b) => b.inflight?.key);
    t.same(keys, binds ? ['backend:rr1/a', 'backend:rr1/b'] : [undefined, undefined], JSON.stringify(p));
  }
});

t.test('round-robin: a backend whose slot the worker holds is taken first, without asking', async (t) => {
  const n = await setup(LIMITS);
  n.grant('backend:rr1/b', { add: 1 });
  for (let i = 0; i < 2; i++) {
    const r = send(n.dp, `/rr1/x${i}`);
    await r.done;
    t.same([r.res.status, r.res.body], [200, 'b'], `request ${i}: b, whose lease holds a slot (a's is empty)`);
  }
  await n.turn();
  await n.turn();
  t.same(asked(n), [], 'no ask for a waiting request: the held slot served both');
  t.equal(n.inUse('backend:rr1/b'), 0, "b's slot given back");
});

t.test('round-robin: every lease empty → a lease wait; exhausted → the next backend; none anywhere → 503 queue_full', async (t) => {
  const n = await setup(LIMITS);
  const x = send(n.dp, '/rr2/x');
  await waitFor(() => asked(n).length === 1);
  t.same(asked(n), ['backend:rr2/a 1'], "the worker asks for a slot of a, round-robin's pick, counting the request");
  n.grant('backend:rr2/a', { reply: true, exhausted: true });
  await waitFor(() => asked(n).length === 2);
  t.same(asked(n).slice(1), ['backend:rr2/b 1'], 'the node has none of a: the request now waits for b');
  t.same(
    n.asks.flatMap((m) => m.filter((a) => a.key === 'backend:rr2/a').map((a) => a.need)),
    [1, 0],
    'and withdraws its need of a',
  );
  n.grant('backend:rr2/b', { add: 1, reply: true });
  await x.done;
  t.same([x.res.status, x.res.body], [200, 'b'], 'granted a slot of b: served by b');
  t.equal(n.inUse('backend:rr2/b'), 0, "b's slot given back");
  // No slot for either backend on the node: refused by the route queue (cap 0).
  const from = n.asks.length;
  const y = send(n.dp, '/rr3/y');
  await waitFor(() => asked(n, from).length === 1);
  n.grant('backend:rr3/a', { reply: true, exhausted: true });
  await waitFor(() => asked(n, from).length === 2);
  n.grant('backend:rr3/b', { reply: true, exhausted: true });
  await y.done;
  t.same(asked(n, from), ['backend:rr3/a 1', 'backend:rr3/b 1'], 'one ask for each backend, each with the request counted');
  t.same([y.res.status, y.res.body], [503, '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n'], 'both exhausted node-wide: 503 queue_full');
});

t.test("consistent-hash: the key's owner is waited for while the node may have its slot, not passed over; exhausted → its fallback", async (t) => {
  const n = await setup(LIMITS);
  // Held requests never outlive the case (a failure here leaves the next one its backends empty).
  t.teardown(() => {
    A.release();
    B.release();
  });
  const u = n.upstream('ch');
  const k = (u.hashKey as NonNullable<UpstreamRuntime['hashKey']>)({ clientIp: '127.0.0.1', host: 'x.example.com', path: '/ch/hold', route: 'ch', header: (h) => (h === 'x-k' ? 'k1' : undefined) });
  const owner = (u.selector as ConsistentHashSelector).owner(k)?.id as string;
  const other = owner === 'a' ? 'b' : 'a';
  n.grant(`backend:ch/${other}`, { add: 1 });
  const first = send(n.dp, '/ch/hold/1', { 'x-k': 'k1' });
  await waitFor(() => asked(n).length === 1);
  t.same(asked(n), [`backend:ch/${owner} 1`], `the worker asks for a slot of the owner ${owner} (${other} holds an idle one)`);
  n.grant(`backend:ch/${owner}`, { add: 1, reply: true });
  const ownerBe = owner === 'a' ? A : B;
  const otherBe = owner === 'a' ? B : A;
  await t.resolves(waitFor(() => ownerBe.held.length === 1), 'the request reached the owner');
  // The owner's one slot in use, its lease empty: the node says it has none more, the next request of the key falls back.
  const from = n.asks.length;
  const second = send(n.dp, '/ch/hold/2', { 'x-k': 'k1' });
  const needs = (): number[] => n.asks.slice(from).flatMap((m) => m.filter((a) => a.key === `backend:ch/${owner}`).map((a) => a.need));
  await waitFor(() => needs().includes(1));
  t.equal(needs().at(-1), 1, 'the second request of the key waits for the owner too (its need sent; the headroom ask of the first is still out)');
  // The answer to the ask sent before it waited is not its answer: a fresh ask with its need follows.
  n.grant(`backend:ch/${owner}`, { reply: true, exhausted: true });
  await waitFor(() => asked(n, from).length === 1);
  t.same(asked(n, from), [`backend:ch/${owner} 1`], 'its own ask for the owner');
  n.grant(`backend:ch/${owner}`, { reply: true, exhausted: true });
  await t.resolves(waitFor(() => otherBe.held.length === 1), 'exhausted: the fallback took it, with the slot its lease held');
  t.same([n.inUse(`backend:ch/${owner}`), n.inUse(`backend:ch/${other}`)], [1, 1], 'one slot of each in use');
  A.release();
  B.release();
  await Promise.all([first.done, second.done]);
  t.same([first.res.body, second.res.body], [owner, other]);
  t.same([n.inUse(`backend:ch/${owner}`), n.inUse(`backend:ch/${other}`)], [0, 0], 'both slots given back once');
});

t.test('solo (no supervisor): the lease holds the whole limit; past it the request is refused by the route queue', async (t) => {
  const n = await setup(LIMITS, false);
  const held = Array.from({ length: 6 }, (_, i) => send(n.dp, `/rr1/hold/${i}`));
  await waitFor(() => A.held.length + B.held.length === 6);
  const over = send(n.dp, '/rr1/over');
  await over.done;
  t.equal(over.res.status, 503, 'the seventh: 3 at each backend, refused');
  t.same([A.held.length, B.held.length], [3, 3], 'exactly 3 at each backend');
  A.release();
  B.release();
  await Promise.all(held.map((h) => h.done));
  t.same([n.inUse('backend:rr1/a'), n.inUse('backend:rr1/b')], [0, 0], 'every slot given back');
});

/** Resolves once `pred()` holds (checked every 5 ms; the backends are in this process); rejects after 5 s. */
async function waitFor(pred: () => boolean): Promise<void> {
  const until = performance.now() + 5000;
  while (!pred()) {
    if (performance.now() > until) throw new Error('not within 5 s');
    await new Promise((r) => setTimeout(r, 5));
  }
}
