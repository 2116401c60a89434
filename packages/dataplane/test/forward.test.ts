// Forwarding over real sockets: real node:http / node:http2 backends, a node:http front calling
// `forward`, Node's own client. Port 0 everywhere; everything is closed in teardown.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import { createHash } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { forward } from '../src/proxy/forward.ts';
import type { ForwardResult } from '../src/proxy/forward.ts';
import { UpstreamPools } from '../src/upstream/pools.ts';
import type { PoolSpec } from '../src/upstream/pools.ts';
import { upstreamRequestHeaders } from '../src/upstream/headers.ts';
import type { HeaderMap } from '../src/upstream/headers.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-forward-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const backendCert = makeLeaf(dir, 'backend', ca, { sans: ['backend.test', '127.0.0.1'] });
const otherCa = makeCa(dir, 'other-ca');

const pools = new UpstreamPools();
t.teardown(() => pools.destroy());

async function listen(server: net.Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as AddressInfo).port;
}

/** Backend: `/echo` streams the body back; `/slow-headers` never answers; `/slow-body` stalls mid-body; others describe the request. */
const seen: { aborted: number; lastHeaders: http.IncomingHttpHeaders } = { aborted: 0, lastHeaders: {} };
const backendEvents = new EventEmitter();
const backend = http.createServer((req, res) => {
  seen.lastHeaders = req.headers;
  req.on('close', () => {
    if (!res.writableFinished) {
      seen.aborted++;
      backendEvents.emit('aborted');
    }
  });
  if (req.url === '/echo') {
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    req.pipe(res);
  } else if (req.url === '/slow-headers') {
    // never answers
  } else if (req.url === '/slow-body') {
    res.writeHead(200, { 'content-length': '100' });
    res.write('x'.repeat(10));
  } else if (req.url === '/stream') {
    res.writeHead(200);
    const timer = setInterval(() => res.write('chunk\n'), 5);
    res.on('close', () => clearInterval(timer));
  } else {
    res.writeHead(201, { 'x-backend': 'yes', connection: 'keep-alive, x-hop', 'x-hop': 'secret-hop', 'keep-alive': 'timeout=77' });
    res.end(JSON.stringify({ method: req.method, url: req.url }));
  }
});
const backendPort = await listen(backend);

const h2backend = http2.createSecureServer({ cert: readFileSync(backendCert.cert), key: readFileSync(backendCert.key), allowHTTP1: false }, (req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain' });
  res.end(`h2 ${req.httpVersion} ${req.url}`);
});
const h2Port = await listen(h2backend);

function spec(over: Partial<PoolSpec> = {}): PoolSpec {
  return { scheme: 'http', host: '127.0.0.1', port: backendPort, connectTimeoutMs: 1000, connections: 16, tls: undefined, ...over };
}

const timeouts = { headersTimeout: 2000, bodyTimeout: 2000, bodyTotalMs: 10_000 };
let current: { spec: PoolSpec; timeouts: typeof timeouts } = { spec: spec(), timeouts };
const results = new EventEmitter();
/** The next forwarding result (subscribe before sending the request). */
const nextResult = (): Promise<ForwardResult> => once(results, 'result').then(([r]) => r as ForwardResult);

const front = http.createServer(async (req, res) => {
  const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined;
  const headers = upstreamRequestHeaders(req.headers as HeaderMap, { remoteAddress: req.socket.remoteAddress ?? '', authority: undefined, host: req.headers.host, protocol: '1.1' }, req.headers.host);
  const r = await forward(res, {
    pool: pools.get(current.spec),
    method: req.method ?? 'GET',
    path: req.url ?? '/',
    headers,
    body: hasBody ? req : null,
    ...current.timeouts,
    backendProtocol: current.spec.scheme === 'https' ? '2' : '1.1',
    servername: undefined,
  });
  results.emit('result', r);
  if (!r.responseStarted && r.status !== undefined) {
    res.writeHead(r.status, { 'content-type': 'text/plain' });
    res.end(`${r.reason}\n`);
  }
  // The attempt is over: a response it left open (a defect under test) is cut, so that the client
  // side of a failing test fails at once instead of waiting for tap's timeout.
  if (!res.writableEnded) res.destroy();
});
const frontPort = await listen(front);

function request(p: string, options: { method?: string; body?: Buffer; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: frontPort, path: p, method: options.method ?? 'GET', headers: options.headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

t.test('passes status, headers and body; strips hop-by-hop; records the client', async (t) => {
  current = { spec: spec(), timeouts };
  const result = nextResult();
  const r = await request('/hello?x=1', { headers: { host: 'shop.example', connection: 'x-drop', 'x-drop': 'v', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'x-forwarded-for': '198.51.100.7' } });
  t.equal(r.status, 201);
  t.same(JSON.parse(r.body.toString()), { method: 'GET', url: '/hello?x=1' });
  t.equal(r.headers['x-backend'], 'yes');
  t.equal(r.headers['x-hop'], undefined, 'a field named in the backend Connection header is dropped');
  t.not(r.headers['keep-alive'], 'timeout=77', "the backend's keep-alive is not forwarded");
  t.equal(r.headers['via'], '1.1 edge-proxy');
  const h = seen.lastHeaders;
  t.equal(h['x-drop'], undefined, 'a field named in the client Connection header is dropped');
  t.equal(h['x-forwarded-for'], '127.0.0.1', "the client's own x-forwarded-for does not survive");
  t.equal(h['x-forwarded-proto'], 'https');
  t.equal(h['x-forwarded-host'], 'shop.example');
  t.equal(h['forwarded'], 'for=127.0.0.1;proto=https;host="shop.example"');
  t.equal(h['via'], '1.1 edge-proxy');
  t.equal(h['traceparent'], '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
  t.equal(h['host'], 'shop.example');
  t.match(await result, { status: 201, outcome: 'success', health: 'ok' });
});

t.test('streams a 20 MB body both ways unchanged', async (t) => {
  current = { spec: spec(), timeouts };
  const body = Buffer.alloc(20 * 1024 * 1024);
  for (let i = 0; i < body.length; i += 4096) body.writeUInt32LE(i, i);
  const r = await request('/echo', { method: 'POST', body });
  t.equal(r.status, 200);
  t.equal(r.body.length, body.length);
  t.equal(createHash('sha256').update(r.body).digest('hex'), createHash('sha256').update(body).digest('hex'));
});

t.test('no response headers in time: 504, outcome timeout', async (t) => {
  current = { spec: spec(), timeouts: { ...timeouts, headersTimeout: 150 } };
  const result = nextResult();
  const r = await request('/slow-headers');
  t.equal(r.status, 504);
  t.match(await result, { outcome: 'timeout', reason: 'headers_timeout', health: 'timeout', responseStarted: false });
});

t.test('body stalls after the headers: the downstream is cut, outcome timeout', async (t) => {
  current = { spec: spec(), timeouts: { ...timeouts, bodyTimeout: 150 } };
  const result = nextResult();
  await t.rejects(request('/slow-body'), 'the client sees an aborted response, not a complete one');
  t.match(await result, { status: 200, outcome: 'timeout', reason: 'body_timeout', responseStarted: true });
});

t.test('a body longer than body_total is cut', async (t) => {
  current = { spec: spec(), timeouts: { ...timeouts, bodyTotalMs: 100 } };
  const result = nextResult();
  await t.rejects(request('/stream'));
  t.match(await result, { outcome: 'timeout', reason: 'body_timeout', responseStarted: true });
});

t.test('connection refused: 502, outcome backend_error, reason transport', async (t) => {
  const closed = http.createServer();
  const port = await listen(closed);
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  current = { spec: spec({ port }), timeouts };
  const result = nextResult();
  const r = await request('/');
  t.equal(r.status, 502);
  t.match(await result, { outcome: 'backend_error', reason: 'transport', health: 'transport' });
});

t.test('a client that disconnects aborts the backend request', async (t) => {
  current = { spec: spec(), timeouts };
  const before = seen.aborted;
  const result = nextResult();
  const aborted = once(backendEvents, 'aborted');
  await new Promise<void>((resolve) => {
    const req = http.request({ host: '127.0.0.1', port: frontPort, path: '/stream', agent: false }, (res) => {
      res.once('data', () => {
        req.destroy();
        resolve();
      });
    });
    req.end();
  });
  await aborted;
  t.equal(seen.aborted, before + 1, 'the backend saw its request end early');
  t.match(await result, { outcome: 'failure', reason: 'client_closed', health: undefined });
});

t.test('https backend over HTTP/2 with a private CA; a wrong CA is a TLS failure', async (t) => {
  const tls = { verify: true, serverName: 'backend.test', ca: [readFileSync(ca.cert, 'utf8')], cert: undefined, key: undefined, fingerprint: 'ca1' };
  current = { spec: spec({ scheme: 'https', port: h2Port, tls }), timeouts };
  const ok = await request('/h2path');
  t.equal(ok.status, 200);
  t.equal(ok.body.toString(), 'h2 2.0 /h2path', 'the backend saw HTTP/2');
  t.equal(ok.headers['via'], '2 edge-proxy');
  current = { spec: spec({ scheme: 'https', port: h2Port, tls: { ...tls, ca: [readFileSync(otherCa.cert, 'utf8')], fingerprint: 'ca2' } }), timeouts };
  const result = nextResult();
  const bad = await request('/h2path');
  t.equal(bad.status, 502);
  t.match(await result, { outcome: 'backend_error', reason: 'tls', health: 'tls' });
});

t.test('a backend that answers with a smuggling-shaped response: 502 transport, and the cause in the client\'s words', async (t) => {
  const raw = net.createServer((socket) => {
    socket.on('error', () => undefined);
    socket.once('data', () => socket.end('HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'));
  });
  const port = await listen(raw);
  current = { spec: spec({ port }), timeouts };
  const result = nextResult();
  t.equal((await request('/smuggle')).status, 502);
  t.match(await result, { outcome: 'backend_error', reason: 'transport', health: 'transport', cause: 'H1_PROTOCOL: a response with both content-length and transfer-encoding' });
  current = { spec: spec(), timeouts };
  const refusedBy = net.createServer();
  const gone = await listen(refusedBy);
  await new Promise<void>((resolve) => refusedBy.close(() => resolve()));
  current = { spec: spec({ port: gone }), timeouts };
  const refused = nextResult();
  await request('/x');
  t.match(await refused, { cause: /^ECONNREFUSED: connect ECONNREFUSED 127\.0\.0\.1:\d+$/ });
  current = { spec: spec(), timeouts };
  const clientSide = nextResult();
  await request('/hello');
  t.equal((await clientSide).cause, undefined, 'a success has no cause');
});

t.test('pools are shared per identity and closed when not retained', async (t) => {
  const a = pools.get(spec());
  t.equal(pools.get(spec()), a, 'same identity, same pool');
  t.not(pools.get(spec({ connectTimeoutMs: 999 })), a);
  await pools.retain(new Set());
  t.equal(pools.size, 0);
});
