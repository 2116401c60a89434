// The request body on its way upstream: counts bytes against `max_request_body_bytes` (413) and
// fails when the client pauses longer than `client_body_idle_ms` (408). A Transform keeps the
// stream's backpressure intact (a 'data' listener would switch the source to flowing mode).
import { Transform } from 'node:stream';
import type { TransformCallback } from 'node:stream';
import { codedError } from './forward.ts';

export class BodyGuard extends Transform {
  private received = 0;
  private readonly maxBytes: number;
  private readonly idleMs: number;
  private timer: NodeJS.Timeout | undefined;

  /** @param maxBytes 0 for unlimited */
  constructor(maxBytes: number, idleMs: number) {
    super();
    this.maxBytes = maxBytes;
    this.idleMs = idleMs;
    this.arm();
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
    }, this.idleMs);
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.received += chunk.length;
    if (this.maxBytes > 0 && this.received > this.maxBytes) {
      callback(codedError('EDGE_REQUEST_TOO_LARGE', 'the request body exceeds max_request_body_bytes'));
      return;
    }
    this.arm();
    callback(null, chunk);
  }

  override _flush(callback: TransformCallback): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    callback();
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    callback(err);
  }
}
