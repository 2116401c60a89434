// Deadlines of downstream TCP connections, so that a connection which does nothing cannot hold a
// slot of `max_connections` for ever: the TLS handshake must finish within
// `timeouts.tls_handshake_ms` of accept (node's own `handshakeTimeout` is an inactivity timer that a
// client dribbling its ClientHello resets, and on expiry it only reports the error), and an HTTP/2
// session with no open stream for `timeouts.client_idle_ms` is sent GOAWAY and closed (node has
// no such timer: its session timeout is reset by any frame, PING included).
//
// An HTTP/2 session whose output is stuck is cut after `timeouts.client_send_idle_ms`: frames wait
// to be sent and not one byte has moved either way on its socket since the last check. node stops
// reading a session's socket while one of its writes is in flight, so a write that never
// completes (a peer that stopped reading, or one that went away while node's TLS layer held the
// write: nodejs/node#55804) leaves a session that never sees its peer's FIN, holds its streams and
// their header blocks for ever, and cannot even be closed (node destroys a closed session only once
// its output is flushed). Only destroying the socket frees it. The per-response send deadline
// (forward.ts) does not cover this: a response node has taken whole is settled from our side.
//
// HTTP/1.1 keeps node's own header and keep-alive timers, set by the ingress. Every deadline sits
// in one coarse sweep (no timer per connection).
import type { Http2Session, ServerHttp2Stream } from 'node:http2';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { NormalizedConfig } from '@edge-proxy/config';
import { DeadlineSweep } from '../proxy/deadline-sweep.ts';
import type { Expirable } from '../proxy/deadline-sweep.ts';
import { RefusedBlockWatch } from './h2-refused-blocks.ts';

/** The downstream connection timeouts of the active generation, in ms (read per new connection). */
export interface DownstreamTimeouts {
  readonly tlsHandshakeMs: number;
  readonly headerMs: number;
  readonly idleMs: number;
  /** How long an HTTP/2 session's output may stay stuck before its connection is cut. */
  readonly sendIdleMs: number;
  /** HTTP/1.1 outer bound on head + body (node's `requestTimeout`): header time + body total. */
  readonly requestMs: number;
}

export function downstreamTimeouts(t: NormalizedConfig['performance']['timeouts']): DownstreamTimeouts {
  return { tlsHandshakeMs: t.tls_handshake_ms, headerMs: t.client_header_ms, idleMs: t.client_idle_ms, sendIdleMs: t.client_send_idle_ms, requestMs: t.client_header_ms + t.client_body_total_ms };
}

/** How often deadlines are checked: they fire up to this late. */
const RESOLUTION_MS = 100;
/**
 * After an idle GOAWAY, how long a session with none of our streams open may stay (its GOAWAY
 * flushed, a header block that crossed it finished) before it is destroyed; and how long a
 * destroyed one's socket may take to flush. ms.
 */
const CLOSE_GRACE_MS = 1000;

class HandshakeDeadline implements Expirable {
  readonly deadline: number;
  sweepSlot = -1;
  private readonly socket: Socket;
  private readonly onExpire: () => void;

  constructor(socket: Socket, ms: number, onExpire: () => void) {
    this.socket = socket;
    this.deadline = performance.now() + ms;
    this.onExpire = onExpire;
  }

  expire(): void {
    if (this.socket.destroyed) return;
    this.onExpire();
    this.socket.destroy();
  }
}

/** What `SessionIdle` reads of a session's TLS socket (node keeps byte counters on the stream handle; not in the typings). */
interface CountedSocket {
  readonly _handle?: { readonly bytesRead?: number; readonly bytesWritten?: number } | null;
  destroy(): void;
}

/** One HTTP/2 session's deadlines: when it is cut or closed, and what `expire` does then. */
interface SessionLimits {
  readonly firstMs: number;
  readonly idleMs: number;
  readonly sendIdleMs: number;
  /** Runs just before a session whose output is stuck has its socket destroyed. */
  readonly onStall: () => void;
  /** Runs when a session is closed (GOAWAY ENHANCE_YOUR_CALM) for the header blocks refused on it (h2-refused-blocks.ts). */
  readonly onRefusedBlocks?: () => void;
}

/**
 * One HTTP/2 session: open streams and since when it has had none. Until its first stream it gets
 * `firstMs` (the header timeout, as an HTTP/1.1 connection that has sent no request), then
 * `idleMs`. While a stream is open, or once it has been sent GOAWAY, its output is checked every
 * `sendIdleMs` instead (see the module header).
 *
 * Idle is decided after the event loop's next I/O, not at the sweep: the sweep runs in the timers
 * phase, before the loop reads its sockets, so after the worker was busy past the deadline a
 * request that had arrived meanwhile would still be unread, and the GOAWAY would refuse it
 * (REFUSED_STREAM) for the worker's own lateness.
 */
export class SessionIdle implements Expirable {
  sweepSlot = -1;
  private open = 0;
  private idleSince = performance.now();
  private idleMs: number;
  /** Set by `close`: the GOAWAY is out, node destroys the session once its output is flushed. */
  private closing = false;
  /**
   * When the idle GOAWAY went out (-1: not yet), and the socket's byte count then. A session still
   * open `CLOSE_GRACE_MS` later with none of our streams open whose socket has moved bytes since
   * is held only by its peer (a slow CONTINUATION: a header block in progress; node, which checks
   * whether a closed session can go only when something of its own happens, left it open when a
   * write was pending at the GOAWAY) and is destroyed. One whose bytes have not moved is left to
   * the stuck-output check.
   */
  private goawayAt = -1;
  private goawayBytes = -1;
  /** When the next such check is due. */
  private graceAt = Infinity;
  /** When the session was destroyed for that (-1: not); its socket follows `CLOSE_GRACE_MS` later. */
  private forcedAt = -1;
  /** While streams are open or the session is closing: when its output progress is checked next. */
  private checkAt = Infinity;
  private lastBytes = -1;
  private readonly session: Http2Session;
  private readonly socket: CountedSocket | undefined;
  private readonly limits: SessionLimits;
  private readonly sweep: DeadlineSweep;
  /** Bound once per session, not once per stream. */
  readonly streamClosed = (): void => {
    if (--this.open === 0) this.idleSince = performance.now();
  };

  /**
   * An idle expiry once the loop has read what was waiting (`expire` defers it here): a stream
   * opened since, or one that came and went, keeps the session; otherwise it is sent GOAWAY.
   */
  private readonly closeIfIdle = (): void => {
    if (this.session.destroyed) return;
    if (this.open > 0 || this.closing || this.deadline > performance.now()) {
      this.sweep.add(this);
      return;
    }
    // GOAWAY (RFC 9113 §6.8) with NO_ERROR; with no stream open node closes the session at
    // once, unless a write of it is still in flight.
    if (!this.session.closed) this.session.close();
    if (this.session.destroyed) return;
    this.closing = true;
    this.goawayAt = performance.now();
    this.graceAt = this.goawayAt + CLOSE_GRACE_MS;
    this.goawayBytes = this.bytes();
    this.watchOutput();
    this.sweep.add(this);
  };

  constructor(session: Http2Session, socket: CountedSocket | undefined, limits: SessionLimits, sweep: DeadlineSweep) {
    this.session = session;
    this.socket = socket;
    this.limits = limits;
    this.idleMs = limits.firstMs;
    this.sweep = sweep;
  }

  get deadline(): number {
    if (this.forcedAt !== -1) return this.forcedAt + CLOSE_GRACE_MS;
    if (this.goawayAt !== -1 && this.open === 0) return Math.min(this.checkAt, this.graceAt);
    return this.open > 0 || this.closing ? this.checkAt : this.idleSince + this.idleMs;
  }

  streamOpened(stream: ServerHttp2Stream): void {
    if (this.open++ === 0 && !this.closing) this.watchOutput();
    this.idleMs = this.limits.idleMs;
    stream.on('close', this.streamClosed);
  }

  expire(): void {
    if (this.forcedAt !== -1) {
      // The destroyed session had its grace to flush; a peer that does not read is not waited for.
      this.socket?.destroy();
      return;
    }
    if (this.session.destroyed) return;
    if (this.goawayAt !== -1 && this.open === 0 && performance.now() >= this.graceAt) {
      this.graceAt = performance.now() + CLOSE_GRACE_MS;
      if (this.bytes() !== this.goawayBytes) {
        // node flushes what nghttp2 holds and ends the socket; the socket itself goes after a grace.
        this.forcedAt = performance.now();
        this.session.destroy();
        if (this.socket !== undefined) this.sweep.add(this);
        return;
      }
      if (performance.now() < this.checkAt) {
        this.sweep.add(this);
        return;
      }
    }
    if (this.open === 0 && !this.closing) {
      // setImmediate runs after this turn's poll phase: what the client sent meanwhile is read
      // first. The sweep has dropped this session, so nothing schedules it twice meanwhile.
      setImmediate(this.closeIfIdle);
      return;
    }
    const bytes = this.bytes();
    // Stuck: nothing moved, and output is waiting: frames queued in nghttp2 (`state` is a native
    // call: once per `sendIdleMs`, only here), or a closed session with no stream left, which node
    // would have destroyed had it nothing left to write.
    const waiting = (this.closing && this.open === 0) || (this.session.state.outboundQueueSize ?? 0) > 0;
    if (bytes !== this.lastBytes || !waiting || this.socket === undefined) {
      this.watchOutput(bytes);
      this.sweep.add(this);
      return;
    }
    this.limits.onStall();
    this.socket.destroy();
  }

  private watchOutput(bytes = this.bytes()): void {
    this.lastBytes = bytes;
    this.checkAt = performance.now() + this.limits.sendIdleMs;
  }

  /** Bytes read and written on the session's socket so far (-1 once it has none). */
  private bytes(): number {
    const h = this.socket?._handle;
    return h == null ? -1 : (h.bytesRead ?? 0) + (h.bytesWritten ?? 0);
  }
}

export class ConnectionDeadlines {
  private readonly sweep = new DeadlineSweep(RESOLUTION_MS);
  private readonly handshakes = new WeakMap<Socket, HandshakeDeadline>();
  private readonly sessions = new WeakMap<Http2Session, SessionIdle>();
  private readonly refusals = new WeakMap<Http2Session, RefusedBlockWatch>();

  /** Starts the handshake deadline of a just-accepted TCP socket; `onExpire` runs before it is destroyed. */
  accepted(socket: Socket, ms: number, onExpire: () => void): void {
    const d = new HandshakeDeadline(socket, ms, onExpire);
    this.handshakes.set(socket, d);
    this.sweep.add(d);
  }

  /** The handshake of `tls` finished: its TCP socket's deadline is cleared. */
  secured(tls: TLSSocket): void {
    // node's TLSSocket keeps the TCP socket it wraps as `_parent` (not in the typings).
    const raw = (tls as TLSSocket & { _parent?: Socket })._parent ?? tls;
    this.forget(raw);
  }

  /** The TCP socket closed: nothing to wait for any more. */
  forget(socket: Socket): void {
    const d = this.handshakes.get(socket);
    if (d === undefined) return;
    this.handshakes.delete(socket);
    this.sweep.delete(d);
  }

  /**
   * Starts watching a new HTTP/2 session on `socket` (its TLS socket; node's `session.socket` is a
   * proxy that refuses `destroy`): idle for `firstMs` until its first stream, then `idleMs`; output
   * stuck for `sendIdleMs` while streams are open or after GOAWAY; and closed once it has sent
   * too many header blocks that were refused below us (h2-refused-blocks.ts).
   */
  session(session: Http2Session, socket: TLSSocket | undefined, limits: SessionLimits): void {
    const s = new SessionIdle(session, socket as CountedSocket | undefined, limits, this.sweep);
    this.sessions.set(session, s);
    this.sweep.add(s);
    const r = new RefusedBlockWatch(session, socket, this.sweep, limits.onRefusedBlocks ?? (() => {}));
    this.refusals.set(session, r);
    session.once('close', () => {
      this.sweep.delete(s);
      this.sweep.delete(r);
    });
  }

  /** A stream opened on `session`: the session is busy until it (and every other) closes. */
  streamOpened(session: Http2Session, stream: ServerHttp2Stream): void {
    this.sessions.get(session)?.streamOpened(stream);
    const r = this.refusals.get(session);
    if (r !== undefined) r.delivered++;
  }

  /** A header block delivered on `session` was refused for its size (431): it counts as refused. */
  headerBlockRefused(session: Http2Session): void {
    const r = this.refusals.get(session);
    if (r !== undefined) r.refusedAbove++;
  }

  /** Deadlines being watched (tests). */
  get size(): number {
    return this.sweep.size;
  }
}
