// Deadlines of downstream TCP connections, so that a connection which does nothing cannot hold a
// slot of `max_connections` for ever: the TLS handshake must finish within
// `timeouts.tls_handshake_ms` of accept (node's own `handshakeTimeout` is an inactivity timer that a
// client dribbling its ClientHello resets, and on expiry it only reports the error), and an HTTP/2
// session with no open stream for `timeouts.client_idle_ms` is sent GOAWAY and closed (node has
// no such timer: its session timeout is reset by any frame, PING included). HTTP/1.1 keeps node's
// own header and keep-alive timers, set by the ingress. Every deadline sits in one coarse sweep
// (no timer per connection).
import type { Http2Session, ServerHttp2Stream } from 'node:http2';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { NormalizedConfig } from '@edge-proxy/config';
import { DeadlineSweep } from '../proxy/deadline-sweep.ts';
import type { Expirable } from '../proxy/deadline-sweep.ts';

/** The downstream connection timeouts of the active generation, in ms (read per new connection). */
export interface DownstreamTimeouts {
  readonly tlsHandshakeMs: number;
  readonly headerMs: number;
  readonly idleMs: number;
  /** HTTP/1.1 outer bound on head + body (node's `requestTimeout`): header time + body total. */
  readonly requestMs: number;
}

export function downstreamTimeouts(t: NormalizedConfig['performance']['timeouts']): DownstreamTimeouts {
  return { tlsHandshakeMs: t.tls_handshake_ms, headerMs: t.client_header_ms, idleMs: t.client_idle_ms, requestMs: t.client_header_ms + t.client_body_total_ms };
}

/** How often deadlines are checked: they fire up to this late. */
const RESOLUTION_MS = 100;

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

/**
 * One HTTP/2 session: open streams and since when it has had none. Until its first stream it gets
 * `firstMs` (the header timeout, as an HTTP/1.1 connection that has sent no request), then `idleMs`.
 */
class SessionIdle implements Expirable {
  sweepSlot = -1;
  private open = 0;
  private idleSince = performance.now();
  private readonly session: Http2Session;
  private idleMs: number;
  private readonly laterIdleMs: number;
  /** Bound once per session, not once per stream. */
  readonly streamClosed = (): void => {
    if (--this.open === 0) this.idleSince = performance.now();
  };

  constructor(session: Http2Session, firstMs: number, idleMs: number) {
    this.session = session;
    this.idleMs = firstMs;
    this.laterIdleMs = idleMs;
  }

  get deadline(): number {
    return this.open > 0 ? Infinity : this.idleSince + this.idleMs;
  }

  streamOpened(stream: ServerHttp2Stream): void {
    this.open++;
    this.idleMs = this.laterIdleMs;
    stream.on('close', this.streamClosed);
  }

  expire(): void {
    if (this.session.destroyed || this.session.closed) return;
    // GOAWAY (RFC 9113 §6.8) with NO_ERROR; with no stream open node closes the session at once.
    this.session.close();
  }
}

export class ConnectionDeadlines {
  private readonly sweep = new DeadlineSweep(RESOLUTION_MS);
  private readonly handshakes = new WeakMap<Socket, HandshakeDeadline>();
  private readonly sessions = new WeakMap<Http2Session, SessionIdle>();

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

  /** Starts watching a new HTTP/2 session for idleness: `firstMs` until its first stream, then `idleMs`. */
  session(session: Http2Session, firstMs: number, idleMs: number): void {
    const s = new SessionIdle(session, firstMs, idleMs);
    this.sessions.set(session, s);
    this.sweep.add(s);
    session.once('close', () => this.sweep.delete(s));
  }

  /** A stream opened on `session`: the session is busy until it (and every other) closes. */
  streamOpened(session: Http2Session, stream: ServerHttp2Stream): void {
    this.sessions.get(session)?.streamOpened(stream);
  }

  /** Deadlines being watched (tests). */
  get size(): number {
    return this.sweep.size;
  }
}
