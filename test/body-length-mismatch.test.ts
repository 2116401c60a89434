// A request body longer or shorter than its `content-length` on HTTP/2 and HTTP/3 (issue 38,
// own pass): such a message is malformed (RFC 9113 §8.1.1, RFC 9114 §4.1.2) and an intermediary
// must not forward it. The upstream request is framed by the same content-length, so before the
// fix the backend took the declared bytes as a complete request: extra bytes sent after it had
// answered went unnoticed (the client got 200), extra bytes sent sooner reset the client's stream
// only after the backend had processed the request. Against a real `edge-proxy serve` (2 workers)
// and a real HTTP/1.1 backend that records every request body it read to its end
// (test/support/controlled-backend.ts, `echo-sha256`): for each malformed shape the client gets a
// stream error (RST_STREAM PROTOCOL_ERROR, RESET_STREAM H3_MESSAGE_ERROR), the backend reads no
// request to its end and its request is aborted, the in-flight slots return to 0, and the access
// log records EDGE_REQUEST_BODY_LENGTH_MISMATCH. An ordinary POST is still 200, byte-exact.
//
// HTTP/2 as nghttp2 1.6x in Node 24 enforces it (before any of our code runs): an END_STREAM short
// of the length resets the stream (RST_STREAM PROTOCOL_ERROR); DATA beyond it fails the whole
// connection (GOAWAY INTERNAL_ERROR when it gets out, the stream reset with it). Each HTTP/2 shape
// runs on its own connection.
import t from 'tap';
import http2 from 'node:http2';
import { randomBytes } from 'node:crypto';
import { Http3ClientSession } from '@edge-proxy/http3';
import { controlledBackend, sha256 } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { loadNow, pollUntil, startProxy } from './support/overload.ts';
import type { StartedProxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-body-length-');
const be = await controlledBackend(t, 'cl');
be.set({ kind: 'echo-sha256' }, '/cl');

const p: StartedProxy = await startProxy(t, files, 'body-length', {
  workers: 2,
  performance: 'global_inflight_limit: 100',
  upstream: `{ cl: { route: { path_prefix: /cl }, backends: [{ id: cl-1, address: "127.0.0.1:${be.port}" }] } }`,
  resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false } }',
  observability: '  access_log: { enabled: true }\n',
});

/** A request line smuggled after the declared length: were it forwarded, a backend would read it as a second request. */
const SMUGGLED = Buffer.from('GET /cl/smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n');

/**
 * How long a backend that has the whole body takes to answer, at most, on this machine: the
 * window in which, before the fix, the backend had answered a request whose client had not yet
 * ended its stream (it answered in ~2 ms). An observation window, not a synchronisation.
 */
const ANSWER_WINDOW_MS = 400;

/** One malformed request: its `content-length`, the body sent before the pause, and what follows it. */
interface Shape {
  readonly name: string;
  /** More bytes than declared (else fewer). */
  readonly longer: boolean;
  readonly contentLength: number;
  /** Sent first. */
  readonly first: Buffer;
  /** Sent after the backend has the request and `ANSWER_WINDOW_MS` passed (undefined: straight after `first`). */
  readonly later?: Buffer;
  /** Sent straight after `first` (before the backend could answer). */
  readonly rest?: Buffer;
}

const SHAPES: readonly Shape[] = [
  { name: 'longer, the extra sent before the backend could answer', longer: true, contentLength: 1000, first: Buffer.alloc(1000, 0x61), rest: Buffer.alloc(10, 0x62) },
  { name: 'longer, the extra sent after the backend had time to answer', longer: true, contentLength: 1000, first: Buffer.alloc(1000, 0x61), later: Buffer.alloc(10, 0x62) },
  { name: 'longer, in one DATA frame', longer: true, contentLength: 1000, first: Buffer.alloc(1010, 0x61) },
  { name: 'shorter, then the end of stream', longer: false, contentLength: 1000, first: Buffer.alloc(600, 0x61) },
  { name: 'shorter, the end of stream after the backend had time to answer', longer: false, contentLength: 1000, first: Buffer.alloc(600, 0x61), later: Buffer.alloc(0) },
  { name: 'a request line smuggled after the declared length', longer: true, contentLength: 5, first: Buffer.from('hello'), rest: SMUGGLED },
  { name: 'a request line smuggled after the backend had time to answer', longer: true, contentLength: 5, first: Buffer.from('hello'), later: SMUGGLED },
];

/** What the backend saw under `prefix`: arrivals, and bodies it read to their end (complete requests). */
function backendSaw(prefix: string): { arrivals: number; complete: number } {
  return { arrivals: be.arrivalsUnder(prefix).length, complete: be.bodies.filter((b) => b.path.startsWith(prefix)).length };
}

/** Resolves once the backend has the request for `path` and `ANSWER_WINDOW_MS` passed; what it had read to the end by then. */
async function backendHadTime(path: string): Promise<number> {
  await be.until(() => be.arrivalsUnder(path).length > 0, `the request ${path} arrived`);
  await new Promise((r) => setTimeout(r, ANSWER_WINDOW_MS));
  return backendSaw(path).complete;
}

/** The access log line of request `id` (the worker's log is buffered). */
function accessLine(id: string): Promise<Record<string, unknown>> {
  return p.served.waitFor((l) => l['log_type'] === 'access' && l['request_id'] === id, 10_000);
}

const inflightReaches0 = (): Promise<number> => pollUntil(async () => (await loadNow(p)).inflight, (v) => v === 0, 8000);

/** What the client saw: `status <n>` when answered, else the stream error (`reset <code>`; `connection closed (...)` when the connection failed). */
type Seen = { readonly outcome: string; readonly heldBeforeLater: number | undefined };

/** A new HTTP/2 connection to the proxy (destroyed at teardown); `goaway` holds the code of a GOAWAY it received. */
async function h2Connect(t: { teardown(fn: () => unknown): void }): Promise<{ session: http2.ClientHttp2Session; goaway: { code: number | undefined } }> {
  const session = http2.connect(`https://localhost:${p.lport}`, { ca: p.ca, host: '127.0.0.1', servername: 'localhost' } as http2.SecureClientSessionOptions);
  const goaway: { code: number | undefined } = { code: undefined };
  session.on('error', () => undefined);
  session.on('goaway', (code: number) => (goaway.code = code));
  t.teardown(() => session.destroy());
  await new Promise<void>((resolve, reject) => session.once('connect', () => resolve()).once('error', reject));
  return { session, goaway };
}

async function h2Send(t: { teardown(fn: () => unknown): void }, path: string, id: string, shape: Shape): Promise<Seen> {
  const { session, goaway } = await h2Connect(t);
  const stream = session.request({ ':method': 'POST', ':path': path, 'content-length': String(shape.contentLength), 'x-request-id': id }, { endStream: false });
  const outcome = new Promise<string>((resolve) => {
    stream.on('response', (h) => resolve(`status ${String(h[':status'])}`));
    stream.on('error', () => undefined);
    stream.on('close', () => {
      // A stream ended by its connection's failure: what the connection was closed with (the
      // GOAWAY and the stream's close come in either order).
      if (stream.rstCode === http2.constants.NGHTTP2_PROTOCOL_ERROR) resolve(`reset ${stream.rstCode}`);
      else if (session.closed || session.destroyed) resolve(`connection closed (GOAWAY ${goaway.code}, stream ${stream.rstCode})`);
      else session.once('close', () => resolve(`connection closed (GOAWAY ${goaway.code}, stream ${stream.rstCode})`));
    });
  });
  stream.write(shape.first);
  if (shape.rest !== undefined) stream.write(shape.rest);
  let heldBeforeLater: number | undefined;
  if (shape.later !== undefined) {
    heldBeforeLater = await backendHadTime(path);
    if (!stream.destroyed && shape.later.length > 0) stream.write(shape.later);
  }
  if (!stream.destroyed) stream.end();
  return { outcome: await outcome, heldBeforeLater };
}

async function h3Send(session: Http3ClientSession, path: string, id: string, shape: Shape): Promise<Seen> {
  let heldBeforeLater: number | undefined;
  async function* body(): AsyncGenerator<Uint8Array> {
    yield shape.first;
    if (shape.rest !== undefined) yield shape.rest;
    if (shape.later !== undefined) {
      heldBeforeLater = await backendHadTime(path);
      if (shape.later.length > 0) yield shape.later;
    }
  }
  const outcome = await session.fetch({ method: 'POST', path, headers: { 'content-length': String(shape.contentLength), 'x-request-id': id }, body: body(), timeoutMs: 10_000 }).then(
    (r) => `status ${r.status}`,
    (e: unknown) => `reset ${String((e as { code?: unknown }).code)}`,
  );
  return { outcome, heldBeforeLater };
}

/** What the client sees of a shape: see the file comment. */
function expected(protocol: 'h2' | 'h3', shape: Shape): string {
  if (protocol === 'h3') return 'reset H3_MESSAGE_ERROR';
  return shape.longer ? 'connection closed' : `reset ${http2.constants.NGHTTP2_PROTOCOL_ERROR}`;
}

for (const protocol of ['h2', 'h3'] as const) {
  t.test(`${protocol}: an exact content-length POST is 200 and byte-exact; every longer or shorter body is a stream error the backend never reads to its end`, async (t) => {
    let h2s: http2.ClientHttp2Session | undefined;
    let h3s: Http3ClientSession | undefined;
    if (protocol === 'h2') {
      h2s = (await h2Connect(t)).session;
    } else {
      const session = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 10_000 });
      t.teardown(() => session.close(true).catch(() => undefined));
      h3s = session;
    }
    const send = (path: string, id: string, shape: Shape): Promise<Seen> => (h2s !== undefined ? h2Send(t, path, id, shape) : h3Send(h3s as Http3ClientSession, path, id, shape));

    // An ordinary upload: 200, and the backend read exactly the bytes sent.
    const exact = randomBytes(100_000);
    const okPath = `/cl/${protocol}/exact`;
    let answer: { status: number; body: string };
    if (h2s !== undefined) {
      const stream = h2s.request({ ':method': 'POST', ':path': okPath, 'content-length': String(exact.length) });
      stream.end(exact);
      const [status, text] = await Promise.all([new Promise<number>((r) => stream.once('response', (h) => r(Number(h[':status'])))), (async () => {
        let s = '';
        for await (const c of stream) s += String(c);
        return s;
      })()]);
      answer = { status, body: text };
    } else {
      const r = await (h3s as Http3ClientSession).fetch({ method: 'POST', path: okPath, headers: { 'content-length': String(exact.length) }, body: exact, timeoutMs: 10_000 });
      answer = { status: r.status, body: r.body.toString() };
    }
    t.same(answer, { status: 200, body: sha256(exact) }, 'exact content-length: 200 with the SHA-256 of the bytes sent');
    t.same(be.bodies.filter((b) => b.path === okPath).map((b) => [b.bytes, b.sha256]), [[exact.length, sha256(exact)]], 'the backend read the 100,000 bytes, byte-exact');

    for (const [i, shape] of SHAPES.entries()) {
      const path = `/cl/${protocol}/bad-${i}`;
      const id = `bl-${protocol}-${i}`;
      const abandonedBefore = be.abandoned;
      const seen = await send(path, id, shape);
      t.equal(seen.outcome.replace(/ \(.*\)$/, ''), expected(protocol, shape), `${shape.name}: refused by the protocol layer, no answer (${seen.outcome})`);
      if (seen.heldBeforeLater !== undefined) t.equal(seen.heldBeforeLater, 0, `${shape.name}: ${ANSWER_WINDOW_MS} ms after the request reached the backend, the backend still had no complete request`);
      t.equal(await inflightReaches0(), 0, `${shape.name}: svc_inflight_requests back to 0`);
      await pollUntil(async () => be.inflight, (n) => n === 0, 5000);
      const saw = backendSaw(path);
      t.equal(saw.complete, 0, `${shape.name}: the backend read no request to its end (${saw.arrivals} had reached it)`);
      t.equal(be.abandoned - abandonedBefore, saw.arrivals, `${shape.name}: each request that reached the backend was aborted by the proxy, none answered`);
      t.equal(backendSaw('/cl/smuggled').arrivals, 0, `${shape.name}: no smuggled request reached the backend`);
      t.match(await accessLine(id), { log_type: 'access', protocol: protocol === 'h2' ? '2' : '3', method: 'POST', status: 0, code: 'EDGE_REQUEST_BODY_LENGTH_MISMATCH', reason: 'body_length_mismatch', failure_class: 'malformed' }, `${shape.name}: the access log names the cause`);
    }
    // The first connection (HTTP/2) or the same one (HTTP/3) is still good.
    const again = randomBytes(5000);
    const r2 =
      h2s !== undefined
        ? await new Promise<number>((resolve) => {
            const s = (h2s as http2.ClientHttp2Session).request({ ':method': 'POST', ':path': `/cl/${protocol}/after`, 'content-length': String(again.length) });
            s.once('response', (h) => resolve(Number(h[':status'])));
            s.resume();
            s.end(again);
          })
        : (await (h3s as Http3ClientSession).fetch({ method: 'POST', path: `/cl/${protocol}/after`, headers: { 'content-length': String(again.length) }, body: again, timeoutMs: 10_000 })).status;
    t.equal(r2, 200, 'an ordinary upload is then served on the connection');
  });
}
