// The request body on its way upstream: counts bytes against `max_request_body_bytes` (413) and
// fails with 408 when the client pauses longer than `client_body_idle_ms`, or when the whole body
// takes longer than its deadline: `client_body_total_ms`, and sooner for a body slower than
// `client_body_min_bytes_per_s` (after a first `client_body_idle_ms`, each byte received extends
// the deadline by 1/rate s, Apache mod_reqtimeout's MinRate). Without the deadline a client that
// sends one byte every few seconds held its backend in-flight slot for as long as the backend let
// it. A Transform keeps the stream's backpressure intact (a 'data' listener would switch the
// source to flowing mode).
//
// A body framed by `content-length` on HTTP/2 or HTTP/3 is complete only at the client's end of
// stream: DATA beyond the declared length, or an END_STREAM/FIN short of it, makes the message
// malformed (RFC 9113 §8.1.1, RFC 9114 §4.1.2) and an intermediary must not forward it. The
// upstream request is framed by the same content-length, so a backend would take the declared
// bytes as a complete request even if the client then sent more (or a second request line). The
// guard therefore holds back the chunk that completes the declared length until the client's
// stream ends, and releases it with the end; an ordinary client sends its END_STREAM/FIN with the
// last DATA frame, so this adds no wait and no copy (the chunk is passed on as it came). When the
// protocol layer refuses the body instead (nghttp2 on HTTP/2, see `resetForLength`; our HTTP/3
// layer's EDGE_H3_CONTENT_LENGTH_MISMATCH), the held chunk is never sent and the backend never
// sees the whole body: the upstream request is aborted with the client's stream.
import { constants as h2 } from 'node:http2';
import { Transform } from 'node:stream';
import type { Readable, TransformCallback } from 'node:stream';
import { codedError } from './forward.ts';

/** Time limits of one request body, in ms (bytes/s for the rate; 0 disables it). */
export interface BodyTimeouts {
  readonly idleMs: number;
  readonly totalMs: number;
  readonly minBytesPerSec: number;
}

/**
 * When a body that started at `start` and has brought `received` bytes must be complete: the
 * total deadline, or sooner the one its minimum rate gives. Pure.
 */
export function bodyDeadline(start: number, received: number, t: BodyTimeouts): number {
  const total = start + t.totalMs;
  if (t.minBytesPerSec <= 0) return total;
  return Math.min(total, start + t.idleMs + (received * 1000) / t.minBytesPerSec);
}

/** nghttp2's NGHTTP2_ERR_PROTO, which node reports as the `errno` of an ERR_HTTP2_ERROR. */
const NGHTTP2_ERR_PROTO = -505;

/**
 * Whether `source`, a client's request body with `declared` bytes of content-length, was reset by
 * its protocol layer for a body that disagrees with that length. HTTP/3: our layer's
 * EDGE_H3_CONTENT_LENGTH_MISMATCH. HTTP/2, as nghttp2 1.6x in Node 24 does it: an END_STREAM short
 * of the length resets the stream with PROTOCOL_ERROR; DATA beyond it fails the whole session
 * (node sends GOAWAY INTERNAL_ERROR and its streams error with ERR_HTTP2_ERROR, errno
 * NGHTTP2_ERR_PROTO). nghttp2 does not say which rule was broken: a client resetting its own
 * stream with PROTOCOL_ERROR mid-body, or any other protocol error that fails the session while
 * the body is incomplete, reads the same.
 */
export function resetForLength(source: Readable, declared: number): boolean {
  if (Number.isNaN(declared) || source.readableEnded) return false;
  const err = source.errored as { code?: unknown; errno?: unknown } | null;
  if (err?.code === 'EDGE_H3_CONTENT_LENGTH_MISMATCH') return true;
  if (err?.code === 'ERR_HTTP2_ERROR' && err.errno === NGHTTP2_ERR_PROTO) return true;
  return (source as { rstCode?: unknown }).rstCode === h2.NGHTTP2_PROTOCOL_ERROR;
}

/** Size, pace and content-length framing of one request body (a Transform between the client and the upstream request). */
export class BodyGuard extends Transform {
  private received = 0;
  private readonly maxBytes: number;
  private readonly t: BodyTimeouts;
  /** The declared `content-length`, NaN when the body is not framed by one. */
  private readonly declared: number;
  private readonly source: Readable | undefined;
  /** The chunk that completed the declared length, held until the client's stream ends. */
  private held: Buffer | undefined;
  /** Set when the guard itself saw the body disagree with its content-length. */
  private mismatched = false;
  private readonly start = performance.now();
  private timer: NodeJS.Timeout | undefined;
  private totalTimer: NodeJS.Timeout | undefined;

  /**
   * @param maxBytes 0 for unlimited
   * @param declared the request's `content-length` in bytes, NaN when it has none
   * @param source the client's body stream, read by `lengthMismatch`
   */
  constructor(maxBytes: number, t: BodyTimeouts, declared = NaN, source?: Readable) {
    super();
    this.maxBytes = maxBytes;
    this.t = t;
    this.declared = declared;
    this.source = source;
    this.arm();
    this.armTotal();
  }

  get bytes(): number {
    return this.received;
  }

  /** Whether the body was refused (here or by the client's protocol layer) for disagreeing with its content-length. */
  get lengthMismatch(): boolean {
    return this.mismatched || (this.source !== undefined && resetForLength(this.source, this.declared));
  }

  private arm(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      // Unread data waiting here means the upstream side is slow, not the client: keep waiting.
      if (this.readableLength > 0) this.arm();
      else this.destroy(codedError('EDGE_CLIENT_BODY_TIMEOUT', 'the client paused its request body too long'));
    }, this.t.idleMs);
  }

  /** One timer for the whole body, re-armed when the bytes received since moved the deadline. */
  private armTotal(): void {
    const due = bodyDeadline(this.start, this.received, this.t);
    this.totalTimer = setTimeout(() => {
      const now = performance.now();
      if (this.readableLength > 0 || bodyDeadline(this.start, this.received, this.t) > now + 1) this.armTotal();
      else this.destroy(codedError('EDGE_CLIENT_BODY_TIMEOUT', 'the request body took too long'));
    }, Math.max(1, due - performance.now()));
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.received += chunk.length;
    if (this.maxBytes > 0 && this.received > this.maxBytes) {
      callback(codedError('EDGE_REQUEST_BODY_TOO_LARGE', 'the request body exceeds max_request_body_bytes'));
      return;
    }
    this.arm();
    // Comparisons with NaN (no content-length) are false: an unframed body streams as it comes.
    if (this.received >= this.declared) {
      // Past the declared length is refused by the protocol layers before it gets here; checked
      // again so that nothing beyond it is ever forwarded.
      if (this.received > this.declared) {
        this.mismatched = true;
        callback(codedError('EDGE_REQUEST_BODY_LENGTH_MISMATCH', 'the request body exceeds its content-length'));
        return;
      }
      this.held = chunk;
      callback();
      return;
    }
    callback(null, chunk);
  }

  private clearTimers(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    if (this.totalTimer !== undefined) clearTimeout(this.totalTimer);
  }

  override _flush(callback: TransformCallback): void {
    this.clearTimers();
    if (this.received < this.declared) {
      this.mismatched = true;
      callback(codedError('EDGE_REQUEST_BODY_LENGTH_MISMATCH', 'the request body ended short of its content-length'));
      return;
    }
    const held = this.held;
    this.held = undefined;
    callback(null, held);
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.clearTimers();
    this.held = undefined;
    callback(err);
  }
}
