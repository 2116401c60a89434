// The native HTTP/3 ingress in one process: a real config, node:http backends, the Dataplane, and
// two HTTP/3 clients: ours (Http3ClientSession) and an independent one (ngtcp2's gtlsclient).
import t from 'tap';
import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Http3ClientSession, QpackEncoder, encodeHeadersFrame } from '@edge-proxy/http3';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { QuicIngress } from '../src/ingress/quic.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';
import { toolPath } from '../../../scripts/system-tools.ts';

const run = promisify(execFile);
const dir = mkdtempSync(path.join(tmpdir(), 'edge-quic-ingress-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert, 'utf8');

const seenHeaders: http.IncomingHttpHeaders[] = [];
async function backend(name: string): Promise<number> {
  const server = http.createServer((req, res) => {
    seenHeaders.push(req.headers);
    if (req.url === '/echo') {
      const hash = createHash('sha256');
      let n = 0;
      req.on('data', (c: Buffer) => {
        hash.update(c);
        n += c.length;
      });
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ backend: name, bytes: n, sha256: hash.digest('hex') })));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`${name} ${req.method} ${req.url}`);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as AddressInfo).port;
}
const [p1, p2] = await Promise.all([backend('b1'), backend('b2')]);

const loaded = await loadConfigText(
  `
listen:
  address: 127.0.0.1
  port: 9889
  tls: { cert: ${cert.cert}, key: ${cert.key} }
resilience:
  protocol: { denied_path_prefixes: [/internal] }
upstream:
  rr:
    route: { path_prefix: / }
    backends: [{ id: r1, address: "127.0.0.1:${p1}" }, { id: r2, address: "127.0.0.1:${p2}" }]
  sticky:
    route: { path_prefix: /sticky }
    load_balancing: { type: sticky-cid }
    backends: [{ id: s1, address: "127.0.0.1:${p1}" }, { id: s2, address: "127.0.0.1:${p2}" }]
`,
  dir,
);
if (!loaded.ok) throw new Error(JSON.stringify(loaded.issues));
const resolved = loaded.value;
const metrics = new Metrics('worker');
const dataplane = new Dataplane(metrics);
dataplane.commit(dataplane.prepare(resolved, 1));
const listener = resolved.config.listeners[0];
const material = resolved.material.listeners[listener?.name ?? ''];
if (listener === undefined || material === undefined) throw new Error('no listener');
const ingress = new QuicIngress({
  listener,
  material,
  runtimes: dataplane,
  metrics,
  cryptoKey: randomBytes(32),
  ticketKey: randomBytes(48),
  idleTimeoutMs: 10_000,
  allow0rtt: false,
  maxFieldSectionSize: 16_384,
  counters: dataplane.quicCounters,
  bindPort: 0,
});
const port = await ingress.listen();
t.teardown(async () => {
  await ingress.close();
  await dataplane.close();
});

async function client(): Promise<Http3ClientSession> {
  const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem });
  t.teardown(() => c.close(true));
  return c;
}

t.test('GET and a 1 MiB POST through the QUIC ingress', async (t) => {
  const c = await client();
  const get = await c.fetch({ path: '/hello?q=1' });
  t.equal(get.status, 200);
  t.match(get.body.toString(), /^b[12] GET \/hello\?q=1$/);
  t.equal(get.headers['via'], '1.1 edge-proxy', 'response via names the backend hop');
  const h = seenHeaders.at(-1) ?? {};
  t.equal(h['via'], '3 edge-proxy', 'the backend sees an HTTP/3 client hop');
  t.equal(h['x-forwarded-for'], '127.0.0.1');
  t.equal(h['host'], `localhost:${port}`, ':authority becomes Host');
  const body = randomBytes(1024 * 1024);
  const post = await c.fetch({ method: 'POST', path: '/echo', body, headers: { 'content-length': String(body.length) } });
  t.equal(post.status, 200);
  t.match(JSON.parse(post.body.toString()), { bytes: body.length, sha256: createHash('sha256').update(body).digest('hex') });
});

t.test('round-robin across backends; sticky-cid keeps one connection on one backend', async (t) => {
  const c = await client();
  const rr = new Set<string>();
  for (let i = 0; i < 6; i++) rr.add((await c.fetch({ path: '/x' })).body.toString().split(' ')[0] as string);
  t.same([...rr].sort(), ['b1', 'b2']);
  const sticky = new Set<string>();
  for (let i = 0; i < 8; i++) sticky.add((await c.fetch({ path: '/sticky/y' })).body.toString().split(' ')[0] as string);
  t.equal(sticky.size, 1, `one backend for one connection (${[...sticky].join(',')})`);
});

t.test('protocol policy on QUIC: Upgrade is refused, denied paths are 403', async (t) => {
  const c = await client();
  // RFC 9114 §4.2: `upgrade` is connection-specific, so a request carrying it is malformed: the
  // HTTP/3 layer resets the stream with H3_MESSAGE_ERROR (0x10e) and nothing reaches a backend.
  // (Our client drops such fields, so the request is written raw.)
  const before = seenHeaders.length;
  const raw = await c.openRawStream('bidi');
  const lines: [string, string][] = [[':method', 'GET'], [':scheme', 'https'], [':authority', `localhost:${port}`], [':path', '/x'], ['upgrade', 'websocket']];
  await raw.write(encodeHeadersFrame(new QpackEncoder().encodeFieldSection(raw.id, lines)));
  await raw.end();
  const result = await raw.readAll();
  t.equal(result.resetCode, 0x10e, 'stream reset with H3_MESSAGE_ERROR');
  t.equal(seenHeaders.length, before, 'no backend request');
  t.equal((await c.fetch({ path: '/internal/x' })).status, 403);
});

t.test('gtlsclient (ngtcp2, an independent HTTP/3 client) through the proxy', async (t) => {
  const gtlsclient = toolPath('gtlsclient');
  if (gtlsclient === undefined) {
    t.fail('gtlsclient missing: install the Debian package ngtcp2-client');
    return;
  }
  const out = mkdtempSync(path.join(dir, 'gtls-'));
  const urls = Array.from({ length: 20 }, (_, i) => `https://localhost:${port}/gtls/${i}`);
  await run(gtlsclient, ['--quiet', '--no-quic-dump', '--no-http-dump', '--exit-on-all-streams-close', '--timeout=10s', '--handshake-timeout=5s', `--download=${out}`, '127.0.0.1', String(port), ...urls], { timeout: 30_000 });
  const files = readdirSync(out);
  t.equal(files.length, 20, '20 responses downloaded on one connection');
  for (const f of files) t.match(readFileSync(path.join(out, f), 'utf8'), /^b[12] GET \/gtls\/\d+$/);
});

t.test('certificate reload: new QUIC handshakes get the new certificate, open connections keep working', async (t) => {
  const ca2 = makeCa(dir, 'ca2', '/CN=second CA');
  const cert2 = makeLeaf(dir, 'server2', ca2, { sans: ['localhost', '127.0.0.1'] });
  const ca2Pem = readFileSync(ca2.cert, 'utf8');
  const before = await client();
  await t.rejects(Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: ca2Pem, handshakeTimeoutMs: 3000 }), 'the old certificate is not trusted by the second CA');
  const r2 = await loadConfigText(`listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert2.cert}, key: ${cert2.key} } }\nupstream: { a: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${p1}" }] } }`, dir);
  if (!r2.ok) throw new Error(JSON.stringify(r2.issues));
  const m2 = r2.value.material.listeners[r2.value.config.listeners[0]?.name ?? ''];
  if (m2 === undefined) throw new Error('no material');
  ingress.updateMaterial(m2);
  const after = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: ca2Pem });
  t.teardown(() => after.close(true));
  t.equal((await after.fetch({ path: '/x' })).status, 200, 'a new connection verifies against the second CA');
  t.equal((await before.fetch({ path: '/x' })).status, 200, 'the connection opened before the reload keeps working');
});

/** Current value of an unlabelled worker metric, as a scrape would read it. */
async function metricValue(name: string): Promise<number> {
  const m = metrics.registry.getSingleMetric(name);
  if (m === undefined) throw new Error(`no metric ${name}`);
  return (await m.get()).values[0]?.value ?? 0;
}

t.test('QUIC ingress counters reach the metrics at a scrape', async (t) => {
  const sock = createSocket('udp4');
  t.teardown(() => sock.close());
  await new Promise<void>((r) => sock.bind(0, '127.0.0.1', r));
  const packetsBefore = await metricValue('svc_ingress_packets_total');
  t.ok(packetsBefore > 0, `the clients' datagrams were counted (${packetsBefore})`);
  const badBefore = await metricValue('svc_ingress_bad_header_total');
  for (let i = 0; i < 3; i++) await new Promise<void>((r) => sock.send(Buffer.from([0]), port, '127.0.0.1', () => r()));
  // Nothing answers a datagram without a header: poll the scrape, bounded.
  const deadline = Date.now() + 5000;
  while ((await metricValue('svc_ingress_bad_header_total')) < badBefore + 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  t.equal(await metricValue('svc_ingress_bad_header_total'), badBefore + 3, 'three unparsable datagrams');
  t.ok((await metricValue('svc_ingress_packets_total')) >= packetsBefore + 3, 'and counted as datagrams received');
  t.equal(await metricValue('svc_ingress_queue_bytes'), 0, 'queue empty at rest');
});

t.test('after clients close and the ingress drains, nothing is held', async (t) => {
  const packets = await metricValue('svc_ingress_packets_total');
  await ingress.close(0);
  t.ok((await metricValue('svc_ingress_packets_total')) >= packets, 'the counters keep what the closed ingress counted');
  const s = ingress.stats();
  t.same({ sessions: s.sessions, requestStreams: s.requestStreams, timers: s.timers }, { sessions: 0, requestStreams: 0, timers: 0 });
  t.same([...dataplane.inflight().entries()], [], 'no request holds a generation');
});
