// The server side of one request stream (RFC 9114 §4.1): reads HEADERS, DATA and trailing
// HEADERS in the only order allowed, validates the request (RFC 9114 §4.3), streams the body to
// the application with backpressure, and frames the response the application writes. Stream
// errors reset this stream with their code; connection errors go to the session.

import type { ControlStreams } from './control-streams.ts';
import { H3Error, isH3Error } from './errors.ts';
import { FrameReader } from './frame-reader.ts';
import type { H3Frame } from './frames.ts';
import { encodeHeadersFrame } from './frames.ts';
import { headersObject, rawHeaderList } from './header-object.ts';
import { fieldSectionSize, validateRequestHeaders, validateTrailers } from './message-validation.ts';
import type { Header, UnblockedSection } from './qpack/decoder.ts';
import type { Http3ConnectionInfo } from './quic-adapter.ts';
import { peerCodeOf } from './quic-adapter.ts';
import { Http3ServerRequest } from './server-request.ts';
import { Http3ServerResponse } from './server-response.ts';
import type { ResponseSink } from './server-response.ts';
import { pumpFrames } from './stream-io.ts';
import type { StreamIo } from './stream-io.ts';
import type { TimerSet } from './timer-set.ts';

/** What a request stream needs from its session. */
export interface RequestStreamHost {
  readonly control: ControlStreams;
  readonly socket: Http3ConnectionInfo;
  /** Largest field section we accept, bytes (our SETTINGS_MAX_FIELD_SECTION_SIZE). */
  readonly maxFieldSectionSize: number;
  /** Body bytes buffered per request before reading pauses. */
  readonly bodyHighWaterMark: number;
  /** Deadline for a complete, decodable request head, ms. */
  readonly requestHeadTimeoutMs: number;
  readonly timers: TimerSet;
  /** A valid request arrived. */
  onRequest(req: Http3ServerRequest, res: Http3ServerResponse): void;
  /** A connection error (RFC 9114 §8): close the connection with its code. */
  onConnectionError(err: H3Error): void;
  /** The stream is finished in both directions, as far as HTTP/3 is concerned. */
  onDone(stream: ServerRequestStream): void;
}

type Phase = 'headers' | 'body' | 'trailers';

/** One request/response exchange on a client-initiated bidirectional stream. */
export class ServerRequestStream implements ResponseSink {
  readonly id: number;
  private readonly io: StreamIo;
  private readonly host: RequestStreamHost;
  private readonly reader: FrameReader;
  private phase: Phase = 'headers';
  private req: Http3ServerRequest | undefined;
  private res: Http3ServerResponse | undefined;
  private contentLength: number | undefined;
  private bodyBytes = 0;
  private waitingBody: (() => void) | undefined;
  private waitingSection: { resolve(h: Header[]): void; reject(e: unknown): void } | undefined;
  private readDone = false;
  private writeDone = false;
  private finished = false;
  private dead = false;
  private headTimer: NodeJS.Timeout | undefined;

  constructor(io: StreamIo, host: RequestStreamHost) {
    this.io = io;
    this.id = io.id;
    this.host = host;
    // RFC 9114 §4.2.2: a HEADERS frame larger than our limit cannot hold an acceptable section.
    this.reader = new FrameReader({ stream: 'request', role: 'server', maxFramePayload: host.maxFieldSectionSize });
  }

  /** Starts reading the request. */
  start(): void {
    // A client that sends half a HEADERS frame (or a section that stays blocked) and keeps the
    // connection alive would otherwise hold the stream forever.
    this.headTimer = this.host.timers.set(() => {
      this.headTimer = undefined;
      this.fail(new H3Error('EDGE_H3_TIMEOUT', `no complete request head within ${this.host.requestHeadTimeoutMs} ms`, { scope: 'stream' }));
    }, this.host.requestHeadTimeoutMs);
    void this.run();
  }

  /** Rejects the request unprocessed (RFC 9114 §4.1.1, §5.2: after GOAWAY; the client may retry). */
  reject(): void {
    this.io.abort(new H3Error('H3_REQUEST_REJECTED', 'request rejected', { scope: 'stream' }));
    this.readDone = true;
    this.writeDone = true;
    this.finish();
  }

  /** Called by the session when the connection is gone: everything in flight is aborted. */
  connectionLost(err: H3Error): void {
    this.dead = true;
    this.host.timers.clear(this.headTimer);
    this.headTimer = undefined;
    this.waitingSection?.reject(err);
    this.resume();
    this.req?.abort(err);
    if (this.res !== undefined && !this.res.writableFinished) this.res.destroy();
    this.readDone = true;
    this.writeDone = true;
    this.finish();
  }

  /** A blocked field section of this stream became decodable (RFC 9204 §2.1.2). */
  unblocked(section: UnblockedSection): void {
    const waiting = this.waitingSection;
    this.waitingSection = undefined;
    if (waiting === undefined) return;
    if (section.error !== undefined) waiting.reject(section.error);
    else waiting.resolve(section.headers);
  }

  private async run(): Promise<void> {
    try {
      await pumpFrames(this.io, this.reader, (frame) => this.onFrame(frame));
      if (!this.readDone) this.onFin();
    } catch (err) {
      this.fail(err);
    }
  }

  private onFrame(frame: H3Frame): Promise<void> | undefined {
    switch (frame.type) {
      case 'headers':
        if (this.phase === 'headers') return this.onHead(frame.fieldSection);
        if (this.phase === 'body') return this.onTrailers(frame.fieldSection);
        throw new H3Error('H3_FRAME_UNEXPECTED', 'a HEADERS frame after the trailers');
      case 'data': {
        // RFC 9114 §4.1: DATA before HEADERS or after trailers is an invalid frame sequence.
        if (this.phase !== 'body') throw new H3Error('H3_FRAME_UNEXPECTED', `DATA frame ${this.phase === 'headers' ? 'before HEADERS' : 'after trailers'}`);
        if (frame.data.length === 0) return undefined;
        this.bodyBytes += frame.data.length;
        // RFC 9114 §4.1.2: more DATA than content-length is malformed (H3_MESSAGE_ERROR on the wire).
        if (this.contentLength !== undefined && this.bodyBytes > this.contentLength) {
          throw new H3Error('EDGE_H3_CONTENT_LENGTH_MISMATCH', `body exceeds content-length ${this.contentLength}`, { scope: 'stream' });
        }
        const req = this.req as Http3ServerRequest;
        if (req.destroyed) return undefined; // the application stopped listening; drain and discard
        const data = Buffer.from(frame.data.buffer, frame.data.byteOffset, frame.data.length);
        if (req.pushBody(data)) return undefined;
        return new Promise<void>((resolve) => {
          this.waitingBody = resolve;
        });
      }
      default:
        return undefined; // the FrameReader rejects control-only frames on request streams
    }
  }

  // RFC 9114 §4.1.1: a server may stop reading a request whose response is settled; the
  // read loop must wake up if it was paused for backpressure.
  private stopRead(reason: H3Error): void {
    this.readDone = true;
    this.io.stopReading(reason);
    this.resume();
  }

  /** Readable._read: the application wants more body. */
  resume(): void {
    const w = this.waitingBody;
    this.waitingBody = undefined;
    w?.();
  }

  private async decode(fieldSection: Uint8Array): Promise<Header[]> {
    const control = this.host.control;
    const result = control.decoder.decodeFieldSection(this.id, fieldSection);
    if (!result.blocked) {
      control.flushDecoder();
      return result.headers;
    }
    const lines = await new Promise<Header[]>((resolve, reject) => {
      this.waitingSection = { resolve, reject };
    });
    control.flushDecoder();
    return lines;
  }

  private async onHead(fieldSection: Uint8Array): Promise<void> {
    const lines = await this.decode(fieldSection);
    const head = validateRequestHeaders(lines);
    this.host.timers.clear(this.headTimer);
    this.headTimer = undefined;
    this.phase = 'body';
    this.contentLength = head.contentLength;
    const req = new Http3ServerRequest({
      streamId: this.id,
      method: head.method,
      scheme: head.scheme,
      authority: head.authority,
      path: head.path,
      headers: headersObject(lines),
      rawHeaders: rawHeaderList(lines),
      socket: this.host.socket,
      source: this,
      highWaterMark: this.host.bodyHighWaterMark,
    });
    const res = new Http3ServerResponse({ streamId: this.id, method: head.method, socket: this.host.socket, sink: this, highWaterMark: this.host.bodyHighWaterMark });
    this.req = req;
    this.res = res;
    // A destroyed request body is drained and discarded, so the read loop must not stay paused.
    req.once('close', () => this.resume());
    res.once('close', () => {
      this.writeDone = true;
      if (!this.readDone && !res.writableFinished) {
        // The response was abandoned: the exchange is over in both directions.
        this.stopRead(new H3Error('H3_REQUEST_CANCELLED', 'response abandoned', { scope: 'stream' }));
        req.abort(new H3Error('H3_REQUEST_CANCELLED', 'response abandoned before the request body ended', { scope: 'stream' }));
      }
      this.finish();
    });
    this.host.onRequest(req, res);
  }

  private async onTrailers(fieldSection: Uint8Array): Promise<void> {
    const lines = await this.decode(fieldSection);
    validateTrailers(lines);
    this.phase = 'trailers';
    const req = this.req as Http3ServerRequest;
    req.trailers = headersObject(lines);
    req.rawTrailers = rawHeaderList(lines);
  }

  private onFin(): void {
    this.reader.end(); // RFC 9114 §7.1: a FIN inside a frame is H3_FRAME_ERROR
    if (this.phase === 'headers') throw new H3Error('H3_REQUEST_INCOMPLETE', 'the request stream ended before HEADERS', { scope: 'stream' });
    if (this.contentLength !== undefined && this.bodyBytes !== this.contentLength) {
      throw new H3Error('EDGE_H3_CONTENT_LENGTH_MISMATCH', `body of ${this.bodyBytes} bytes disagrees with content-length ${this.contentLength}`, { scope: 'stream' });
    }
    this.readDone = true;
    this.req?.endBody();
    this.finish();
  }

  private fail(err: unknown): void {
    if (this.finished) return;
    this.readDone = true;
    // A head still waiting for QPACK inserts will never be needed now.
    const waiting = this.waitingSection;
    this.waitingSection = undefined;
    if (waiting !== undefined) queueMicrotask(() => waiting.reject(err));
    if (peerCodeOf(err) !== undefined) {
      // The client reset the request (RFC 9114 §4.1.1): abandon the response too, unless done.
      this.host.control.decoder.cancelStream(this.id);
      this.host.control.flushDecoder();
      this.req?.abort(err as H3Error);
      if (this.res !== undefined && !this.res.writableFinished) this.res.destroy(err as H3Error);
      else if (this.res === undefined) this.io.reset(new H3Error('H3_REQUEST_CANCELLED', 'request cancelled', { scope: 'stream' }));
      this.writeDone = this.res === undefined || this.writeDone;
      this.finish();
      return;
    }
    if (!isH3Error(err)) {
      // The library tore the stream down (the connection is closing).
      this.connectionLost(new H3Error('EDGE_H3_CONNECTION_LOST', 'the connection closed', { cause: err }));
      return;
    }
    const h3 = err as H3Error;
    if (h3.scope === 'connection') {
      this.host.onConnectionError(h3);
      return;
    }
    if (h3.code === 'H3_EXCESSIVE_LOAD' && this.res === undefined) {
      // RFC 9114 §4.2.2: a request head over our limit gets 431, and we stop reading it
      // without error (RFC 9114 §4.1.1).
      this.respondTooLarge();
      return;
    }
    this.host.control.decoder.cancelStream(this.id);
    this.host.control.flushDecoder();
    this.io.abort(h3);
    this.req?.abort(h3);
    if (this.res !== undefined && !this.res.writableFinished) this.res.destroy(h3);
    this.writeDone = true;
    this.finish();
  }

  private respondTooLarge(): void {
    this.stopRead(new H3Error('H3_NO_ERROR', 'request head too large', { scope: 'stream' }));
    let frame: Uint8Array;
    try {
      frame = this.headersFrame([[':status', '431'], ['content-length', '0']]);
    } catch {
      this.io.reset(new H3Error('H3_EXCESSIVE_LOAD', 'request head too large', { scope: 'stream' }));
      this.writeDone = true;
      this.finish();
      return;
    }
    this.io.write(frame).catch(() => {});
    void this.io.end().then(() => {
      this.writeDone = true;
      this.finish();
    });
  }

  private finish(): void {
    if (this.finished || !this.readDone || !this.writeDone) return;
    this.finished = true;
    this.host.timers.clear(this.headTimer);
    this.headTimer = undefined;
    this.host.onDone(this);
  }

  // ResponseSink

  headersFrame(lines: Header[]): Uint8Array {
    // RFC 9114 §4.2.2: do not send a section larger than the peer's advertised limit.
    const limit = this.host.control.peerSettings.maxFieldSectionSize;
    if (limit !== Infinity && fieldSectionSize(lines) > limit) {
      throw new H3Error('EDGE_H3_FIELD_SECTION_TOO_LARGE', `response field section exceeds the peer's limit of ${limit} bytes`);
    }
    const control = this.host.control;
    const frame = encodeHeadersFrame(control.encoder.encodeFieldSection(this.id, lines));
    control.flushEncoder();
    return frame;
  }

  write(bytes: Uint8Array): Promise<void> {
    return this.io.write(bytes);
  }

  end(): Promise<void> {
    return this.io.end();
  }

  reset(err: H3Error): void {
    if (!this.dead) this.io.abort(err);
    this.readDone = true;
    this.resume();
    this.req?.abort(err);
  }
}
