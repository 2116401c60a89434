// The client side of one request stream (RFC 9114 §4.1): sends HEADERS, the body as DATA
// frames with backpressure, optional trailers and FIN; reads any informational responses, the
// final response head, the body (streamed) and trailers, validating them (RFC 9114 §4.3.2).

import { Readable } from 'node:stream';
import type { ControlStreams } from './control-streams.ts';
import { H3Error, isH3Error } from './errors.ts';
import { FrameReader } from './frame-reader.ts';
import type { H3Frame } from './frames.ts';
import { encodeDataFrameHeader, encodeHeadersFrame } from './frames.ts';
import { headersObject } from './header-object.ts';
import type { IncomingHeaders } from './header-object.ts';
import { fieldSectionSize, responseHasNoBody, validateResponseHeaders, validateTrailers } from './message-validation.ts';
import type { Header, UnblockedSection } from './qpack/decoder.ts';
import { peerCodeOf } from './quic-adapter.ts';
import { pumpFrames } from './stream-io.ts';
import type { StreamIo } from './stream-io.ts';

/** A request body: bytes, text, or a stream of chunks (sent as they come, with backpressure). */
export type RequestBody = Uint8Array | string | AsyncIterable<Uint8Array | string>;

/** An informational (1xx) response received before the final one. */
export interface InformationalResponse {
  status: number;
  headers: IncomingHeaders;
}

/** Body chunks larger than this are sent as several DATA frames. */
const MAX_DATA_FRAME = 65536;

/**
 * A response: status and headers at once, the body as a Readable of Buffers, trailers filled
 * when the body ends. `bytes()`/`text()` read the whole body.
 */
export class Http3ClientResponse {
  /** QUIC stream ID of the exchange. */
  readonly streamId: number;
  /** Final status code. */
  readonly status: number;
  /** Response headers (pseudo-headers included, as in Node's http2). */
  readonly headers: IncomingHeaders;
  /** Response field lines in wire order. */
  readonly rawHeaders: Header[];
  /** Informational responses that preceded this one (RFC 9114 §4.1). */
  readonly informational: InformationalResponse[];
  /** The body. It errors with an H3Error when the stream is reset or malformed. */
  readonly body: Readable;
  /** Trailer fields; filled before the body's 'end'. */
  trailers: IncomingHeaders = Object.create(null) as IncomingHeaders;

  constructor(streamId: number, status: number, lines: Header[], informational: InformationalResponse[], body: Readable) {
    this.streamId = streamId;
    this.status = status;
    this.rawHeaders = lines;
    this.headers = headersObject(lines);
    this.informational = informational;
    this.body = body;
  }

  /** Reads the whole body. */
  async bytes(): Promise<Buffer> {
    const parts: Buffer[] = [];
    for await (const chunk of this.body) parts.push(chunk as Buffer);
    return Buffer.concat(parts);
  }

  /** Reads the whole body as UTF-8. */
  async text(): Promise<string> {
    return (await this.bytes()).toString('utf8');
  }
}

/** What an exchange needs from its session. */
export interface ExchangeHost {
  readonly control: ControlStreams;
  /** A connection error: close the connection with its code. */
  onConnectionError(err: H3Error): void;
  /** The exchange is over (both directions). */
  onDone(exchange: ClientExchange): void;
}

/** One request/response exchange initiated by the client. */
export class ClientExchange {
  readonly id: number;
  /** Resolves with the final response head; rejects with an H3Error. */
  readonly response: Promise<Http3ClientResponse>;
  private readonly io: StreamIo;
  private readonly host: ExchangeHost;
  private readonly method: string;
  private readonly reader = new FrameReader({ stream: 'request', role: 'client', maxFramePayload: 1 << 20 });
  private resolveResponse!: (r: Http3ClientResponse) => void;
  private rejectResponse!: (e: unknown) => void;
  private res: Http3ClientResponse | undefined;
  private readonly informational: InformationalResponse[] = [];
  private phase: 'head' | 'body' | 'trailers' = 'head';
  private contentLength: number | undefined;
  private bodyBytes = 0;
  private waiting: (() => void) | undefined;
  private waitingSection: { resolve(h: Header[]): void; reject(e: unknown): void } | undefined;
  private readDone = false;
  private sendDone = false;
  private finished = false;

  constructor(io: StreamIo, host: ExchangeHost, method: string) {
    this.io = io;
    this.id = io.id;
    this.host = host;
    this.method = method;
    this.response = new Promise((resolve, reject) => {
      this.resolveResponse = resolve;
      this.rejectResponse = reject;
    });
    this.response.catch(() => {});
  }

  /** Sends the request and starts reading the response. */
  start(head: Header[], body: RequestBody | undefined, trailers: Header[] | undefined): void {
    void this.read();
    void this.send(head, body, trailers);
  }

  /** Aborts the exchange (timeout, connection loss, caller cancel). */
  abort(err: H3Error, resetStream = true): void {
    if (resetStream) this.io.abort(err);
    this.readDone = true;
    this.sendDone = true;
    this.failResponse(err);
    this.wake();
    this.finish();
  }

  private headersFrame(lines: Header[]): Uint8Array {
    const limit = this.host.control.peerSettings.maxFieldSectionSize;
    if (limit !== Infinity && fieldSectionSize(lines) > limit) {
      throw new H3Error('EDGE_H3_FIELD_SECTION_TOO_LARGE', `request field section exceeds the server's limit of ${limit} bytes`);
    }
    const frame = encodeHeadersFrame(this.host.control.encoder.encodeFieldSection(this.id, lines));
    this.host.control.flushEncoder();
    return frame;
  }

  private async send(head: Header[], body: RequestBody | undefined, trailers: Header[] | undefined): Promise<void> {
    try {
      const headFrame = this.headersFrame(head);
      if (body === undefined) {
        await this.io.write(headFrame);
      } else if (typeof body === 'string' || body instanceof Uint8Array) {
        const bytes = typeof body === 'string' ? Buffer.from(body) : body;
        await this.io.write(headFrame);
        for (let at = 0; at < bytes.length; at += MAX_DATA_FRAME) {
          const piece = bytes.subarray(at, at + MAX_DATA_FRAME);
          await this.io.write(Buffer.concat([encodeDataFrameHeader(piece.length), piece]));
        }
      } else {
        await this.io.write(headFrame);
        for await (const chunk of body) {
          const piece = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
          if (piece.length === 0) continue;
          this.io.write(encodeDataFrameHeader(piece.length)).catch(() => {});
          await this.io.write(piece);
        }
      }
      if (trailers !== undefined && trailers.length > 0) await this.io.write(this.headersFrame(trailers));
      await this.io.end();
    } catch (err) {
      if (this.finished) return;
      if (peerCodeOf(err) !== undefined) {
        // RFC 9114 §4.1.1: a server may stop reading the request once it answered; with
        // H3_NO_ERROR that is not a failure, and the response carries on.
        if ((err as H3Error).code === 'H3_NO_ERROR') {
          this.sendDone = true;
          this.finish();
          return;
        }
        this.abort(err as H3Error, true);
        return;
      }
      this.abort(isH3Error(err) ? (err as H3Error) : new H3Error('H3_INTERNAL_ERROR', 'sending the request failed', { scope: 'stream', cause: err }));
      return;
    }
    this.sendDone = true;
    this.finish();
  }

  private async read(): Promise<void> {
    try {
      await pumpFrames(this.io, this.reader, (frame) => this.onFrame(frame));
      if (!this.readDone) this.onFin();
    } catch (err) {
      this.onReadError(err);
    }
  }

  private onFrame(frame: H3Frame): Promise<void> | undefined {
    switch (frame.type) {
      case 'headers':
        if (this.phase === 'trailers') throw new H3Error('H3_FRAME_UNEXPECTED', 'a HEADERS frame after the trailers');
        return this.onHeaders(frame.fieldSection);
      case 'data': {
        if (this.phase !== 'body') throw new H3Error('H3_FRAME_UNEXPECTED', `DATA frame ${this.phase === 'head' ? 'before the response head' : 'after trailers'}`);
        if (frame.data.length === 0) return undefined;
        this.bodyBytes += frame.data.length;
        if (this.contentLength !== undefined && this.bodyBytes > this.contentLength) {
          throw new H3Error('H3_MESSAGE_ERROR', `response body exceeds content-length ${this.contentLength}`, { scope: 'stream' });
        }
        const body = (this.res as Http3ClientResponse).body;
        if (body.destroyed) return undefined;
        if (body.push(Buffer.from(frame.data.buffer, frame.data.byteOffset, frame.data.length))) return undefined;
        return new Promise<void>((resolve) => {
          this.waiting = resolve;
        });
      }
      default:
        return undefined;
    }
  }

  private async onHeaders(fieldSection: Uint8Array): Promise<void> {
    const control = this.host.control;
    const decoded = control.decoder.decodeFieldSection(this.id, fieldSection);
    let lines: Header[];
    if (decoded.blocked) {
      // RFC 9204 §2.1.2: wait for the encoder stream to deliver the inserts it references.
      lines = await new Promise<Header[]>((resolve, reject) => {
        this.waitingSection = { resolve, reject };
      });
    } else {
      lines = decoded.headers;
    }
    control.flushDecoder();
    if (this.phase === 'body') {
      validateTrailers(lines);
      this.phase = 'trailers';
      (this.res as Http3ClientResponse).trailers = headersObject(lines);
      return;
    }
    const head = validateResponseHeaders(lines);
    if (head.status < 200) {
      this.informational.push({ status: head.status, headers: headersObject(lines) });
      return;
    }
    this.phase = 'body';
    if (!responseHasNoBody(this.method, head.status)) this.contentLength = head.contentLength;
    else this.contentLength = 0;
    const body = new Readable({
      read: () => this.wake(),
      // Like Node's IncomingMessage: errors go to 'error' only when someone listens for them.
      destroy(err, callback) {
        callback(err !== null && this.listenerCount('error') > 0 ? err : null);
      },
    });
    body.on('close', () => {
      if (!this.readDone) {
        // The caller dropped the body: stop the server sending it (RFC 9114 §4.1.1).
        this.readDone = true;
        this.io.stopReading(new H3Error('H3_REQUEST_CANCELLED', 'response body abandoned', { scope: 'stream' }));
        this.wake();
        this.finish();
      }
    });
    this.res = new Http3ClientResponse(this.id, head.status, lines, this.informational, body);
    this.resolveResponse(this.res);
  }

  private onFin(): void {
    this.reader.end();
    if (this.phase === 'head') throw new H3Error('H3_REQUEST_INCOMPLETE', 'the stream ended before a final response', { scope: 'stream' });
    if (this.contentLength !== undefined && this.bodyBytes !== this.contentLength) {
      throw new H3Error('H3_MESSAGE_ERROR', `response body of ${this.bodyBytes} bytes disagrees with content-length ${this.contentLength}`, { scope: 'stream' });
    }
    this.readDone = true;
    (this.res as Http3ClientResponse).body.push(null);
    this.finish();
  }

  private onReadError(err: unknown): void {
    if (this.finished || this.readDone) return;
    if (isH3Error(err) && (err as H3Error).scope === 'connection' && peerCodeOf(err) === undefined) {
      this.host.onConnectionError(err as H3Error);
      this.abort(err as H3Error, false);
      return;
    }
    const h3 = isH3Error(err) ? (err as H3Error) : new H3Error('EDGE_H3_CONNECTION_LOST', 'the connection closed', { cause: err });
    // A peer reset ends the exchange; our own stream-level finding resets the stream.
    this.abort(h3, peerCodeOf(err) === undefined && h3.code !== 'EDGE_H3_CONNECTION_LOST');
  }

  /** A blocked field section of this stream became decodable. */
  unblocked(section: UnblockedSection): void {
    const waiting = this.waitingSection;
    this.waitingSection = undefined;
    if (waiting === undefined) return;
    if (section.error !== undefined) waiting.reject(section.error);
    else waiting.resolve(section.headers);
  }

  private failResponse(err: H3Error): void {
    this.waitingSection?.reject(err);
    this.waitingSection = undefined;
    if (this.res === undefined) {
      this.rejectResponse(err);
      return;
    }
    const body = this.res.body;
    if (!body.destroyed && !body.readableEnded) body.destroy(err);
  }

  private wake(): void {
    const w = this.waiting;
    this.waiting = undefined;
    w?.();
  }

  private finish(): void {
    if (this.finished || !this.readDone || !this.sendDone) return;
    this.finished = true;
    this.host.onDone(this);
  }
}
