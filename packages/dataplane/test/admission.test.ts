// Connection admission: token bucket and cap with a fake clock; then real sockets on both ingresses.
import t from 'tap';
import { jsonLog } from './support/json-log.ts';
import type { Test } from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Http3ClientSession } from '@edge-proxy/http3';
import { ConnectionAdmission, sourceKey, takeToken } from '../src/ingress/admission.ts';
import { clientErrorReply } from '../src/ingress/client-error.ts';
import { RefusalLog } from '../src/ingress/refusal-log.ts';
import { bodyDeadline } from '../src/proxy/body-guard.ts';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { BootstrapIngress } from '../src/ingress/bootstrap.ts';
import { downstreamTimeouts } from '../src/ingress/connection-deadlines.ts';
import { QuicIngress } from '../src/ingress/quic.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-admission-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost'] });
const backend = http.createServer((_q, r) => r.end('ok'));
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
const loaded = await loadConfigText(
  `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert.cert}, key: ${cert.key} } }
performance: { max_connections: 2, new_connections_per_sec: 1000, new_connections_burst: 1000, per_backend_inflight_limit: 2, per_upstream_inflight_limit: 2, global_inflight_limit: 64 }
upstream: { a: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }`,
  dir,
);
if (!loaded.ok) throw new Error(JSON.stringify(loaded.issues));
const resolved = loaded.value;
const listener = resolved.config.listeners[0]!;
const material = resolved.material.listeners[listener.name]!;

t.test('token bucket: burst, then the sustained rate', async (t) => {
  let b = { tokens: 3, at: 0 };
  const got: boolean[] = [];
  for (const now of [0, 0, 0, 0, 500, 999, 1000]) {
    const r = takeToken(b, 2, 3, now);
    b = r.bucket;
    got.push(r.ok);
  }
  t.same(got, [true, true, true, false, true, false, true], '3 at once, then 2 per second');
});

t.test('token bucket: time going backwards neither drains nor refills it', async (t) => {
  const back = takeToken({ tokens: 2, at: 10_000 }, 1000, 5, 10_000 - 3_600_000);
  t.same([back.ok, back.bucket.tokens], [true, 1], 'an hour back: the 2 tokens held are still there (one taken)');
  const next = takeToken(back.bucket, 1000, 5, 10_000 - 3_600_000 + 1);
  t.same([next.ok, next.bucket.tokens], [true, 1], '1 ms later on the stepped clock: refilled by 1 ms of rate, not by minus an hour');
});

t.test('admission runs on the monotonic clock: a wall clock stepped back an hour refuses nothing', async (t) => {
  const a = new ConnectionAdmission(() => ({ maxConnections: 100, perSource: 100, perSecond: 1000, burst: 5 }));
  const dateNow = Date.now;
  const before = dateNow();
  try {
    Date.now = () => before - 3_600_000;
    const verdicts = [a.admit('s'), a.admit('s'), a.admit('s')];
    t.same(verdicts, ['admitted', 'admitted', 'admitted'], 'the default clock does not read the wall clock');
  } finally {
    Date.now = dateNow;
  }
});

t.test('admission: cap first, then rate; release frees a slot', async (t) => {
  let now = 0;
  const a = new ConnectionAdmission(() => ({ maxConnections: 2, perSource: 2, perSecond: 1, burst: 3 }), () => now);
  t.same([a.admit("s"), a.admit("s"), a.admit("s")], ['admitted', 'admitted', 'cap']);
  a.release("s");
  t.equal(a.admit("s"), 'admitted', 'the third token');
  a.release("s");
  t.equal(a.admit("s"), 'rate', 'bucket empty');
  now = 1000;
  t.equal(a.admit("s"), 'admitted');
  t.equal(a.active, 2);
});

t.test('per-source cap: one source is refused at its cap, others are not, and it spends no token', async (t) => {
  const a = new ConnectionAdmission(() => ({ maxConnections: 10, perSource: 2, perSecond: 1, burst: 4 }), () => 0);
  t.same([a.admit('x'), a.admit('x'), a.admit('x'), a.admit('x')], ['admitted', 'admitted', 'source', 'source']);
  t.same([a.admit('y'), a.admit('y')], ['admitted', 'admitted'], 'two tokens left for another source');
  t.equal(a.heldBy('x'), 2);
  a.release('x');
  t.equal(a.heldBy('x'), 1);
  t.equal(a.active, 3);
});

t.test('sourceKey: IPv4 as is, IPv4-mapped unmapped, IPv6 by /64', async (t) => {
  const cases: [string, string][] = [
    ['192.0.2.7', '192.0.2.7'],
    ['::ffff:192.0.2.7', '192.0.2.7'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['2001:DB8:1:2::9', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['2001:db8:0:0:ffff::1', '2001:db8:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['64:ff9b::192.0.2.1', '64:ff9b:0:0::/64'],
  ];
  for (const [address, key] of cases) t.equal(sourceKey(address), key, address);
});

t.test('clientErrorReply: HTTP failures get a status line, TLS and transport failures none', async (t) => {
  const cases: [string, string | undefined][] = [
    ['ERR_HTTP_REQUEST_TIMEOUT', '408'],
    ['HPE_HEADER_OVERFLOW', '431'],
    ['HPE_INVALID_METHOD', '400'],
    ['ERR_TLS_HANDSHAKE_TIMEOUT', undefined],
    ['ERR_SSL_WRONG_VERSION_NUMBER', undefined],
    ['ECONNRESET', undefined],
    ['', undefined],
  ];
  for (const [code, status] of cases) t.equal(clientErrorReply(code)?.slice(9, 12), status, code);
});

t.test('bodyDeadline: the total deadline, or sooner the minimum rate one', async (t) => {
  const cases: [number, { idleMs: number; totalMs: number; minBytesPerSec: number }, number][] = [
    [0, { idleMs: 1000, totalMs: 60_000, minBytesPerSec: 0 }, 60_000],
    [0, { idleMs: 1000, totalMs: 60_000, minBytesPerSec: 1000 }, 1000],
    [5000, { idleMs: 1000, totalMs: 60_000, minBytesPerSec: 1000 }, 6000],
    [1_000_000, { idleMs: 1000, totalMs: 60_000, minBytesPerSec: 1000 }, 60_000],
  ];
  for (const [received, limits, due] of cases) t.equal(bodyDeadline(0, received, limits), due, `${received} bytes, ${JSON.stringify(limits)}`);
});

t.test('refusal log: the first refusal at once, then one summary line per interval, not a line each', async (t) => {
  const { lines, wrote, logger } = jsonLog();
  const log = new RefusalLog(logger, 100);
  for (let i = 0; i < 500; i++) log.note('source_cap', '192.0.2.1');
  log.note('tls_handshake_timeout', '192.0.2.2');
  while (lines.length < 3) await once(wrote, 'line');
  const summary = lines.map((l) => [l['level'], l['reason'], l['connections'], l['example_source']]);
  t.same(summary, [
    ['warn', 'source_cap', 1, '192.0.2.1'],
    ['warn', 'source_cap', 499, '192.0.2.1'],
    ['warn', 'tls_handshake_timeout', 1, '192.0.2.2'],
  ]);
});

t.test('refusal log: refused requests (CONNECT) are summarized in requests, not connections', async (t) => {
  const { lines, wrote, logger } = jsonLog();
  let now = 0;
  const log = new RefusalLog(logger, 100, () => now);
  for (let i = 0; i < 12; i++) log.note('connect_refused', '192.0.2.7');
  now = 100;
  log.note('connect_refused', '192.0.2.8');
  while (lines.length < 2) await once(wrote, 'line');
  t.same(
    lines.map((l) => [l['msg'], l['reason'], l['requests'], l['connections'], l['example_source']]),
    [
      ['downstream requests refused', 'connect_refused', 1, undefined, '192.0.2.7'],
      ['downstream requests refused', 'connect_refused', 12, undefined, '192.0.2.7'],
    ],
  );
});

t.test('TLS bootstrap: the third concurrent connection is refused at accept and counted', async (t) => {
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(resolved, 1));
  const ingress = new BootstrapIngress({ listener, material, runtimes: dataplane, metrics, admission: dataplane.connections, timeouts: () => downstreamTimeouts(resolved.config.performance.timeouts), bindPort: 0 });
  const port = await ingress.listen();
  t.teardown(async () => {
    await ingress.close();
    await dataplane.close();
  });
  const open = async (): Promise<tls.TLSSocket | Error> =>
    new Promise((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: readFileSync(ca.cert) });
      s.once('secureConnect', () => resolve(s));
      s.once('error', (e) => resolve(e));
    });
  const a = await open();
  const b = await open();
  const c = await open();
  t.notOk(a instanceof Error);
  t.notOk(b instanceof Error);
  t.ok(c instanceof Error, 'refused');
  t.match(await metrics.registry.metrics(), /svc_connection_cap_rejects 1/);
  t.match(await metrics.registry.metrics(), /svc_active_connections 2/);
  for (const s of [a, b]) if (!(s instanceof Error)) s.destroy();
});

/** A QUIC ingress (port 0) over a dataplane on `config`; closed in `t`'s teardown. */
async function quicIngress(t: Test, config: typeof resolved): Promise<{ port: number; metrics: Metrics }> {
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(config, 1));
  const ingress = new QuicIngress({ listener, material, runtimes: dataplane, metrics, cryptoKey: randomBytes(32), ticketKey: randomBytes(48), idleTimeoutMs: 5000, allow0rtt: false, maxFieldSectionSize: 16384, admission: dataplane.connections, bindPort: 0 });
  const port = await ingress.listen();
  t.teardown(async () => {
    await ingress.close(0);
    await dataplane.close();
  });
  return { port, metrics };
}

/** `n` HTTP/3 sessions opened one after another, one GET each: its status, or why it failed. Closed in teardown. */
async function sessions(t: Test, port: number, n: number): Promise<(number | string)[]> {
  const clients: Http3ClientSession[] = [];
  t.teardown(() => Promise.all(clients.map((c) => c.close(true))));
  const results: (number | string)[] = [];
  for (let i = 0; i < n; i++) {
    const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: readFileSync(ca.cert, 'utf8') }).catch(() => undefined);
    if (c === undefined) {
      results.push('connect failed');
      continue;
    }
    clients.push(c);
    results.push(await c.fetch({ path: '/' }).then((r) => r.status, (e: { code?: string }) => e.code ?? 'error'));
  }
  return results;
}

t.test('QUIC: a session beyond the cap is closed with H3_EXCESSIVE_LOAD and counted', async (t) => {
  const { port, metrics } = await quicIngress(t, resolved);
  // The refused session is closed right after its handshake: its connect or its request fails.
  const results = await sessions(t, port, 3);
  t.same(results.filter((r) => r === 200).length, 2, `two sessions served (${JSON.stringify(results)})`);
  t.match(await metrics.registry.metrics(), /svc_connection_cap_rejects 1/);
});

t.test('TLS bootstrap: a source over its cap is refused and counted; a silent connection is closed at the handshake deadline and counted', async (t) => {
  const loaded = await loadConfigText(
    `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert.cert}, key: ${cert.key} } }
performance: { max_connections_per_source: 1, timeouts: { tls_handshake_ms: 2000 } }
upstream: { a: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }`,
    dir,
  );
  if (!loaded.ok) throw new Error(JSON.stringify(loaded.issues));
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(loaded.value, 1));
  const ingress = new BootstrapIngress({ listener, material, runtimes: dataplane, metrics, admission: dataplane.connections, timeouts: () => downstreamTimeouts(loaded.value.config.performance.timeouts), bindPort: 0 });
  const port = await ingress.listen();
  t.teardown(async () => {
    await ingress.close();
    await dataplane.close();
  });
  const connect = async (localAddress: string): Promise<net.Socket> => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress });
    s.on('error', () => undefined);
    await once(s, 'connect');
    return s;
  };
  const held = await connect('127.0.0.3');
  const t0 = performance.now();
  const refused = await connect('127.0.0.3');
  await once(refused, 'close');
  // The handshake deadline is 2000 ms: a close well before it is the refusal at accept, with room
  // for a loaded machine.
  t.ok(performance.now() - t0 < 1500, 'the second connection of 127.0.0.3 is closed at accept');
  const other = await connect('127.0.0.4');
  await Promise.all([once(held, 'close'), once(other, 'close')]);
  t.ok(performance.now() - t0 >= 1900, 'the silent ones are closed at the handshake deadline');
  const text = await metrics.registry.metrics();
  t.match(text, /^svc_connection_cap_rejects 1$/m);
  t.match(text, /^svc_downstream_tls_handshake_failure_total\{listener="[^"]+",reason="timeout"\} 2$/m);
  // The server's own 'close' comes a few loop turns after the client's: wait for them, bounded.
  for (let i = 0; i < 10_000 && dataplane.connections.active > 0; i++) await new Promise(setImmediate);
  t.equal(dataplane.connections.active, 0, 'every admitted connection released');
});

t.test('QUIC: a second session from the same address beyond max_connections_per_source is refused and counted', async (t) => {
  const loaded = await loadConfigText(
    `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert.cert}, key: ${cert.key} } }
performance: { max_connections_per_source: 1 }
upstream: { a: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }`,
    dir,
  );
  if (!loaded.ok) throw new Error(JSON.stringify(loaded.issues));
  const { port, metrics } = await quicIngress(t, loaded.value);
  const results = await sessions(t, port, 2);
  t.equal(results[0], 200, `the first session is served (${JSON.stringify(results)})`);
  t.not(results[1], 200, 'the second from 127.0.0.1 is refused');
  t.match(await metrics.registry.metrics(), /^svc_connection_cap_rejects 1$/m);
});

t.test('TLS bootstrap HTTP/2: a session that never opens a stream gets GOAWAY at the header timeout, not the idle one', async (t) => {
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(resolved, 1));
  const timeouts = { tlsHandshakeMs: 5000, headerMs: 300, idleMs: 60_000, sendIdleMs: 60_000, requestMs: 60_000 };
  const ingress = new BootstrapIngress({ listener, material, runtimes: dataplane, metrics, timeouts: () => timeouts, bindPort: 0 });
  const port = await ingress.listen();
  t.teardown(async () => {
    await ingress.close();
    await dataplane.close();
  });
  const session = http2.connect(`https://localhost:${port}`, { ca: readFileSync(ca.cert) });
  t.teardown(() => session.destroy());
  session.on('error', () => undefined);
  await once(session, 'remoteSettings');
  const t0 = performance.now();
  const [code] = (await once(session, 'goaway')) as [number];
  const ms = performance.now() - t0;
  t.equal(code, http2.constants.NGHTTP2_NO_ERROR);
  t.ok(ms < 5000, `GOAWAY after ${ms.toFixed(0)} ms without a stream (header timeout 300 ms, idle 60 s)`);
});
