// The server and client sessions over real UDP sockets on loopback: requests and responses,
// trailers, 1xx, backpressure both ways, concurrency and stream limits, GOAWAY drain, idle
// timeout, field-section limits both ways; after each test the server holds nothing.
import { X509Certificate, createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { once } from 'node:events';
import t from 'tap';
import { QUICStream, errors as quicErrors, events as quicEvents } from '@matrixai/quic';
import type { QUICConnection } from '@matrixai/quic';
import { QpackEncoder, encodeDataFrameHeader, encodeHeadersFrame } from '../src/index.ts';
import type { Http3Server, Http3ServerRequest, Http3ServerResponse } from '../src/index.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';
import { CONTROL_STREAMS, assertNothingHeld, connect, makePki, quicStreamsSettled, sessionsClosed, startServer } from './net-helpers.ts';

const pki = makePki(t);
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

/** The HEADERS frame of a POST to `path` on stream `id`, for a raw stream. */
function postHead(id: number, path: string): Uint8Array {
  return encodeHeadersFrame(new QpackEncoder().encodeFieldSection(id, [[':method', 'POST'], [':scheme', 'https'], [':authority', 'localhost'], [':path', path]]));
}

/** Answers every request with 200 "ok", its body read and dropped. */
function answerOk(server: Http3Server): void {
  server.on('request', (req, res) => {
    req.resume();
    res.end('ok');
  });
}

async function readAll(req: Http3ServerRequest): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of req) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

t.test('GET: request fields, connection facts, response headers and body', async (t) => {
  const { server, port } = await startServer(t, pki);
  let seen: Http3ServerRequest | undefined;
  server.on('request', (req, res) => {
    seen = req;
    req.resume();
    res.setHeader('x-answer', '42');
    res.setHeader('content-type', 'text/plain');
    res.end('hello');
  });
  const client = await connect(t, pki, port);
  const res = await client.fetch({ path: '/a/b?c=d', headers: { 'x-req': 'yes', cookie: ['a=1', 'b=2'] } });
  t.equal(res.status, 200);
  t.equal(res.headers['x-answer'], '42');
  t.equal(res.headers['content-type'], 'text/plain');
  t.ok(typeof res.headers['date'] === 'string', 'date added');
  t.equal(res.body.toString(), 'hello');
  const req = seen as Http3ServerRequest;
  t.match(req, { method: 'GET', url: '/a/b?c=d', authority: `localhost:${port}`, scheme: 'https', httpVersion: '3.0' });
  t.equal(req.headers[':path'], '/a/b?c=d', 'pseudo-headers in headers, as in http2');
  t.equal(req.headers['x-req'], 'yes');
  t.equal(req.headers['cookie'], 'a=1; b=2');
  t.ok(req.rawHeaders.includes('x-req'));
  t.match(req.socket, { remoteAddress: '127.0.0.1', serverName: 'localhost', alpnProtocol: 'h3', encrypted: true, resumed: false });
  t.match(req.socket.connectionId, /^[0-9a-f]{16,}$/, 'connection id as hex');
  const [session] = [...server.liveSessions];
  t.equal(session?.info.connectionId, req.socket.connectionId, 'per-connection info on the session');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('HEAD: headers only, even when the handler writes a body', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', (req, res) => {
    req.resume();
    res.writeHead(200, { 'content-length': 5 });
    res.end('hello');
  });
  const client = await connect(t, pki, port);
  const res = await client.fetch({ method: 'HEAD', path: '/' });
  t.equal(res.status, 200);
  t.equal(res.headers['content-length'], '5');
  t.equal(res.body.length, 0, 'no body on the wire');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('writeHead with a headers object: sent as given, read back by getHeader, validated first', async (t) => {
  const { server, port } = await startServer(t, pki);
  const seen: Record<string, unknown>[] = [];
  server.on('request', (req, res) => {
    req.resume();
    if (req.url === '/bad') {
      // Refused before anything is sent; the response can still be answered.
      t.throws(() => res.writeHead(200, { 'x-ok': 'a', 'x-bad': 'a\r\nb' }), /holds NUL, CR or LF/);
      t.equal(res.headersSent, false, 'nothing sent after the refusal');
      res.writeHead(400, { 'content-length': 3 });
      res.end('bad');
      return;
    }
    res.writeHead(201, { 'Content-Type': 'text/plain', 'X-List': ['1', '2'], 'x-number': 7, connection: 'close', 'x-unset': undefined, 'content-length': 2 });
    seen.push({
      type: res.getHeader('content-type'),
      typeAnyCase: res.getHeader('CONTENT-TYPE'),
      list: res.getHeader('x-list'),
      unset: res.getHeader('x-unset'),
      has: res.hasHeader('X-Number'),
      hasUnset: res.hasHeader('x-unset'),
      names: res.getHeaderNames(),
      headers: { ...res.getHeaders() },
    });
    t.throws(() => res.setHeader('x-late', '1'), /after the response head was sent/);
    res.end('hi');
  });
  const client = await connect(t, pki, port);
  const res = await client.fetch({ path: '/' });
  t.equal(res.status, 201);
  t.equal(res.headers['content-type'], 'text/plain');
  t.equal(res.headers['x-list'], '1, 2', 'a list becomes repeated lines');
  t.equal(res.headers['x-number'], '7');
  t.equal(res.headers['connection'], undefined, 'a connection-specific field is not sent (RFC 9114 §4.2)');
  t.equal(res.headers['x-unset'], undefined);
  t.ok(typeof res.headers['date'] === 'string', 'date added');
  t.equal(res.body.toString(), 'hi');
  t.same(seen, [{
    type: 'text/plain',
    typeAnyCase: 'text/plain',
    list: ['1', '2'],
    unset: undefined,
    has: true,
    hasUnset: false,
    names: ['content-type', 'x-list', 'x-number', 'connection', 'content-length'],
    headers: { 'content-type': 'text/plain', 'x-list': ['1', '2'], 'x-number': 7, connection: 'close', 'content-length': 2 },
  }]);
  const bad = await client.fetch({ path: '/bad' });
  t.equal(bad.status, 400);
  t.equal(bad.body.toString(), 'bad');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('POST echo with trailers in both directions', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', async (req, res) => {
    const body = await readAll(req);
    res.addTrailers({ 'x-sha256': sha(body), 'x-request-trailer': String(req.trailers['x-checksum']) });
    res.end(body);
  });
  const client = await connect(t, pki, port);
  const payload = Buffer.from('a'.repeat(100000));
  const res = await client.fetch({ method: 'POST', path: '/echo', body: payload, trailers: { 'x-checksum': 'abc' } });
  t.equal(res.status, 200);
  t.equal(res.body.length, payload.length);
  t.equal(res.trailers['x-sha256'], sha(payload));
  t.equal(res.trailers['x-request-trailer'], 'abc', 'request trailers reached the handler');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('1xx informational responses precede the final one', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', (req, res) => {
    res.writeContinue();
    res.writeEarlyHints({ link: '</s.css>; rel=preload; as=style' });
    t.throws(() => res.writeInformational(101), { code: 'EDGE_H3_INVALID_USE' }, '101 is not allowed in HTTP/3');
    req.resume();
    res.end('done');
  });
  const client = await connect(t, pki, port);
  const res = await client.fetch({ method: 'POST', body: 'x', headers: { expect: '100-continue' } });
  t.same(res.informational.map((i) => i.status), [100, 103]);
  t.equal(res.informational[1]?.headers['link'], '</s.css>; rel=preload; as=style');
  t.equal(res.body.toString(), 'done');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('large bodies with backpressure in both directions', async (t) => {
  const { server, port } = await startServer(t, pki, { bodyHighWaterMark: 65536, readChunkSize: 16384 });
  // Larger than the QUIC stream window (1 MiB) plus the JS buffers, so both sides must wait.
  const size = 2 * 1024 * 1024;
  let maxBuffered = 0;
  let falseWrites = 0;
  let drains = 0;
  server.on('request', async (req, res) => {
    if (req.url === '/upload') {
      // A slow consumer: one chunk per event-loop turn.
      const hash = createHash('sha256');
      let n = 0;
      for await (const c of req) {
        maxBuffered = Math.max(maxBuffered, req.readableLength);
        hash.update(c as Buffer);
        n += (c as Buffer).length;
        await new Promise((r) => setImmediate(r));
      }
      res.end(JSON.stringify({ n, sha: hash.digest('hex') }));
      return;
    }
    req.resume();
    res.writeHead(200, { 'content-length': size });
    const piece = Buffer.alloc(65536, 7);
    let left = size;
    res.on('drain', () => drains++);
    while (left > 0) {
      left -= piece.length;
      if (!res.write(piece)) {
        falseWrites++;
        await once(res, 'drain');
      }
    }
    res.end();
  });
  const client = await connect(t, pki, port);
  const up = Buffer.alloc(size, 3);
  const upRes = await client.fetch({ method: 'POST', path: '/upload', body: up });
  t.same(JSON.parse(upRes.body.toString()), { n: size, sha: sha(up) }, 'upload intact');
  t.ok(maxBuffered <= 65536 + 16384, `request body buffer stayed bounded (max ${maxBuffered} bytes)`);
  const down = await client.request({ path: '/download' });
  const hash = createHash('sha256');
  let n = 0;
  for await (const c of down.body) {
    hash.update(c as Buffer);
    n += (c as Buffer).length;
    await new Promise((r) => setImmediate(r));
  }
  t.equal(n, size, 'download complete');
  t.equal(hash.digest('hex'), sha(Buffer.alloc(size, 7)));
  t.ok(falseWrites > 0 && drains > 0, `write() returned false ${falseWrites} times and 'drain' followed`);
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('200 concurrent requests on one connection, and a per-connection stream limit', async (t) => {
  const { server, port } = await startServer(t, pki, { maxConcurrentStreams: 8 });
  let active = 0;
  let maxActive = 0;
  server.on('request', async (req, res) => {
    active++;
    maxActive = Math.max(maxActive, active);
    await readAll(req);
    res.end(req.url);
    res.on('close', () => active--);
  });
  const client = await connect(t, pki, port);
  const results = await Promise.all(Array.from({ length: 200 }, (_, i) => client.fetch({ path: `/${i}` })));
  t.same(results.map((r) => r.body.toString()), Array.from({ length: 200 }, (_, i) => `/${i}`), 'every response matches its request');
  t.equal(server.stats().sessions, 1, 'all on one connection');
  t.ok(maxActive <= 8, `never more than 8 streams at once (max ${maxActive})`);
  await client.close();
  await assertNothingHeld(t, server);
});

// Request streams read and end through the patched library's direct calls (tryRead, trySend,
// tryFinish): each must still close both directions and be released by the library while the
// connection stays open, whether its response fit QUIC's window at once or had to wait.
t.test('request streams are released while the connection stays open', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', async (req, res) => {
    const body = await readAll(req);
    const size = Number(req.headers['x-size'] ?? 0);
    res.end(size > 0 ? Buffer.alloc(size, body[0] ?? 1) : body);
  });
  const client = await connect(t, pki, port);
  const sizes = Array.from({ length: 120 }, (_, i) => (i % 3 === 0 ? 0 : i % 3 === 1 ? 20_000 : 300_000));
  const results = await Promise.all(
    sizes.map((size, i) => {
      const body = Buffer.alloc(size === 0 ? 5000 + i : 3, i % 250);
      return client.fetch({ method: 'POST', path: `/${i}`, headers: { 'x-size': String(size) }, body }).then((r) => ({ r, body, size }));
    }),
  );
  const wrong = results.filter(({ r, body, size }) => r.status !== 200 || sha(r.body) !== sha(size === 0 ? body : Buffer.alloc(size, body[0] ?? 1)));
  t.equal(wrong.length, 0, 'every body came back intact (echoed, or generated past the stream window)');
  t.equal(await quicStreamsSettled(server, CONTROL_STREAMS), CONTROL_STREAMS, 'the library holds only the control and QPACK streams');
  const s = server.stats();
  t.equal(s.sessions, 1, 'the connection is still open');
  t.equal(s.requestStreams, 0, 'no request stream left in the session');
  await client.close();
  await assertNothingHeld(t, server);
});

// The patched library builds a stream's WHATWG ReadableStream and WritableStream only when asked
// for (docs/decisions.md, row 17): our StreamIo reads and writes directly, so requests whose bodies
// fit the stream window build neither, on either side; a response larger than the window takes
// the writer (and so the WritableStream) to wait for capacity.
t.test('request streams build no WHATWG streams unless a write must wait for capacity', async (t) => {
  const built = { readable: 0, writable: 0 };
  for (const side of ['readable', 'writable'] as const) {
    // The exported class is the library's decorator subclass: the getter is on a prototype above it.
    let proto: object | null = QUICStream.prototype;
    while (proto !== null && Object.getOwnPropertyDescriptor(proto, side) === undefined) proto = Object.getPrototypeOf(proto) as object | null;
    const d = proto === null ? undefined : Object.getOwnPropertyDescriptor(proto, side);
    const get = d?.get;
    if (proto === null || d === undefined || get === undefined) {
      t.fail(`QUICStream.${side} is not a getter: the library is not patched`);
      return;
    }
    const owner = proto;
    Object.defineProperty(owner, side, { ...d, get(this: QUICStream) { if ((this as unknown as Record<string, unknown>)[`_${side}`] === undefined) built[side]++; return get.call(this) as unknown; } });
    t.teardown(() => Object.defineProperty(owner, side, d));
  }
  const { server, port } = await startServer(t, pki);
  server.on('request', async (req, res) => {
    const body = await readAll(req);
    res.end(req.headers['x-size'] === undefined ? body : Buffer.alloc(Number(req.headers['x-size']), 7));
  });
  const client = await connect(t, pki, port);
  const small = await Promise.all(Array.from({ length: 30 }, (_, i) => client.fetch({ method: 'POST', path: `/${i}`, body: Buffer.alloc(100 + i, i) })));
  t.same(small.map((r) => r.status), Array(30).fill(200), '30 requests with small bodies answered');
  t.same(built, { readable: 0, writable: 0 }, 'no ReadableStream or WritableStream built, client or server side');
  const big = await client.fetch({ method: 'GET', path: '/big', headers: { 'x-size': '2000000' } });
  t.equal(big.body.length, 2_000_000, 'a 2 MB response, past the stream window');
  t.ok(built.writable >= 1, `its writes waited for capacity through the WritableStream (${built.writable} built)`);
  t.equal(built.readable, 0, 'still no ReadableStream');
  await client.close();
});

// The patched library (docs/decisions.md, row 18) no longer has a stream listen to its own error
// and close events: it calls what those listeners did, and builds and dispatches the event only
// when someone else listens, and a stream whose sides both closed is destroyed synchronously (rows
// 18-19). A request stream, client or server side, then dispatches only the Destroyed event the
// connection listens to and carries only the connection's three listeners; a listener added to a
// stream still sees its close and error events.
t.test('request streams dispatch no events nobody listens to, and listeners still see them', async (t) => {
  const isBidi = (s: QUICStream): boolean => (Number(s.streamId) & 2) === 0;
  const dispatched = new Map<string, number>();
  let listeners = 0;
  let asyncDestroys = 0;
  const proto = QUICStream.prototype as unknown as { dispatchEvent(e: Event): boolean; addEventListener(...a: unknown[]): void; destroy(...a: unknown[]): Promise<void> };
  const { dispatchEvent, addEventListener, destroy } = proto;
  proto.destroy = function (this: QUICStream, ...a: unknown[]) {
    if (isBidi(this)) asyncDestroys++;
    return destroy.apply(this, a);
  };
  proto.dispatchEvent = function (this: QUICStream, e: Event) {
    if (isBidi(this)) dispatched.set(e.type, (dispatched.get(e.type) ?? 0) + 1);
    return dispatchEvent.call(this, e);
  };
  proto.addEventListener = function (this: QUICStream, ...a: unknown[]) {
    if (isBidi(this)) listeners++;
    addEventListener.apply(this, a);
  };
  t.teardown(() => {
    delete (proto as Partial<typeof proto>).dispatchEvent;
    delete (proto as Partial<typeof proto>).addEventListener;
    delete (proto as Partial<typeof proto>).destroy;
  });
  const { server, port } = await startServer(t, pki);
  let arrived: (path: string) => void = () => {};
  server.on('request', async (req, res) => {
    arrived(req.url);
    const body = await readAll(req).catch(() => undefined);
    if (body !== undefined) res.end(body);
  });
  const client = await connect(t, pki, port);
  const small = await Promise.all(Array.from({ length: 30 }, (_, i) => client.fetch({ method: 'POST', path: `/${i}`, body: Buffer.alloc(100 + i, i) })));
  t.same(small.map((r) => r.status), Array(30).fill(200), '30 requests answered');
  t.equal(await quicStreamsSettled(server, CONTROL_STREAMS), CONTROL_STREAMS, 'every request stream released');
  t.same(Object.fromEntries(dispatched), { EventQUICStreamDestroyed: 60 },
    'the 60 request streams (30 each side) dispatched only Destroyed, which the connection listens to');
  t.equal(listeners, 180, 'three listeners per request stream: the connection\'s');
  t.equal(asyncDestroys, 0, 'each closed stream destroyed synchronously, not through the locked async destroy()');

  // Listeners on every new stream from here on: the events still reach them.
  const seen: Array<{ id: number; type: string; detail: unknown }> = [];
  const created: number[] = [];
  const { createQUICStream } = QUICStream;
  const types = [quicEvents.EventQUICStreamCloseRead.name, quicEvents.EventQUICStreamCloseWrite.name, quicEvents.EventQUICStreamError.name, quicEvents.EventQUICStreamDestroy.name];
  QUICStream.createQUICStream = function (this: typeof QUICStream, ...a: Parameters<typeof createQUICStream>) {
    const stream = createQUICStream.apply(this, a);
    created.push(Number(stream.streamId));
    for (const type of types) stream.addEventListener(type, (e: Event) => seen.push({ id: Number(stream.streamId), type, detail: (e as CustomEvent).detail }));
    return stream;
  } as typeof createQUICStream;
  t.teardown(() => { delete (QUICStream as Partial<typeof QUICStream>).createQUICStream; });
  const res = await client.fetch({ method: 'POST', path: '/observed', body: Buffer.from('seen') });
  t.equal(res.body.toString(), 'seen', 'an observed request answered');
  const raw = await client.openRawStream('bidi');
  const resetArrived = new Promise<string>((r) => (arrived = r));
  await raw.write(Buffer.concat([postHead(raw.id, '/reset'), encodeDataFrameHeader(1000), Buffer.alloc(10)]));
  t.equal(await resetArrived, '/reset', 'the server has the request whose body is then reset');
  raw.reset(0x10c);
  t.equal(await quicStreamsSettled(server, CONTROL_STREAMS), CONTROL_STREAMS, 'the reset stream released');
  const of = (type: string) => seen.filter((s) => s.type === type);
  const observed = created.find((id) => (id & 2) === 0);
  t.equal(of('EventQUICStreamCloseRead').filter((s) => s.id === observed).length, 2, 'the observed request\'s stream saw CloseRead, on each side');
  t.equal(of('EventQUICStreamCloseWrite').filter((s) => s.id === observed).length, 2, 'and CloseWrite, on each side');
  t.equal(of('EventQUICStreamDestroy').filter((s) => s.id === observed).length, 2, 'and Destroy, on each side');
  t.ok(of('EventQUICStreamError').some((s) => s.id === raw.id && s.detail instanceof quicErrors.ErrorQUICStreamPeerRead),
    'the server\'s stream saw the peer\'s reset as an EventQUICStreamError (ErrorQUICStreamPeerRead)');
  t.ok(of('EventQUICStreamCloseRead').some((s) => s.id === raw.id && s.detail instanceof quicErrors.ErrorQUICStreamPeerRead),
    'and the CloseRead that followed it carries that error');
  await client.close();
  await assertNothingHeld(t, server);
});

// The patched library builds the quiche config (its BoringSSL context, the certificate and key
// parsed from PEM) once per server configuration and shares it between the connections it
// accepts (docs/decisions.md, row 22); a configuration change builds a new one for the connections
// after it (test/live-keys.test.ts shows those connections advertise the new idle timeout).
t.test('connections share one quiche config until the server configuration changes', async (t) => {
  const { server, port } = await startServer(t, pki, { retry: false });
  const quic = (server as unknown as { quic: { sharedQuicheConfig?: () => object } }).quic;
  const share = quic.sharedQuicheConfig;
  if (share === undefined) {
    t.fail('QUICServer.sharedQuicheConfig is missing: the library is not patched');
    return;
  }
  const handed: object[] = [];
  quic.sharedQuicheConfig = function (this: unknown) {
    const config = share.call(this);
    handed.push(config);
    return config;
  };
  answerOk(server);
  const answer = async (): Promise<string> => {
    const client = await connect(t, pki, port);
    const body = (await client.fetch({})).body.toString();
    await client.close();
    return body;
  };
  t.same(await Promise.all([answer(), answer(), answer()]), ['ok', 'ok', 'ok'], 'three connections served');
  t.equal(handed.length, 3, 'each accepted connection took the shared config');
  t.equal(new Set(handed).size, 1, 'the same one');
  server.setIdleTimeout(20_000);
  t.equal(await answer(), 'ok', 'a connection after a configuration change served');
  t.equal(handed.length, 4);
  t.not(handed[3], handed[0], 'it took a config built from the new configuration');
  await assertNothingHeld(t, server);
});

/** The library connection under a server session (a private field, read for these tests). */
function quicConnectionOf(session: unknown): QUICConnection {
  return (session as { conn: QUICConnection }).conn;
}

// The patched library converts a certificate chain from PEM to DER once per certificate value,
// not once per accepted connection (docs/decisions.md, "Performance patches", row 24); a new
// certificate is converted for the connections after it.
t.test('connections share one DER certificate chain until the certificate changes', async (t) => {
  const { server, port } = await startServer(t, pki, { retry: false });
  answerOk(server);
  const chainOfNextConnection = async (): Promise<Uint8Array[]> => {
    const client = await connect(t, pki, port);
    t.equal((await client.fetch({})).body.toString(), 'ok');
    const chain = quicConnectionOf([...server.liveSessions].at(-1)).getLocalCertsChain();
    await client.close();
    await sessionsClosed(server);
    return chain;
  };
  const first = await chainOfNextConnection();
  const second = await chainOfNextConnection();
  t.equal(first.length, 1, 'one certificate in the chain');
  t.same(Buffer.from(first[0] as Uint8Array), new X509Certificate(pki.certPem).raw, 'the server certificate in DER');
  t.equal(second, first, 'the second connection has the same array: converted once');
  t.ok(Object.isFrozen(first), 'frozen, since every connection shares it');
  t.throws(() => first.push(new Uint8Array(1)), TypeError, 'a holder cannot change it for the others');

  const ca = makeCa(path.join(pki.dir, 'ca2'), 'ca2');
  const other = makeLeaf(path.join(pki.dir, 'ca2'), 'server2', ca, { sans: ['localhost'] });
  server.setCertificate(readFileSync(other.cert, 'utf8'), readFileSync(other.key, 'utf8'));
  const client = await connect(t, { ...pki, caPem: readFileSync(ca.cert, 'utf8') }, port);
  t.equal((await client.fetch({})).body.toString(), 'ok', 'a connection after the certificate changed served');
  const third = quicConnectionOf([...server.liveSessions].at(-1)).getLocalCertsChain();
  t.same(Buffer.from(third[0] as Uint8Array), new X509Certificate(readFileSync(other.cert)).raw, 'with the new certificate');
  t.not(third, first);
  await client.close();
  await assertNothingHeld(t, server);
});

// The errors that report the ordinary end of a connection carry no stack trace: the peer's close,
// and the cancel of the control and QPACK streams when the connection stops (docs/decisions.md,
// "Performance patches", row 23). Everything else about them is as before.
t.test('the errors of an ordinary connection end are built without a stack trace', async (t) => {
  const { server, port } = await startServer(t, pki);
  answerOk(server);
  const client = await connect(t, pki, port);
  t.equal((await client.fetch({})).body.toString(), 'ok');
  const conn = quicConnectionOf([...server.liveSessions][0]);
  const connectionErrors: unknown[] = [];
  const streamErrors: unknown[] = [];
  conn.addEventListener(quicEvents.EventQUICConnectionError.name, (e: Event) => connectionErrors.push((e as CustomEvent).detail));
  const uni = [...(conn as unknown as { streamMap: Map<number, QUICStream> }).streamMap.values()];
  t.equal(uni.length, CONTROL_STREAMS, 'the control and QPACK streams of both sides are open');
  for (const stream of uni) stream.addEventListener(quicEvents.EventQUICStreamError.name, (e: Event) => streamErrors.push((e as CustomEvent).detail));
  await client.close();
  await assertNothingHeld(t, server);
  const frames = (e: unknown): number => String((e as Error).stack).split('\n').filter((l) => l.trimStart().startsWith('at ')).length;
  const peer = connectionErrors.find((e) => e instanceof quicErrors.ErrorQUICConnectionPeer);
  t.ok(peer, 'the server saw the peer close the connection');
  t.equal((peer as Error).message, 'Peer closed with application code 256', 'H3_NO_ERROR, in the message');
  t.match((peer as { data: unknown }).data, { isApp: true, errorCode: 0x100 }, 'and in the data');
  t.equal(frames(peer), 0, 'no stack frames');
  const local = streamErrors.filter((e) => e instanceof quicErrors.ErrorQUICStreamLocalRead || e instanceof quicErrors.ErrorQUICStreamLocalWrite);
  t.equal(local.length, CONTROL_STREAMS, 'each control or QPACK stream was cancelled when the connection stopped');
  t.same(local.map(frames), Array(CONTROL_STREAMS).fill(0), 'none with stack frames');
  t.ok(local.every((e) => typeof (e as { data: { code: unknown } }).data.code === 'number'), 'each with the code sent to the peer');
  // Errors that report a fault still carry their stack.
  t.ok(frames(new quicErrors.ErrorQUICStreamInternal('x')) > 0, 'an internal error has its stack');
});

// With direct reads the library hands a reset to the reader; when the reader is paused (a body
// nobody consumes) the library must still take the reset at once and release the stream.
t.test('a request reset while its body is paused is released by the library at once', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', (_req: Http3ServerRequest, res: Http3ServerResponse) => res.end('ok')); // the body is never read
  const client = await connect(t, pki, port);
  const raw = await client.openRawStream('bidi');
  // Past the request body's high-water mark (64 KiB), so the server's read loop pauses.
  await raw.write(Buffer.concat([postHead(raw.id, '/up'), encodeDataFrameHeader(1_000_000), Buffer.alloc(200_000)]));
  const response = await raw.readAll();
  t.ok(response.fin, 'the response ended with FIN while the request body was still open');
  raw.reset(0x10c);
  t.equal(await quicStreamsSettled(server, CONTROL_STREAMS), CONTROL_STREAMS, 'the reset stream is released with the connection still open');
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('GOAWAY: in-flight requests finish, new ones are refused, then the connection closes', async (t) => {
  const { server, port } = await startServer(t, pki);
  let release: () => void = () => {};
  const held = new Promise<void>((r) => (release = r));
  let arrived: () => void = () => {};
  const arrivedP = new Promise<void>((r) => (arrived = r));
  server.on('request', async (req, res) => {
    req.resume();
    arrived();
    await held;
    res.end('finished after GOAWAY');
  });
  const client = await connect(t, pki, port);
  const inFlight = client.fetch({ path: '/slow' });
  await arrivedP;
  const goaway = once(client, 'goaway');
  const closing = server.close(10000);
  const [id] = (await goaway) as [number];
  t.equal(id, 4, 'GOAWAY names the first unprocessed request stream');
  await t.rejects(client.request({ path: '/new' }), { code: 'EDGE_H3_GOAWAY' }, 'no new requests after GOAWAY');
  release();
  const res = await inFlight;
  t.equal(res.body.toString(), 'finished after GOAWAY');
  // Listen before awaiting the server: the client may finish its own draining period first
  // (RFC 9000 §10.2.2), which is as valid as the other order.
  const clientClosed = once(client, 'close');
  await closing;
  const [info] = (await clientClosed) as [{ by: string; code: number; isApp: boolean }];
  t.match(info, { by: 'peer', code: 0x100, isApp: true }, 'closed with H3_NO_ERROR');
  await assertNothingHeld(t, server);
});

t.test('drain period: requests still running when it ends are cut off', async (t) => {
  const { server, port } = await startServer(t, pki);
  let arrived: () => void = () => {};
  const arrivedP = new Promise<void>((r) => (arrived = r));
  server.on('request', (req) => {
    req.resume();
    arrived(); // never answers
  });
  const client = await connect(t, pki, port);
  const stuck = t.rejects(client.fetch({ path: '/never' }), { code: 'EDGE_H3_CONNECTION_LOST' });
  await arrivedP;
  await server.close(200);
  await stuck;
  await assertNothingHeld(t, server);
});

t.test('idle timeout closes a quiet connection', async (t) => {
  const { server, port } = await startServer(t, pki, { maxIdleTimeoutMs: 300 });
  server.on('request', (req, res) => {
    req.resume();
    res.end();
  });
  const client = await connect(t, pki, port, { maxIdleTimeoutMs: 60000 });
  await client.fetch({});
  const [session] = [...server.liveSessions];
  t.ok(session);
  const [[serverInfo], [clientInfo]] = (await Promise.all([once(session!, 'close'), once(client, 'close')])) as [[{ by: string }], [{ by: string }]];
  t.equal(serverInfo.by, 'idle', 'the server session ended by its idle timer');
  t.equal(clientInfo.by, 'idle', 'so did the client (the smaller idle timeout wins, RFC 9000 §10.1)');
  await assertNothingHeld(t, server);
});

t.test('SETTINGS_MAX_FIELD_SECTION_SIZE is enforced both ways', async (t) => {
  const { server, port } = await startServer(t, pki, { maxFieldSectionSize: 2048 });
  const codes: string[] = [];
  server.on('request', (req, res) => {
    req.resume();
    try {
      res.setHeader('x-big', 'y'.repeat(3000));
      res.writeHead(200);
    } catch (err) {
      codes.push((err as { code: string }).code);
      res.removeHeader('x-big');
      res.writeHead(500);
    }
    res.end();
  });
  const client = await connect(t, pki, port, { maxFieldSectionSize: 1024 });
  await client.fetch({}); // the server's SETTINGS have arrived once a response did
  await t.rejects(client.request({ headers: { 'x-big': 'z'.repeat(4096) } }), { code: 'EDGE_H3_FIELD_SECTION_TOO_LARGE' }, 'the client does not send a section over the server limit');
  const res = await client.fetch({});
  t.equal(res.status, 500, 'the server could not send a head over the client limit');
  t.same(codes, ['EDGE_H3_FIELD_SECTION_TOO_LARGE', 'EDGE_H3_FIELD_SECTION_TOO_LARGE']);
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('a throwing handler costs one request, not the server', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', (req, res) => {
    if (req.url === '/throw') throw new Error('handler bug');
    req.resume();
    res.end('fine');
  });
  const errors: unknown[] = [];
  server.on('handlerError', (err) => errors.push(err));
  const client = await connect(t, pki, port);
  await t.rejects(client.request({ path: '/throw' }), { code: 'H3_INTERNAL_ERROR' });
  t.equal((await client.fetch({ path: '/ok' })).body.toString(), 'fine');
  t.equal(errors.length, 1);
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('a client cancelling mid-upload aborts the request on the server', async (t) => {
  const { server, port } = await startServer(t, pki);
  const events: string[] = [];
  let gotData: () => void = () => {};
  const gotDataP = new Promise<void>((r) => (gotData = r));
  let closed: () => void = () => {};
  const closedP = new Promise<void>((r) => (closed = r));
  server.on('request', (req: Http3ServerRequest, res: Http3ServerResponse) => {
    req.on('aborted', () => events.push('aborted'));
    req.once('data', () => gotData());
    res.on('close', () => {
      events.push(`res close finished=${res.writableFinished}`);
      closed();
    });
  });
  const client = await connect(t, pki, port);
  const raw = await client.openRawStream('bidi');
  await raw.write(Buffer.concat([postHead(raw.id, '/up'), encodeDataFrameHeader(1000000), Buffer.alloc(5000)]));
  await gotDataP;
  raw.reset(0x10c);
  await closedP;
  t.same(events, ['aborted', 'res close finished=false']);
  await client.close();
  await assertNothingHeld(t, server);
});

t.test('worker options: reusePort binds, a shared ticket key resumes across servers', async (t) => {
  const { randomBytes } = await import('node:crypto');
  const { Http3Server } = await import('../src/index.ts');
  const keys = { ticketKey: randomBytes(48), cryptoKey: randomBytes(32) };
  const a = new Http3Server({ key: pki.keyPem, cert: pki.certPem, ...keys });
  const b = new Http3Server({ key: pki.keyPem, cert: pki.certPem, ...keys });
  t.teardown(() => Promise.all([a.destroy(), b.destroy()]));
  const { port } = await a.listen({ host: '127.0.0.1', port: 0, reusePort: true });
  const bound = await b.listen({ host: '127.0.0.1', port, reusePort: true });
  t.equal(bound.port, port, 'two servers share one port with reusePort, as cluster workers do');
  const other = new Http3Server({ key: pki.keyPem, cert: pki.certPem, ...keys });
  t.teardown(() => other.destroy());
  const { port: otherPort } = await other.listen({ host: '127.0.0.1', port: 0 });
  for (const s of [a, b, other]) {
    s.on('request', (req, res) => {
      req.resume();
      res.end(String(req.socket.resumed));
    });
  }
  const first = await connect(t, pki, port);
  t.equal((await first.fetch({})).body.toString(), 'false', 'full handshake first');
  const ticket = first.ticket();
  t.ok(ticket !== undefined, 'our client kept the session ticket');
  await first.close();
  // A different server process with the same keys accepts the ticket.
  const second = await connect(t, pki, otherPort, { sessionTicket: ticket as Uint8Array });
  t.equal(second.info.resumed, true, 'resumed on another server with the shared ticket key');
  t.equal((await second.fetch({})).body.toString(), 'true', 'the server sees resumed too');
  await second.close();
  const stranger = new Http3Server({ key: pki.keyPem, cert: pki.certPem });
  t.teardown(() => stranger.destroy());
  const { port: strangerPort } = await stranger.listen({ host: '127.0.0.1', port: 0 });
  stranger.on('request', (req, res) => {
    req.resume();
    res.end(String(req.socket.resumed));
  });
  const third = await connect(t, pki, strangerPort, { sessionTicket: ticket as Uint8Array });
  t.equal((await third.fetch({})).body.toString(), 'false', 'a server without the key falls back to a full handshake');
  await third.close();
  for (const s of [a, b, other, stranger]) await assertNothingHeld(t, s);
});
