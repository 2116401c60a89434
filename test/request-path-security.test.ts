// Attacks on the request path, end to end (issue 11, items 2, 3, 7 and 13): `edge-proxy serve`
// as real processes, a real backend that records every request it receives, and clients that send
// the hostile bytes verbatim: raw TLS sockets (HTTP/1.1), node:http2 with raw pseudo-headers, and
// our HTTP/3 client. Each test asserts what the client got and what the backend saw (nothing, for
// a request the proxy must stop). Port 0 for the backends; the proxy's ports come from freePort.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Socket } from 'node:net';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-reqpath-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

// --- backends -------------------------------------------------------------------------------
interface Seen {
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
}
/** Every request the backends received, in order. */
const seen: Seen[] = [];
const listen = (s: http.Server): Promise<number> => listenTracked(t, s);

// The application backend: an ordinary HTTP/1.1 server with no 'upgrade' listener, so it answers
// an Upgrade request like any other (200) and keeps reading HTTP requests on that connection:
// the backend the upgrade smuggling attack needs.
const appPort = await listen(
  http.createServer((req, res) => {
    let body = '';
    req.setEncoding('latin1');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ url: req.url, host: req.headers.host }));
    });
  }),
);

// A WebSocket-style backend: /ws/wrong switches to a protocol nobody asked for; others echo.
const wsServer = http.createServer((_req, res) => res.writeHead(426).end());
wsServer.on('upgrade', (req: http.IncomingMessage, socket: Socket) => {
  seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: '' });
  const proto = req.url === '/ws/wrong' ? 'h2c' : 'websocket';
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: ${proto}\r\nconnection: Upgrade\r\n\r\n`);
  socket.on('data', (d: Buffer) => socket.write(d.toString().toUpperCase()));
  socket.on('end', () => socket.end());
  socket.on('error', () => socket.destroy());
});
const wsPort = await listen(wsServer);

// --- the proxy ------------------------------------------------------------------------------
const [port, mport] = [await freePort(), await freePort()];
const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 1 }
resilience:
  protocol: { denied_path_prefixes: [/private, /admin/secret] }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${appPort}" }]
  ws:
    route: { path_prefix: /ws }
    backends: [{ id: ws, address: "127.0.0.1:${wsPort}" }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
`,
);
t.teardown(() => served.stop());

// --- clients --------------------------------------------------------------------------------
/** A TLS connection speaking HTTP/1.1, for bytes sent verbatim. */
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
      reject(new Error(`connection still open after ${ms} ms; got ${JSON.stringify(text.slice(0, 200))}`));
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

/** One raw HTTP/1.1 request on its own connection (`connection: close`); the whole answer. */
async function rawH1(head: string, body = ''): Promise<string> {
  const s = await h1Socket();
  const done = readToClose(s);
  s.write(`${head}\r\n${body}`);
  return done;
}
const statusOf = (answer: string): number => Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0);

let h2session: http2.ClientHttp2Session | undefined;
function h2(): http2.ClientHttp2Session {
  if (h2session === undefined || h2session.closed || h2session.destroyed) {
    h2session = http2.connect(`https://localhost:${port}`, { ca: caPem, servername: 'localhost', host: '127.0.0.1' } as http2.SecureClientSessionOptions);
    h2session.on('error', () => {});
    const s = h2session;
    t.teardown(() => s.destroy());
  }
  return h2session;
}

/** One HTTP/2 request with the pseudo-headers given verbatim: the status, or `reset <code>`. */
function rawH2(headers: http2.OutgoingHttpHeaders): Promise<string> {
  return new Promise((resolve) => {
    let req: http2.ClientHttp2Stream;
    try {
      req = h2().request({ ':method': 'GET', ':scheme': 'https', ':authority': `localhost:${port}`, ...headers }, { endStream: true });
    } catch (err) {
      resolve(`refused by the client: ${(err as { code?: string }).code}`);
      return;
    }
    let status = '';
    req.on('response', (h) => (status = String(h[':status'])));
    req.on('error', () => {});
    req.resume();
    req.on('close', () => resolve(status === '' ? `reset ${req.rstCode}` : status));
  });
}

/** An HPACK literal field without indexing, new name, no Huffman (RFC 7541 §6.2.2); short strings only. */
function hpackLiteral(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x00, name.length]), Buffer.from(name, 'latin1'), Buffer.from([value.length]), Buffer.from(value, 'latin1')]);
}

/**
 * One HTTP/2 request built frame by frame (node's client refuses to send two Host fields): the
 * connection preface, an empty SETTINGS and one HEADERS frame with END_STREAM; resolves with the
 * first HPACK byte of the response HEADERS on stream 1 (`0x88` is :status 200, `0x8c` is 400, RFC
 * 7541 Appendix A), or `reset` on RST_STREAM.
 */
async function handBuiltH2(fields: [string, string][]): Promise<string> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['h2'] });
  await once(s, 'secureConnect');
  const block = Buffer.concat(fields.map(([n, v]) => hpackLiteral(n, v)));
  const frame = (type: number, flags: number, stream: number, payload: Buffer): Buffer => {
    const h = Buffer.alloc(9);
    h.writeUIntBE(payload.length, 0, 3);
    h[3] = type;
    h[4] = flags;
    h.writeUInt32BE(stream, 5);
    return Buffer.concat([h, payload]);
  };
  s.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1'), frame(0x4, 0, 0, Buffer.alloc(0)), frame(0x1, 0x5, 1, block)]));
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
        if (stream === 1 && type === 0x1) return done(`0x${(payload[0] ?? 0).toString(16)}`);
        if (stream === 1 && type === 0x3) return done('reset');
        if (type === 0x7) return done('goaway');
      }
    });
    s.on('error', () => {});
  });
}

let h3session: Http3ClientSession | undefined;
async function h3(): Promise<Http3ClientSession> {
  if (h3session === undefined) {
    h3session = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
    const s = h3session;
    t.teardown(() => s.close(true));
  }
  return h3session;
}

/** One HTTP/3 request: the status, or `reset <code>` when the stream was reset. */
async function rawH3(options: Parameters<Http3ClientSession['fetch']>[0]): Promise<string> {
  const c = await h3();
  try {
    return String((await c.fetch({ timeoutMs: 10_000, ...options })).status);
  } catch (err) {
    return `reset ${(err as { code?: string }).code}`;
  }
}

/** Whether any request the backends received so far satisfies `p`. */
const backendSaw = (p: (s: Seen) => boolean): boolean => seen.some(p);

/** Sum of a worker counter over its label sets, from the supervisor's metrics endpoint. */
async function metricSum(name: string): Promise<number> {
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
  for (const line of text.split('\n')) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

// --- item 2: smuggling through Upgrade ----------------------------------------------------------
t.test('an Upgrade the backend answers with 200 is not spliced: a second request on the connection never reaches the backend', async (t) => {
  const s = await h1Socket();
  const all = readToClose(s);
  let first = '';
  const gotFirst = new Promise<void>((resolve) => {
    const on = (d: string): void => {
      first += d;
      if (first.includes('"url"')) {
        s.off('data', on);
        resolve();
      }
    };
    s.on('data', on);
  });
  s.write('GET /app-upgrade HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n');
  await gotFirst;
  t.match(first, /^HTTP\/1\.1 200 /, "the backend's 200 is relayed");
  t.match(first, /\r\nconnection: close\r\n/i, 'with Connection: close');
  // The smuggled request: a denied path and a forged client address.
  s.write('GET /private/secret HTTP/1.1\r\nhost: localhost\r\nx-forwarded-for: 6.6.6.6\r\n\r\n');
  const rest = await all;
  t.notMatch(rest.slice(first.length), /HTTP\/1\.1/, 'no second answer on the connection');
  // A request after the attack, through the proxy: by the time it arrives, a smuggled request
  // forwarded on the spliced connection would have been recorded.
  t.equal(statusOf(await rawH1('GET /after HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n')), 200);
  t.ok(backendSaw((x) => x.url === '/app-upgrade'), 'the upgrade request itself was forwarded');
  t.notOk(backendSaw((x) => x.url.includes('private')), 'the backend never saw the smuggled request');
  t.notOk(backendSaw((x) => String(x.headers['x-forwarded-for']).includes('6.6.6.6')), 'nor the forged X-Forwarded-For');
});

t.test('a 101 naming a protocol the client did not ask for is refused (502), a matching 101 is spliced', async (t) => {
  const wrong = await rawH1('GET /ws/wrong HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\n');
  t.equal(statusOf(wrong), 502);
  const s = await h1Socket();
  t.teardown(() => s.destroy());
  s.write('GET /ws/chat HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n');
  const [head] = (await once(s, 'data')) as [Buffer];
  t.match(head.toString(), /^HTTP\/1\.1 101 /);
  s.write('ping');
  const [echo] = (await once(s, 'data')) as [Buffer];
  t.equal(echo.toString(), 'PING', 'the tunnel carries bytes both ways');
});

// --- item 3: denied_path_prefixes on the normalized target -----------------------------------
/**
 * Spellings of /private and /admin/secret, with the exact status (SPEC "Protocol policy": a denied
 * path is 403; a target that cannot be normalized safely is a malformed request, 400), the same on
 * every protocol. None may reach the backend.
 */
const DENIED_TARGETS: [string, 400 | 403][] = [
  ['/private/x', 403],
  ['/private', 403],
  ['/private/', 403],
  ['/private?x=1', 403],
  ['/private?/public', 403],
  ['//private/x', 403],
  ['/./private/x', 403],
  ['/public/../private/x', 403],
  ['/../../private', 403],
  ['/PRIVATE/x', 403],
  ['/Private', 403],
  ['/%50RIVATE', 403],
  ['/private;x', 403],
  ['/private;x/y', 403],
  ['/%70rivate/x', 403],
  ['/%70%72%69%76%61%74%65', 403],
  ['/%2e%2e/private/x', 403],
  ['/public/%2E%2E/private/x', 403],
  ['/public/.%2e/private', 403],
  ['/private%3Bx', 403],
  ['/private%3b', 403],
  ['///admin//./secret', 403],
  ['/admin/x/../secret/y', 403],
  ['/ADMIN/Secret/', 403],
  ['/admin;x/secret', 403],
  ['/admin%3bx/secret/y', 403],
  ['/admin/secret;jsessionid=1', 403],
  ['/;x/private', 403],
  ['/private.', 403],
  ['/private%2e%20/x', 403],
  ['/admin./secret', 403],
  ['/private::$DATA', 403],
  ['/private%2fx', 400],
  ['/admin%2Fsecret', 400],
  ['/admin%5csecret', 400],
  ['/private%00', 400],
  ['/private%2', 400],
  ['/%7private', 400],
  ['/public/..;/private/x', 400],
  ['/public/%2e%2e;x/private', 400],
  ['/x/%C0%AE%C0%AE/private', 400],
  ['/admin%c0%afsecret', 400],
  ['/x/%E0%80%AE%E0%80%AE/private', 400],
  ['/x/%F0%80%80%AE%F0%80%80%AE/private', 400],
  ['/private#x', 400],
  ['/public#/../private', 400],
];

t.test('HTTP/1.1: every spelling of a denied path is refused with its exact status before the backend', async (t) => {
  const before = seen.length;
  const h1Only: [string, 400 | 403][] = [
    [`http://localhost:${port}/private/x`, 403],
    ['https://localhost/./private', 403],
    ['http://localhost//admin/%73ecret', 403],
    ['/public\\..\\private/x', 400],
    ['/admin\\secret', 400],
    ['/\xc4\xb1private', 400],
  ];
  for (const [target, expected] of [...DENIED_TARGETS, ...h1Only]) {
    t.equal(statusOf(await rawH1(`GET ${target} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n`)), expected, target);
  }
  t.same(seen.slice(before).map((s) => s.url), [], 'the backend saw none of them');
});

t.test('HTTP/2: every spelling of a denied path is refused with its exact status; an absolute :path and a bogus :scheme too', async (t) => {
  const before = seen.length;
  for (const [target, expected] of [...DENIED_TARGETS, ['/admin\\secret', 400] as const]) t.equal(await rawH2({ ':path': target }), String(expected), target);
  // An absolute-form :path is a malformed message: node resets the stream (RFC 9113 §8.1.1, PROTOCOL_ERROR).
  t.equal(await rawH2({ ':path': `https://localhost:${port}/private/x` }), 'reset 1', 'absolute :path');
  for (const h of [{ ':path': `https://localhost:${port}/private/x`, ':scheme': 'foo' }, { ':path': '/private/x', ':scheme': 'foo' }]) {
    t.equal(await rawH2(h), '400', JSON.stringify(h));
  }
  t.same(seen.slice(before).map((s) => s.url), [], 'the backend saw none of them');
});

t.test('HTTP/3: every spelling of a denied path is refused with its exact status; an absolute :path and a bogus :scheme too', async (t) => {
  const before = seen.length;
  for (const [target, expected] of [...DENIED_TARGETS, ['/admin\\secret', 400] as const]) t.equal(await rawH3({ path: target }), String(expected), target);
  // An absolute-form :path is a malformed message (RFC 9114 §4.1.2): the stream is reset with H3_MESSAGE_ERROR.
  t.equal(await rawH3({ path: `https://localhost:${port}/private/x` }), 'reset H3_MESSAGE_ERROR', 'absolute :path');
  for (const o of [{ path: `https://localhost:${port}/private/x`, scheme: 'foo' }, { path: '/private/x', scheme: 'foo' }]) {
    t.equal(await rawH3(o), '400', JSON.stringify(o));
  }
  t.same(seen.slice(before).map((s) => s.url), [], 'the backend saw none of them');
});

t.test('allowed paths are forwarded exactly as normalized, on every protocol', async (t) => {
  const table: [string, string][] = [
    ['/public/./a//b/../c?x=..//y', '/public/a/c?x=..//y'],
    ['/%7euser/%41', '/~user/A'],
    ['/caf%c3%a9', '/caf%C3%A9'],
    ['/privately', '/privately'],
    ['/admin/secrets', '/admin/secrets'],
    ['/private.html', '/private.html'],
    ['/admin;x/public', '/admin;x/public'],
    ['/%E0%A0%80', '/%E0%A0%80'],
  ];
  for (const [target, expected] of table) {
    let before = seen.length;
    t.equal(statusOf(await rawH1(`GET ${target} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n`)), 200, `h1 ${target}`);
    t.same(seen.slice(before).map((s) => s.url), [expected], `h1 ${target} → ${expected}`);
    before = seen.length;
    t.equal(await rawH2({ ':path': target }), '200', `h2 ${target}`);
    t.same(seen.slice(before).map((s) => s.url), [expected], `h2 ${target} → ${expected}`);
    before = seen.length;
    t.equal(await rawH3({ path: target }), '200', `h3 ${target}`);
    t.same(seen.slice(before).map((s) => s.url), [expected], `h3 ${target} → ${expected}`);
  }
  // RFC 9112 §3.2.2: the absolute-form's authority is the Host; the backend gets origin-form.
  const before = seen.length;
  t.equal(statusOf(await rawH1('GET http://other.example/public/x?q=1 HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n')), 200);
  t.match(seen.slice(before), [{ url: '/public/x?q=1', headers: { host: 'other.example', 'x-forwarded-host': 'other.example' } }]);
});

// --- item 7: requests that fail inside the proxy do not eject a healthy backend ----------------
t.test('OPTIONS * and malformed HTTP/3 requests are answered by the proxy and never count against the backend', async (t) => {
  const failuresBefore = await metricSum('svc_health_failures_total');
  const errorsBefore = await metricSum('svc_backend_errors');
  const before = seen.length;
  for (let i = 0; i < 4; i++) {
    const h1 = await rawH1('OPTIONS * HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n');
    t.equal(statusOf(h1), 200, 'h1 OPTIONS *');
    t.match(h1, /\r\nallow: GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS\r\n/i);
    t.equal(await rawH2({ ':method': 'OPTIONS', ':path': '*' }), '200', 'h2 OPTIONS *');
    t.equal(await rawH3({ method: 'OPTIONS', path: '*' }), '200', 'h3 OPTIONS *');
    t.equal(await rawH3({ path: '/x', headers: { 'x-note': 'a\x01b' } }), '400', 'h3 control character in a field value');
    t.equal(await rawH3({ path: '/a b' }), '400', 'h3 space in the path');
  }
  t.same(seen.slice(before).map((s) => s.url), [], 'none reached the backend');
  // HTTP/1.1 `Upgrade` without `Connection: upgrade` is no upgrade (RFC 9110 §7.8): forwarded as
  // a plain request without its Upgrade field (undici refused to send one: a 400 until issue 38).
  t.equal(statusOf(await rawH1('GET /upgrade-field HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: close\r\n')), 200, 'h1 Upgrade field alone: a plain request');
  t.match(seen.slice(before), [{ url: '/upgrade-field' }]);
  t.notOk('upgrade' in (seen[seen.length - 1] as Seen).headers, 'without its Upgrade');
  t.equal(await metricSum('svc_health_failures_total'), failuresBefore, 'no passive health failure recorded');
  t.equal(await metricSum('svc_backend_errors'), errorsBefore, 'no backend error recorded');
  // With one backend, an ejection would answer 503 to everyone now.
  t.equal(statusOf(await rawH1('GET /x HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n')), 200, 'h1 still served');
  t.equal(await rawH2({ ':path': '/x' }), '200', 'h2 still served');
  t.equal(await rawH3({ path: '/x' }), '200', 'h3 still served');
});

// --- item 13: forwarding headers, Host, Transfer-Encoding -------------------------------------
t.test('client-supplied forwarding headers never reach the backend, on every protocol', async (t) => {
  const forged = { 'x-forwarded-for': '6.6.6.6', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'http', forwarded: 'for=6.6.6.6;host=evil.example' };
  const expected = { 'x-forwarded-for': '127.0.0.1', 'x-forwarded-host': `localhost:${port}`, 'x-forwarded-proto': 'https', forwarded: `for=127.0.0.1;proto=https;host="localhost:${port}"` };
  let before = seen.length;
  const lines = Object.entries(forged).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  t.equal(statusOf(await rawH1(`GET /fwd HTTP/1.1\r\nhost: localhost:${port}\r\n${lines}connection: close\r\n`)), 200);
  t.match(seen.slice(before), [{ headers: expected }], 'HTTP/1.1');
  before = seen.length;
  t.equal(await rawH2({ ':path': '/fwd', ...forged }), '200');
  t.match(seen.slice(before), [{ headers: expected }], 'HTTP/2');
  before = seen.length;
  t.equal(await rawH3({ path: '/fwd', headers: forged }), '200');
  t.match(seen.slice(before), [{ headers: expected }], 'HTTP/3');
});

t.test('two Host fields, userinfo in Host or :authority, and :authority vs host disagreeing: 400', async (t) => {
  const before = seen.length;
  t.equal(statusOf(await rawH1('GET /h HTTP/1.1\r\nhost: localhost\r\nhost: evil.example\r\nconnection: close\r\n')), 400, 'h1 two Host fields');
  t.equal(statusOf(await rawH1('GET /h HTTP/1.1\r\nhost: evil@localhost\r\nconnection: close\r\n')), 400, 'h1 Host with userinfo');
  t.equal(await rawH2({ ':path': '/h', ':authority': 'evil@localhost' }), 'reset 1', 'h2 :authority with userinfo: refused by the HTTP/2 layer (PROTOCOL_ERROR)');
  t.equal(await rawH2({ ':path': '/h', host: 'evil.example' }), '400', 'h2 :authority and host disagree');
  const h2Head = (host2: string): [string, string][] => [[':method', 'GET'], [':scheme', 'https'], [':path', '/h'], [':authority', 'localhost'], ['host', 'localhost'], ['host', host2]];
  // nghttp2 already resets a stream with two host fields (PROTOCOL_ERROR); our check is behind it.
  for (const second of ['evil.example', 'localhost']) {
    const r = await handBuiltH2(h2Head(second));
    t.ok(r === '0x8c' || r === 'reset', `h2 two host fields (${second}): ${r}`);
  }
  t.equal(await handBuiltH2([[':method', 'GET'], [':scheme', 'https'], [':path', '/h2-raw-ok'], [':authority', 'localhost']]), '0x88', 'the hand-built request itself is fine: 200');
  t.equal(await rawH3({ path: '/h', authority: 'evil@localhost' }), '400', 'h3 :authority with userinfo');
  t.equal(await rawH3({ path: '/h', headers: { host: [`localhost:${port}`, `localhost:${port}`] } }), '400', 'h3 two host fields');
  t.equal(await rawH3({ path: '/h', headers: { host: 'evil.example' } }), 'reset H3_MESSAGE_ERROR', 'h3 :authority and host disagree: malformed, a stream error (RFC 9114 §4.3.1)');
  t.same(seen.slice(before).map((s) => s.url), ['/h2-raw-ok'], 'the backend saw none of them (only the well-formed control request)');
});

t.test('Transfer-Encoding: gzip, chunked is refused with 501, not forwarded without its gzip coding', async (t) => {
  const before = seen.length;
  const answer = await rawH1('POST /te HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n', '5\r\nhello\r\n0\r\n\r\n');
  t.equal(statusOf(answer), 501);
  t.same(seen.slice(before).map((s) => s.url), [], 'the backend saw nothing');
  // Plain chunked still passes, body intact.
  const ok = await rawH1('POST /te HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\nconnection: close\r\n', '5\r\nhello\r\n0\r\n\r\n');
  t.equal(statusOf(ok), 200);
  t.match(seen.slice(before), [{ url: '/te', body: 'hello' }]);
});
