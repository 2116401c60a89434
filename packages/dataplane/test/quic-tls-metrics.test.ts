// QUIC handshakes in the downstream TLS series (issue 12 item 6), in one process: a QUIC ingress on
// a `client_auth: required` listener, an HTTP/3 client with and without a client certificate, and
// the worker's registry read as a scrape reads it. A completed handshake counts as on the TLS
// bootstrap path (success, ALPN `h3`, the certificate selection); a refused one as a failure of
// that listener with the SPEC's generic reason `handshake` (the QUIC library does not say why).
import t from 'tap';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Http3ClientSession } from '@edge-proxy/http3';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { QuicIngress } from '../src/ingress/quic.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-quic-tls-metrics-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const clientCa = makeCa(dir, 'client-ca', '/CN=edge-proxy test client CA');
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const good = makeLeaf(dir, 'good-client', clientCa, { usage: 'client', sans: [], subject: '/CN=good client' });
const caPem = readFileSync(ca.cert, 'utf8');

const backend = http.createServer((_req, res) => res.end('ok'));
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));

const loaded = await loadConfigText(
  `
listeners:
  - name: mtls
    address: 127.0.0.1
    port: 9889
    tls: { cert: ${server.cert}, key: ${server.key}, client_auth: { mode: required, ca_file: ${clientCa.cert} } }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }
`,
  dir,
);
if (!loaded.ok) throw new Error(JSON.stringify(loaded.issues));
const metrics = new Metrics('worker');
const dataplane = new Dataplane(metrics);
dataplane.commit(dataplane.prepare(loaded.value, 1));
const listener = loaded.value.config.listeners[0];
const material = loaded.value.material.listeners['mtls'];
if (listener === undefined || material === undefined) throw new Error('no listener');
const ingress = new QuicIngress({ listener, material, runtimes: dataplane, metrics, cryptoKey: randomBytes(32), ticketKey: randomBytes(48), idleTimeoutMs: 10_000, allow0rtt: false, maxFieldSectionSize: 16_384, counters: dataplane.quicCounters, bindPort: 0 });
const port = await ingress.listen();
t.teardown(async () => {
  await ingress.close();
  await dataplane.close();
});

/** The value of one series as a scrape sees it (the collect hooks run first). */
async function value(name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = await metrics.registry.getSingleMetric(name)?.get();
  return (m?.values ?? []).filter((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x)).reduce((s, v) => s + v.value, 0);
}

t.test('completed QUIC handshakes: success, ALPN h3 and the default identity, once per connection', async (t) => {
  const N = 3;
  for (let i = 0; i < N; i++) {
    const s = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem, cert: readFileSync(good.cert, 'utf8'), key: readFileSync(good.key, 'utf8'), handshakeTimeoutMs: 10_000 });
    t.equal((await s.fetch({ path: '/' })).status, 200);
    await s.close(true);
  }
  t.equal(await value('svc_downstream_tls_handshake_success_total'), N);
  t.equal(await value('svc_downstream_tls_alpn_total', { listener: 'mtls', protocol: 'h3' }), N);
  t.equal(await value('svc_downstream_tls_certificate_selection_total', { listener: 'mtls', selection: 'default' }), N);
  t.equal(await value('svc_downstream_tls_handshake_failure_total'), 0);
});

t.test('a refused QUIC handshake (no client certificate): one failure of the listener, reason handshake', async (t) => {
  const before = await value('svc_downstream_tls_handshake_success_total');
  let refused = false;
  try {
    const s = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 5_000 });
    // A client may believe its handshake done before the server's verdict arrives: the request fails then.
    await s.fetch({ path: '/', timeoutMs: 5_000 }).catch(() => undefined);
    await s.close(true).catch(() => undefined);
  } catch {
    refused = true;
  }
  t.comment(`the client saw ${refused ? 'its handshake fail' : 'its request fail'}`);
  // The server learns of the failure when the library gives up the connection: wait for the count.
  const deadline = performance.now() + 20_000;
  while ((await value('svc_downstream_tls_handshake_failure_total')) === 0 && performance.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  t.equal(await value('svc_downstream_tls_handshake_failure_total', { listener: 'mtls', reason: 'handshake' }), 1, 'one failure, reason handshake');
  t.equal(await value('svc_downstream_tls_handshake_success_total'), before, 'no success counted');
});
