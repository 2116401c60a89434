// The request body on its way upstream: counts bytes against `max_request_body_bytes` (413) and
// fails with 408 when the client pauses longer than `client_body_idle_ms`, or when the whole body
// takes longer than its deadline: `client_body_total_ms`, and sooner for a body slower than
// `client_body_min_bytes_per_s` (after a first `client_body_idle_ms`, each byte received extends
// the deadline by 1/rate s, Apache mod_reqtimeout's MinRate). Without the deadline a client that
// sends one byte every few seconds held its backend in-flight slot for as long as the backend let
// it. A Transform keeps the stream's backpressure intact (a 'data' listener would switch the
// source to flowing mode).
import { Transform } from 'node:stream';
import type { TransformCallback } from 'node:stream';
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

export class BodyGuard extends Transform {
  private received = 0;
  private readonly maxBytes: number;
  private readonly t: BodyTimeouts;
  private readonly start = performance.now();
  private timer: NodeJS.Timeout | undefined;
  private totalTimer: NodeJS.Timeout | undefined;

  /** @param maxBytes 0 for unlimited */
  constructor(maxBytes: number, t: BodyTimeouts) {
    super();
    this.maxBytes = maxBytes;
    this.t = t;
    this.arm();
    this.armTotal();
  }

  get bytes(): number {
    return this.received;
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
    callback(null, chunk);
  }

  private clearTimers(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    if (this.totalTimer !== undefined) clearTimeout(this.totalTimer);
  }

  override _flush(callback: TransformCallback): void {
    this.clearTimers();
    callback();
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    this.clearTimers();
    callback(err);
  }
}
