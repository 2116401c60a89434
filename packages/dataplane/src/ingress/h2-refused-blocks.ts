// HTTP/2 sessions that keep sending header blocks the proxy refuses (issue 38, finding 10). nghttp2
// and node refuse a header block stream by stream: one whose decoded list exceeds the field limits
// (an HPACK bomb: a few bytes referencing a large dynamic-table entry many times) is reset with
// ENHANCE_YOUR_CALM inside node's native layer, before JavaScript ever sees a stream. The session
// stayed open, so one connection could make the worker decode bomb after bomb (3 connections,
// 29,200 frames in 12 s: 160 % CPU, and a canary's latency 11 → 40-95 ms). RFC 9113 §5.4.1 lets an
// endpoint end a connection that keeps provoking stream errors; after a bounded count this one is
// sent GOAWAY ENHANCE_YOUR_CALM and closed.
//
// Such refusals are invisible to JavaScript, so they are counted from nghttp2's side: every stream
// it opened for the peer moves `lastProcStreamID` (client streams are odd, 1, 3, 5...), and every
// one node delivered is a 'stream' event. The difference is the header blocks refused below us
// (a peer that skips stream ids only inflates its own count). Read on a coarse sweep (`CHECK_MS`;
// `session.state` is one native call, about 0.2 µs), nothing per request. A block node let through
// but the protocol policy refused for its size (431: the same bomb under node's field count) is
// counted by the ingress as it answers.
import { constants } from 'node:http2';
import type { Http2Session } from 'node:http2';
import type { DeadlineSweep, Expirable } from '../proxy/deadline-sweep.ts';

/**
 * Refused header blocks a session may send within `REFUSED_BLOCK_WINDOW_MS` before it is closed:
 * a leaky bucket of `REFUSED_BLOCK_LIMIT`, draining at that many per window. No browser or HTTP/2
 * library has a header block refused in normal use (it would be a broken request each time); 100
 * matches node's own tolerance of streams refused for memory (`maxSessionRejectedStreams`).
 */
export const REFUSED_BLOCK_LIMIT = 100;
/** The window over which `REFUSED_BLOCK_LIMIT` refused header blocks drain, ms. */
export const REFUSED_BLOCK_WINDOW_MS = 10_000;
/**
 * How often each session's count is read, ms. A session is closed within this of crossing the
 * limit: at most the limit plus what it sends in one interval is decoded.
 */
export const REFUSED_BLOCK_CHECK_MS = 200;
/** How long a closed session's socket may take to flush its GOAWAY before it is destroyed, ms. */
const CLOSE_GRACE_MS = 1000;

/**
 * The leaky bucket of one session's refused header blocks, pure: `observe` is given the session's
 * total so far and the time, and says whether the session is over the limit.
 */
export class RefusedBlockBucket {
  private level = 0;
  private total = 0;
  private at: number;
  private readonly limit: number;
  private readonly windowMs: number;

  constructor(now: number, limit = REFUSED_BLOCK_LIMIT, windowMs = REFUSED_BLOCK_WINDOW_MS) {
    this.at = now;
    this.limit = limit;
    this.windowMs = windowMs;
  }

  /** Takes the session's running total of refused blocks at `now`; true once it is over the limit. */
  observe(total: number, now: number): boolean {
    const drained = ((now - this.at) * this.limit) / this.windowMs;
    this.at = now;
    this.level = Math.max(0, this.level - drained) + Math.max(0, total - this.total);
    this.total = Math.max(this.total, total);
    return this.level > this.limit;
  }
}

/** What the watch reads of a session's TLS socket, and destroys if the GOAWAY cannot be flushed. */
interface ClosableSocket {
  readonly destroyed: boolean;
  destroy(): void;
}

/** One session's refused-block watch on the connection sweep. */
export class RefusedBlockWatch implements Expirable {
  sweepSlot = -1;
  deadline: number;
  /** Streams node delivered to us ('stream' events), counted by the ingress. */
  delivered = 0;
  /** Delivered header blocks the request path refused for their size (431), counted by the ingress. */
  refusedAbove = 0;
  private closedAt = -1;
  private readonly bucket: RefusedBlockBucket;
  private readonly session: Http2Session;
  private readonly socket: ClosableSocket | undefined;
  private readonly sweep: DeadlineSweep;
  private readonly onClose: () => void;

  /** `onClose` runs when the session is closed for its refused blocks (metric, log). */
  constructor(session: Http2Session, socket: ClosableSocket | undefined, sweep: DeadlineSweep, onClose: () => void) {
    const now = performance.now();
    this.session = session;
    this.socket = socket;
    this.sweep = sweep;
    this.onClose = onClose;
    this.bucket = new RefusedBlockBucket(now);
    this.deadline = now + REFUSED_BLOCK_CHECK_MS;
    sweep.add(this);
  }

  /** Header blocks nghttp2 opened a stream for and node never delivered, and delivered ones refused for their size. */
  refused(): number {
    const last = this.session.state.lastProcStreamID ?? 0;
    return Math.max(0, (last + 1) / 2 - this.delivered) + this.refusedAbove;
  }

  expire(): void {
    const now = performance.now();
    if (this.closedAt !== -1) {
      // The GOAWAY had its grace: a peer that does not read is not waited for.
      if (this.socket !== undefined && !this.socket.destroyed) this.socket.destroy();
      return;
    }
    if (this.session.destroyed) return;
    if (this.bucket.observe(this.refused(), now)) {
      this.closedAt = now;
      this.onClose();
      // RFC 9113 §6.8: GOAWAY with ENHANCE_YOUR_CALM (0xb); node flushes it, then ends the socket
      // (the error goes to the server's 'sessionError', which the ingress listens to).
      this.session.destroy(new Error('too many refused header blocks'), constants.NGHTTP2_ENHANCE_YOUR_CALM);
      this.deadline = now + CLOSE_GRACE_MS;
    } else {
      this.deadline = now + REFUSED_BLOCK_CHECK_MS;
    }
    this.sweep.add(this);
  }
}
