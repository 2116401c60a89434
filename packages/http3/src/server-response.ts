// The response side of an HTTP/3 exchange: a Writable shaped like Node's
// `http2.Http2ServerResponse` (statusCode, setHeader/getHeader/removeHeader, writeHead, write,
// end, addTrailers, writeContinue, writeEarlyHints, headersSent), framed as RFC 9114 §4.1 says:
// zero or more informational HEADERS, one final HEADERS, DATA frames, optional trailing HEADERS.

import { Writable } from 'node:stream';
import { H3Error, isH3Error } from './errors.ts';
import { encodeDataFrameHeader } from './frames.ts';
import { appendOutgoing, appendOutgoingField } from './header-object.ts';
import type { OutgoingHeaders } from './header-object.ts';
import { responseHasNoBody } from './message-validation.ts';
import type { Header } from './qpack/decoder.ts';
import type { Http3ConnectionInfo } from './quic-adapter.ts';

/** What a response needs from its request stream. */
export interface ResponseSink {
  /** QPACK-encodes `lines` into a HEADERS frame; throws EDGE_H3_FIELD_SECTION_TOO_LARGE. */
  headersFrame(lines: Header[]): Uint8Array;
  /** Writes stream bytes; resolves when QUIC accepted them, rejects when the stream is gone. */
  write(bytes: Uint8Array): Promise<void>;
  /** Ends the stream (FIN) after queued writes. */
  end(): Promise<void>;
  /** Resets the exchange with `err.wireCode` (RFC 9114 §4.1.1). */
  reset(err: H3Error): void;
}

/** Construction data of {@link Http3ServerResponse}. */
export interface ServerResponseInit {
  streamId: number;
  /** The request method: HEAD responses carry no body (RFC 9110 §9.3.2). */
  method: string;
  socket: Http3ConnectionInfo;
  sink: ResponseSink;
  /** Bytes buffered before write() returns false. */
  highWaterMark: number;
}

// Writes at most this large are copied into one buffer with their frame header (one QUIC write).
const COALESCE_LIMIT = 16384;

let dateText = '';
let dateSecond = -1;
/** RFC 9110 §6.6.1 Date, cached per second. */
function httpDate(): string {
  const now = Date.now();
  const second = Math.floor(now / 1000);
  if (second !== dateSecond) {
    dateSecond = second;
    dateText = new Date(now).toUTCString();
  }
  return dateText;
}

function misuse(message: string): H3Error {
  return new H3Error('EDGE_H3_INVALID_USE', message);
}

/**
 * An outgoing HTTP/3 response. `write()` returns false when the buffer is full and 'drain'
 * follows (QUIC flow control is the backpressure). 'finish' follows the last byte handed to
 * QUIC; 'close' follows finish or a cancellation. Network failures never emit 'error' unless an
 * 'error' listener exists (Node's http pattern), so a cancelled client cannot crash the server.
 */
export class Http3ServerResponse extends Writable {
  /** QUIC stream ID of the exchange. */
  readonly streamId: number;
  /** Connection facts, as on the request. */
  readonly socket: Http3ConnectionInfo;
  /** Status of the final response. Default 200. */
  statusCode = 200;
  /** Kept for API compatibility; HTTP/3 has no reason phrase (RFC 9114 §4.3.2). */
  statusMessage = '';
  /** Add a `date` header when the application did not set one. Default true. */
  sendDate = true;
  private readonly method: string;
  private readonly sink: ResponseSink;
  /** Headers by lowercase name: what setHeader was given, and the field lines it validated into. */
  private readonly fields = new Map<string, { name: string; value: string | number | readonly string[]; lines: Header[] }>();
  /**
   * The headers object `writeHead` sent, when no `setHeader` came before it: its field lines went
   * straight into the head, and `getHeader` & co. read it from here. Per-field entries in `fields`
   * would live as long as the response; at HTTP/3 load that is past a scavenge, and V8 promotes
   * what a scavenge keeps (about 1.2 KiB per request; docs/performance.md "Where HTTP/3's garbage
   * collection goes").
   */
  private givenHeaders: OutgoingHeaders | undefined;
  private trailerLines: Header[] | undefined;
  private headSent = false;
  private pendingHead: Uint8Array | undefined;
  private noBody = false;
  private declaredLength: number | undefined;
  private bodyBytes = 0;
  private lost = false;

  constructor(init: ServerResponseInit) {
    super({ highWaterMark: init.highWaterMark });
    this.streamId = init.streamId;
    this.method = init.method;
    this.socket = init.socket;
    this.sink = init.sink;
  }

  /** True once the final response head was sent (or queued to be sent). */
  get headersSent(): boolean {
    return this.headSent;
  }

  /** Same as `socket`. */
  get connection(): Http3ConnectionInfo {
    return this.socket;
  }

  /** The value of header `name` in `givenHeaders` (any case), or undefined. */
  private given(name: string): string | number | readonly string[] | undefined {
    const given = this.givenHeaders as OutgoingHeaders;
    const lower = name.toLowerCase();
    for (const key of Object.keys(given)) if (key.toLowerCase() === lower && given[key] !== undefined) return given[key];
    return undefined;
  }

  /** Sets a response header; throws EDGE_H3_INVALID_USE once headers were sent. */
  setHeader(name: string, value: string | number | readonly string[]): this {
    if (this.headSent) throw misuse('cannot set a header after the response head was sent');
    this.fields.set(name.toLowerCase(), { name, value, lines: appendOutgoingField([], name, value) });
    return this;
  }

  /** A header set by setHeader, or undefined. */
  getHeader(name: string): string | number | readonly string[] | undefined {
    if (this.givenHeaders !== undefined) return this.given(name);
    return this.fields.get(name.toLowerCase())?.value;
  }

  /** All headers set so far, by lowercase name. */
  getHeaders(): OutgoingHeaders {
    const out: OutgoingHeaders = Object.create(null) as OutgoingHeaders;
    if (this.givenHeaders !== undefined) {
      for (const [name, value] of Object.entries(this.givenHeaders)) if (value !== undefined) out[name.toLowerCase()] = value;
      return out;
    }
    for (const [lower, f] of this.fields) out[lower] = f.value;
    return out;
  }

  /** Lowercase names of the headers set so far. */
  getHeaderNames(): string[] {
    if (this.givenHeaders !== undefined) return Object.keys(this.getHeaders());
    return [...this.fields.keys()];
  }

  hasHeader(name: string): boolean {
    if (this.givenHeaders !== undefined) return this.given(name) !== undefined;
    return this.fields.has(name.toLowerCase());
  }

  removeHeader(name: string): void {
    if (this.headSent) throw misuse('cannot remove a header after the response head was sent');
    this.fields.delete(name.toLowerCase());
  }

  /**
   * Sends the final response head now (merged with headers set earlier). `statusMessage` is
   * accepted for API compatibility and ignored.
   */
  writeHead(status: number, statusMessageOrHeaders?: string | OutgoingHeaders, headers?: OutgoingHeaders): this {
    if (this.headSent) throw misuse('the response head was already sent');
    if (!Number.isInteger(status) || status < 200 || status > 599) throw misuse(`invalid final status ${status}`);
    const extra = typeof statusMessageOrHeaders === 'string' ? headers : statusMessageOrHeaders;
    if (extra !== undefined && this.fields.size === 0) {
      // Nothing set before: the head's lines come straight from `extra` (validated as setHeader
      // validates), and `extra` answers getHeader from now on.
      const lines = appendOutgoing([[':status', String(status)]], extra);
      this.statusCode = status;
      this.givenHeaders = extra;
      this.queueHead(lines);
      return this;
    }
    for (const [name, value] of Object.entries(extra ?? {})) if (value !== undefined) this.setHeader(name, value);
    this.statusCode = status;
    this.queueHead(this.fieldLines());
    return this;
  }

  /** Sends the head now if it has not been sent (Node's flushHeaders). */
  flushHeaders(): void {
    if (!this.headSent) this.queueHead(this.fieldLines());
  }

  /**
   * Sends an informational (1xx) response (RFC 9114 §4.1: HEADERS before the final response).
   * 101 is not allowed in HTTP/3 (RFC 9114 §4.5).
   */
  writeInformational(status: number, headers?: OutgoingHeaders): void {
    if (this.headSent) throw misuse('informational responses must precede the final response');
    if (!Number.isInteger(status) || status < 100 || status > 199 || status === 101) throw misuse(`invalid informational status ${status}`);
    const lines = appendOutgoing([[':status', String(status)]], headers);
    this.send(this.sink.headersFrame(lines));
  }

  /** 100 Continue (RFC 9110 §15.2.1). */
  writeContinue(): void {
    this.writeInformational(100);
  }

  /** 103 Early Hints (RFC 8297), e.g. `{ link: '</style.css>; rel=preload; as=style' }`. */
  writeEarlyHints(hints: OutgoingHeaders, callback?: () => void): void {
    this.writeInformational(103, hints);
    if (callback !== undefined) process.nextTick(callback);
  }

  /** Trailer fields sent after the body (RFC 9114 §4.1). */
  addTrailers(headers: OutgoingHeaders): void {
    this.trailerLines = appendOutgoing(this.trailerLines ?? [], headers);
  }

  /** The status line and the lines of the headers set with setHeader. */
  private fieldLines(): Header[] {
    const lines: Header[] = [[':status', String(this.statusCode)]];
    for (const f of this.fields.values()) for (const line of f.lines) lines.push(line);
    return lines;
  }

  // Builds the head now so header errors surface to the caller; sends it with the first body
  // bytes, or on the next tick when none follow at once (time to first byte matters to a proxy).
  // `lines`: the status, then the validated header lines (names lowercase).
  private queueHead(lines: Header[]): void {
    let date = false;
    let lengths = 0;
    let cl: string | undefined;
    for (let i = 1; i < lines.length; i++) {
      const [name, value] = lines[i] as Header;
      if (name === 'date') date = true;
      else if (name === 'content-length') {
        lengths++;
        cl = value;
      }
    }
    if (this.sendDate && !date) lines.push(['date', httpDate()]);
    const frame = this.sink.headersFrame(lines);
    this.headSent = true;
    this.noBody = responseHasNoBody(this.method, this.statusCode);
    // More than one Content-Length line declares no single length (as Number() of a list).
    this.declaredLength = cl === undefined ? undefined : lengths > 1 ? NaN : Number(cl);
    this.pendingHead = frame;
    process.nextTick(() => {
      // After end(), _final sends the head together with the trailers and FIN.
      if (this.writableEnded) return;
      const head = this.takeHead();
      if (head !== undefined) this.send(head);
    });
  }

  private takeHead(): Uint8Array | undefined {
    const head = this.pendingHead;
    this.pendingHead = undefined;
    return head;
  }

  private send(bytes: Uint8Array): void {
    this.sink.write(bytes).catch(() => this.onLost());
  }

  private onLost(): void {
    if (this.lost) return;
    this.lost = true;
    this.destroy();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.writeChunks([chunk], callback);
  }

  override _writev(chunks: Array<{ chunk: Buffer }>, callback: (error?: Error | null) => void): void {
    this.writeChunks(chunks.map((c) => c.chunk), callback);
  }

  private writeChunks(chunks: Buffer[], callback: (error?: Error | null) => void): void {
    try {
      if (!this.headSent) this.queueHead(this.fieldLines());
    } catch (err) {
      callback(err as Error);
      return;
    }
    const parts: Uint8Array[] = [];
    const head = this.takeHead();
    if (head !== undefined) parts.push(head);
    let total = 0;
    for (const c of chunks) total += c.length;
    if (!this.noBody && total > 0) {
      this.bodyBytes += total;
      if (this.declaredLength !== undefined && this.bodyBytes > this.declaredLength) {
        this.failLength(callback);
        return;
      }
      parts.push(encodeDataFrameHeader(total), ...chunks);
    }
    if (parts.length === 0) {
      callback();
      return;
    }
    this.writeParts(parts).then(
      () => callback(),
      () => {
        this.onLost();
        callback();
      },
    );
  }

  override _final(callback: (error?: Error | null) => void): void {
    try {
      if (!this.headSent) this.queueHead(this.fieldLines());
    } catch (err) {
      callback(err as Error);
      return;
    }
    if (!this.noBody && this.declaredLength !== undefined && this.bodyBytes !== this.declaredLength) {
      this.failLength(callback);
      return;
    }
    const parts: Uint8Array[] = [];
    const head = this.takeHead();
    if (head !== undefined) parts.push(head);
    try {
      if (this.trailerLines !== undefined && this.trailerLines.length > 0) parts.push(this.sink.headersFrame(this.trailerLines));
    } catch (err) {
      callback(err as Error);
      return;
    }
    const written = parts.length > 0 ? this.writeParts(parts) : Promise.resolve();
    written.then(
      () => this.sink.end().then(() => callback()),
      () => {
        this.onLost();
        callback();
      },
    );
  }

  // RFC 9110 §8.6: a body that disagrees with its content-length would be malformed on the wire.
  private failLength(callback: (error?: Error | null) => void): void {
    const err = misuse(`response body of ${this.bodyBytes} bytes disagrees with content-length ${this.declaredLength}`);
    this.sink.reset(new H3Error('H3_INTERNAL_ERROR', err.message, { scope: 'stream' }));
    this.lost = true;
    callback(err);
  }

  private writeParts(parts: Uint8Array[]): Promise<void> {
    let size = 0;
    for (const p of parts) size += p.length;
    if (parts.length === 1 || size <= COALESCE_LIMIT) return this.sink.write(parts.length === 1 ? (parts[0] as Uint8Array) : Buffer.concat(parts));
    let last: Promise<void> = Promise.resolve();
    for (const p of parts) last = this.sink.write(p);
    return last;
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    if (!this.lost && !this.writableFinished) {
      // The application gave up on the response: reset it so the client does not take a
      // truncated body for a complete one.
      this.lost = true;
      this.sink.reset(isH3Error(err) ? (err as H3Error) : new H3Error('H3_INTERNAL_ERROR', 'response destroyed before it was complete', { scope: 'stream' }));
    }
    callback(err !== null && this.listenerCount('error') > 0 ? err : null);
  }
}
