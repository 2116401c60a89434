// End to end: the data plane as a real process (packages/dataplane/src/worker/standalone.ts) on a
// real configuration file, real backends (node:http, and node:http2 over TLS), and independent
// clients: curl (HTTP/1.1, HTTP/2) and ngtcp2's gtlsclient (HTTP/3). Port 0 everywhere; the worker
// and every server are stopped in teardown.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { spawn, execFile } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createReadStream, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { AddressInfo, Socket } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { toolPath } from '../scripts/system-tools.ts';
import { heldRequest, refusedWithin } from './support/drain.ts';
import { listeningLine } from './support/serve.ts';

const run = promisify(execFile);
const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-e2e-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const def = makeLeaf(dir, 'default', ca, { sans: ['localhost', '127.0.0.1'] });
const api = makeLeaf(dir, 'api', ca, { sans: ['api.example.com'] });
const backendCert = makeLeaf(dir, 'backend', ca, { sans: ['backend.test'] });
const gtlsclient = toolPath('gtlsclient');

// --- backends -------------------------------------------------------------------------------
const sockets = new Set<Socket>();
async function listen<S extends http.Server | http2.Http2SecureServer>(server: S): Promise<{ server: S; port: number }> {
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { server, port: (server.address() as AddressInfo).port };
}

let release: () => void = () => undefined;
function h1Backend(name: string): http.Server {
  const server = http.createServer((req, res) => {
    if (req.url === '/upload') {
      const hash = createHash('sha256');
      let n = 0;
      req.on('data', (c: Buffer) => ((n += c.length), hash.update(c)));
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ backend: name, bytes: n, sha256: hash.digest('hex') })));
      return;
    }
    const big = /^\/download\/(\d+)$/.exec(req.url ?? '');
    if (big !== null) {
      const total = Number(big[1]);
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(total) });
      const chunk = Buffer.alloc(64 * 1024, 7);
      let sent = 0;
      const pump = (): void => {
        while (sent < total) {
          const n = Math.min(chunk.length, total - sent);
          sent += n;
          if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
      return;
    }
    if (req.url === '/slow') return; // never answers: the backend request timeout fires
    if (req.url === '/hold') {
      // Head and first bytes at once, the rest when the test calls `release`: in flight across SIGTERM.
      res.writeHead(200, { 'content-type': 'text/plain' }).write('held ');
      release = () => res.end('released');
      return;
    }
    res.writeHead(200, { 'content-type': 'text/plain', 'x-backend': name }).end(`${name} ${req.method} ${req.headers.host} ${req.url} via=${req.headers.via}`);
  });
  server.on('upgrade', (_req: http.IncomingMessage, socket: Socket) => {
    socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n');
    socket.on('data', (d: Buffer) => socket.write(d.toString().toUpperCase()));
    socket.on('end', () => socket.end());
  });
  return server;
}

const a1 = await listen(h1Backend('a1'));
const a2 = await listen(h1Backend('a2'));
const victim = await listen(h1Backend('victim'));
const h2 = await listen(
  http2.createSecureServer({ cert: readFileSync(backendCert.cert), key: readFileSync(backendCert.key) }, (req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`h2backend ${req.httpVersion} ${req.url}`);
  }),
);

// --- the worker -----------------------------------------------------------------------------
const configFile = path.join(dir, 'config.yaml');
writeFileSync(
  configFile,
  `
listen:
  address: 127.0.0.1
  port: 9889
  tls:
    cert: ${def.cert}
    key: ${def.key}
    certificates: [{ server_name: api.example.com, cert: ${api.cert}, key: ${api.key} }]
performance:
  # Generous for a loaded machine (100 MB transfers pass through every route); the timeout under
  # test has its own pool (slow) and the body-idle test waits for its 408 by event.
  timeouts: { backend_request_ms: 10000, connect_ms: 5000, client_body_idle_ms: 1500 }
  body: { max_request_body_bytes: 209715200 }
resilience:
  protocol: { denied_path_prefixes: [/admin], max_headers_count: 40 }
upstream:
  api:
    route: { host: api.example.com, path_prefix: / }
    backends: [{ id: a1, address: "127.0.0.1:${a1.port}" }]
  spread:
    route: { path_prefix: /spread }
    backends:
      - { id: a1, address: "127.0.0.1:${a1.port}" }
      - { id: a2, address: "127.0.0.1:${a2.port}" }
      - { id: victim, address: "127.0.0.1:${victim.port}" }
  writes:
    route: { path_prefix: /spread/items, methods: [POST, PUT] }
    backends: [{ id: a2, address: "127.0.0.1:${a2.port}" }]
  tls-backend:
    route: { path_prefix: /h2 }
    tls: { ca_file: ${ca.cert}, server_name: backend.test }
    backends: [{ id: h2, address: "https://127.0.0.1:${h2.port}" }]
  slow:
    route: { path_prefix: /slow }
    # connect_ms too: the 5000 written above would exceed 400 (EDGE_CONFIG_TIMEOUT_ORDER)
    timeouts: { backend_request_ms: 400, connect_ms: 300 }
    backends: [{ id: a1, address: "127.0.0.1:${a1.port}" }]
  files:
    route: { path_prefix: / }
    backends: [{ id: a1, address: "127.0.0.1:${a1.port}" }]
`,
);

const worker: ChildProcess = spawn(process.execPath, [path.join(root, 'packages/dataplane/src/worker/standalone.ts'), '-c', configFile, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
t.teardown(() => {
  if (worker.exitCode === null) worker.kill('SIGKILL');
});
const line = await listeningLine(worker);
const ready = JSON.parse(line.toString().split('\n')[0] ?? '{}') as { listeners: { udp: number; tcp: number }[] };
const port = ready.listeners[0]?.tcp as number;
t.equal(ready.listeners[0]?.udp, port, 'QUIC and TLS share the port number');

function curl(args: string[]): Promise<{ stdout: string }> {
  return run('curl', ['-sS', '--max-time', '20', '--cacert', ca.cert, '--resolve', `api.example.com:${port}:127.0.0.1`, '--resolve', `localhost:${port}:127.0.0.1`, ...args], { maxBuffer: 256 * 1024 * 1024, encoding: 'utf8' });
}
const status = async (args: string[]): Promise<string> => (await curl(['-o', '/dev/null', '-w', '%{http_code}', ...args])).stdout;

// --- tests ----------------------------------------------------------------------------------
t.test('routing by host, path and method over HTTP/1.1 and HTTP/2 (curl)', async (t) => {
  const h1 = await curl(['--http1.1', `https://api.example.com:${port}/x`]);
  t.match(h1.stdout, /^a1 GET api\.example\.com:\d+ \/x via=1\.1 edge-proxy$/);
  const h2c = await curl(['--http2', '-w', ' %{http_version}', `https://api.example.com:${port}/y`]);
  t.match(h2c.stdout, /^a1 GET api\.example\.com:\d+ \/y via=2 edge-proxy 2$/);
  t.match((await curl([`https://localhost:${port}/spread/items`, '-X', 'POST', '-d', 'x'])).stdout, /^a2 POST /, 'explicit method route');
  // GET is not in the writes route's methods: the shorter /spread prefix (round-robin over a1, a2,
  // victim) answers, so three GETs reach three backends. A router that ignored methods sent all to a2.
  const gets: string[] = [];
  for (let i = 0; i < 3; i++) gets.push((await curl([`https://localhost:${port}/spread/items`])).stdout.split(' ')[0] as string);
  t.same(gets.toSorted(), ['a1', 'a2', 'victim'], 'a method outside the explicit list falls to the shorter prefix');
  t.match((await curl([`https://localhost:${port}/h2/z`])).stdout, /^h2backend 2\.0 \/h2\/z$/, 'https backend over HTTP/2 with a private CA');
});

t.test('HTTP/3 with gtlsclient: 30 requests on one connection, spread round-robin', async (t) => {
  if (gtlsclient === undefined) return void t.fail('gtlsclient missing: install the Debian package ngtcp2-client');
  const out = mkdtempSync(path.join(dir, 'h3-'));
  const urls = Array.from({ length: 30 }, (_, i) => `https://localhost:${port}/spread/${i}`);
  await run(gtlsclient, ['--quiet', '--no-quic-dump', '--no-http-dump', '--exit-on-all-streams-close', '--timeout=10s', `--download=${out}`, '127.0.0.1', String(port), ...urls], { timeout: 30_000 });
  const names = readdirSync(out).map((f) => readFileSync(path.join(out, f), 'utf8').split(' ')[0]);
  t.equal(names.length, 30);
  t.same([...new Set(names)].sort(), ['a1', 'a2', 'victim']);
  t.ok(readdirSync(out).every((f) => readFileSync(path.join(out, f), 'utf8').endsWith('via=3 edge-proxy')), 'backends saw an HTTP/3 hop');
});

t.test('SNI: the exact name gets its certificate, others the default', async (t) => {
  const subject = (servername: string): Promise<string> =>
    new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port, servername, ca: readFileSync(ca.cert), rejectUnauthorized: false }, () => {
        resolve(s.getPeerX509Certificate()?.subjectAltName ?? '');
        s.end();
      });
      s.on('error', reject);
    });
  t.match(await subject('api.example.com'), /api\.example\.com/);
  t.match(await subject('other.example.com'), /localhost/);
});

t.test('policy rejections and timeouts, each with its status', async (t) => {
  t.equal(await status([`https://localhost:${port}/admin/x`]), '403', 'denied path');
  t.equal(await status(['-X', 'GET', `https://localhost:${port}/spread/items`]), '200', 'GET falls back to the all-methods route');
  t.equal(await status(['-X', 'DELETE', `https://api.example.com:${port}/`]), '200');
  const many = Array.from({ length: 45 }, (_, i) => ['-H', `x-h${i}: v`]).flat();
  t.equal(await status([...many, `https://localhost:${port}/x`]), '431', 'too many header fields');
  t.equal(await status([`https://localhost:${port}/slow`]), '504', 'backend request timeout');
  // A client that sends half its body and stops: 408.
  const slow = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: readFileSync(ca.cert), ALPNProtocols: ['http/1.1'] });
  await once(slow, 'secureConnect');
  slow.write('POST /upload HTTP/1.1\r\nhost: localhost\r\ncontent-length: 100\r\n\r\n0123456789');
  const [answer] = (await once(slow, 'data')) as [Buffer];
  t.match(answer.toString(), /^HTTP\/1\.1 408 /, 'client body idle timeout');
  slow.destroy();
});

t.test('100 MB streamed both ways without buffering in the proxy', async (t) => {
  const file = path.join(dir, 'upload.bin');
  const chunk = Buffer.alloc(1024 * 1024);
  for (let i = 0; i < chunk.length; i += 4) chunk.writeUInt32LE(i, i);
  writeFileSync(file, Buffer.concat(Array(100).fill(chunk) as Buffer[]));
  const memory = (field: 'VmRSS' | 'VmHWM'): number => Number(new RegExp(`${field}:\\s+(\\d+)`).exec(readFileSync(`/proc/${worker.pid}/status`, 'utf8'))?.[1] ?? 0) / 1024;
  // Warm up (the heap grows to its working size on the first large transfer), then measure: a
  // proxy that buffered a 100 MiB body would grow by at least that much; a streaming one grows by
  // its buffers and garbage only (measured 0-40 MiB; with 300 MiB bodies the same).
  const warm = path.join(dir, 'warm.bin');
  writeFileSync(warm, Buffer.alloc(20 * 1024 * 1024));
  await curl(['--http1.1', '-T', warm, '-X', 'POST', '-o', '/dev/null', `https://localhost:${port}/upload`]);
  // The request body over HTTP/2 too (the core-stream path of the bootstrap ingress).
  const h2up = JSON.parse((await curl(['--http2', '-T', warm, '-X', 'POST', `https://localhost:${port}/upload`])).stdout) as { bytes: number; sha256: string };
  t.same(h2up, { backend: 'a1', bytes: 20 * 1024 * 1024, sha256: createHash('sha256').update(Buffer.alloc(20 * 1024 * 1024)).digest('hex') } as unknown as typeof h2up, '20 MiB uploaded over HTTP/2');
  await curl(['--http2', '-o', '/dev/null', `https://localhost:${port}/download/${20 * 1024 * 1024}`]);
  const before = memory('VmRSS');
  writeFileSync(`/proc/${worker.pid}/clear_refs`, '5'); // reset the peak (VmHWM) to the current RSS
  const expected = createHash('sha256');
  for await (const c of createReadStream(file)) expected.update(c as Buffer);
  const up = JSON.parse((await curl(['--http1.1', '-T', file, '-X', 'POST', `https://localhost:${port}/upload`])).stdout) as { bytes: number; sha256: string };
  t.same(up, { backend: 'a1', bytes: 100 * 1024 * 1024, sha256: expected.digest('hex') } as unknown as typeof up);
  const down = await curl(['--http2', '-o', '/dev/null', '-w', '%{size_download} %{http_code}', `https://localhost:${port}/download/${100 * 1024 * 1024}`]);
  t.equal(down.stdout, `${100 * 1024 * 1024} 200`);
  const growth = memory('VmHWM') - before;
  t.ok(growth < 80, `worker peak RSS grew ${growth.toFixed(0)} MiB (from ${before.toFixed(0)} MiB) while 200 MiB passed through`);
});

t.test('WebSocket upgrade on bootstrap HTTP/1.1', async (t) => {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: readFileSync(ca.cert), ALPNProtocols: ['http/1.1'] });
  t.teardown(() => s.destroy());
  await once(s, 'secureConnect');
  s.write('GET /chat HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
  const [head] = (await once(s, 'data')) as [Buffer];
  t.match(head.toString(), /^HTTP\/1\.1 101 /);
  s.write('ping');
  const [echo] = (await once(s, 'data')) as [Buffer];
  t.equal(echo.toString(), 'PING');
});

t.test('a backend dies mid-run: every request still succeeds (failover, then its circuit breaker opens)', async (t) => {
  const codes: string[] = [];
  for (let i = 0; i < 30; i++) {
    if (i === 10) {
      await new Promise<void>((resolve) => {
        victim.server.close(() => resolve());
        for (const s of sockets) if ((s.address() as AddressInfo).port === victim.port) s.destroy();
      });
    }
    codes.push(await status([`https://localhost:${port}/spread/${i}`]));
  }
  t.same(codes, Array(30).fill('200'));
});

t.test('SIGTERM: the worker drains (the request in flight completes, new connections are refused) and exits 0', async (t) => {
  const held = heldRequest(port, readFileSync(ca.cert));
  t.equal(await held.started, 'held ', 'a request is in flight: head and first bytes through the proxy');
  const exited = once(worker, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  worker.kill('SIGTERM');
  t.equal(await refusedWithin(port, 30_000), 'ECONNREFUSED', 'after SIGTERM the listener refuses new connections');
  t.equal(worker.exitCode, null, 'and the worker is still running: the request in flight holds the drain open');
  release();
  t.same(await held.done, { status: 200, body: 'held released' }, 'the request in flight completes after SIGTERM');
  t.same(await exited, [0, null], 'the worker exits by itself with code 0, not by a signal');
});
