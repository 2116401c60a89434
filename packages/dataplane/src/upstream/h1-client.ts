// Our HTTP/1.1 client toward plain `http://` backends: a keep-alive connection pool with undici's
// `dispatch` shape (one handler object per request: `onRequestStart`, `onResponseStart`,
// `onResponseData`, `onResponseEnd`, `onResponseError`; a controller with `abort`, `pause` and
// `resume`), so forwarding and health checks run on it and on undici's Pool (kept for `https://`
// backends: TLS and HTTP/2) alike. It exists for speed and memory: one object per request, the
// request head written as one string, the response head parsed from one buffer, deadlines on one
// coarse sweep instead of timers (docs/decisions.md, "Our own HTTP/1.1 upstream client").
//
// The response parser is strict where a lenient one would let a backend smuggle or split a
// response: a status line `HTTP/1.x NNN`, field names that are tokens, field values without
// control characters, no obs-fold, one Content-Length (repeated only with the same value), never
// both Content-Length and Transfer-Encoding, chunk sizes of at most 16 hex digits, and a head
// bounded by `maxHeaderSize`. Bare LF line ends are accepted (RFC 9112 §2.2). Bytes after a
// response, before a request was sent, end the connection.
import net from 'node:net';
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { DeadlineSweep } from '../proxy/deadline-sweep.ts';
import type { Expirable } from '../proxy/deadline-sweep.ts';
import type { HeaderMap } from './headers.ts';
import { validFieldValue } from '../policy/request-validation.ts';

/** The `code` of every error this client raises (forward.ts classifies them). */
export const H1_ERR = {
  /** No connection within `connectTimeout`. */
  CONNECT_TIMEOUT: 'H1_CONNECT_TIMEOUT',
  /** No response head within the request's `headersTimeout`. */
  HEADERS_TIMEOUT: 'H1_HEADERS_TIMEOUT',
  /** A pause in the response body longer than the request's `bodyTimeout`. */
  BODY_TIMEOUT: 'H1_BODY_TIMEOUT',
  /** The backend closed the connection before the response was complete. */
  CLOSED: 'H1_CLOSED',
  /** The backend's bytes are not an HTTP/1.1 response we accept (the reason says why). */
  PROTOCOL: 'H1_PROTOCOL',
  /** The request cannot be written (a method, target or field we refuse to send). */
  INVALID_REQUEST: 'H1_INVALID_REQUEST',
  /** The request body's length differs from its Content-Length. */
  CONTENT_LENGTH_MISMATCH: 'H1_CONTENT_LENGTH_MISMATCH',
  /** The pool was closed or destroyed (a generation swap, shutdown). */
  POOL_CLOSED: 'H1_POOL_CLOSED',
} as const;

function h1Error(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** What a pool is made with. */
export interface H1PoolOptions {
  /** Most connections open at once (busy, idle and connecting). */
  readonly connections: number;
  readonly connectTimeout: number;
  /** How long an idle connection is kept when the backend gives no `Keep-Alive: timeout`, ms. */
  readonly keepAliveTimeout?: number;
  /** Upper bound of a backend's `Keep-Alive: timeout`, ms. */
  readonly keepAliveMaxTimeout?: number;
  /** Largest response head (status line and fields, interim responses each), bytes. */
  readonly maxHeaderSize?: number;
}

/** The request fields this client reads from undici's dispatch options. */
interface H1Request {
  readonly method: string;
  readonly path: string;
  readonly headers?: unknown;
  readonly body?: unknown;
  readonly headersTimeout?: number | null;
  readonly bodyTimeout?: number | null;
}

type Handler = Dispatcher.DispatchHandler;

/**
 * Deadlines of every connection of this process (connect, response head, body pause, keep-alive);
 * its timer does not keep the process alive (idle connections do not either).
 */
const SWEEP = new DeadlineSweep(25, { unref: true });

/** A request target: visible ASCII and obs-text, nothing else (undici's rule). */
const BAD_TARGET = /[^\x21-\xff]/;
/** Request fields the client frames itself, or that a proxy never sends upstream. */
const REFUSED_FIELDS = new Set(['transfer-encoding', 'keep-alive', 'upgrade', 'expect', 'connection']);
/** Request field names already checked (a token, not refused), with their lower case; bounded. */
const SENDABLE_NAMES = new Map<string, string>();
/** Methods whose requests carry a body by definition: sent with `content-length: 0` when empty. */
const PAYLOAD_METHODS = new Set(['POST', 'PUT', 'PATCH']);
/** Methods checked once: the rest go through the token rule. */
const KNOWN_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH', 'TRACE']);

const noop = (): void => undefined;

/** Destroys a request body stream nobody will read (its later errors stay handled). */
function dropBody(body: unknown): void {
  const stream = body as Readable | null | undefined;
  if (stream === null || stream === undefined || typeof stream !== 'object' || typeof stream.destroy !== 'function' || stream.destroyed) return;
  stream.on('error', noop);
  stream.destroy();
}

/** One request: the handler's controller, queued in the pool or on a connection. */
class Exchange implements Dispatcher.DispatchController {
  readonly pool: H1Pool;
  readonly req: H1Request;
  readonly handler: Handler;
  conn: Conn | undefined;
  done = false;
  aborted = false;
  paused = false;
  reason: Error | null = null;

  constructor(pool: H1Pool, req: H1Request, handler: Handler) {
    this.pool = pool;
    this.req = req;
    this.handler = handler;
  }

  abort(reason: Error): void {
    if (this.done) return;
    this.aborted = true;
    this.reason = reason;
    if (this.conn !== undefined) this.conn.fail(reason);
    else this.pool.dequeue(this, reason);
  }

  pause(): void {
    this.paused = true;
    this.conn?.pauseRead();
  }

  /**
   * Ends the exchange with `err`: the request body, if a stream, is destroyed (nobody will read
   * the rest; its producer's timers stop), and the handler hears the error.
   */
  error(err: Error): void {
    this.done = true;
    this.conn = undefined;
    dropBody(this.req.body);
    this.handler.onResponseError?.(this, err);
  }

  resume(): void {
    this.paused = false;
    this.conn?.resumeRead();
  }
}

// Connection states.
const CONNECTING: number = 0;
const IDLE: number = 1;
const BUSY: number = 2;
const CLOSED: number = 3;

// Response parser phases.
const HEAD: number = 0;
/** Content-Length body: `remaining` bytes left. */
const LENGTH: number = 1;
/** Chunked body, at a chunk-size line. */
const CHUNK_SIZE: number = 2;
/** Chunked body, inside a chunk's data: `remaining` bytes left. */
const CHUNK_DATA: number = 3;
/** Chunked body, at the CRLF after a chunk's data. */
const CHUNK_END: number = 4;
/** Chunked body, in the trailer section. */
const TRAILERS: number = 5;
/** Body delimited by the connection's close. */
const UNTIL_CLOSE: number = 6;

/** A chunk-size line, extensions included, may not be longer than this. */
const MAX_CHUNK_LINE = 4096;

class Conn implements Expirable {
  readonly pool: H1Pool;
  readonly socket: net.Socket;
  state = CONNECTING;
  ex: Exchange | undefined;
  deadline = Infinity;
  sweepSlot = -1;
  /** Requests this connection has carried (0: it has never been reused). */
  served = 0;

  // Response parsing.
  private phase = HEAD;
  /** Bytes of an incomplete line or head, kept until the rest arrives. */
  private partial: Buffer | undefined;
  private remaining = 0;
  /** Input left over while reading is paused. */
  private stash: Buffer | undefined;
  private parsing = false;
  /** The backend's end of stream arrived while input was kept (paused). */
  private remoteEnded = false;
  private reusable = true;
  /** How long this connection may stay idle (the pool's keep-alive, or the backend's hint), ms. */
  keepAliveMs: number;
  private trailers: Record<string, string | string[]> | undefined;

  // Request body.
  private body: Readable | undefined;
  private bodyDone = true;
  private bodyExpected = -1;
  private bodySent = 0;
  private bodyChunked = false;

  constructor(pool: H1Pool) {
    this.pool = pool;
    this.keepAliveMs = pool.keepAliveTimeout;
    // Reads land in one buffer shared by every connection (`onread`): no Buffer and no stream
    // bookkeeping per read. Whatever outlives the callback (a partial head, a body chunk handed to
    // the handler, input kept while paused) is copied out of it.
    this.socket = net.connect({ host: pool.host, port: pool.port, noDelay: true, keepAlive: true, keepAliveInitialDelay: 60_000, onread: { buffer: READ_BUFFER, callback: this.onRead } });
    this.deadline = performance.now() + pool.connectTimeout;
    SWEEP.add(this);
    pool.track(this);
    this.socket.on('connect', this.onConnect);
    this.socket.on('end', this.onEnd);
    this.socket.on('error', this.onError);
    this.socket.on('close', this.onClose);
  }

  private readonly onConnect = (): void => {
    if (this.state !== CONNECTING) return;
    this.state = IDLE;
    this.deadline = Infinity;
    this.pool.connected(this);
  };

  /** Waits, idle, for the next request; the process may exit meanwhile. */
  rest(): void {
    this.deadline = performance.now() + this.keepAliveMs;
    SWEEP.add(this);
    this.socket.unref();
  }

  /** Sends `ex` on this connection (idle, connected). */
  assign(ex: Exchange): void {
    if (this.state === IDLE) this.socket.ref();
    this.state = BUSY;
    this.ex = ex;
    ex.conn = this;
    this.served++;
    this.phase = HEAD;
    this.reusable = true;
    this.trailers = undefined;
    const timeout = ex.req.headersTimeout;
    this.deadline = timeout === undefined || timeout === null || timeout <= 0 ? Infinity : performance.now() + timeout;
    SWEEP.add(this);
    const error = this.writeRequest(ex.req);
    if (error !== undefined) this.fail(error);
    else if (ex.paused) this.pauseRead();
  }

  /** Writes the request head (and starts the body); a request we refuse to send returns its error. */
  private writeRequest(req: H1Request): Error | undefined {
    const method = req.method;
    if (!KNOWN_METHODS.has(method) && !isToken(method)) return h1Error(H1_ERR.INVALID_REQUEST, 'invalid request method');
    const path = req.path;
    if (path.length === 0 || BAD_TARGET.test(path)) return h1Error(H1_ERR.INVALID_REQUEST, 'invalid request target');
    let head = `${method} ${path} HTTP/1.1\r\nconnection: keep-alive\r\n`;
    let host = false;
    let length: string | undefined;
    const headers = req.headers as HeaderMap | null | undefined;
    if (headers !== undefined && headers !== null) {
      for (const name in headers) {
        const value = headers[name];
        if (value === undefined) continue;
        let lower = SENDABLE_NAMES.get(name);
        if (lower === undefined) {
          if (!isToken(name)) return h1Error(H1_ERR.INVALID_REQUEST, 'invalid request field name');
          lower = name.toLowerCase();
          if (REFUSED_FIELDS.has(lower)) return h1Error(H1_ERR.INVALID_REQUEST, `the request field ${lower} is not sent upstream`);
          if (SENDABLE_NAMES.size < 1024) SENDABLE_NAMES.set(name, lower);
        }
        if (lower === 'host') host = true;
        if (typeof value === 'string') {
          if (!validFieldValue(value)) return h1Error(H1_ERR.INVALID_REQUEST, `invalid value of request field ${lower}`);
          if (lower === 'content-length') {
            if (length !== undefined) return h1Error(H1_ERR.INVALID_REQUEST, 'repeated content-length');
            length = value;
          }
          head += `${name}: ${value}\r\n`;
        } else {
          if (lower === 'content-length' || lower === 'host') return h1Error(H1_ERR.INVALID_REQUEST, `repeated ${lower}`);
          for (const v of value) {
            if (!validFieldValue(v)) return h1Error(H1_ERR.INVALID_REQUEST, `invalid value of request field ${lower}`);
            head += `${name}: ${v}\r\n`;
          }
        }
      }
    }
    if (!host) head += `host: ${this.pool.hostHeader}\r\n`;
    let expected = -1;
    if (length !== undefined) {
      if (!/^\d{1,15}$/.test(length)) return h1Error(H1_ERR.INVALID_REQUEST, 'invalid content-length');
      expected = Number(length);
    }
    const body = req.body;
    if (body === undefined || body === null) {
      if (expected > 0) return h1Error(H1_ERR.CONTENT_LENGTH_MISMATCH, 'the request has a content-length but no body');
      if (expected === -1 && PAYLOAD_METHODS.has(method)) head += 'content-length: 0\r\n';
      this.bodyDone = true;
      this.socket.write(`${head}\r\n`, 'latin1');
      return undefined;
    }
    if (typeof body === 'string' || body instanceof Uint8Array) {
      const bytes = typeof body === 'string' ? Buffer.from(body) : body;
      if (expected !== -1 && expected !== bytes.length) return h1Error(H1_ERR.CONTENT_LENGTH_MISMATCH, 'the request body differs from its content-length');
      if (expected === -1) head += `content-length: ${bytes.length}\r\n`;
      this.bodyDone = true;
      this.socket.cork();
      this.socket.write(`${head}\r\n`, 'latin1');
      this.socket.write(bytes);
      this.socket.uncork();
      return undefined;
    }
    const stream = body as Readable;
    if (typeof stream.on !== 'function' || typeof stream.pause !== 'function') return h1Error(H1_ERR.INVALID_REQUEST, 'unsupported request body');
    if (expected === -1) head += 'transfer-encoding: chunked\r\n';
    this.socket.write(`${head}\r\n`, 'latin1');
    this.body = stream;
    this.bodyDone = false;
    this.bodyExpected = expected;
    this.bodySent = 0;
    this.bodyChunked = expected === -1;
    stream.on('data', this.onBodyData);
    stream.on('end', this.onBodyEnd);
    stream.on('error', this.onBodyError);
    stream.on('close', this.onBodyClose);
    return undefined;
  }

  private readonly onBodyData = (chunk: Buffer | string): void => {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    if (bytes.length === 0) return;
    this.bodySent += bytes.length;
    if (this.bodyExpected !== -1 && this.bodySent > this.bodyExpected) {
      this.fail(h1Error(H1_ERR.CONTENT_LENGTH_MISMATCH, 'the request body is longer than its content-length'));
      return;
    }
    const socket = this.socket;
    let more: boolean;
    if (this.bodyChunked) {
      socket.cork();
      socket.write(`${bytes.length.toString(16)}\r\n`, 'latin1');
      socket.write(bytes);
      more = socket.write('\r\n', 'latin1');
      socket.uncork();
    } else {
      more = socket.write(bytes);
    }
    if (!more) {
      (this.body as Readable).pause();
      socket.once('drain', this.onSocketDrain);
    }
  };

  private readonly onSocketDrain = (): void => {
    if (this.body !== undefined && !this.bodyDone) this.body.resume();
  };

  private readonly onBodyEnd = (): void => {
    if (this.body === undefined) return;
    if (this.bodyExpected !== -1 && this.bodySent !== this.bodyExpected) {
      this.fail(h1Error(H1_ERR.CONTENT_LENGTH_MISMATCH, 'the request body is shorter than its content-length'));
      return;
    }
    if (this.bodyChunked) this.socket.write('0\r\n\r\n', 'latin1');
    this.bodyDone = true;
    this.detachBody(false);
  };

  private readonly onBodyError = (err: Error): void => {
    if (this.body !== undefined) this.fail(err);
  };

  /** A body destroyed without an error before its end (its producer went away). */
  private readonly onBodyClose = (): void => {
    if (this.body !== undefined && !this.bodyDone) this.fail(h1Error(H1_ERR.CONTENT_LENGTH_MISMATCH, 'the request body was cut short'));
  };

  /** Stops reading the request body; `destroy` when the exchange ended before the body did. */
  private detachBody(destroy: boolean): void {
    const body = this.body;
    if (body === undefined) return;
    this.body = undefined;
    body.off('data', this.onBodyData);
    body.off('end', this.onBodyEnd);
    body.off('error', this.onBodyError);
    body.off('close', this.onBodyClose);
    this.socket.off('drain', this.onSocketDrain);
    if (destroy) dropBody(body);
  }

  pauseRead(): void {
    if (this.state === BUSY) this.socket.pause();
    if (this.phase !== HEAD) this.deadline = Infinity;
  }

  resumeRead(): void {
    const ex = this.ex;
    if (ex === undefined || this.state !== BUSY) return;
    if (this.phase !== HEAD) this.deadline = bodyDeadline(ex);
    this.socket.resume();
    if (this.parsing) return;
    const stash = this.stash;
    if (stash !== undefined) {
      this.stash = undefined;
      this.onData(stash);
    }
    if (this.remoteEnded && this.stash === undefined && this.state !== CLOSED) this.onEnd();
  }

  private readonly onRead = (nread: number, buf: Uint8Array): boolean => {
    this.onData(Buffer.from(buf.buffer, buf.byteOffset, nread));
    // Pausing is `pauseRead`'s business (socket.pause), not the return value's.
    return true;
  };

  /** Input from the socket; `data` is only valid during this call (see `onRead`). */
  private readonly onData = (data: Buffer): void => {
    if (this.state !== BUSY) {
      // Bytes from the backend while no request is in flight: nothing can be matched to them.
      this.close();
      return;
    }
    this.parsing = true;
    try {
      this.parse(data);
    } catch (err) {
      // A handler callback threw (a response head node refuses to write, say): the exchange fails.
      this.fail(err instanceof Error ? err : new Error(String(err)));
    } finally {
      this.parsing = false;
    }
  };

  private parse(data: Buffer): void {
    const ex = this.ex as Exchange;
    let buf = data;
    while (buf.length > 0) {
      if (this.ex !== ex || this.state !== BUSY) return;
      if (ex.paused) {
        this.stash = this.stash === undefined ? Buffer.from(buf) : Buffer.concat([this.stash, buf]);
        this.socket.pause();
        return;
      }
      switch (this.phase) {
        case HEAD: {
          const input = this.partial === undefined ? buf : Buffer.concat([this.partial, buf]);
          const end = headEnd(input, this.partial === undefined ? 0 : Math.max(0, this.partial.length - 3));
          if (end === -1) {
            if (input.length > this.pool.maxHeaderSize) throw h1Error(H1_ERR.PROTOCOL, 'response head too large');
            this.partial = input === buf ? Buffer.from(input) : input;
            return;
          }
          this.partial = undefined;
          if (end > this.pool.maxHeaderSize) throw h1Error(H1_ERR.PROTOCOL, 'response head too large');
          buf = input.subarray(end);
          this.head(ex, input, end);
          if (this.phase === LENGTH && this.remaining === 0 && this.ex === ex) this.complete(ex, buf);
          break;
        }
        case LENGTH:
          buf = this.deliver(ex, buf);
          if (this.remaining === 0 && this.ex === ex) this.complete(ex, buf);
          break;
        case UNTIL_CLOSE:
          this.deadline = bodyDeadline(ex);
          ex.handler.onResponseData?.(ex, Buffer.from(buf));
          return;
        case CHUNK_DATA:
          if (this.remaining <= buf.length) this.phase = CHUNK_END;
          buf = this.deliver(ex, buf);
          break;
        default:
          buf = this.chunkLine(ex, buf);
      }
    }
  }

  /**
   * Hands the handler up to `remaining` bytes of `buf` (a copy: `buf` is the shared read buffer)
   * and returns the rest.
   */
  private deliver(ex: Exchange, buf: Buffer): Buffer {
    const n = Math.min(buf.length, this.remaining);
    this.remaining -= n;
    this.deadline = bodyDeadline(ex);
    ex.handler.onResponseData?.(ex, Buffer.from(buf.subarray(0, n)));
    return buf.subarray(n);
  }

  /**
   * Parses a response head (interim or final), `buf[0, end)`, byte by byte (a split into line
   * strings and a regular expression per field cost 4 µs of a request); throws on anything we do
   * not accept.
   */
  private head(ex: Exchange, buf: Buffer, end: number): void {
    // Status line: `HTTP/1.` 0|1 SP 3DIGIT [SP reason] (CR) LF.
    if (end < 13 || buf[0] !== 0x48 || buf[1] !== 0x54 || buf[2] !== 0x54 || buf[3] !== 0x50 || buf[4] !== 0x2f || buf[5] !== 0x31 || buf[6] !== 0x2e || (buf[7] !== 0x31 && buf[7] !== 0x30) || buf[8] !== 0x20) {
      throw h1Error(H1_ERR.PROTOCOL, 'malformed status line');
    }
    const d0 = (buf[9] as number) - 0x30;
    const d1 = (buf[10] as number) - 0x30;
    const d2 = (buf[11] as number) - 0x30;
    if (d0 < 1 || d0 > 9 || d1 < 0 || d1 > 9 || d2 < 0 || d2 > 9) throw h1Error(H1_ERR.PROTOCOL, 'malformed status line');
    const status = d0 * 100 + d1 * 10 + d2;
    const http10 = buf[7] === 0x30;
    let i = 12;
    let c = buf[i] as number;
    let reasonStart = i;
    let reasonEnd = i;
    if (c === 0x20) {
      reasonStart = ++i;
      while (VALUE_BYTE[(c = buf[i] as number)] === 1) i++;
      reasonEnd = i;
    }
    i = lineEnd(buf, i, c);
    const headers: Record<string, string | string[]> = {};
    let length = -1;
    let chunked = false;
    let te = false;
    let close = http10;
    let keepAliveHint = -1;
    for (;;) {
      c = buf[i] as number;
      if (c === 0x0d || c === 0x0a) {
        // The empty line: it must be the one headEnd found.
        if (lineEnd(buf, i, c) !== end) throw h1Error(H1_ERR.PROTOCOL, 'invalid character in the response head');
        break;
      }
      if (c === 0x20 || c === 0x09) throw h1Error(H1_ERR.PROTOCOL, 'obsolete line folding in a response field');
      const nameStart = i;
      let upper = false;
      while (TOKEN_BYTE[(c = buf[i] as number)] === 1) {
        if (c >= 0x41 && c <= 0x5a) upper = true;
        i++;
      }
      if (c !== 0x3a || i === nameStart) throw h1Error(H1_ERR.PROTOCOL, 'malformed response field');
      const raw = latin1(buf, nameStart, i);
      const name = upper ? raw.toLowerCase() : raw;
      i++;
      while ((c = buf[i] as number) === 0x20 || c === 0x09) i++;
      const valueStart = i;
      let valueEnd = i;
      while (VALUE_BYTE[(c = buf[i] as number)] === 1) {
        i++;
        if (c !== 0x20 && c !== 0x09) valueEnd = i;
      }
      i = lineEnd(buf, i, c);
      const value = latin1(buf, valueStart, valueEnd);
      addField(headers, name, value);
      switch (name) {
        case 'content-length': {
          const n = contentLength(value);
          if (n === -1 || (length !== -1 && n !== length)) throw h1Error(H1_ERR.PROTOCOL, 'invalid content-length in the response');
          length = n;
          break;
        }
        case 'transfer-encoding': {
          te = true;
          const codings = value.toLowerCase().split(',');
          chunked = (codings[codings.length - 1] as string).trim() === 'chunked';
          break;
        }
        case 'connection': {
          if (value === 'keep-alive') {
            if (http10) close = false;
            break;
          }
          const v = value.toLowerCase();
          if (v.includes('close')) close = true;
          else if (http10 && v.includes('keep-alive')) close = false;
          break;
        }
        case 'keep-alive': {
          const m = /(?:^|[\s,])timeout\s*=\s*(\d{1,9})/i.exec(value);
          if (m !== null) keepAliveHint = Number(m[1]) * 1000;
          break;
        }
      }
    }
    if (status < 200) {
      // 101 switches protocols, which this client never asks for; other interim responses are skipped.
      if (status === 101) throw h1Error(H1_ERR.PROTOCOL, 'unexpected 101 Switching Protocols');
      return;
    }
    if (te && length !== -1) throw h1Error(H1_ERR.PROTOCOL, 'a response with both content-length and transfer-encoding');
    if (close) this.reusable = false;
    if (keepAliveHint !== -1) {
      const ms = Math.min(keepAliveHint - 2000, this.pool.keepAliveMaxTimeout);
      if (ms < 1000) this.reusable = false;
      else this.keepAliveMs = ms;
    }
    const noBody = ex.req.method === 'HEAD' || status === 204 || status === 304;
    if (noBody) this.phase = LENGTH;
    else if (te) {
      if (chunked) this.phase = CHUNK_SIZE;
      else {
        this.phase = UNTIL_CLOSE;
        this.reusable = false;
      }
    } else if (length !== -1) this.phase = LENGTH;
    else {
      this.phase = UNTIL_CLOSE;
      this.reusable = false;
    }
    this.remaining = noBody ? 0 : length;
    this.deadline = bodyDeadline(ex);
    ex.handler.onResponseStart?.(ex, status, headers, latin1(buf, reasonStart, reasonEnd));
  }

  /** Reads a chunk-size line, the CRLF after a chunk, or a trailer line; returns the input left. */
  private chunkLine(ex: Exchange, buf: Buffer): Buffer {
    const input = this.partial === undefined ? buf : Buffer.concat([this.partial, buf]);
    const lf = input.indexOf(0x0a);
    if (lf === -1) {
      if (input.length > (this.phase === TRAILERS ? this.pool.maxHeaderSize : MAX_CHUNK_LINE)) throw h1Error(H1_ERR.PROTOCOL, 'chunk framing line too long');
      this.partial = input === buf ? Buffer.from(input) : input;
      return EMPTY;
    }
    this.partial = undefined;
    const line = stripCR(input.toString('latin1', 0, lf));
    const rest = input.subarray(lf + 1);
    switch (this.phase) {
      case CHUNK_END:
        if (line.length !== 0) throw h1Error(H1_ERR.PROTOCOL, 'chunk data longer than its size');
        this.phase = CHUNK_SIZE;
        return rest;
      case CHUNK_SIZE: {
        const semi = line.indexOf(';');
        const hex = (semi === -1 ? line : line.slice(0, semi)).trimEnd();
        if (!/^[0-9a-fA-F]{1,16}$/.test(hex) || (semi !== -1 && !validFieldValue(line))) throw h1Error(H1_ERR.PROTOCOL, 'invalid chunk size');
        const size = parseInt(hex, 16);
        if (!Number.isSafeInteger(size)) throw h1Error(H1_ERR.PROTOCOL, 'invalid chunk size');
        if (size === 0) {
          this.phase = TRAILERS;
          this.remaining = 0;
        } else {
          this.phase = CHUNK_DATA;
          this.remaining = size;
        }
        return rest;
      }
      default: {
        // TRAILERS: field lines until the empty one; their total is bounded like a head.
        if (line.length === 0) {
          this.complete(ex, rest);
          return rest;
        }
        this.remaining += line.length;
        if (this.remaining > this.pool.maxHeaderSize) throw h1Error(H1_ERR.PROTOCOL, 'response trailers too large');
        const colon = line.indexOf(':');
        const name = colon <= 0 ? '' : line.slice(0, colon);
        const value = colon <= 0 ? '' : trimOWS(line, colon + 1);
        if (!isToken(name) || !validFieldValue(value)) throw h1Error(H1_ERR.PROTOCOL, 'malformed response trailer');
        addField((this.trailers ??= {}), name.toLowerCase(), value);
        return rest;
      }
    }
  }

  /** The response is complete; `rest` is what followed it in the input. */
  private complete(ex: Exchange, rest: Buffer): void {
    ex.done = true;
    ex.conn = undefined;
    this.ex = undefined;
    this.stash = undefined;
    this.partial = undefined;
    // A request body still being sent when the response ended leaves the connection mid-message.
    if (!this.bodyDone) {
      this.reusable = false;
      this.detachBody(true);
    }
    const trailers = this.trailers ?? {};
    this.trailers = undefined;
    if (this.reusable && rest.length === 0 && !this.pool.closing) {
      this.state = IDLE;
      this.socket.resume();
      ex.handler.onResponseEnd?.(ex, trailers);
      if (this.state === IDLE) this.pool.released(this);
    } else {
      this.close();
      ex.handler.onResponseEnd?.(ex, trailers);
    }
  }

  /** Fails the exchange in flight with `err` and ends the connection (it is mid-message). */
  fail(err: Error): void {
    const ex = this.ex;
    this.close();
    if (ex === undefined || ex.done) return;
    ex.error(err);
  }

  /**
   * Ends the connection; the exchange in flight, if any, is the caller's to fail. `connectError`:
   * the connection was never made, and the request waiting longest fails with it.
   */
  close(connectError?: Error): void {
    if (this.state === CLOSED) return;
    const wasConnecting = this.state === CONNECTING;
    this.state = CLOSED;
    this.ex = undefined;
    this.stash = undefined;
    this.partial = undefined;
    SWEEP.delete(this);
    this.detachBody(true);
    this.socket.destroy();
    this.pool.gone(this, wasConnecting, wasConnecting ? connectError : undefined);
  }

  expire(): void {
    switch (this.state) {
      case CONNECTING:
        this.close(h1Error(H1_ERR.CONNECT_TIMEOUT, 'connect timeout'));
        return;
      case IDLE:
        this.close();
        return;
      case BUSY:
        this.fail(this.phase === HEAD ? h1Error(H1_ERR.HEADERS_TIMEOUT, 'no response head in time') : h1Error(H1_ERR.BODY_TIMEOUT, 'the response body paused too long'));
    }
  }

  private readonly onEnd = (): void => {
    if (this.stash !== undefined) {
      // Reading is paused with input kept: the end counts once that input is read.
      this.remoteEnded = true;
      return;
    }
    if (this.state === BUSY && this.phase === UNTIL_CLOSE && this.partial === undefined && this.stash === undefined) {
      this.complete(this.ex as Exchange, EMPTY);
      return;
    }
    this.fail(h1Error(H1_ERR.CLOSED, 'the backend closed the connection'));
  };

  private readonly onError = (err: Error): void => {
    if (this.state === CONNECTING) this.close(err);
    else this.fail(err);
  };

  private readonly onClose = (): void => {
    if (this.state === CONNECTING) this.close(h1Error(H1_ERR.CLOSED, 'the connection closed while connecting'));
    else this.fail(h1Error(H1_ERR.CLOSED, 'the backend closed the connection'));
  };
}

const EMPTY = Buffer.alloc(0);

/** Where every connection's reads land (`onread`); valid only inside the read callback. */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);

/** Bytes of an RFC 9110 token (methods and field names, `isToken`; the head parser reads it directly). */
const TOKEN_BYTE = new Uint8Array(256);
for (const ch of "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") TOKEN_BYTE[ch.charCodeAt(0)] = 1;
/** Bytes a field value or reason phrase may hold: HTAB, SP, visible ASCII, obs-text. */
const VALUE_BYTE = new Uint8Array(256);
VALUE_BYTE[0x09] = 1;
for (let b = 0x20; b <= 0xff; b++) if (b !== 0x7f) VALUE_BYTE[b] = 1;

/** A non-empty RFC 9110 token (methods, field names): every character a token byte. */
function isToken(s: string): boolean {
  if (s.length === 0) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c > 0xff || TOKEN_BYTE[c] !== 1) return false;
  }
  return true;
}

/** `buf[start, end)` as a latin1 string: node's own Buffer method when there is one (no argument checks). */
const latin1: (buf: Buffer, start: number, end: number) => string =
  typeof (Buffer.prototype as unknown as { latin1Slice?: unknown }).latin1Slice === 'function'
    ? (buf, start, end) => (buf as unknown as { latin1Slice(s: number, e: number): string }).latin1Slice(start, end)
    : (buf, start, end) => buf.toString('latin1', start, end);

/** The offset after the line end at `i` (`c` is `buf[i]`): CRLF or LF; anything else is refused. */
function lineEnd(buf: Buffer, i: number, c: number): number {
  if (c === 0x0a) return i + 1;
  if (c === 0x0d && buf[i + 1] === 0x0a) return i + 2;
  throw h1Error(H1_ERR.PROTOCOL, 'invalid character in the response head');
}

function bodyDeadline(ex: Exchange): number {
  const t = ex.req.bodyTimeout;
  return ex.paused || t === undefined || t === null || t <= 0 ? Infinity : performance.now() + t;
}

/** Adds a field line to a section: a repeated name becomes a list, in order. */
function addField(section: Record<string, string | string[]>, name: string, value: string): void {
  const prior = section[name];
  if (prior === undefined) section[name] = value;
  else if (typeof prior === 'string') section[name] = [prior, value];
  else prior.push(value);
}

function stripCR(line: string): string {
  return line.charCodeAt(line.length - 1) === 0x0d ? line.slice(0, -1) : line;
}

/** The value after `from` without leading and trailing spaces and tabs (OWS). */
function trimOWS(line: string, from: number): string {
  let a = from;
  let b = line.length;
  while (a < b && (line.charCodeAt(a) === 0x20 || line.charCodeAt(a) === 0x09)) a++;
  while (b > a && (line.charCodeAt(b - 1) === 0x20 || line.charCodeAt(b - 1) === 0x09)) b--;
  return line.slice(a, b);
}

/** A Content-Length value (`42`, or the same number repeated in a list), else -1. */
function contentLength(value: string): number {
  // The usual case, digits alone, without a split or a regular expression.
  const len = value.length;
  if (len > 0 && len <= 15) {
    let n = 0;
    let i = 0;
    for (; i < len; i++) {
      const d = value.charCodeAt(i) - 0x30;
      if (d < 0 || d > 9) break;
      n = n * 10 + d;
    }
    if (i === len) return n;
  }
  let n = -1;
  for (const part of value.split(',')) {
    const p = part.trim();
    if (!/^\d{1,15}$/.test(p)) return -1;
    const v = Number(p);
    if (n !== -1 && v !== n) return -1;
    n = v;
  }
  return n;
}

/** Offset just after the empty line that ends a head (`\r\n\r\n`, or LF-only line ends), else -1. */
function headEnd(buf: Buffer, from: number): number {
  let i = buf.indexOf(0x0a, from);
  while (i !== -1) {
    const next = buf[i + 1];
    if (next === 0x0a) return i + 2;
    if (next === 0x0d && buf[i + 2] === 0x0a) return i + 3;
    i = buf.indexOf(0x0a, i + 1);
  }
  return -1;
}

/**
 * A pool of keep-alive connections to one `http://` backend: at most `connections` open, idle ones
 * reused most-recent first and closed after their keep-alive time, requests queued in order while
 * every connection is busy.
 */
export class H1Pool {
  readonly host: string;
  readonly port: number;
  /** `Host` sent when the request has none. */
  readonly hostHeader: string;
  readonly connectTimeout: number;
  readonly keepAliveTimeout: number;
  readonly keepAliveMaxTimeout: number;
  readonly maxHeaderSize: number;
  private readonly max: number;
  private readonly idle: Conn[] = [];
  private readonly queue: Exchange[] = [];
  private queueHead = 0;
  /** Connections open or opening. */
  private open = 0;
  private connecting = 0;
  closing = false;
  private destroyed = false;
  /** Callers of `close` waiting for the last connection to end. */
  private readonly drained: (() => void)[] = [];
  /** Every connection open or opening, for `destroy`. */
  private readonly all = new Set<Conn>();

  constructor(host: string, port: number, o: H1PoolOptions) {
    this.host = host;
    this.port = port;
    this.hostHeader = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
    this.max = Math.max(1, o.connections);
    this.connectTimeout = o.connectTimeout;
    this.keepAliveTimeout = o.keepAliveTimeout ?? 4_000;
    this.keepAliveMaxTimeout = o.keepAliveMaxTimeout ?? 60_000;
    this.maxHeaderSize = o.maxHeaderSize ?? 16_384;
  }

  /** Sends a request; the handler hears how it went, possibly before this returns. */
  dispatch(options: Dispatcher.DispatchOptions, handler: Handler): boolean {
    if (this.closing) {
      dropBody((options as unknown as H1Request).body);
      handler.onResponseError?.(null as unknown as Dispatcher.DispatchController, h1Error(H1_ERR.POOL_CLOSED, this.destroyed ? 'the upstream pool was destroyed' : 'the upstream pool is closed'));
      return false;
    }
    const ex = new Exchange(this, options as unknown as H1Request, handler);
    handler.onRequestStart?.(ex, {});
    if (ex.done) return true;
    const conn = this.idle.pop();
    if (conn !== undefined) conn.assign(ex);
    else {
      this.queue.push(ex);
      this.grow();
    }
    return true;
  }

  /** Requests waiting for a connection. */
  get pending(): number {
    return this.queue.length - this.queueHead;
  }

  /** Connections open or opening. */
  get connections(): number {
    return this.open;
  }

  /** Opens connections for waiting requests that no opening connection will take. */
  private grow(): void {
    while (this.open < this.max && this.connecting < this.pending) {
      this.open++;
      this.connecting++;
      new Conn(this);
    }
  }

  private next(): Exchange | undefined {
    if (this.queueHead === this.queue.length) return undefined;
    const ex = this.queue[this.queueHead] as Exchange;
    this.queue[this.queueHead] = undefined as unknown as Exchange;
    this.queueHead++;
    if (this.queueHead === this.queue.length) {
      this.queue.length = 0;
      this.queueHead = 0;
    } else if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
      this.queue.splice(0, this.queueHead);
      this.queueHead = 0;
    }
    return ex;
  }

  /** A connection was made. */
  connected(conn: Conn): void {
    this.connecting--;
    this.released(conn);
  }

  /** A connection is free (connected, or done with its request). */
  released(conn: Conn): void {
    if (this.closing) {
      conn.close();
      return;
    }
    const ex = this.next();
    if (ex !== undefined) conn.assign(ex);
    else {
      conn.rest();
      this.idle.push(conn);
    }
  }

  /**
   * A connection ended. One that could not be made (`connectError`) fails the request waiting
   * longest: a backend that refuses connections fails requests one per attempt, not the queue.
   */
  gone(conn: Conn, wasConnecting: boolean, connectError: Error | undefined): void {
    this.open--;
    this.all.delete(conn);
    if (wasConnecting) this.connecting--;
    const i = this.idle.lastIndexOf(conn);
    if (i !== -1) this.idle.splice(i, 1);
    if (connectError !== undefined) {
      const ex = this.next();
      ex?.error(connectError);
    }
    if (this.closing) this.checkDrained();
    else if (this.pending > 0) this.grow();
  }

  /** A queued request was aborted. */
  dequeue(ex: Exchange, reason: Error): void {
    const i = this.queue.indexOf(ex, this.queueHead);
    if (i !== -1) this.queue.splice(i, 1);
    ex.error(reason);
  }

  /** Refuses new requests, lets the queued and in-flight ones finish, then closes every connection. */
  close(): Promise<void> {
    this.closing = true;
    for (const conn of this.idle.splice(0)) conn.close();
    return new Promise((resolve) => {
      this.drained.push(resolve);
      this.checkDrained();
    });
  }

  private checkDrained(): void {
    if (this.open === 0 && this.pending === 0) {
      for (const done of this.drained.splice(0)) done();
    } else if (this.pending > 0) this.grow();
  }

  /** Fails every queued and in-flight request and closes every connection at once. */
  destroy(): Promise<void> {
    this.closing = true;
    this.destroyed = true;
    const err = h1Error(H1_ERR.POOL_CLOSED, 'the upstream pool was destroyed');
    for (let ex = this.next(); ex !== undefined; ex = this.next()) ex.error(err);
    for (const conn of [...this.all]) conn.fail(err);
    return this.close();
  }

  /** Registers a new connection (its constructor calls this). */
  track(conn: Conn): void {
    this.all.add(conn);
  }
}
