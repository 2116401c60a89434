// Connection admission: token bucket and cap with a fake clock; then real sockets on both ingresses.
import t from 'tap';
import http from 'node:http';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Http3ClientSession } from '@edge-proxy/http3';
import { ConnectionAdmission, takeToken } from '../src/ingress/admission.ts';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { BootstrapIngress } from '../src/ingress/bootstrap.ts';
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
resilience: { adaptive_admission: { min_limit: 2 } }
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

t.test('admission: cap first, then rate; release frees a slot', async (t) => {
  let now = 0;
  const a = new ConnectionAdmission(() => ({ maxConnections: 2, perSecond: 1, burst: 3 }), () => now);
  t.same([a.admit(), a.admit(), a.admit()], ['admitted', 'admitted', 'cap']);
  a.release();
  t.equal(a.admit(), 'admitted', 'the third token');
  a.release();
  t.equal(a.admit(), 'rate', 'bucket empty');
  now = 1000;
  t.equal(a.admit(), 'admitted');
  t.equal(a.active, 2);
});

t.test('TLS bootstrap: the third concurrent connection is refused at accept and counted', async (t) => {
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(resolved, 1));
  const ingress = new BootstrapIngress({ listener, material, runtimes: dataplane, metrics, admission: dataplane.connections, bindPort: 0 });
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

t.test('QUIC: a session beyond the cap is closed with H3_EXCESSIVE_LOAD and counted', async (t) => {
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(resolved, 1));
  const ingress = new QuicIngress({ listener, material, runtimes: dataplane, metrics, cryptoKey: randomBytes(32), ticketKey: randomBytes(48), idleTimeoutMs: 5000, allow0rtt: false, maxFieldSectionSize: 16384, admission: dataplane.connections, bindPort: 0 });
  const port = await ingress.listen();
  t.teardown(async () => {
    await ingress.close(0);
    await dataplane.close();
  });
  const clients: Http3ClientSession[] = [];
  t.teardown(() => Promise.all(clients.map((c) => c.close(true))));
  // The refused session is closed right after its handshake: its connect or its request fails.
  const results: (number | string)[] = [];
  for (let i = 0; i < 3; i++) {
    const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: readFileSync(ca.cert, 'utf8') }).catch(() => undefined);
    if (c === undefined) {
      results.push('connect failed');
      continue;
    }
    clients.push(c);
    results.push(await c.fetch({ path: '/' }).then((r) => r.status, (e: { code?: string }) => e.code ?? 'error'));
  }
  t.same(results.filter((r) => r === 200).length, 2, `two sessions served (${JSON.stringify(results)})`);
  t.match(await metrics.registry.metrics(), /svc_connection_cap_rejects 1/);
});
