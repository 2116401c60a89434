// Incremental HTTP/3 frame decoder for one stream (RFC 9114 §7). Feed it the stream's bytes in
// any chunking; it yields complete frames. DATA payloads are passed through as they arrive,
// never buffered; unknown and reserved frames are skipped without buffering; every other
// frame is buffered up to `maxFramePayload` bytes.

import { H3Error } from './errors.ts';
import { FRAME_TYPE, HTTP2_ONLY_FRAME_TYPES, decodeSingleVarintPayload } from './frames.ts';
import type { H3Frame } from './frames.ts';
import { decodeSettings } from './settings.ts';
import type { Http3Role } from './stream-types.ts';
import { decodeVarint } from './varint.ts';

/** The kind of stream a FrameReader reads, which decides which frames are allowed (RFC 9114 §7.2). */
export type FrameStreamKind = 'control' | 'request' | 'push';

/** Options for {@link FrameReader}. */
export interface FrameReaderOptions {
  /** The stream carrying the frames. Default 'request'. */
  stream?: FrameStreamKind;
  /** Which side we are; decides who may send PUSH_PROMISE, MAX_PUSH_ID and GOAWAY IDs. Default 'server'. */
  role?: Http3Role;
  /**
   * Largest payload, in bytes, of a buffered frame (HEADERS, SETTINGS, ...). Larger ones raise
   * H3_EXCESSIVE_LOAD before any payload is buffered. DATA and unknown frames are not limited
   * (they are streamed or skipped). Default 65536.
   */
  maxFramePayload?: number;
}

type ReaderState = 'header' | 'buffer' | 'data' | 'skip';

/** Longest frame header: two 8-byte varints. */
const MAX_HEADER_BYTES = 16;
/** GOAWAY, MAX_PUSH_ID and CANCEL_PUSH hold a single varint: at most 8 bytes. */
const MAX_SINGLE_VARINT_PAYLOAD = 8;

/** Decodes the frames of one stream incrementally. Create one per stream. */
export class FrameReader {
  private readonly stream: FrameStreamKind;
  private readonly role: Http3Role;
  private readonly maxFramePayload: number;
  private state: ReaderState = 'header';
  private readonly head = new Uint8Array(MAX_HEADER_BYTES);
  private headLen = 0;
  private frameType = 0;
  private remaining = 0;
  private payload: Uint8Array = new Uint8Array(0);
  private payloadLen = 0;
  private framesSeen = 0;

  constructor(options: FrameReaderOptions = {}) {
    this.stream = options.stream ?? 'request';
    this.role = options.role ?? 'server';
    this.maxFramePayload = options.maxFramePayload ?? 65536;
  }

  /** True when the reader stands between frames (a FIN here is clean). */
  get atFrameBoundary(): boolean {
    return this.state === 'header' && this.headLen === 0;
  }

  /**
   * Consumes `chunk` and returns the frames (or DATA pieces) it completes, in order.
   * Throws H3Error for any protocol violation; the reader is then unusable.
   * DATA pieces are views into `chunk`; copy them if `chunk` will be reused.
   */
  push(chunk: Uint8Array): H3Frame[] {
    const out: H3Frame[] = [];
    let at = 0;
    while (at < chunk.length) {
      switch (this.state) {
        case 'header':
          at = this.readHeader(chunk, at, out);
          break;
        case 'buffer': {
          const n = Math.min(this.remaining, chunk.length - at);
          this.payload.set(chunk.subarray(at, at + n), this.payloadLen);
          this.payloadLen += n;
          this.remaining -= n;
          at += n;
          if (this.remaining === 0) this.finishBuffered(out);
          break;
        }
        case 'data': {
          const n = Math.min(this.remaining, chunk.length - at);
          this.remaining -= n;
          out.push({ type: 'data', data: chunk.subarray(at, at + n), end: this.remaining === 0 });
          at += n;
          if (this.remaining === 0) this.state = 'header';
          break;
        }
        case 'skip': {
          const n = Math.min(this.remaining, chunk.length - at);
          this.remaining -= n;
          at += n;
          if (this.remaining === 0) this.state = 'header';
          break;
        }
      }
    }
    return out;
  }

  /**
   * Call when the stream ends cleanly (FIN). RFC 9114 §7.1: a stream that ends inside a frame
   * is a connection error of type H3_FRAME_ERROR.
   */
  end(): void {
    if (!this.atFrameBoundary) throw new H3Error('H3_FRAME_ERROR', 'stream ended inside a frame');
  }

  private readHeader(chunk: Uint8Array, at: number, out: H3Frame[]): number {
    if (this.headLen === 0) {
      const parsed = parseHeader(chunk, at);
      if (parsed !== null) {
        this.startFrame(parsed.type, parsed.length, out);
        return at + parsed.consumed;
      }
    }
    // The header straddles chunks: gather up to 16 bytes, which always suffice.
    const take = Math.min(MAX_HEADER_BYTES - this.headLen, chunk.length - at);
    const before = this.headLen;
    this.head.set(chunk.subarray(at, at + take), this.headLen);
    this.headLen += take;
    const parsed = parseHeader(this.head.subarray(0, this.headLen), 0);
    if (parsed === null) return at + take;
    this.headLen = 0;
    this.startFrame(parsed.type, parsed.length, out);
    return at + (parsed.consumed - before);
  }

  private startFrame(type: number, length: number, out: H3Frame[]): void {
    this.checkAllowed(type);
    this.framesSeen++;
    this.frameType = type;
    if (!Number.isSafeInteger(length)) {
      throw new H3Error('H3_EXCESSIVE_LOAD', 'frame length above 2^53-1', { scope: this.limitScope() });
    }
    this.remaining = length;
    if (type === FRAME_TYPE.DATA) {
      this.state = length === 0 ? 'header' : 'data';
      return;
    }
    if (!isBufferedType(type)) {
      // RFC 9114 §9: unknown and reserved frame types MUST be ignored.
      this.state = length === 0 ? 'header' : 'skip';
      return;
    }
    if (isSingleVarintType(type) && length > MAX_SINGLE_VARINT_PAYLOAD) {
      throw new H3Error('H3_FRAME_ERROR', `frame 0x${type.toString(16)} payload of ${length} bytes cannot hold one varint`);
    }
    if (length > this.maxFramePayload) {
      throw new H3Error('H3_EXCESSIVE_LOAD', `frame 0x${type.toString(16)} payload of ${length} bytes exceeds the limit of ${this.maxFramePayload}`, {
        scope: this.limitScope(),
      });
    }
    this.payload = new Uint8Array(length);
    this.payloadLen = 0;
    this.state = 'buffer';
    if (length === 0) this.finishBuffered(out);
  }

  // An oversized request frame costs one request, an oversized control frame the connection.
  private limitScope(): 'stream' | 'connection' {
    return this.stream === 'control' ? 'connection' : 'stream';
  }

  // RFC 9114 §7.2 and §6.2.1: which frames each stream may carry.
  private checkAllowed(type: number): void {
    if (HTTP2_ONLY_FRAME_TYPES.has(type)) {
      throw new H3Error('H3_FRAME_UNEXPECTED', `HTTP/2 frame type 0x${type.toString(16)} is not allowed in HTTP/3`);
    }
    if (this.stream === 'control') {
      // §6.2.1: the first frame of the control stream MUST be SETTINGS.
      if (this.framesSeen === 0 && type !== FRAME_TYPE.SETTINGS) {
        throw new H3Error('H3_MISSING_SETTINGS', 'the control stream must begin with SETTINGS');
      }
      if (this.framesSeen > 0 && type === FRAME_TYPE.SETTINGS) {
        throw new H3Error('H3_FRAME_UNEXPECTED', 'a second SETTINGS frame on the control stream');
      }
      if (type === FRAME_TYPE.DATA || type === FRAME_TYPE.HEADERS || type === FRAME_TYPE.PUSH_PROMISE) {
        throw new H3Error('H3_FRAME_UNEXPECTED', `frame 0x${type.toString(16)} is not allowed on the control stream`);
      }
      // §7.2.7: only a client sends MAX_PUSH_ID.
      if (type === FRAME_TYPE.MAX_PUSH_ID && this.role === 'client') {
        throw new H3Error('H3_FRAME_UNEXPECTED', 'a server must not send MAX_PUSH_ID');
      }
      return;
    }
    if (type === FRAME_TYPE.SETTINGS || type === FRAME_TYPE.GOAWAY || type === FRAME_TYPE.MAX_PUSH_ID || type === FRAME_TYPE.CANCEL_PUSH) {
      throw new H3Error('H3_FRAME_UNEXPECTED', `frame 0x${type.toString(16)} is only allowed on the control stream`);
    }
    if (type === FRAME_TYPE.PUSH_PROMISE) {
      // §7.2.5: a server MUST treat PUSH_PROMISE as H3_FRAME_UNEXPECTED. We never send MAX_PUSH_ID,
      // so as a client every push ID exceeds our limit: H3_ID_ERROR. Push streams carry no PUSH_PROMISE.
      if (this.role === 'server' || this.stream === 'push') {
        throw new H3Error('H3_FRAME_UNEXPECTED', 'PUSH_PROMISE is not accepted here');
      }
      throw new H3Error('H3_ID_ERROR', 'PUSH_PROMISE received but no push was ever permitted (no MAX_PUSH_ID sent)');
    }
  }

  private finishBuffered(out: H3Frame[]): void {
    const payload = this.payload;
    this.payload = new Uint8Array(0);
    this.state = 'header';
    switch (this.frameType) {
      case FRAME_TYPE.HEADERS:
        out.push({ type: 'headers', fieldSection: payload });
        return;
      case FRAME_TYPE.SETTINGS:
        out.push({ type: 'settings', settings: decodeSettings(payload) });
        return;
      case FRAME_TYPE.GOAWAY: {
        const id = decodeSingleVarintPayload(payload, 'GOAWAY');
        // §5.2: a server's GOAWAY carries a client-initiated bidirectional stream ID.
        if (this.role === 'client' && id !== Number.MAX_SAFE_INTEGER && id % 4 !== 0) {
          throw new H3Error('H3_ID_ERROR', `GOAWAY stream ID ${id} is not a client-initiated bidirectional stream`);
        }
        out.push({ type: 'goaway', id });
        return;
      }
      case FRAME_TYPE.MAX_PUSH_ID:
        out.push({ type: 'max_push_id', pushId: decodeSingleVarintPayload(payload, 'MAX_PUSH_ID') });
        return;
      case FRAME_TYPE.CANCEL_PUSH:
        out.push({ type: 'cancel_push', pushId: decodeSingleVarintPayload(payload, 'CANCEL_PUSH') });
        return;
      default:
        throw new H3Error('H3_INTERNAL_ERROR', `no decoder for buffered frame 0x${this.frameType.toString(16)}`);
    }
  }
}

function isBufferedType(type: number): boolean {
  return type === FRAME_TYPE.HEADERS || type === FRAME_TYPE.SETTINGS || isSingleVarintType(type);
}

function isSingleVarintType(type: number): boolean {
  return type === FRAME_TYPE.GOAWAY || type === FRAME_TYPE.MAX_PUSH_ID || type === FRAME_TYPE.CANCEL_PUSH;
}

function parseHeader(bytes: Uint8Array, at: number): { type: number; length: number; consumed: number } | null {
  const type = decodeVarint(bytes, at);
  if (type === null) return null;
  const length = decodeVarint(bytes, at + type.length);
  if (length === null) return null;
  return { type: type.value, length: length.value, consumed: type.length + length.length };
}
