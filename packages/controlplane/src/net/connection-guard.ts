// The control API's TCP front: it accepts every connection itself and hands it to the TLS/HTTP
// server only after deciding that it may stay. In order, at accept, before any TLS byte:
//   1. the source address must pass the IP allowlist (else the socket is reset at once);
//   2. the connection limits (`max_connections`, `max_connections_per_source`) are applied by
//      `admitConnection`: the newcomer displaces the oldest connection that has not authenticated
//      a request, or is dropped when every connection has;
// and afterwards: the TLS handshake must finish within `handshake_timeout_ms`, a connection with
// no request in progress is closed after `idle_timeout_ms` (before its first request too), and
// none lives longer than `connection_timeout_ms`. A connection proves itself when one of its
// requests authenticates with a role; proven connections are never displaced.
import net from 'node:net';
import type { Socket } from 'node:net';
import { once } from 'node:events';
import { admitConnection } from './connection-admission.ts';
import type { ConnectionView } from './connection-admission.ts';

export interface GuardSettings {
  readonly maxConnections: number;
  readonly maxPerSource: number;
  readonly handshakeTimeoutMs: number;
  readonly idleTimeoutMs: number;
  /** Lifetime of any connection (SPEC `connection_timeout_ms`). */
  readonly lifetimeMs: number;
}

/** What the guard did to a connection (the server counts, logs and audits these). */
export type GuardEvent =
  | { readonly kind: 'source_refused'; readonly source: string }
  | { readonly kind: 'dropped' | 'evicted'; readonly source: string; readonly limit: 'per_source' | 'global' }
  | { readonly kind: 'timeout'; readonly source: string; readonly phase: 'handshake' | 'idle' };

interface Conn extends ConnectionView {
  proven: boolean;
  readonly socket: Socket;
  secured: boolean;
  inflight: number;
  timer: NodeJS.Timeout | undefined;
  readonly lifetime: NodeJS.Timeout;
}

/** The source address as the allowlist and the per-source limit see it (IPv4-mapped IPv6 unwrapped). */
export function sourceOf(address: string | undefined): string {
  const a = address ?? '';
  return /^::ffff:\d+\.\d+\.\d+\.\d+$/i.test(a) ? a.slice(7) : a;
}

/** The key a TLS socket shares with the TCP socket under it. */
const tupleOf = (s: { remoteAddress?: string | undefined; remotePort?: number | undefined }): string => `${s.remoteAddress ?? ''}|${s.remotePort ?? 0}`;

export class ConnectionGuard {
  private readonly server: net.Server;
  private readonly conns = new Map<number, Conn>();
  private readonly byTuple = new Map<string, Conn>();
  private settings: GuardSettings;
  private nextId = 1;
  private readonly sourceAllowed: (source: string) => boolean;
  private readonly handoff: (socket: Socket) => void;
  private readonly onEvent: (e: GuardEvent) => void;

  constructor(settings: GuardSettings, sourceAllowed: (source: string) => boolean, handoff: (socket: Socket) => void, onEvent: (e: GuardEvent) => void) {
    this.settings = settings;
    this.sourceAllowed = sourceAllowed;
    this.handoff = handoff;
    this.onEvent = onEvent;
    this.server = net.createServer({ noDelay: true }, (s) => this.accept(s));
  }

  async listen(host: string, port: number): Promise<number> {
    this.server.listen({ host, port });
    await once(this.server, 'listening');
    return (this.server.address() as net.AddressInfo).port;
  }

  /** New limits and timeouts; they apply to new connections and to the next timer of open ones. */
  setSettings(settings: GuardSettings): void {
    this.settings = settings;
  }

  /** Open connections (tests and the snapshot). */
  get size(): number {
    return this.conns.size;
  }

  private accept(socket: Socket): void {
    const source = sourceOf(socket.remoteAddress);
    if (!this.sourceAllowed(source)) {
      // A reset, not a FIN: nothing of TLS or HTTP is ever sent to a refused source.
      socket.resetAndDestroy();
      this.onEvent({ kind: 'source_refused', source });
      return;
    }
    const decision = admitConnection([...this.conns.values()], source, this.settings);
    if (!decision.admit) {
      socket.resetAndDestroy();
      this.onEvent({ kind: 'dropped', source, limit: decision.limit });
      return;
    }
    if (decision.evict !== undefined) {
      const victim = this.conns.get(decision.evict);
      if (victim !== undefined) {
        this.forget(victim);
        victim.socket.destroy();
        this.onEvent({ kind: 'evicted', source: victim.source, limit: decision.limit ?? 'global' });
      }
    }
    const id = this.nextId++;
    const lifetime = setTimeout(() => socket.destroy(), this.settings.lifetimeMs);
    lifetime.unref();
    const conn: Conn = { id, source, openedAt: performance.now(), proven: false, socket, secured: false, inflight: 0, timer: undefined, lifetime };
    this.conns.set(id, conn);
    const tuple = tupleOf(socket);
    this.byTuple.set(tuple, conn);
    this.arm(conn, 'handshake');
    socket.once('close', () => this.forget(conn));
    this.handoff(socket);
  }

  private forget(conn: Conn): void {
    clearTimeout(conn.timer);
    clearTimeout(conn.lifetime);
    this.conns.delete(conn.id);
    const tuple = tupleOf(conn.socket);
    if (this.byTuple.get(tuple) === conn) this.byTuple.delete(tuple);
  }

  private arm(conn: Conn, phase: 'handshake' | 'idle'): void {
    clearTimeout(conn.timer);
    const ms = phase === 'handshake' ? this.settings.handshakeTimeoutMs : this.settings.idleTimeoutMs;
    conn.timer = setTimeout(() => {
      conn.socket.destroy();
      this.onEvent({ kind: 'timeout', source: conn.source, phase });
    }, ms);
    conn.timer.unref();
  }

  private find(s: { remoteAddress?: string | undefined; remotePort?: number | undefined }): Conn | undefined {
    return this.byTuple.get(tupleOf(s));
  }

  /** The TLS handshake of the connection under `tlsSocket` finished. */
  secured(tlsSocket: Socket): void {
    const conn = this.find(tlsSocket);
    if (conn === undefined || conn.secured) return;
    conn.secured = true;
    if (conn.inflight === 0) this.arm(conn, 'idle');
  }

  /** A request began on the connection: it is not idle until every request has ended. */
  requestStarted(tlsSocket: Socket): void {
    const conn = this.find(tlsSocket);
    if (conn === undefined) return;
    conn.secured = true;
    conn.inflight++;
    clearTimeout(conn.timer);
    conn.timer = undefined;
  }

  requestEnded(tlsSocket: Socket): void {
    const conn = this.find(tlsSocket);
    if (conn === undefined) return;
    conn.inflight = Math.max(0, conn.inflight - 1);
    if (conn.inflight === 0 && !conn.socket.destroyed) this.arm(conn, 'idle');
  }

  /** A request on the connection authenticated with a role: the connection keeps its place. */
  prove(tlsSocket: Socket): void {
    const conn = this.find(tlsSocket);
    if (conn !== undefined) conn.proven = true;
  }

  async close(): Promise<void> {
    for (const c of this.conns.values()) c.socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
