// An HTTP/2 session's idle deadline against the event loop's order (connection-deadlines.ts): the
// deadline sweep runs in the timers phase, before the loop reads its sockets. A worker busy past a
// session's deadline must not refuse a request that arrived meanwhile (CI, 2026-11-27: a client's
// only request answered RST_STREAM REFUSED_STREAM while the worker was under the HTTP/2 abuse
// rounds). Real sockets: node's HTTP/2 server and client in this process, over TLS on 127.0.0.1.
import t from 'tap';
import type { Test } from 'tap';
import http2 from 'node:http2';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { SessionIdle } from '../src/ingress/connection-deadlines.ts';
import { DeadlineSweep } from '../src/proxy/deadline-sweep.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-session-idle-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const leaf = makeLeaf(dir, 'leaf', ca, { sans: ['localhost', '127.0.0.1'] });

interface Served {
  readonly port: number;
  /** The server side of the next session, with its deadline object (firstMs 0: due at once). */
  nextSession(): Promise<{ idle: SessionIdle; session: http2.ServerHttp2Session }>;
  close(): Promise<void>;
}

async function serve(): Promise<Served> {
  const sweep = new DeadlineSweep(100);
  let accepting: TLSSocket | undefined;
  const waiting: Array<(s: { idle: SessionIdle; session: http2.ServerHttp2Session }) => void> = [];
  const idles = new WeakMap<http2.Http2Session, SessionIdle>();
  const server = http2.createSecureServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) });
  server.prependListener('secureConnection', (socket: TLSSocket) => {
    accepting = socket;
  });
  server.on('session', (session) => {
    const idle = new SessionIdle(session, accepting, { firstMs: 0, idleMs: 60_000, sendIdleMs: 60_000, onStall: () => {} }, sweep);
    idles.set(session, idle);
    session.once('close', () => sweep.delete(idle));
    waiting.shift()?.({ idle, session });
  });
  server.on('stream', (stream) => {
    idles.get(stream.session as http2.Http2Session)?.streamOpened(stream);
    stream.respond({ ':status': 200 });
    stream.end('ok');
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    nextSession: () => new Promise((resolve) => waiting.push(resolve)),
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** The status of `req`, or the error that ended it. */
function outcome(req: http2.ClientHttp2Stream): Promise<string> {
  return new Promise((resolve) => {
    req.on('response', (h) => resolve(String(h[':status'])));
    req.on('error', (err: Error & { code?: string }) => resolve(`${err.code ?? 'error'}: ${err.message}`));
    req.resume();
  });
}

/** A server and a client connected to it, settings exchanged; both closed in `t`'s teardown. */
async function connected(t: Test): Promise<{ client: http2.ClientHttp2Session; idle: SessionIdle; session: http2.ServerHttp2Session }> {
  const srv = await serve();
  t.teardown(() => srv.close());
  const next = srv.nextSession();
  const client = http2.connect(`https://localhost:${srv.port}`, { ca: readFileSync(ca.cert) });
  t.teardown(() => client.destroy());
  const { idle, session } = await next;
  await once(client, 'remoteSettings');
  return { client, idle, session };
}

t.test('a request that arrived while the worker was busy past the idle deadline is served, not refused', async (t) => {
  const { client, idle, session } = await connected(t);
  // The request leaves the client on this turn (node writes a session's frames from a native
  // immediate, which runs before the JavaScript ones); the server reads it on the next poll phase.
  const req = client.request({ ':path': '/' });
  await new Promise((resolve) => setImmediate(resolve));
  // The sweep's moment: the deadline (firstMs 0) is long past, the request is in the socket, unread.
  idle.expire();
  t.equal(await outcome(req), '200', 'the waiting request was answered');
  t.equal(session.closed, false, 'and the session was not sent GOAWAY');
});

t.test('a session still idle once its input is read is closed with GOAWAY', async (t) => {
  const { client, idle } = await connected(t);
  const goaway = once(client, 'goaway');
  idle.expire();
  const [code] = (await goaway) as [number];
  t.equal(code, http2.constants.NGHTTP2_NO_ERROR, 'GOAWAY with NO_ERROR');
});
