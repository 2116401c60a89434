// The TLS bootstrap ingress end to end inside one process: a real config loaded by the config
// package, real node:http backends, the Dataplane runtime, and independent clients (curl for
// HTTP/2, Node's https for HTTP/1.1, raw TLS for SNI). Port 0 everywhere; all closed in teardown.
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import http2 from 'node:http2';
import tls from 'node:tls';
import type { X509Certificate } from 'node:crypto';
import { execFile } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { AddressInfo, Socket } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import type { ResolvedConfig } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { BootstrapIngress } from '../src/ingress/bootstrap.ts';
import { downstreamTimeouts } from '../src/ingress/connection-deadlines.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const run = promisify(execFile);
const dir = mkdtempSync(path.join(tmpdir(), 'edge-bootstrap-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const def = makeLeaf(dir, 'default', ca, { sans: ['localhost', '127.0.0.1'] });
const api = makeLeaf(dir, 'api', ca, { sans: ['api.example.com'] });
const caPem = readFileSync(ca.cert);

/** Backends answer with their name; `/slow` waits for a release; `/healthz` follows `unhealthy`. */
const unhealthy = new Set<string>();
/** Failing health answers each backend gave (the count the probe failure counter is checked against). */
const failedProbes = new Map<string, number>();
const release = new EventEmitter();
async function backend(name: string): Promise<{ port: number; server: http.Server }> {
  const server = http.createServer((req, res) => {
    if (req.url === '/healthz') {
      if (unhealthy.has(name)) failedProbes.set(name, (failedProbes.get(name) ?? 0) + 1);
      res.writeHead(unhealthy.has(name) ? 500 : 200).end();
      return;
    }
    const answer = (): void => {
      res.writeHead(200, { 'content-type': 'application/json', 'x-backend': name });
      res.end(JSON.stringify({ backend: name, url: req.url, host: req.headers.host, via: req.headers.via }));
    };
    if (req.url?.startsWith('/slow')) {
      release.once('go', answer);
      release.emit('arrived');
    }
    else answer();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as AddressInfo).port, server };
}

const [b1, b2, b3, other] = await Promise.all([backend('b1'), backend('b2'), backend('b3'), backend('other')]);
// Every backend accepts upgrades: 101, then every byte echoed upper-cased (a stand-in for a WebSocket server).
let upgradeHeaders: http.IncomingHttpHeaders = {};
for (const b of [b1, b2, b3, other]) {
  b.server.on('upgrade', (req: http.IncomingMessage, socket: Socket, head: Buffer) => {
    upgradeHeaders = req.headers;
    socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n');
    if (head.length > 0) socket.write(head.toString().toUpperCase());
    socket.on('data', (d: Buffer) => socket.write(d.toString().toUpperCase()));
    // http.Server sockets allow half-open; a WebSocket server closes when its peer does.
    socket.on('end', () => socket.end());
  });
}

/** The next chunk from a socket; rejects if the socket closes first (a test must not hang). */
function nextData(socket: tls.TLSSocket): Promise<Buffer> {
  return new Promise((resolvePromise, reject) => {
    const onData = (d: Buffer): void => {
      socket.off('close', onClose);
      resolvePromise(d);
    };
    const onClose = (): void => {
      socket.off('data', onData);
      reject(new Error('socket closed before any data'));
    };
    socket.once('data', onData);
    socket.once('close', onClose);
  });
}
const deadServer = http.createServer();
deadServer.listen(0, '127.0.0.1');
await once(deadServer, 'listening');
const deadPort = (deadServer.address() as AddressInfo).port;
await new Promise<void>((resolve) => deadServer.close(() => resolve()));

function configText(apiPort: number, extra = ''): string {
  return `
listen:
  address: 127.0.0.1
  port: 9889
  tls:
    cert: ${def.cert}
    key: ${def.key}
    certificates:
      - { server_name: api.example.com, cert: ${api.cert}, key: ${api.key} }
upstream:
  api:
    route: { host: api.example.com, path_prefix: / }
    backends: [{ id: a1, address: "127.0.0.1:${apiPort}" }]
  rr:
    route: { path_prefix: /rr }
    backends:
      - { id: r1, address: "127.0.0.1:${b1.port}" }
      - { id: r2, address: "127.0.0.1:${b2.port}" }
      - { id: r3, address: "127.0.0.1:${b3.port}" }
  weighted-rr:
    route: { path_prefix: /wrr }
    backends:
      - { id: w1, address: "127.0.0.1:${b1.port}", weight: 5 }
      - { id: w2, address: "127.0.0.1:${b2.port}", weight: 1 }
      - { id: w3, address: "127.0.0.1:${b3.port}", weight: 0 }
  weighted-random:
    route: { path_prefix: /wrand }
    load_balancing: { type: random }
    backends:
      - { id: w1, address: "127.0.0.1:${b1.port}", weight: 9 }
      - { id: w2, address: "127.0.0.1:${b2.port}", weight: 1 }
      - { id: w3, address: "127.0.0.1:${b3.port}", weight: 0 }
  failover:
    route: { path_prefix: /failover }
    backends:
      - { id: dead, address: "127.0.0.1:${deadPort}" }
      - { id: live, address: "127.0.0.1:${b1.port}" }
  checked:
    route: { path_prefix: /checked }
    health_check: { path: /healthz, interval: 500, timeout_ms: 400, unhealthy_threshold: 2, healthy_threshold: 1 }
    backends:
      - { id: c2, address: "127.0.0.1:${b2.port}" }
      - { id: c3, address: "127.0.0.1:${b3.port}" }
  writes:
    route: { path_prefix: /writes, methods: [POST] }
    backends: [{ id: w, address: "127.0.0.1:${b1.port}" }]
${extra}`;
}

async function resolve(text: string): Promise<ResolvedConfig> {
  const r = await loadConfigText(text, dir);
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value;
}

const metrics = new Metrics('worker');
const dataplane = new Dataplane(metrics);
t.teardown(() => dataplane.close());
let resolved = await resolve(configText(b1.port));
dataplane.commit(dataplane.prepare(resolved, 1));
const listener = resolved.config.listeners[0];
const listenerMaterial = resolved.material.listeners[listener?.name ?? ''];
if (listener === undefined || listenerMaterial === undefined) throw new Error('no listener');
const ingress = new BootstrapIngress({ listener, material: listenerMaterial, runtimes: dataplane, metrics, timeouts: () => downstreamTimeouts(resolved.config.performance.timeouts), bindPort: 0 });
const port = await ingress.listen();
t.teardown(() => ingress.close());

function get(p: string, options: { servername?: string; host?: string; method?: string } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolvePromise, reject) => {
    const req = https.request(
      { host: '127.0.0.1', port, path: p, method: options.method ?? 'GET', ca: caPem, servername: options.servername ?? 'localhost', headers: { host: options.host ?? 'localhost' }, agent: false },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolvePromise({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

t.test('HTTP/1.1: routes by host and path, adds Alt-Svc and via', async (t) => {
  const r = await get('/anything', { servername: 'api.example.com', host: 'api.example.com' });
  t.equal(r.status, 200);
  t.equal(JSON.parse(r.body).backend, 'b1');
  t.equal(JSON.parse(r.body).host, 'api.example.com', 'host preserved by default');
  t.equal(JSON.parse(r.body).via, '1.1 edge-proxy');
  t.equal(r.headers['alt-svc'], undefined, 'no Alt-Svc for a name the QUIC certificate (the default identity) does not cover');
  const local = await get('/rr/x');
  t.equal(local.headers['alt-svc'], 'h3=":9889"; ma=86400', 'Alt-Svc for a name the default identity covers');
  t.equal(r.headers['via'], '1.1 edge-proxy');
});

t.test('HTTP/2 with curl (an independent client)', async (t) => {
  const { stdout } = await run('curl', ['-sS', '--http2', '--cacert', ca.cert, '--resolve', `api.example.com:${port}:127.0.0.1`, '-w', '\n%{http_version} %{http_code}', `https://api.example.com:${port}/h2`]);
  const [body, status] = stdout.split('\n');
  t.equal(status, '2 200');
  t.match(JSON.parse(body ?? '{}'), { backend: 'b1', url: '/h2', host: 'api.example.com:' + port, via: '2 edge-proxy' });
});

t.test('HTTP/2: client stream resets never take the ingress down; 100-continue and HEAD', async (t) => {
  // The api.example.com route: its backend holds `/slow` until released.
  const client = http2.connect(`https://127.0.0.1:${port}`, { ca: caPem, servername: 'api.example.com' });
  t.teardown(() => client.close());
  const authority = 'api.example.com';
  const noop = (): void => {};
  // `events.once` would reject on the stream's own 'error' (the reset we cause): wait for 'close' only.
  const closeOf = (s: http2.ClientHttp2Stream): Promise<void> => new Promise((r) => s.once('close', () => r()));
  // A reset with an error code makes node emit 'error' on the server stream: unhandled, it
  // would be thrown and end the worker (here: this test process).
  for (const code of [http2.constants.NGHTTP2_INTERNAL_ERROR, http2.constants.NGHTTP2_PROTOCOL_ERROR, http2.constants.NGHTTP2_CANCEL]) {
    const arrived = once(release, 'arrived');
    const req = client.request({ ':authority': authority, ':path': '/slow' });
    req.on('error', noop);
    req.end();
    await arrived;
    const closed = closeOf(req);
    req.close(code);
    await closed;
  }
  const post = client.request({ ':authority': authority, ':method': 'POST', ':path': '/slow-post' });
  post.on('error', noop);
  post.write('part of a body');
  const postClosed = closeOf(post);
  post.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  await postClosed;
  const fetch = (headers: http2.OutgoingHttpHeaders, body?: string): Promise<{ status: number; body: string; continued: boolean }> =>
    new Promise((resolvePromise, reject) => {
      const req = client.request({ ':authority': authority, ...headers });
      let continued = false;
      let status = 0;
      let text = '';
      req.on('continue', () => {
        continued = true;
        req.end(body);
      });
      req.on('response', (h) => (status = Number(h[':status'])));
      req.setEncoding('utf8');
      req.on('data', (c: string) => (text += c));
      req.on('end', () => resolvePromise({ status, body: text, continued }));
      req.on('error', reject);
      if (headers['expect'] === undefined) req.end(body);
    });
  const after = await fetch({ ':path': '/after-resets' });
  t.equal(after.status, 200, 'still serving on the same connection after four resets');
  t.match(JSON.parse(after.body), { url: '/after-resets', via: '2 edge-proxy' });
  const expect = await fetch({ ':method': 'POST', ':path': '/upload', expect: '100-continue' }, 'payload');
  t.equal(expect.continued, true, '100 Continue sent before the body');
  t.equal(expect.status, 200);
  const head = await fetch({ ':method': 'HEAD', ':path': '/head' });
  t.same({ status: head.status, body: head.body }, { status: 200, body: '' }, 'HEAD: headers only');
  // The backend still holds the reset requests: the proxy must have given up on them already.
  t.same([...dataplane.inflight()], [], 'the reset requests were aborted upstream and released their generation');
  // Answer what the backend still holds (one emit releases every waiting request).
  release.emit('go');
});

t.test('SNI: exact name → its certificate; unknown or missing name → the default identity', async (t) => {
  const certFor = (servername: string | undefined): Promise<X509Certificate> =>
    new Promise((resolvePromise, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port, ...(servername === undefined ? {} : { servername }), rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] }, () => {
        const raw = s.getPeerX509Certificate();
        s.end();
        if (raw === undefined) reject(new Error('no certificate'));
        else resolvePromise(raw);
      });
      s.on('error', reject);
    });
  const selection = (kind: string): Promise<number> => scraped(`svc_downstream_tls_certificate_selection_total{listener="127.0.0.1:9889",selection="${kind}"}`);
  const [sniBefore, defaultBefore] = [await selection('sni'), await selection('default')];
  t.match((await certFor('api.example.com')).subjectAltName, /api\.example\.com/);
  t.match((await certFor('API.example.com')).subjectAltName, /api\.example\.com/, 'case-insensitive');
  t.match((await certFor('unknown.example.com')).subjectAltName, /localhost/);
  t.match((await certFor(undefined)).subjectAltName, /localhost/);
  // A handshake without SNI is counted when the server sees it complete, which may be just after
  // the client did: poll, bounded.
  const counted = async (): Promise<number[]> => [(await selection('sni')) - sniBefore, (await selection('default')) - defaultBefore];
  for (let i = 0; i < 50 && (await counted()).join() !== '2,2'; i++) await new Promise((r) => setTimeout(r, 20));
  t.same(await counted(), [2, 2], 'four handshakes counted by the selection each got: two by SNI, two default');
  t.match(await metrics.registry.metrics(), /svc_downstream_tls_certificate_days_remaining\{listener="127\.0\.0\.1:9889",server_name="api\.example\.com"\} 29/);
});

t.test('404 when nothing matches; 405 with Allow; policy rejections', async (t) => {
  const miss = await get('/nothing-here', { host: 'api2.example.org' });
  t.equal(miss.status, 404);
  const none = await run('curl', ['-sS', '-o', '/dev/null', '-w', '%{http_code}', '--cacert', ca.cert, '--resolve', `localhost:${port}:127.0.0.1`, `https://localhost:${port}/x`]);
  t.equal(none.stdout, '404', 'no host-less route for /x');
  const wrong = await get('/writes', { method: 'GET' });
  t.equal(wrong.status, 405);
  t.equal(wrong.headers['allow'], 'POST');
  t.equal(wrong.headers['alt-svc'], 'h3=":9889"; ma=86400', 'our own error responses advertise HTTP/3 too');
  // curl folds a Host header into :authority on HTTP/2; Node's client sends both as given.
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  t.teardown(() => session.close());
  const stream = session.request({ ':path': '/rr', ':authority': `localhost:${port}`, host: 'other.example' });
  const [headers] = (await once(stream, 'response')) as [http2.IncomingHttpHeaders];
  stream.resume();
  t.equal(headers[':status'], 400, 'HTTP/2 :authority differing from Host is rejected');
});

/** The value of one exposition line (`name{labels}`), 0 when absent. */
async function scraped(line: string): Promise<number> {
  const text = await metrics.registry.metrics();
  const found = text.split('\n').find((l) => l.startsWith(`${line} `));
  return found === undefined ? 0 : Number(found.slice(line.length + 1));
}

t.test('round-robin spreads requests evenly over three backends, and every request is counted', async (t) => {
  const series = [
    'svc_requests_total',
    'svc_requests_success',
    'svc_upstream_requests_total{upstream="rr",status_class="2xx",outcome="success"}',
    'svc_backend_requests_total{upstream="rr",backend="r1",status_class="2xx",outcome="success"}',
    'svc_backend_requests_total{upstream="rr",backend="r2",status_class="2xx",outcome="success"}',
    'svc_backend_requests_total{upstream="rr",backend="r3",status_class="2xx",outcome="success"}',
    'svc_upstream_request_latency_ms_count{upstream="rr",outcome="success"}',
    'svc_upstream_request_latency_ms_bucket{le="+Inf",upstream="rr",outcome="success"}',
  ];
  const before = await Promise.all(series.map(scraped));
  const seen: Record<string, number> = {};
  for (let i = 0; i < 30; i++) {
    const r = await get('/rr/x');
    const b = JSON.parse(r.body).backend as string;
    seen[b] = (seen[b] ?? 0) + 1;
  }
  t.same(seen, { b1: 10, b2: 10, b3: 10 });
  const after = await Promise.all(series.map(scraped));
  t.same(after.map((v, i) => v - (before[i] as number)), [30, 30, 30, 10, 10, 10, 30, 30], 'counted once each, in every series');
  t.same(await Promise.all(series.map(scraped)), after, 'a second scrape adds nothing');
});

t.test('configured weights reach the selectors: smooth round-robin 5:1 exactly, random 9:1 within bounds, weight 0 never picked', async (t) => {
  const count = async (p: string, n: number): Promise<Record<string, number>> => {
    const seen: Record<string, number> = {};
    for (let i = 0; i < n; i++) {
      const b = JSON.parse((await get(p)).body).backend as string;
      seen[b] = (seen[b] ?? 0) + 1;
    }
    return seen;
  };
  // Smooth weighted round-robin is deterministic: every 6 picks hold 5 of w1 and 1 of w2.
  t.same(await count('/wrr/x', 12), { b1: 10, b2: 2 }, 'round-robin: 10 and 2 of 12, none for weight 0');
  // Binomial(200, 0.9): mean 180, sd 4.2. Equal weights would give about 100.
  const random = await count('/wrand/x', 200);
  t.equal(random['b3'], undefined, 'random: weight 0 never picked');
  t.ok((random['b1'] ?? 0) >= 160 && (random['b1'] ?? 0) <= 196, `random: ${random['b1']} of 200 on the weight-9 backend (expected about 180)`);
});

t.test('a dead backend: requests fail over to the live one, none fails', async (t) => {
  const statuses: number[] = [];
  for (let i = 0; i < 10; i++) statuses.push((await get('/failover')).status);
  t.same(statuses, Array(10).fill(200));
  t.match(await metrics.registry.metrics(), /svc_backend_requests_total\{upstream="failover",backend="dead",status_class="5xx",outcome="backend_error"\} [1-9]/);
});

t.test('active health: a failing health endpoint takes a backend out, and it returns', async (t) => {
  const transition = (eligible: boolean): Promise<unknown> =>
    new Promise((resolvePromise) => {
      const on = (key: string, now: boolean): void => {
        if (key.startsWith('checked/c3/') && now === eligible) {
          dataplane.events.off('health', on);
          resolvePromise(undefined);
        }
      };
      dataplane.events.on('health', on);
    });
  const failuresBefore = await scraped('svc_health_checks_failure');
  const out = transition(false);
  unhealthy.add('b3');
  t.teardown(() => unhealthy.delete('b3'));
  await out;
  const seen = new Set<string>();
  for (let i = 0; i < 10; i++) seen.add(JSON.parse((await get('/checked')).body).backend as string);
  t.same([...seen], ['b2'], 'only the healthy backend serves');
  const back = transition(true);
  unhealthy.delete('b3');
  await back;
  const all = new Set<string>();
  for (let i = 0; i < 10; i++) all.add(JSON.parse((await get('/checked')).body).backend as string);
  t.same([...all].sort(), ['b2', 'b3'], 'b3 is back after a passing probe');
  // Probes of one backend run one after another, so every failing answer b3 gave was counted
  // before its passing probe; a probe timing out on a loaded machine may add failures, never remove them.
  const answered = failedProbes.get('b3') ?? 0;
  const counted = (await scraped('svc_health_checks_failure')) - failuresBefore;
  t.ok(answered >= 2, `b3 answered ${answered} probes with 500 (unhealthy_threshold is 2)`);
  t.ok(counted >= answered, `each was counted: svc_health_checks_failure grew by ${counted}`);
});

t.test('generation swap: new requests use the new routing, an in-flight request finishes on the old', async (t) => {
  const arrived = once(release, 'arrived');
  const inflight = get('/slow', { servername: 'api.example.com', host: 'api.example.com' });
  await arrived;
  resolved = await resolve(configText(other.port));
  dataplane.commit(dataplane.prepare(resolved, 2));
  const fresh = await get('/fresh', { servername: 'api.example.com', host: 'api.example.com' });
  t.equal(JSON.parse(fresh.body).backend, 'other', 'a new request uses generation 2');
  t.equal(dataplane.inflight().get(1), 1, 'generation 1 still holds the slow request');
  release.emit('go');
  const old = await inflight;
  t.equal(JSON.parse(old.body).backend, 'b1', 'the in-flight request completed on generation 1');
  t.equal(dataplane.inflight().get(1), undefined, 'generation 1 released');
});

t.test('WebSocket upgrade on bootstrap HTTP/1.1 passes through to the backend', async (t) => {
  const socket = tls.connect({ host: '127.0.0.1', port, servername: 'api.example.com', ca: caPem, ALPNProtocols: ['http/1.1'] });
  t.teardown(() => socket.destroy());
  await once(socket, 'secureConnect');
  socket.write('GET /chat HTTP/1.1\r\nhost: api.example.com\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n');
  const first = await nextData(socket);
  t.match(first.toString(), /^HTTP\/1\.1 101 Switching Protocols\r\n/);
  t.equal(upgradeHeaders['upgrade'], 'websocket', 'Upgrade reached the backend');
  t.equal(upgradeHeaders['x-forwarded-for'], '127.0.0.1');
  socket.write('hello tunnel');
  const echo = await nextData(socket);
  t.equal(echo.toString(), 'HELLO TUNNEL', 'bytes flow both ways after the upgrade');
});

t.test('an upgrade to a route without a backend that answers is refused cleanly', async (t) => {
  const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  t.teardown(() => socket.destroy());
  await once(socket, 'secureConnect');
  socket.write('GET /nothing HTTP/1.1\r\nhost: nowhere.example\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n');
  const answer = await nextData(socket);
  t.match(answer.toString(), /^HTTP\/1\.1 404 Not Found\r\n/);
});
