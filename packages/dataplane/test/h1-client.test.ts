// Our HTTP/1.1 upstream client (upstream/h1-client.ts) over real sockets: node:http backends for the
// ordinary exchanges, and raw TCP backends that write exact bytes for the framing rules and for
// hostile responses (smuggling, splitting, oversize, malformed), each of which must fail the
// exchange with a protocol error and never reach the next request on the connection.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import net from 'node:net';
import { EventEmitter, once } from 'node:events';
import { createHash } from 'node:crypto';
import { PassThrough, Readable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import type { Dispatcher } from 'undici';
import { H1Pool, H1_ERR } from '../src/upstream/h1-client.ts';
import type { H1PoolOptions } from '../src/upstream/h1-client.ts';

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
  trailers: Record<string, string | string[] | undefined>;
}

interface SendOptions {
  method?: string;
  path?: string;
  headers?: Record<string, string | string[] | undefined>;
  body?: Readable | Buffer | string | null;
  headersTimeout?: number;
  bodyTimeout?: number;
  /** Called with the controller when the request starts. */
  started?: (c: Dispatcher.DispatchController) => void;
  /** Pause reading after every chunk and resume on the next turn (backpressure). */
  slowReader?: boolean;
}

/** One request through `pool.dispatch`; rejects with the client's error. */
function send(pool: H1Pool, o: SendOptions = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    let status = 0;
    let headers: Reply['headers'] = {};
    const chunks: Buffer[] = [];
    pool.dispatch(
      { method: o.method ?? 'GET', path: o.path ?? '/', headers: o.headers ?? {}, body: o.body ?? null, headersTimeout: o.headersTimeout ?? 5_000, bodyTimeout: o.bodyTimeout ?? 5_000 } as Dispatcher.DispatchOptions,
      {
        onRequestStart(c) {
          o.started?.(c);
        },
        onResponseStart(_c, s, h) {
          status = s;
          headers = h;
        },
        onResponseData(c, chunk) {
          // Kept as given, not copied: a chunk must stay intact after the client reads more.
          chunks.push(chunk as Buffer);
          if (o.slowReader === true) {
            c.pause();
            setImmediate(() => c.resume());
          }
        },
        onResponseEnd(_c, trailers) {
          resolve({ status, headers, body: Buffer.concat(chunks), trailers });
        },
        onResponseError(_c, err) {
          reject(err);
        },
      },
    );
  });
}

async function listen(server: net.Server, t: Test): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as AddressInfo).port;
}

function pool(t: Test, port: number, o: Partial<H1PoolOptions> = {}): H1Pool {
  const p = new H1Pool('127.0.0.1', port, { connections: 8, connectTimeout: 2_000, ...o });
  t.teardown(() => p.destroy());
  return p;
}

/** A node:http backend counting its connections; `handler` answers. */
async function httpBackend(t: Test, handler: http.RequestListener): Promise<{ port: number; connections: () => number; sockets: Set<net.Socket> }> {
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = http.createServer(handler);
  server.keepAliveTimeout = 30_000;
  server.on('connection', (s: net.Socket) => {
    connections++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  t.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  return { port: await listen(server, t), connections: () => connections, sockets };
}

/**
 * A raw TCP backend: for each request head received, `answer(n, head)` gives the bytes to write
 * (n counts requests over all connections); undefined writes nothing.
 */
async function rawBackend(t: Test, answer: (n: number, head: string, socket: net.Socket) => string | Buffer | undefined): Promise<{ port: number; connections: () => number; requests: string[]; events: EventEmitter }> {
  let connections = 0;
  const requests: string[] = [];
  /** 'request' (head) for each request received, 'close' for each connection closed. */
  const events = new EventEmitter();
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on('close', () => {
      sockets.delete(socket);
      events.emit('close');
    });
    socket.on('error', () => undefined);
    let input = '';
    socket.on('data', (d) => {
      input += d.toString('latin1');
      for (let end = input.indexOf('\r\n\r\n'); end !== -1; end = input.indexOf('\r\n\r\n')) {
        const head = input.slice(0, end);
        input = input.slice(end + 4);
        requests.push(head);
        const out = answer(requests.length, head, socket);
        if (out !== undefined) socket.write(out);
        events.emit('request', head);
      }
    });
  });
  t.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  return { port: await listen(server, t), connections: () => connections, requests, events };
}

t.test('keep-alive: sequential requests share one connection; the request head is what was asked', async (t) => {
  const seen: http.IncomingHttpHeaders[] = [];
  const b = await httpBackend(t, (req, res) => {
    seen.push(req.headers);
    res.end(`${req.method} ${req.url}`);
  });
  const p = pool(t, b.port);
  for (let i = 0; i < 20; i++) {
    const r = await send(p, { path: `/n/${i}?q=1`, headers: { 'x-a': 'one', 'x-list': ['a', 'b'] } });
    t.equal(r.body.toString(), `GET /n/${i}?q=1`);
  }
  t.equal(b.connections(), 1, 'one connection for 20 requests');
  t.equal(seen[0]?.['host'], `127.0.0.1:${b.port}`, 'host from the origin when the request has none');
  t.equal(seen[0]?.['x-a'], 'one');
  t.equal(seen[0]?.['x-list'], 'a, b', 'a repeated field is sent as two lines');
  const withHost = await send(p, { headers: { host: 'svc.example' } });
  t.equal(withHost.status, 200);
  t.equal(seen[20]?.['host'], 'svc.example', "the request's own host is kept");
});

t.test('at most `connections` at once; the rest queue and are served in order', async (t) => {
  let open = 0;
  let most = 0;
  const order: string[] = [];
  const b = await httpBackend(t, (req, res) => {
    open++;
    most = Math.max(most, open);
    order.push(req.url as string);
    setTimeout(() => {
      open--;
      res.end(req.url);
    }, 20);
  });
  const p = pool(t, b.port, { connections: 2 });
  const replies = await Promise.all(Array.from({ length: 10 }, (_, i) => send(p, { path: `/${i}` })));
  t.same(
    replies.map((r) => r.body.toString()),
    Array.from({ length: 10 }, (_, i) => `/${i}`),
  );
  t.equal(most, 2, 'never more than two requests at the backend at once');
  t.equal(b.connections(), 2, 'two connections opened, reused for the queue');
  t.same(order, Array.from({ length: 10 }, (_, i) => `/${i}`), 'served in the order dispatched');
});

t.test('framing: content-length, chunked with trailers, until close, HEAD, 204 and 304, interim responses', async (t) => {
  const b = await rawBackend(t, (_n, head, socket) => {
    const path = head.split(' ')[1];
    switch (path) {
      case '/length':
        return 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello';
      case '/chunked':
        return 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n';
      case '/lf':
        return 'HTTP/1.1 200 OK\nContent-Length: 2\n\nok';
      case '/head':
        return 'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n';
      case '/204':
        return 'HTTP/1.1 204 No Content\r\n\r\n';
      case '/304':
        return 'HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n';
      case '/interim':
        return 'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nfin';
      case '/close':
        socket.end('HTTP/1.1 200 OK\r\n\r\nuntil the end');
        return undefined;
      default:
        return 'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n';
    }
  });
  const p = pool(t, b.port, { connections: 1 });
  t.equal((await send(p, { path: '/length' })).body.toString(), 'hello');
  const chunked = await send(p, { path: '/chunked' });
  t.equal(chunked.body.toString(), 'hello world');
  t.same(chunked.trailers, { 'x-sum': '42' }, 'trailers reach onResponseEnd');
  t.equal((await send(p, { path: '/lf' })).body.toString(), 'ok', 'bare LF line ends are accepted');
  const head = await send(p, { path: '/head', method: 'HEAD' });
  t.equal(head.body.length, 0, 'HEAD: no body is read');
  t.equal(head.headers['content-length'], '1000');
  t.equal((await send(p, { path: '/204' })).status, 204);
  t.equal((await send(p, { path: '/304' })).status, 304);
  const interim = await send(p, { path: '/interim' });
  t.equal(interim.status, 200, 'interim responses are skipped');
  t.equal(interim.body.toString(), 'fin');
  t.equal(b.connections(), 1, 'every response so far left the connection reusable');
  t.equal((await send(p, { path: '/close' })).body.toString(), 'until the end', 'a body without length ends with the connection');
  t.equal((await send(p, { path: '/length' })).body.toString(), 'hello');
  t.equal(b.connections(), 2, 'a close-delimited response is not followed by another request on its connection');
});

t.test('hostile responses fail as protocol errors, and nothing of them reaches the next request', async (t) => {
  const cases: [string, string][] = [
    ['both content-length and transfer-encoding', 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'],
    ['two different content-lengths', 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd'],
    ['a content-length that is not a number', 'HTTP/1.1 200 OK\r\nContent-Length: 3x\r\n\r\nabc'],
    ['obs-fold', 'HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n'],
    ['a field name with a space', 'HTTP/1.1 200 OK\r\nX A: one\r\nContent-Length: 0\r\n\r\n'],
    ['a bare CR inside a value (response splitting)', 'HTTP/1.1 200 OK\r\nX-A: one\rSet-Cookie: evil=1\r\nContent-Length: 0\r\n\r\n'],
    ['a CR at the start of a field line', 'HTTP/1.1 200 OK\r\n\rX-A: one\r\nContent-Length: 0\r\n\r\n'],
    ['a status code run into its reason', 'HTTP/1.1 200OK\r\nContent-Length: 0\r\n\r\n'],
    ['a field line without a colon', 'HTTP/1.1 200 OK\r\nX-A one\r\nContent-Length: 0\r\n\r\n'],
    ['a NUL inside a value', 'HTTP/1.1 200 OK\r\nX-A: o\0ne\r\nContent-Length: 0\r\n\r\n'],
    ['a status line that is not HTTP/1.x', 'HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n'],
    ['a two-digit status', 'HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n'],
    ['a chunk size of 17 hex digits', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nx\r\n0\r\n\r\n'],
    ['a chunk size that is not hex', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n'],
    ['chunk data longer than its size', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz\r\n0\r\n\r\n'],
    ['a 101 that was not asked for', 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n'],
    ['a head larger than maxHeaderSize', `HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(20_000)}\r\nContent-Length: 0\r\n\r\n`],
  ];
  for (const [name, bytes] of cases) {
    const b = await rawBackend(t, (n) => (n === 1 ? bytes : 'HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext'));
    const p = pool(t, b.port, { connections: 1, maxHeaderSize: 16_384 });
    await t.rejects(send(p), { code: H1_ERR.PROTOCOL }, name);
    const next = await send(p);
    t.equal(next.body.toString(), 'next', `${name}: the next request gets its own answer`);
    t.equal(b.connections(), 2, `${name}: on a new connection`);
  }
});

t.test('bytes after a complete response (a smuggled second response) end the connection', async (t) => {
  const b = await rawBackend(t, (n) => (n === 1 ? 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle' : 'HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal'));
  const p = pool(t, b.port, { connections: 1 });
  t.equal((await send(p)).body.toString(), 'ok');
  t.equal((await send(p)).body.toString(), 'real', 'the smuggled response never answers a request');
  t.equal(b.connections(), 2);
  // The same bytes arriving a moment later, while the connection is idle, end it too.
  const late = await rawBackend(t, (n, _h, socket) => {
    if (n === 1) setTimeout(() => socket.write('HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle'), 20);
    return n === 1 ? 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok' : 'HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal';
  });
  const q = pool(t, late.port, { connections: 1 });
  const lateClose = once(late.events, 'close');
  t.equal((await send(q)).body.toString(), 'ok');
  await lateClose;
  t.equal((await send(q)).body.toString(), 'real');
  t.equal(late.connections(), 2);
});

t.test('requests we refuse to send: nothing reaches the backend', async (t) => {
  const b = await rawBackend(t, () => 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
  const p = pool(t, b.port);
  await t.rejects(send(p, { headers: { 'x-a': 'one\r\nx-injected: 1' } }), { code: H1_ERR.INVALID_REQUEST }, 'CRLF in a value');
  await t.rejects(send(p, { headers: { 'bad name': 'x' } }), { code: H1_ERR.INVALID_REQUEST }, 'a field name that is not a token');
  await t.rejects(send(p, { path: '/a b' }), { code: H1_ERR.INVALID_REQUEST }, 'a space in the target');
  await t.rejects(send(p, { method: 'G T' }), { code: H1_ERR.INVALID_REQUEST }, 'a method that is not a token');
  await t.rejects(send(p, { headers: { 'transfer-encoding': 'chunked' } }), { code: H1_ERR.INVALID_REQUEST }, 'transfer-encoding is ours to frame');
  await t.rejects(send(p, { method: 'POST', headers: { 'content-length': '5' }, body: null }), { code: H1_ERR.CONTENT_LENGTH_MISMATCH }, 'a length without a body');
  await t.rejects(send(p, { method: 'POST', headers: { 'content-length': '5' }, body: Readable.from([Buffer.from('abc')]) }), { code: H1_ERR.CONTENT_LENGTH_MISMATCH }, 'a body shorter than its length');
  await t.rejects(send(p, { method: 'POST', headers: { 'content-length': '2' }, body: Readable.from([Buffer.from('abc')]) }), { code: H1_ERR.CONTENT_LENGTH_MISMATCH }, 'a body longer than its length');
  t.equal(b.requests.filter((h) => h.startsWith('GET') || h.startsWith('G T')).length, 0, 'no refused GET was written');
});

t.test('request bodies: content-length streamed, chunked when unknown, 8 MB with backpressure both ways', async (t) => {
  const b = await httpBackend(t, (req, res) => {
    const hash = createHash('sha256');
    let n = 0;
    req.on('data', (c: Buffer) => {
      hash.update(c);
      n += c.length;
    });
    req.on('end', () => res.end(JSON.stringify({ n, sha: hash.digest('hex'), te: req.headers['transfer-encoding'] ?? null, cl: req.headers['content-length'] ?? null })));
  });
  const p = pool(t, b.port);
  const big = Buffer.alloc(8 * 1024 * 1024, 'abcdefgh');
  const sha = createHash('sha256').update(big).digest('hex');
  const pieces = (): Readable => Readable.from((function* () {
    for (let i = 0; i < big.length; i += 65_536) yield big.subarray(i, i + 65_536);
  })());
  const known = JSON.parse((await send(p, { method: 'PUT', headers: { 'content-length': String(big.length) }, body: pieces() })).body.toString());
  t.same(known, { n: big.length, sha, te: null, cl: String(big.length) });
  const chunked = JSON.parse((await send(p, { method: 'POST', body: pieces(), slowReader: true })).body.toString());
  t.same(chunked, { n: big.length, sha, te: 'chunked', cl: null }, 'chunked when no length is known');
  const empty = JSON.parse((await send(p, { method: 'POST' })).body.toString());
  t.same(empty, { n: 0, sha: createHash('sha256').digest('hex'), te: null, cl: '0' }, 'an empty POST says content-length: 0');
  const echo = await httpBackend(t, (req, res) => req.pipe(res));
  const e = pool(t, echo.port);
  const back = await send(e, { method: 'POST', body: pieces(), slowReader: true });
  t.equal(createHash('sha256').update(back.body).digest('hex'), sha, 'a paused reader gets every byte, in order');
  t.equal(b.connections(), 1, 'the connection survived three bodies');
});

t.test('a request body that fails ends the exchange with its error; a response that ends first cuts the body', async (t) => {
  const b = await httpBackend(t, (req, res) => {
    if (req.url === '/early') {
      res.end('early');
      return;
    }
    req.resume();
    req.on('end', () => res.end('read'));
  });
  const p = pool(t, b.port);
  const body = new PassThrough();
  body.write('part');
  const failing = send(p, { method: 'POST', body });
  setTimeout(() => body.destroy(Object.assign(new Error('client body timeout'), { code: 'EDGE_CLIENT_BODY_TIMEOUT' })), 20);
  await t.rejects(failing, { code: 'EDGE_CLIENT_BODY_TIMEOUT' }, "the body's own error, code and all");
  const endless = new PassThrough();
  endless.write('x'.repeat(1000));
  const early = await send(p, { method: 'POST', path: '/early', body: endless });
  t.equal(early.body.toString(), 'early');
  t.ok(endless.destroyed, 'the rest of the body is not read');
  t.equal((await send(p, { path: '/after', method: 'POST', body: 'abc' })).body.toString(), 'read', 'the pool still serves');
});

t.test('timeouts: response head, body pause; a paused reader is not timed out', async (t) => {
  const b = await rawBackend(t, (_n, head, socket) => {
    const path = head.split(' ')[1];
    if (path === '/no-head') return undefined;
    if (path === '/stall') return 'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc';
    if (path === '/slow') {
      setTimeout(() => socket.write('def'), 150);
      return 'HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc';
    }
    return 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok';
  });
  const p = pool(t, b.port);
  const t0 = performance.now();
  await t.rejects(send(p, { path: '/no-head', headersTimeout: 100 }), { code: H1_ERR.HEADERS_TIMEOUT });
  const waited = performance.now() - t0;
  t.ok(waited >= 95 && waited < 1_000, `headers timeout after ${waited.toFixed(0)} ms (100 asked)`);
  await t.rejects(send(p, { path: '/stall', bodyTimeout: 100 }), { code: H1_ERR.BODY_TIMEOUT });
  t.equal((await send(p, { path: '/slow', bodyTimeout: 400 })).body.toString(), 'abcdef', 'a pause shorter than bodyTimeout is fine');
  // A reader that keeps the response paused longer than bodyTimeout is not the backend's fault.
  let controller: Dispatcher.DispatchController | undefined;
  const paused = new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    p.dispatch({ method: 'GET', path: '/slow', headers: {}, bodyTimeout: 100, headersTimeout: 1_000 } as Dispatcher.DispatchOptions, {
      onRequestStart(c) {
        controller = c;
      },
      onResponseData(c, chunk) {
        chunks.push(Buffer.from(chunk));
        if (chunks.length === 1) {
          c.pause();
          setTimeout(() => c.resume(), 400);
        }
      },
      onResponseEnd() {
        resolve(Buffer.concat(chunks));
      },
      onResponseError(_c, err) {
        reject(err);
      },
    });
  });
  t.equal((await paused).toString(), 'abcdef', 'paused 400 ms with bodyTimeout 100: complete');
  t.ok(controller !== undefined);
});

t.test('abort: in flight ends the connection; queued never reaches the backend', async (t) => {
  const b = await rawBackend(t, (_n, head) => (head.startsWith('GET /hang') ? undefined : 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'));
  const p = pool(t, b.port, { connections: 1 });
  let first: Dispatcher.DispatchController | undefined;
  let second: Dispatcher.DispatchController | undefined;
  const hangReceived = once(b.events, 'request');
  const a = send(p, { path: '/hang', started: (c) => (first = c) });
  const q = send(p, { path: '/queued', started: (c) => (second = c) });
  await hangReceived;
  second?.abort(Object.assign(new Error('cancelled'), { code: 'EDGE_ATTEMPT_CANCELLED' }));
  await t.rejects(q, { code: 'EDGE_ATTEMPT_CANCELLED' }, 'the queued request fails with the reason given');
  first?.abort(Object.assign(new Error('client closed'), { code: 'EDGE_CLIENT_CLOSED' }));
  await t.rejects(a, { code: 'EDGE_CLIENT_CLOSED' });
  t.equal((await send(p, { path: '/ok' })).body.toString(), 'ok');
  t.same(
    b.requests.map((h) => h.split(' ')[1]),
    ['/hang', '/ok'],
    'the aborted queued request was never written',
  );
  t.equal(b.connections(), 2, 'the aborted in-flight request took its connection with it');
});

t.test('a backend that closes idle connections, one that refuses them, keep-alive hints', async (t) => {
  const b = await httpBackend(t, (_req, res) => res.end('ok'));
  const p = pool(t, b.port);
  t.equal((await send(p)).body.toString(), 'ok');
  const closed = [...b.sockets].map((s) => once(s, 'close'));
  for (const s of b.sockets) s.destroy();
  await Promise.all(closed);
  await new Promise((r) => setImmediate(r));
  t.equal((await send(p)).body.toString(), 'ok', 'a connection the backend closed while idle is not used');
  t.equal(b.connections(), 2);

  const refused = net.createServer();
  const port = await listen(refused, t);
  await new Promise<void>((r) => refused.close(() => r()));
  const r = pool(t, port, { connections: 2 });
  const all = await Promise.allSettled([send(r), send(r), send(r)]);
  t.same(
    all.map((s) => (s.status === 'rejected' ? (s.reason as { code?: string }).code : 'ok')),
    ['ECONNREFUSED', 'ECONNREFUSED', 'ECONNREFUSED'],
    'each waiting request fails on a refused connect',
  );

  const hint = await rawBackend(t, () => 'HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1\r\nContent-Length: 2\r\n\r\nok');
  const h = pool(t, hint.port);
  await send(h);
  await send(h);
  t.equal(hint.connections(), 2, 'keep-alive timeout=1 s: too short to reuse safely');
  const close = await rawBackend(t, () => 'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok');
  const c = pool(t, close.port);
  await send(c);
  await send(c);
  t.equal(close.connections(), 2, 'connection: close is honoured');
  const old = await rawBackend(t, () => 'HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok');
  const o = pool(t, old.port);
  await send(o);
  await send(o);
  t.equal(old.connections(), 2, 'an HTTP/1.0 response without keep-alive ends its connection');
});

t.test('idle connections close after keepAliveTimeout, or after the backend\'s shorter hint', async (t) => {
  const closes = new EventEmitter();
  const b = await rawBackend(t, (_n, head, socket) => {
    const sent = performance.now();
    socket.once('close', () => closes.emit('closed', performance.now() - sent));
    return head.startsWith('GET /hint') ? 'HTTP/1.1 200 OK\r\nKeep-Alive: timeout=3\r\nContent-Length: 2\r\n\r\nok' : 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok';
  });
  const p = pool(t, b.port, { keepAliveTimeout: 100 });
  let closed = once(closes, 'closed');
  await send(p);
  t.equal(p.connections, 1);
  const [idle] = (await closed) as [number];
  t.equal(p.connections, 0, 'the idle connection was closed by the pool');
  t.ok(idle >= 95 && idle < 1_000, `closed ${idle.toFixed(0)} ms after its response (100 asked)`);
  const q = pool(t, b.port, { keepAliveTimeout: 10_000 });
  closed = once(closes, 'closed');
  await send(q, { path: '/hint' });
  const [hinted] = (await closed) as [number];
  t.ok(hinted >= 950 && hinted < 2_000, `timeout=3 kept it ${hinted.toFixed(0)} ms: the hint less 2 s of margin`);
});

t.test('close waits for the requests in flight; destroy fails them; a closed pool refuses', async (t) => {
  const b = await rawBackend(t, (_n, head, socket) => {
    if (head.startsWith('GET /later')) setTimeout(() => socket.write('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nlater'), 50);
    return undefined;
  });
  const p = pool(t, b.port);
  const laterReceived = once(b.events, 'request');
  const later = send(p, { path: '/later' });
  await laterReceived;
  const closed = p.close();
  await t.rejects(send(p), { code: H1_ERR.POOL_CLOSED }, 'no new request once closing');
  t.equal((await later).body.toString(), 'later', 'the request in flight completed');
  await closed;
  t.equal(p.connections, 0);
  const d = pool(t, b.port);
  const hangReceived = once(b.events, 'request');
  const hanging = send(d, { path: '/hang' });
  await hangReceived;
  await d.destroy();
  await t.rejects(hanging, { code: H1_ERR.POOL_CLOSED });
});
