// Overload protection end to end (issue 13, "Must show"): the HTTP/1.1 Upgrade (WebSocket) path
// of the bootstrap listener runs the same admission as a plain request: brownout sheds a non-core
// upgrade, the per-backend in-flight limit holds (at a full backend the upgrade waits in its
// route's queue, or on a cap-0 route is shed queue_full),
// the consistent-hash key picks the backend a plain request with the same key gets, and
// `host_policy: backend` sends the backend's own address as Host. A real `edge-proxy serve` with
// one worker and backends that accept upgrades (test/support/controlled-backend.ts).
import t from 'tap';
import tls from 'node:tls';
import { once } from 'node:events';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, assertShed, metric, pollUntil, request, send, shedCounters, startProxy } from './support/overload.ts';
import type { Answer, Proxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-ov-upgrade-');
const RETRY_AFTER = 7;
const UPGRADE = 'upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n';

const solo = await controlledBackend(t, 'solo');
solo.set({ kind: 'hold' }, '/solo/hold');
const queued = await controlledBackend(t, 'queued');
queued.set({ kind: 'hold' }, '/queued/hold');
const hash = [await controlledBackend(t, 'hash-a'), await controlledBackend(t, 'hash-b'), await controlledBackend(t, 'hash-c')];
const p: Proxy = await startProxy(t, files, 'upgrade', {
  // Brownout at 50 % of 4: two held requests trigger it; per backend 2: the same two fill `solo`.
  performance: 'global_inflight_limit: 4, per_upstream_inflight_limit: 4, per_backend_inflight_limit: 2',
  upstream: `{ solo: { route: { path_prefix: /solo }, backends: [{ id: solo, address: "127.0.0.1:${solo.port}" }] }, queued: { route: { path_prefix: /queued }, backends: [{ id: queued, address: "127.0.0.1:${queued.port}" }] }, ws: { route: { path_prefix: /ws }, load_balancing: { type: consistent-hash, key: "header:x-user" }, host_policy: { mode: backend }, backends: [${hash.map((b) => `{ id: ${b.name}, address: "127.0.0.1:${b.port}" }`).join(', ')}] } }`,
  resilience: `{ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 20, core_routes: [solo, queued] }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER}, max_wait_ms: 20000, caps: { solo: 0 } } }`,
});

/**
 * An upgrade request on its own TLS connection: on 101, resolves once the backend's greeting
 * (`hello from <id>`) came through the tunnel, then closes it; otherwise once the answer's body
 * (content-length) is in or the connection closed. Status, header fields and body as an Answer.
 */
async function upgrade(path: string, headers = ''): Promise<Answer & { greeting: string }> {
  const s = tls.connect({ host: '127.0.0.1', port: p.lport, servername: 'localhost', ca: p.ca, ALPNProtocols: ['http/1.1'] });
  t.teardown(() => s.destroy());
  await once(s, 'secureConnect');
  const t0 = performance.now();
  s.write(`GET ${path} HTTP/1.1\r\nhost: localhost\r\n${headers}${UPGRADE}\r\n`);
  let buf = Buffer.alloc(0);
  await new Promise<void>((resolve) => {
    const check = (): void => {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = buf.subarray(0, end).toString('latin1');
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? NaN);
      if (/^HTTP\/1\.1 101 /.test(head) ? buf.includes('hello from') : buf.length - end - 4 >= length) resolve();
    };
    s.on('data', (d: Buffer) => ((buf = Buffer.concat([buf, d])), check()));
    s.on('close', () => resolve());
    s.on('error', () => resolve());
  });
  s.destroy();
  const text = buf.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  const [statusLine, ...fields] = (end < 0 ? text : text.slice(0, end)).split('\r\n');
  const headersOut = Object.fromEntries(fields.map((f) => [f.slice(0, f.indexOf(':')).toLowerCase(), f.slice(f.indexOf(':') + 1).trim()]));
  const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine ?? '')?.[1] ?? 0);
  const body = end < 0 ? '' : text.slice(end + 4);
  return { status, headers: headersOut, body: status === 101 ? '' : body, greeting: status === 101 ? body : '', ms: performance.now() - t0 };
}

t.test('consistent-hash key and host_policy backend apply to upgrades as to plain requests', async (t) => {
  const picked: string[] = [];
  for (let i = 0; i < 9; i++) {
    const user = `user-${i}`;
    const plain = await request(p, 'h1', { path: '/ws/plain', headers: { 'x-user': user } });
    const id = plain.headers['x-backend'] ?? '';
    picked.push(id);
    const u = await upgrade('/ws/chat', `x-user: ${user}\r\n`);
    t.equal(u.status, 101, `${user}: 101`);
    t.equal(u.greeting, `hello from ${id}`, `${user}: the upgrade reached ${id}, as the plain request did`);
    const backend = hash.find((b) => b.name === id);
    const seen = backend?.arrivals.filter((a) => a.headers['x-user'] === user) ?? [];
    t.same(
      seen.map((a) => [a.upgrade, a.host]),
      [
        [false, `127.0.0.1:${backend?.port}`],
        [true, `127.0.0.1:${backend?.port}`],
      ],
      `${user}: both carried Host 127.0.0.1:${backend?.port} (host_policy backend)`,
    );
  }
  t.ok(new Set(picked).size > 1, `the key spreads users over ${[...new Set(picked)].join(', ')}`);
});

t.test('brownout sheds a non-core upgrade; a full backend on a cap-0 route sheds a core one queue_full; both recover', async (t) => {
  // The tunnels of the previous test are closed: nothing in flight to start with.
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 0)).inflight, 0, 'nothing in flight at the start');
  // Two requests held on `solo`: in-flight 2 of 4 (50 %, the trigger) and `solo` at its per-backend limit.
  const held = [send(p, 'h1', { path: '/solo/hold/1' }), send(p, 'h1', { path: '/solo/hold/2' })];
  await solo.until(() => solo.held === 2, 'two held');
  const arrivals = hash.map((b) => b.arrivals.length);

  const brownout = await shedCounters(p, 'brownout', 'ws');
  assertShed(t, await upgrade('/ws/chat', 'x-user: u1\r\n'), 'brownout', RETRY_AFTER, 'upgrade to the non-core ws route');
  const afterBrownout = await shedCounters(p, 'brownout', 'ws');
  t.same([afterBrownout.byReason - brownout.byReason, afterBrownout.outcome - brownout.outcome], [1, 1], 'counted: by reason brownout, outcome overload_shed of ws');
  t.same(
    hash.map((b) => b.arrivals.length),
    arrivals,
    'no ws backend saw it',
  );
  t.equal((await pollUntil(() => admission(p), (a) => a.brownout_active)).brownout_active, true, 'snapshot: brownout active');

  const full = await shedCounters(p, 'queue_full', 'solo');
  const soloArrivals = solo.arrivals.length;
  assertShed(t, await upgrade('/solo/chat'), 'queue_full', RETRY_AFTER, 'upgrade to the core solo route, its backend at its limit');
  assertShed(t, await request(p, 'h1', { path: '/solo/plain' }), 'queue_full', RETRY_AFTER, 'a plain request there, the same');
  const afterFull = await shedCounters(p, 'queue_full', 'solo');
  t.same([afterFull.byReason - full.byReason, afterFull.outcome - full.outcome], [2, 2], 'counted: by reason queue_full, outcome overload_shed of solo');
  t.equal(solo.arrivals.length, soloArrivals, 'the solo backend saw neither');

  solo.release();
  t.same(
    (await Promise.all(held.map((h) => h.answer))).map((a) => a.status),
    [200, 200],
    'the held requests complete',
  );
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 0)).inflight, 0, 'in-flight 0');
  const ws = await upgrade('/ws/chat', 'x-user: u1\r\n');
  t.same([ws.status, ws.greeting.startsWith('hello from hash-')], [101, true], 'below recover: the ws upgrade goes through');
  const core = await upgrade('/solo/chat');
  t.same([core.status, core.greeting], [101, 'hello from solo'], 'the solo backend has room: its upgrade goes through');
});

t.test('an upgrade to a backend at its limit waits in its route queue and is admitted when a slot frees', async (t) => {
  t.equal((await pollUntil(() => admission(p), (a) => a.inflight === 0)).inflight, 0, 'nothing in flight at the start');
  const held = [send(p, 'h1', { path: '/queued/hold/1' }), send(p, 'h1', { path: '/queued/hold/2' })];
  await queued.until(() => queued.held === 2, 'two held');
  const before = await metric(p, 'svc_inflight_wait_admit_total', { scope: 'backend' });
  const pending = upgrade('/queued/chat');
  const waiting = await pollUntil(() => admission(p), (a) => a.queued === 1);
  t.equal(waiting.workers?.[0]?.queued_by_route['queued'], 1, 'the upgrade waits in the queue of its route');
  t.equal(queued.arrivals.filter((a) => a.upgrade).length, 0, 'the backend has not seen it');
  queued.release(1);
  const u = await pending;
  t.same([u.status, u.greeting], [101, 'hello from queued'], 'admitted once a slot freed: 101 from the backend');
  t.equal((await metric(p, 'svc_inflight_wait_admit_total', { scope: 'backend' })) - before, 1, 'svc_inflight_wait_admit_total{scope="backend"} +1');
  queued.release();
  t.same(
    (await Promise.all(held.map((h) => h.answer))).map((a) => a.status),
    [200, 200],
    'the held requests complete',
  );
});
