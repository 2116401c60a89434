// Underscore twins of forwarding and framing headers, end to end (issue 38, finding 9):
// `edge-proxy serve` with two workers and a backend that records the header names it receives.
// A CGI, WSGI or Rack server maps `X_Forwarded_For` and `X-Forwarded-For` to one variable
// (`HTTP_X_FORWARDED_FOR`, RFC 3875 §4.1.18; Puma CVE-2024-45614): a twin that reached it could
// stand in for the address the proxy recorded. On HTTP/1.1 (raw TLS bytes, names as written),
// HTTP/2 (node:http2) and HTTP/3 (our client) every twin is absent at the backend while the
// proxy's own forwarding fields are present and correct, and other names with `_` still pass.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { SignJWT } from 'jose';
import { serve } from './support/serve.ts';
import { goodClaims, AUDIENCE, ISSUER } from './support/idp.ts';
import { listenTracked } from './support/backends.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-underscore-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

/** Per request path: the raw header lines the backend received (names as sent on the wire). */
const seen = new Map<string, string[]>();
const backendPort = await listenTracked(
  t,
  http.createServer((req, res) => {
    seen.set(req.url ?? '', req.rawHeaders);
    req.resume();
    req.on('end', () => res.end('ok\n'));
  }),
);

// The authenticated pool reads its token from `x-token` (HS256): a twin `x_token` must not
// reach its backend beside the token the proxy verified.
const SECRET = 'underscore-twin-hmac-secret-0123456789';
const secretFile = path.join(dir, 'jwt.secret');
writeFileSync(secretFile, SECRET, { mode: 0o600 });
const token = await new SignJWT(goodClaims()).setProtectedHeader({ alg: 'HS256', typ: 'JWT' }).sign(new TextEncoder().encode(SECRET));

const [port, mport] = [await freePort(), await freePort()];
const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${backendPort}" }]
  api:
    route: { path_prefix: /api }
    backends: [{ id: api, address: "127.0.0.1:${backendPort}" }]
    auth: { jwt: { issuer: "${ISSUER}", audiences: [${AUDIENCE}], algorithms: [HS256], secret_ref: { ref: "file://${secretFile}" }, header: x-token } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
`,
);
t.teardown(() => served.stop());

/** The twins of the finding and more of the same shape: each folds onto a field the proxy sets, drops or frames with. */
const TWINS: [string, string][] = [
  ['X_Forwarded_For', '6.6.6.6'],
  ['X-Forwarded_Proto', 'http'],
  ['X_Forwarded_Host', 'evil.example'],
  ['x_forwarded_port', '80'],
  ['X_Forwarded_Prefix', '/admin'],
  ['X_Real_IP', '6.6.6.6'],
  ['X_Client_IP', '6.6.6.6'],
  ['True_Client_IP', '6.6.6.6'],
  ['Transfer_Encoding', 'chunked'],
  ['Content_Length', '100'],
  ['Keep_Alive', 'timeout=1'],
  ['Proxy_Authorization', 'Basic ZXZpbDpldmls'],
  ['X_Request_Id', 'forged-id'],
];
/** Names with `_` that fold onto nothing of the kind: passed on as they are. */
const KEPT: [string, string][] = [
  ['My_Header', 'kept'],
  ['X_Api_Key', 'kept'],
];

const fold = (name: string): string => name.toLowerCase().replaceAll('_', '-');

/** Checks what the backend received for `p`: no twin, the proxy's fields, the other underscores. */
function check(t: Test, p: string, protocol: string): void {
  const raw = seen.get(p);
  t.ok(raw !== undefined, `${protocol}: the request reached the backend`);
  if (raw === undefined) return;
  const names = raw.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase());
  const values = (name: string): string[] => raw.filter((_, i) => i % 2 === 1 && (raw[i - 1] as string).toLowerCase() === name);
  for (const [twin] of TWINS) t.notOk(names.includes(twin.toLowerCase()), `${protocol}: ${twin} absent`);
  t.same(
    names.filter((n) => n.includes('_') && TWINS.some(([twin]) => fold(twin) === fold(n))),
    [],
    `${protocol}: no name folding onto a twin's`,
  );
  for (const [name, value] of KEPT) t.same(values(name.toLowerCase()), [value], `${protocol}: ${name} passed on`);
  t.same(values('x-forwarded-for'), ['127.0.0.1'], `${protocol}: our X-Forwarded-For, once`);
  t.same(values('x-forwarded-proto'), ['https'], `${protocol}: our X-Forwarded-Proto`);
  t.same(values('x-forwarded-host'), [`localhost:${port}`], `${protocol}: our X-Forwarded-Host`);
  t.same(values('forwarded'), [`for=127.0.0.1;proto=https;host="localhost:${port}"`], `${protocol}: our Forwarded`);
  t.equal(values('x-request-id').length, 1, `${protocol}: one X-Request-Id`);
  t.notSame(values('x-request-id'), ['forged-id'], `${protocol}: not the twin's value`);
  t.same(values('transfer-encoding'), [], `${protocol}: no Transfer-Encoding on a GET without a body`);
  t.same(values('content-length'), [], `${protocol}: no Content-Length either`);
  t.same(values('proxy-authorization'), [], `${protocol}: no Proxy-Authorization`);
}

t.test('HTTP/1.1: every underscore twin is dropped, names as the client wrote them', async (t) => {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  await once(s, 'secureConnect');
  let answer = '';
  s.setEncoding('latin1');
  s.on('data', (d: string) => (answer += d));
  const closed = once(s, 'close');
  const lines = [...TWINS, ...KEPT].map(([n, v]) => `${n}: ${v}\r\n`).join('');
  s.write(`GET /h1 HTTP/1.1\r\nhost: localhost:${port}\r\n${lines}connection: close\r\n\r\n`);
  await closed;
  t.match(answer, /^HTTP\/1\.1 200 /);
  check(t, '/h1', 'HTTP/1.1');
});

t.test('HTTP/2: every underscore twin is dropped', async (t) => {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem, servername: 'localhost', host: '127.0.0.1' } as http2.SecureClientSessionOptions);
  session.on('error', () => {});
  t.teardown(() => session.destroy());
  const headers: http2.OutgoingHttpHeaders = { ':method': 'GET', ':path': '/h2', ':scheme': 'https', ':authority': `localhost:${port}` };
  for (const [n, v] of [...TWINS, ...KEPT]) headers[n.toLowerCase()] = v;
  const req = session.request(headers, { endStream: true });
  const [response] = (await once(req, 'response')) as [http2.IncomingHttpHeaders];
  req.resume();
  await once(req, 'end');
  t.equal(response[':status'], 200);
  check(t, '/h2', 'HTTP/2');
});

t.test('HTTP/3: every underscore twin is dropped', async (t) => {
  const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
  t.teardown(() => c.close(true));
  const headers: Record<string, string> = {};
  for (const [n, v] of [...TWINS, ...KEPT]) headers[n] = v;
  const r = await c.fetch({ path: '/h3', headers, timeoutMs: 10_000 });
  t.equal(r.status, 200);
  check(t, '/h3', 'HTTP/3');
});

t.test("the twin of the header a route's authentication read (x_token beside x-token) is dropped there, and passes where nothing reads it", async (t) => {
  const forged = 'forged.claims.token';
  const sent: [string, string][] = [
    ['x-token', token],
    ['x_token', forged],
    ['X_Forwarded_For', '6.6.6.6'],
  ];
  // HTTP/1.1, as written.
  for (const p of ['/api/h1', '/open/h1']) {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
    await once(s, 'secureConnect');
    let answer = '';
    s.setEncoding('latin1');
    s.on('data', (d: string) => (answer += d));
    const closed = once(s, 'close');
    s.write(`GET ${p} HTTP/1.1\r\nhost: localhost:${port}\r\n${sent.map(([n, v]) => `${n}: ${v}\r\n`).join('')}connection: close\r\n\r\n`);
    await closed;
    t.match(answer, /^HTTP\/1\.1 200 /, `${p}: served (the token verified on /api)`);
  }
  // HTTP/2 and HTTP/3.
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem, servername: 'localhost', host: '127.0.0.1' } as http2.SecureClientSessionOptions);
  session.on('error', () => {});
  t.teardown(() => session.destroy());
  const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
  t.teardown(() => c.close(true));
  for (const p of ['/api/h2', '/open/h2']) {
    const req = session.request({ ':method': 'GET', ':path': p, ':scheme': 'https', ':authority': `localhost:${port}`, ...Object.fromEntries(sent.map(([n, v]) => [n.toLowerCase(), v])) }, { endStream: true });
    const [response] = (await once(req, 'response')) as [http2.IncomingHttpHeaders];
    req.resume();
    await once(req, 'end');
    t.equal(response[':status'], 200, p);
  }
  for (const p of ['/api/h3', '/open/h3']) t.equal((await c.fetch({ path: p, headers: Object.fromEntries(sent), timeoutMs: 10_000 })).status, 200, p);
  for (const protocol of ['h1', 'h2', 'h3']) {
    const guarded = seen.get(`/api/${protocol}`) ?? [];
    const open = seen.get(`/open/${protocol}`) ?? [];
    const value = (raw: string[], name: string): string[] => raw.filter((_, i) => i % 2 === 1 && (raw[i - 1] as string).toLowerCase() === name);
    t.same(value(guarded, 'x-token'), [token], `${protocol} /api: the verified token reaches the backend`);
    t.same(value(guarded, 'x_token'), [], `${protocol} /api: its twin does not`);
    t.same(value(open, 'x_token'), [forged], `${protocol} /open: no authentication reads x-token there: the name passes`);
    t.same([...value(guarded, 'x_forwarded_for'), ...value(open, 'x_forwarded_for')], [], `${protocol}: X_Forwarded_For dropped on both`);
  }
});
