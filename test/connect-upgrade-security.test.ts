// CONNECT and Upgrade past policy, end to end (issue 38, findings 3 and 8): `edge-proxy serve` with
// two workers, real backends that record every byte they receive, and clients that send the
// hostile bytes verbatim (raw TLS sockets for HTTP/1.1, node:http2 and hand-built HTTP/2 frames,
// our HTTP/3 client).
// - CONNECT is refused (405 with Allow) on every protocol, logged, counted by the protocol-policy
//   metric, never forwarded and never charged to a backend: a burst of them leaves the pool
//   healthy; `allow_connect: true` does not validate (EDGE_CONFIG_NOT_BUILT).
// - `Upgrade: h2c` is never spliced: the request is served as a plain one without its Upgrade, and
//   the HTTP/2 connection the client then tries to open on it never reaches a backend; a lenient
//   backend that answers 101 to anything is not spliced; WebSocket still is.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Socket } from 'node:net';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import { END_HEADERS, END_STREAM, HEADERS, PREFACE, RST_STREAM, frame, settings } from './support/h2-frames.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-connect-upgrade-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

// --- backends -------------------------------------------------------------------------------
interface Seen {
  readonly backend: string;
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
}
/** Every request the HTTP backends received, in order. */
const seen: Seen[] = [];
/** TCP connections each backend accepted. */
const connections = { app: 0, lenient: 0, ws: 0 };
const listen = (s: net.Server): Promise<number> => listenTracked(t, s);

// The application: an ordinary HTTP/1.1 server with no 'upgrade' listener (an Upgrade it gets is
// answered like any request, and it reads on).
const app = http.createServer((req, res) => {
  seen.push({ backend: 'app', method: req.method ?? '', url: req.url ?? '', headers: req.headers });
  req.resume();
  req.on('end', () => res.writeHead(200, { 'content-type': 'text/plain' }).end(`app ${req.url}\n`));
});
app.on('connection', () => connections.app++);
const appPort = await listen(app);

// The lenient backend: answers 101 `Upgrade: h2c` to whatever request head it gets, and records
// every byte it receives, before and after (what would cross a splice).
let lenientBytes = '';
const lenient = net.createServer((socket) => {
  connections.lenient++;
  let head = '';
  socket.setEncoding('latin1');
  socket.on('data', (d: string) => {
    lenientBytes += d;
    if (head.includes('\r\n\r\n')) return;
    head += d;
    if (head.includes('\r\n\r\n')) socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: Upgrade\r\n\r\n');
  });
  socket.on('error', () => socket.destroy());
  socket.on('end', () => socket.end());
});
const lenientPort = await listen(lenient);

// A WebSocket-style backend: switches to `websocket` and echoes upper-cased.
const ws = http.createServer((req, res) => {
  seen.push({ backend: 'ws', method: req.method ?? '', url: req.url ?? '', headers: req.headers });
  res.writeHead(426).end();
});
ws.on('connection', () => connections.ws++);
ws.on('upgrade', (req: http.IncomingMessage, socket: Socket) => {
  seen.push({ backend: 'ws', method: req.method ?? '', url: req.url ?? '', headers: req.headers });
  socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n');
  socket.on('data', (d: Buffer) => socket.write(d.toString().toUpperCase()));
  socket.on('end', () => socket.end());
  socket.on('error', () => socket.destroy());
});
const wsPort = await listen(ws);

// --- the proxy: two workers, breakers that open after 3 failures, the access log on ------------
const [port, mport] = [await freePort(), await freePort()];
const configText = (protocol: string): string => `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2 }
resilience:
  protocol: { denied_path_prefixes: [/internal]${protocol} }
  circuit_breaker: { failure_threshold: 3, open_ms: 60000 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${appPort}" }]
  lenient:
    route: { path_prefix: /lenient }
    backends: [{ id: lenient, address: "127.0.0.1:${lenientPort}" }]
  ws:
    route: { path_prefix: /ws }
    backends: [{ id: ws, address: "127.0.0.1:${wsPort}" }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
  access_log: { enabled: true }
`;
const served = await serve(path.join(dir, 'config.yaml'), configText(''));
t.teardown(() => served.stop());

// --- clients --------------------------------------------------------------------------------
async function h1Socket(): Promise<tls.TLSSocket> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  await once(s, 'secureConnect');
  return s;
}

/** Everything the proxy sends until it closes the connection (bounded by `ms`). */
function readToClose(s: tls.TLSSocket, ms = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`connection still open after ${ms} ms; got ${JSON.stringify(text.slice(0, 300))}`));
    }, ms);
    s.setEncoding('latin1');
    s.on('data', (d: string) => (text += d));
    s.on('error', () => {});
    s.once('close', () => {
      clearTimeout(timer);
      resolve(text);
    });
  });
}

/** Bytes written verbatim on a new connection; the whole answer, up to the close. */
async function rawH1(bytes: string | Buffer): Promise<string> {
  const s = await h1Socket();
  const done = readToClose(s);
  s.write(bytes);
  return done;
}
const statusOf = (answer: string): number => Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0);
const statuses = (answer: string): number[] => [...answer.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));

function h2(): http2.ClientHttp2Session {
  const s = http2.connect(`https://localhost:${port}`, { ca: caPem, servername: 'localhost', host: '127.0.0.1' } as http2.SecureClientSessionOptions);
  s.on('error', () => {});
  t.teardown(() => s.destroy());
  return s;
}
const h2session = h2();

/** One HTTP/2 request as given (no default pseudo-headers): status and headers, or `reset <code>`. */
function rawH2(headers: http2.OutgoingHttpHeaders): Promise<{ status: string; headers: http2.IncomingHttpHeaders }> {
  return new Promise((resolve) => {
    const req = h2session.request(headers, { endStream: headers[':method'] !== 'CONNECT' });
    if (headers[':method'] === 'CONNECT') req.end();
    let got: http2.IncomingHttpHeaders = {};
    req.on('response', (h) => (got = h));
    req.on('error', () => {});
    req.resume();
    req.on('close', () => resolve(got[':status'] === undefined ? { status: `reset ${req.rstCode}`, headers: {} } : { status: String(got[':status']), headers: got }));
  });
}

/** An HPACK literal field without indexing, new name, no Huffman (RFC 7541 §6.2.2); short strings only. */
function hpackLiteral(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x00, name.length]), Buffer.from(name, 'latin1'), Buffer.from([value.length]), Buffer.from(value, 'latin1')]);
}

/** HEADERS frame bytes of stream 1 for the fields given verbatim (what node's client will not send). */
function headersFrame(fields: [string, string][]): Buffer {
  return frame(HEADERS, END_HEADERS | END_STREAM, 1, Buffer.concat(fields.map(([n, v]) => hpackLiteral(n, v))));
}

/**
 * Reads HTTP/2 frames from `s` until stream 1 is answered: the first HPACK byte of its response
 * HEADERS (`0x88` :status 200, RFC 7541 Appendix A), `reset <code>`, or `goaway`.
 */
function h2Answer(s: tls.TLSSocket): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error('no HTTP/2 answer in time'));
    }, 10_000);
    const done = (r: string): void => {
      clearTimeout(timer);
      s.destroy();
      resolve(r);
    };
    s.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) return;
        const type = buf[3];
        const stream = buf.readUInt32BE(5) & 0x7fffffff;
        const payload = buf.subarray(9, 9 + len);
        buf = buf.subarray(9 + len);
        if (stream === 1 && type === HEADERS) return done(`0x${(payload[0] ?? 0).toString(16)}`);
        if (stream === 1 && type === RST_STREAM) return done(`reset ${payload.readUInt32BE(0)}`);
        if (type === 0x7) return done('goaway');
      }
    });
    s.on('error', () => {});
    s.on('close', () => done('closed'));
  });
}

const h3 = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
t.teardown(() => h3.close(true));

/** One HTTP/3 request: status and headers, or `reset <code>`. */
async function rawH3(options: Parameters<Http3ClientSession['fetch']>[0]): Promise<{ status: string; headers: Record<string, string | string[] | undefined> }> {
  try {
    const r = await h3.fetch({ timeoutMs: 10_000, ...options });
    return { status: String(r.status), headers: r.headers as Record<string, string | string[] | undefined> };
  } catch (err) {
    return { status: `reset ${(err as { code?: string }).code}`, headers: {} };
  }
}

/** Sum of a counter or gauge over its label sets, from the supervisor's metrics endpoint (`match`: a label filter). */
async function metricSum(name: string, match = ''): Promise<number> {
  const text = await new Promise<string>((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
        let b = '';
        res.on('data', (c: Buffer) => (b += c.toString()));
        res.on('end', () => resolve(b));
      })
      .on('error', reject);
  });
  let sum = 0;
  for (const line of text.split('\n')) if ((line.startsWith(`${name}{`) || line.startsWith(`${name} `)) && line.includes(match)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

const DEFAULT_ALLOW = 'GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS';
const accessLines = (p: (l: Record<string, unknown>) => boolean): Record<string, unknown>[] => served.lines.filter((l) => l['msg'] === 'access' && p(l));

// --- finding 3: CONNECT ---------------------------------------------------------------------
t.test('CONNECT on HTTP/1.1, HTTP/2 and HTTP/3: 405 with Allow, a log line, nothing forwarded; 15 of each leave the pool healthy', async (t) => {
  const before = { seen: seen.length, app: connections.app, denied: await metricSum('svc_policy_denied'), health: await metricSum('svc_health_failures_total'), errors: await metricSum('svc_backend_errors'), backend: await metricSum('svc_backend_requests_total') };
  const target = `127.0.0.1:${appPort}`;
  const N = 15;
  for (let i = 0; i < N; i++) {
    // HTTP/1.1: answered on the socket, which then closes (tunnel bytes sent at once are dropped).
    const a = await rawH1(`CONNECT ${target} HTTP/1.1\r\nhost: ${target}\r\n\r\nGET /internal/secret HTTP/1.1\r\nhost: localhost\r\n\r\n`);
    t.equal(statusOf(a), 405, `h1 CONNECT ${i}`);
    t.match(a, new RegExp(`\\r\\nallow: ${DEFAULT_ALLOW}\\r\\n`, 'i'), 'h1: Allow');
    t.match(a, /EDGE_POLICY_METHOD_NOT_ALLOWED/, 'h1: the code');
    t.same(statuses(a), [405], 'h1: one answer, the bytes after the CONNECT are not served');
    const b = await rawH2({ ':method': 'CONNECT', ':authority': target });
    t.equal(b.status, '405', `h2 CONNECT ${i}`);
    t.equal(b.headers['allow'], DEFAULT_ALLOW, 'h2: Allow');
    const c = await rawH3({ method: 'CONNECT', authority: target });
    t.equal(c.status, '405', `h3 CONNECT ${i}`);
    t.equal(c.headers['allow'], DEFAULT_ALLOW, 'h3: Allow');
  }
  t.same(seen.slice(before.seen), [], 'the backends saw no request');
  t.equal(connections.app, before.app, 'and no connection was opened to the pool');
  t.equal((await metricSum('svc_policy_denied')) - before.denied, 3 * N, 'each counted by the protocol-policy metric');
  t.equal(await metricSum('svc_health_failures_total'), before.health, 'no passive health failure');
  t.equal(await metricSum('svc_backend_errors'), before.errors, 'no backend error');
  t.equal(await metricSum('svc_backend_requests_total'), before.backend, 'no backend request counted');
  t.equal(await metricSum('svc_circuit_breaker_state', 'backend="app"'), 0, 'the breaker stayed closed');
  // The refusal log's line (the first refusal of a worker at once), and an access line each.
  const line = await served.waitFor((l) => l['msg'] === 'downstream requests refused' && l['reason'] === 'connect_refused');
  t.match(line, { level: 'warn', role: 'worker', example_source: '127.0.0.1' });
  t.ok((line['requests'] as number) >= 1);
  for (const protocol of ['1.1', '2', '3']) {
    const connects = (): Record<string, unknown>[] => accessLines((l) => l['method'] === 'CONNECT' && l['protocol'] === protocol);
    // Written by the workers as the answers go out: wait for the last.
    await served.waitFor(() => connects().length >= N);
    const lines = connects();
    t.equal(lines.length, N, `${N} access lines for HTTP/${protocol}`);
    t.ok(lines.every((l) => l['status'] === 405 && l['code'] === 'EDGE_POLICY_METHOD_NOT_ALLOWED' && l['reason'] === 'connect_disabled' && l['upstream'] === null), `HTTP/${protocol}: 405, refused before routing`);
  }
  // The pool serves, on every protocol.
  t.equal(statusOf(await rawH1('GET /after HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n')), 200, 'h1 GET after');
  t.equal((await rawH2({ ':method': 'GET', ':scheme': 'https', ':authority': `localhost:${port}`, ':path': '/after' })).status, '200', 'h2 GET after');
  t.equal((await rawH3({ path: '/after' })).status, '200', 'h3 GET after');
});

t.test('extended CONNECT (:protocol) is reset as malformed on HTTP/2 and HTTP/3, never forwarded', async (t) => {
  const before = seen.length;
  for (const protocol of ['websocket', 'connect-udp', 'h2c']) {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['h2'] });
    await once(s, 'secureConnect');
    const answer = h2Answer(s);
    s.write(Buffer.concat([PREFACE, settings(), headersFrame([[':method', 'CONNECT'], [':protocol', protocol], [':scheme', 'https'], [':path', '/ws/x'], [':authority', 'localhost']])]));
    // RFC 8441 §3: without SETTINGS_ENABLE_CONNECT_PROTOCOL from us, :protocol is malformed (PROTOCOL_ERROR, 1).
    t.equal(await answer, 'reset 1', `h2 :protocol ${protocol}`);
    t.equal((await rawH3({ method: 'CONNECT', protocol, path: '/ws/x' })).status, 'reset H3_MESSAGE_ERROR', `h3 :protocol ${protocol}`);
  }
  t.same(seen.slice(before), [], 'the backends saw nothing');
  t.equal((await rawH2({ ':method': 'GET', ':scheme': 'https', ':authority': `localhost:${port}`, ':path': '/after-extended' })).status, '200');
});

t.test('allow_connect: true, or a CONNECT allowlist, is refused by validation: EDGE_CONFIG_NOT_BUILT', async (t) => {
  const cases: [string, string][] = [
    [', allow_connect: true', 'resilience.protocol.allow_connect'],
    [', allow_connect: true, allowed_methods: [GET, CONNECT]', 'resilience.protocol.allow_connect'],
    [', connect_allowed_ports: [443]', 'resilience.protocol.connect_allowed_ports'],
    [', connect_allowed_authorities: ["db:5432"]', 'resilience.protocol.connect_allowed_authorities'],
  ];
  for (const [keys, at] of cases) {
    const file = path.join(dir, 'connect-on.yaml');
    writeFileSync(file, configText(keys));
    const r = await runEdgeProxy(['-c', file]);
    t.not(r.code, 0, `${keys}: refused`);
    const out = r.stdout + r.stderr;
    t.match(out, /EDGE_CONFIG_NOT_BUILT/, `${keys}: as not built`);
    t.match(out, at, `${keys}: at ${at}`);
  }
  // The same file without them validates.
  const file = path.join(dir, 'connect-off.yaml');
  writeFileSync(file, configText(', allow_connect: false'));
  t.equal((await runEdgeProxy(['-c', file])).code, 0);
});

// --- finding 8: h2c and other Upgrades ------------------------------------------------------
/** The h2c upgrade request of RFC 7540 §3.2 for `target`, with the client's SETTINGS. */
const h2cUpgrade = (target: string, extra = ''): string => `GET ${target} HTTP/1.1\r\nhost: localhost\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\nconnection: Upgrade, HTTP2-Settings\r\n${extra}\r\n`;
/** What the attacker sends once it believes the upgrade happened: the HTTP/2 preface and a request for the denied path (and one the normalizer refuses). */
const smuggled = Buffer.concat([
  PREFACE,
  settings(),
  frame(HEADERS, END_HEADERS | END_STREAM, 1, Buffer.concat([hpackLiteral(':method', 'GET'), hpackLiteral(':scheme', 'http'), hpackLiteral(':path', '/internal/secret'), hpackLiteral(':authority', 'localhost')])),
  frame(HEADERS, END_HEADERS | END_STREAM, 3, Buffer.concat([hpackLiteral(':method', 'GET'), hpackLiteral(':scheme', 'http'), hpackLiteral(':path', '/a%2fb'), hpackLiteral(':authority', 'localhost')])),
]);

t.test('Upgrade: h2c is served as a plain request; the HTTP/2 connection smuggled after it reaches no backend', async (t) => {
  const before = seen.length;
  const s = await h1Socket();
  const all = readToClose(s);
  s.write(h2cUpgrade('/h2c-probe'));
  // Both at once as well as after the answer: what follows the head is never a tunnel.
  s.write(smuggled);
  const answer = await all;
  t.equal(statusOf(answer), 200, 'the request is answered as a plain one');
  t.notMatch(answer, /HTTP\/1\.1 101 /, 'no 101');
  t.match(answer, /app \/h2c-probe/, "the backend's answer");
  t.notMatch(answer, /app \/internal|app \/a/, 'nothing else was served');
  t.same(
    seen.slice(before).map((x) => x.url),
    ['/h2c-probe'],
    'the backend saw the plain request only',
  );
  const got = seen[before] as Seen;
  t.notOk('upgrade' in got.headers, 'without Upgrade');
  t.notOk('http2-settings' in got.headers, 'without HTTP2-Settings');
  t.equal(got.headers['connection'], 'keep-alive', "with the proxy's own Connection");
  // The access log has it (the finding: the spliced connection had none).
  const line = await served.waitFor((l) => l['msg'] === 'access' && l['path'] === '/h2c-probe');
  t.match(line, { status: 200, upstream: 'app', protocol: '1.1' });
  // The same, the attacker waiting for the answer before sending the preface.
  const s2 = await h1Socket();
  const all2 = readToClose(s2);
  let first = '';
  await new Promise<void>((resolve) => {
    s2.on('data', function on(d: string) {
      first += d;
      if (first.includes('app /h2c-wait')) {
        s2.off('data', on);
        resolve();
      }
    });
    s2.write(h2cUpgrade('/h2c-wait'));
  });
  s2.write(smuggled);
  const rest = await all2;
  t.match(first, /^HTTP\/1\.1 200 /);
  t.notMatch(rest, /app \/internal|app \/a/, 'the preface is no tunnel: nothing served after');
  t.same(
    seen.slice(before).map((x) => x.url),
    ['/h2c-probe', '/h2c-wait'],
    'the backend never saw /internal/secret nor /a%2fb',
  );
});

t.test('a lenient backend that answers 101 to anything is never spliced (502, coded); what follows never reaches it', async (t) => {
  lenientBytes = '';
  const healthBefore = await metricSum('svc_health_failures_total');
  // h2c offered: forwarded as a plain request, whose 101 the upstream client refuses.
  const a = await rawH1(Buffer.concat([Buffer.from(h2cUpgrade('/lenient/h2c')), smuggled]));
  t.equal(statusOf(a), 502, 'h2c: 502');
  t.match(a, /\(EDGE_UPSTREAM_TRANSPORT\)/, 'with its code (the upstream client refuses a 101 it did not ask for)');
  t.same(statuses(a), [502], 'one answer');
  // WebSocket and h2c offered: the backend is offered WebSocket alone, and its 101 to h2c is refused.
  const b = await rawH1(Buffer.concat([Buffer.from('GET /lenient/ws HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket, h2c\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'), smuggled]));
  t.equal(statusOf(b), 502, 'websocket, h2c: 502');
  t.match(b, /\(EDGE_UPSTREAM_PROTOCOL\)/);
  t.same(statuses(b), [502], 'one answer');
  // What it received, request head by request head (the GET, idempotent, was tried twice: a
  // transport failure of the only backend).
  const heads = lenientBytes.split(/(?=GET \/lenient\/)/);
  const plain = heads.filter((h) => h.startsWith('GET /lenient/h2c HTTP/1.1\r\n'));
  t.ok(plain.length >= 1, 'the backend got the first request');
  t.ok(
    plain.every((h) => !/\r\n(?:upgrade|http2-settings):/i.test(h) && /\r\nconnection: keep-alive\r\n/i.test(h)),
    'without its Upgrade and HTTP2-Settings',
  );
  const upgrade = heads.filter((h) => h.startsWith('GET /lenient/ws HTTP/1.1\r\n'));
  t.equal(upgrade.length, 1, 'the upgrade was tried once');
  t.match(upgrade[0], /\r\nupgrade: websocket\r\nconnection: upgrade\r\n/i, 'offered WebSocket alone');
  t.equal(heads.length, plain.length + upgrade.length, 'nothing else reached it');
  t.notMatch(lenientBytes, /upgrade:[^\r]*h2c|PRI \* HTTP\/2\.0|\/internal|%2f/i, 'h2c never offered; no byte the client sent after the heads');
  // The failure log names the refusal.
  const failure = await served.waitFor((l) => l['msg'] === 'upstream failure answered with 502' && l['code'] === 'EDGE_UPSTREAM_PROTOCOL');
  t.match(failure, { upstream: 'lenient', backend: 'lenient' });
  t.ok((await metricSum('svc_health_failures_total')) >= healthBefore, 'a lenient backend is the backend at fault');
});

t.test('WebSocket is still spliced, with the forwarding headers; h2c offered beside it is not passed on', async (t) => {
  const before = seen.length;
  const s = await h1Socket();
  t.teardown(() => s.destroy());
  s.write('GET /ws/chat HTTP/1.1\r\nhost: localhost\r\nupgrade: h2c, websocket\r\nconnection: Upgrade, HTTP2-Settings\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\nx_forwarded_for: 6.6.6.6\r\n\r\n');
  const [head] = (await once(s, 'data')) as [Buffer];
  t.match(head.toString(), /^HTTP\/1\.1 101 /);
  s.write('ping');
  const [echo] = (await once(s, 'data')) as [Buffer];
  t.equal(echo.toString(), 'PING', 'the tunnel carries bytes both ways');
  const got = seen.slice(before);
  t.equal(got.length, 1);
  t.match(got[0], { backend: 'ws', url: '/ws/chat', headers: { upgrade: 'websocket', connection: 'upgrade', 'x-forwarded-for': '127.0.0.1' } });
  t.notOk('http2-settings' in (got[0] as Seen).headers);
  t.notOk('x_forwarded_for' in (got[0] as Seen).headers);
});

t.test('an Upgrade other than WebSocket, or Upgrade without Connection: upgrade, is served plainly without it', async (t) => {
  const before = seen.length;
  const table = ['upgrade: TLS/1.0\r\nconnection: Upgrade, close', 'upgrade: websocket\r\nconnection: close', 'upgrade: h2c\r\nconnection: close', 'connection: upgrade, close'];
  for (const [i, fields] of table.entries()) {
    const a = await rawH1(`GET /plain-${i} HTTP/1.1\r\nhost: localhost\r\n${fields}\r\n\r\n`);
    t.equal(statusOf(a), 200, fields);
  }
  const got = seen.slice(before);
  t.same(
    got.map((x) => x.url),
    table.map((_, i) => `/plain-${i}`),
  );
  t.ok(
    got.every((x) => !('upgrade' in x.headers)),
    'none carries Upgrade',
  );
});
