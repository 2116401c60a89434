// An HTTP/3 server over `@matrixai/quic`'s QUICServer: options as plain data, one
// Http3ServerSession per connection, 'request' events shaped like Node's http2 compatibility
// API, graceful close with GOAWAY, and counters that prove nothing is left behind.

import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { QUICServer, events } from '@matrixai/quic';
import type { QUICConnection } from '@matrixai/quic';
import { H3Error } from './errors.ts';
import { codeToReason, ingressCounts, reasonToCode, serverCrypto, setIngressQueueLimit, transportCounts, transportLogger } from './quic-adapter.ts';
import type { IngressCounts, TransportLogRecord } from './quic-adapter.ts';
import type { Http3ServerRequest } from './server-request.ts';
import type { Http3ServerResponse } from './server-response.ts';
import { Http3ServerSession } from './server-session.ts';
import type { ServerSessionOptions } from './server-session.ts';
import { TimerSet } from './timer-set.ts';

/** Options of {@link Http3Server}. Plain data; defaults in {@link SERVER_DEFAULTS}. */
export interface Http3ServerOptions {
  /** Private key, PEM. */
  key: string | Uint8Array;
  /** Certificate chain, PEM (leaf first). One chain per server: see docs/decisions.md on SNI. */
  cert: string | Uint8Array;
  /**
   * HMAC key (>= 32 bytes) deriving our connection IDs and signing Retry tokens. Give every
   * worker behind one port the same key. Default: random per server.
   */
  cryptoKey?: Uint8Array;
  /**
   * TLS session ticket key (exactly 48 bytes) so sessions resume, and 0-RTT is accepted, across
   * connections and worker processes. Default: none (quiche's random per-connection key: no
   * resumption).
   */
  ticketKey?: Uint8Array;
  /**
   * Client certificates (mutual TLS): the CA certificates, PEM, that must have issued the client's
   * certificate. A client that presents none, or one these CAs did not issue, fails the handshake
   * (quiche verifies the chain natively). Default none: no client certificate is asked for.
   */
  clientCa?: string;
  /** Validate client addresses with a Retry before creating state (RFC 9000 §8.1.2). Default true. */
  retry?: boolean;
  /** Accept 0-RTT from resumed clients (RFC 9001 §4.6; needs `ticketKey`). Default true. */
  earlyData?: boolean;
  /** Close a connection idle this long, ms (RFC 9000 §10.1). Default 30000. */
  maxIdleTimeoutMs?: number;
  /** Abandon a handshake not done in this time, ms. Default 10000. */
  handshakeTimeoutMs?: number;
  /** Concurrent request streams per connection (QUIC initial_max_streams_bidi). Default 100. */
  maxConcurrentStreams?: number;
  /** Concurrent peer unidirectional streams (>= 3: control and two QPACK). Default 8. */
  maxUniStreams?: number;
  /** SETTINGS_MAX_FIELD_SECTION_SIZE, bytes (RFC 9114 §4.2.2). Default 65536. */
  maxFieldSectionSize?: number;
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY, bytes (RFC 9204 §5). Default 4096. */
  qpackMaxTableCapacity?: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS (RFC 9204 §5). Default 16. */
  qpackBlockedStreams?: number;
  /** Let our QPACK encoder use the client's dynamic table. Default false (static table only). */
  qpackEncoderDynamicTable?: boolean;
  /** Connection flow-control window, bytes (QUIC initial_max_data). Default 16 MiB. */
  initialMaxData?: number;
  /** Per-stream flow-control window, bytes. Default 1 MiB. */
  initialMaxStreamData?: number;
  /** Bytes read from QUIC per stream read. Default 16384. */
  readChunkSize?: number;
  /** Body bytes buffered per request and per response before backpressure. Default 65536. */
  bodyHighWaterMark?: number;
  /**
   * A request stream must deliver its complete head within this time, ms, or it is reset
   * (EDGE_H3_TIMEOUT, H3_REQUEST_CANCELLED on the wire). Default 10000.
   */
  requestHeadTimeoutMs?: number;
  /** Default drain period of close(), ms. Default 30000. */
  drainTimeoutMs?: number;
  /**
   * Bytes of received datagrams that may wait to be processed (handshake crypto, connection
   * locks); datagrams beyond it are dropped and counted, and QUIC retransmits them (0 drops every
   * datagram). Default 16 MiB.
   */
  ingressQueueLimitBytes?: number;
  /** Receives the QUIC library's warnings and errors. Default: dropped. */
  onTransportLog?: (record: TransportLogRecord) => void;
}

/** Defaults of every optional server option. */
export const SERVER_DEFAULTS = Object.freeze({
  retry: true,
  earlyData: true,
  maxIdleTimeoutMs: 30000,
  handshakeTimeoutMs: 10000,
  maxConcurrentStreams: 100,
  maxUniStreams: 8,
  maxFieldSectionSize: 65536,
  qpackMaxTableCapacity: 4096,
  qpackBlockedStreams: 16,
  qpackEncoderDynamicTable: false,
  initialMaxData: 16 * 1024 * 1024,
  initialMaxStreamData: 1024 * 1024,
  readChunkSize: 16384,
  bodyHighWaterMark: 65536,
  requestHeadTimeoutMs: 10000,
  drainTimeoutMs: 30000,
  ingressQueueLimitBytes: 16 * 1024 * 1024,
});

/** Where and how to bind. */
export interface ListenOptions {
  /** Address to bind. Default '::' (dual stack). */
  host?: string;
  /** UDP port; 0 picks a free one. Default 0. */
  port?: number;
  /**
   * SO_REUSEPORT so several worker processes bind the same port and the kernel spreads
   * connections by 4-tuple (Node 24 makes it an exclusive bind per process). Default false.
   */
  reusePort?: boolean;
  /** Bind IPv6 only. Default false. */
  ipv6Only?: boolean;
}

/** What the server holds, for leak checks and metrics. */
export interface Http3ServerStats {
  /** HTTP/3 sessions (established connections) alive. */
  sessions: number;
  /** Request streams in progress, over all sessions. */
  requestStreams: number;
  /** Peer control/QPACK streams being read, over all sessions. */
  uniStreams: number;
  /** Timers armed by the session layer (drain periods). */
  timers: number;
  /** Connections the QUIC library holds (handshaking, running or draining). */
  quicConnections: number;
  /** Streams the QUIC library tracks. */
  quicStreams: number;
  /** Requests accepted since start. */
  requests: number;
}

function checkRange(name: string, value: number, min: number, max: number): void {
  if (!Number.isInteger(value) || value < min || value > max) throw new H3Error('EDGE_H3_INVALID_USE', `${name} must be an integer in [${min}, ${max}], got ${value}`);
}

/** Events of {@link Http3Server}. */
export interface Http3ServerEvents {
  /** A connection completed its handshake. */
  session: [session: Http3ServerSession];
  /** A well-formed request arrived (RFC 9114 §4.3.1). */
  request: [req: Http3ServerRequest, res: Http3ServerResponse, session: Http3ServerSession];
  /** A peer violated the protocol; its connection is being closed with `err.wireCode`. */
  protocolError: [err: H3Error, session: Http3ServerSession];
  /** A 'request' listener threw; that request was reset with H3_INTERNAL_ERROR. */
  handlerError: [err: unknown, session: Http3ServerSession];
}

/** An HTTP/3 server (RFC 9114); see {@link Http3ServerEvents}. */
export class Http3Server extends EventEmitter<Http3ServerEvents> {
  private readonly options: Required<Omit<Http3ServerOptions, 'ticketKey' | 'onTransportLog' | 'clientCa'>> & Pick<Http3ServerOptions, 'ticketKey' | 'onTransportLog' | 'clientCa'>;
  private quic: QUICServer | undefined;
  /** The certificate (and client CAs) set by `setCertificate` (options are frozen; this replaces theirs). */
  private identity: { cert: string; key: string; ca?: string } | undefined;
  /** Whether new connections accept 0-RTT (`earlyData`, then `setEarlyData`). */
  private earlyData: boolean;
  /** The max_idle_timeout new connections advertise (`maxIdleTimeoutMs`, then `setIdleTimeout`). */
  private idleTimeoutMs: number;
  private readonly sessions = new Set<Http3ServerSession>();
  private readonly timers = new TimerSet();
  private bound: { host: string; port: number } | undefined;
  private requests = 0;
  /** Ingress counters at close, readable afterwards. */
  private closedIngress: IngressCounts | undefined;

  constructor(options: Http3ServerOptions) {
    super();
    const o = { ...SERVER_DEFAULTS, cryptoKey: randomBytes(32), ...stripUndefined(options), key: options.key, cert: options.cert };
    if (o.cryptoKey.length < 32) throw new H3Error('EDGE_H3_INVALID_USE', 'cryptoKey must be at least 32 bytes');
    if (o.ticketKey !== undefined && o.ticketKey.length !== 48) throw new H3Error('EDGE_H3_INVALID_USE', 'ticketKey must be exactly 48 bytes');
    checkRange('maxConcurrentStreams', o.maxConcurrentStreams, 1, 10000);
    checkRange('maxUniStreams', o.maxUniStreams, 3, 100);
    checkRange('maxFieldSectionSize', o.maxFieldSectionSize, 1024, 1 << 20);
    checkRange('qpackMaxTableCapacity', o.qpackMaxTableCapacity, 0, 1 << 20);
    checkRange('qpackBlockedStreams', o.qpackBlockedStreams, 0, 1000);
    checkRange('maxIdleTimeoutMs', o.maxIdleTimeoutMs, 100, 600000);
    checkRange('handshakeTimeoutMs', o.handshakeTimeoutMs, 100, 600000);
    checkRange('readChunkSize', o.readChunkSize, 1024, 1 << 20);
    checkRange('requestHeadTimeoutMs', o.requestHeadTimeoutMs, 10, 600000);
    checkRange('ingressQueueLimitBytes', o.ingressQueueLimitBytes, 0, 1 << 30);
    this.options = Object.freeze(o);
    this.earlyData = o.earlyData;
    this.idleTimeoutMs = o.maxIdleTimeoutMs;
  }

  /** Binds the UDP socket and starts accepting connections; resolves with the bound address. */
  async listen(listen: ListenOptions = {}): Promise<{ host: string; port: number }> {
    if (this.quic !== undefined) throw new H3Error('EDGE_H3_INVALID_USE', 'the server is already listening');
    const o = this.options;
    const quic = new QUICServer({
      crypto: serverCrypto(o.cryptoKey),
      config: {
        key: this.identity?.key ?? (typeof o.key === 'string' ? o.key : Buffer.from(o.key).toString('utf8')),
        cert: this.identity?.cert ?? (typeof o.cert === 'string' ? o.cert : Buffer.from(o.cert).toString('utf8')),
        verifyPeer: o.clientCa !== undefined,
        ...(o.clientCa !== undefined ? { ca: this.identity?.ca ?? o.clientCa } : {}),
        applicationProtos: ['h3'],
        maxIdleTimeout: this.idleTimeoutMs,
        initialMaxData: o.initialMaxData,
        initialMaxStreamDataBidiRemote: o.initialMaxStreamData,
        initialMaxStreamDataBidiLocal: o.initialMaxStreamData,
        initialMaxStreamDataUni: o.initialMaxStreamData,
        initialMaxStreamsBidi: o.maxConcurrentStreams,
        initialMaxStreamsUni: o.maxUniStreams,
        readableChunkSize: o.readChunkSize,
        enableEarlyData: this.earlyData,
        disableRetry: !o.retry,
        ...(o.ticketKey !== undefined ? { ticketKey: o.ticketKey } : {}),
      },
      reasonToCode,
      codeToReason,
      minIdleTimeout: o.handshakeTimeoutMs,
      logger: transportLogger('h3-server', o.onTransportLog),
    });
    quic.addEventListener(events.EventQUICServerConnection.name, this.onConnection);
    setIngressQueueLimit(quic, o.ingressQueueLimitBytes);
    await quic.start({
      host: listen.host ?? '::',
      port: listen.port ?? 0,
      ...(listen.reusePort !== undefined ? { reusePort: listen.reusePort } : {}),
      ...(listen.ipv6Only !== undefined ? { ipv6Only: listen.ipv6Only } : {}),
    });
    this.quic = quic;
    this.bound = { host: String(quic.host), port: Number(quic.port) };
    return this.bound;
  }

  /** The bound address, or undefined before listen(). */
  address(): { host: string; port: number } | undefined {
    return this.bound;
  }

  /** The live sessions. */
  get liveSessions(): ReadonlySet<Http3ServerSession> {
    return this.sessions;
  }

  private readonly onConnection = (evt: Event): void => {
    const conn = (evt as events.EventQUICServerConnection).detail as QUICConnection;
    const sessionOptions: ServerSessionOptions = {
      maxFieldSectionSize: this.options.maxFieldSectionSize,
      qpackMaxTableCapacity: this.options.qpackMaxTableCapacity,
      qpackBlockedStreams: this.options.qpackBlockedStreams,
      qpackEncoderDynamicTable: this.options.qpackEncoderDynamicTable,
      bodyHighWaterMark: this.options.bodyHighWaterMark,
      requestHeadTimeoutMs: this.options.requestHeadTimeoutMs,
    };
    const session = new Http3ServerSession(conn, sessionOptions, {
      timers: this.timers,
      onRequest: (req, res, s) => {
        this.requests++;
        this.emit('request', req, res, s);
      },
      onClose: (s) => {
        this.sessions.delete(s);
      },
    });
    session.on('protocolError', (err: H3Error) => this.emit('protocolError', err, session));
    session.on('handlerError', (err: unknown) => this.emit('handlerError', err, session));
    this.sessions.add(session);
    // Attach before returning: the library hands over streams that came with the handshake
    // right after this event (see the patch notes in docs/decisions.md).
    session.start();
    this.emit('session', session);
  };

  /**
   * Graceful shutdown: stop accepting connections, send GOAWAY on every session, give requests
   * in progress up to `drainTimeoutMs`, then close every connection with H3_NO_ERROR and release
   * the socket.
   */
  async close(drainTimeoutMs: number = this.options.drainTimeoutMs): Promise<void> {
    const quic = this.quic;
    if (quic === undefined) return;
    // The socket stops creating connections for new clients; established ones keep running.
    (quic as unknown as { socket: { unsetServer(): void } }).socket.unsetServer();
    await Promise.all([...this.sessions].map((s) => s.close(drainTimeoutMs)));
    await this.destroy();
  }

  /** Immediate shutdown: every connection closes with H3_NO_ERROR, requests in progress abort. */
  async destroy(): Promise<void> {
    const quic = this.quic;
    if (quic === undefined) return;
    this.closedIngress = { ...ingressCounts(quic), queueBytes: 0 };
    this.quic = undefined;
    this.bound = undefined;
    for (const s of this.sessions) s.destroy();
    await quic.stop({ isApp: true, errorCode: 0x100, force: true }).catch(() => {});
    quic.removeEventListener(events.EventQUICServerConnection.name, this.onConnection);
    this.timers.clearAll();
  }

  /**
   * New certificate chain and key (and client CAs, on a server made with `clientCa`) for
   * connections accepted from now on (certificate reload); established connections keep the
   * identity they negotiated.
   */
  setCertificate(cert: string | Uint8Array, key: string | Uint8Array, clientCa?: string): void {
    const text = (v: string | Uint8Array): string => (typeof v === 'string' ? v : Buffer.from(v).toString('utf8'));
    this.identity = { cert: text(cert), key: text(key), ...(clientCa === undefined || this.options.clientCa === undefined ? {} : { ca: clientCa }) };
    this.quic?.updateConfig(this.identity);
  }

  /**
   * Whether connections accepted from now on take 0-RTT early data (and are sent tickets that
   * allow it); established connections keep what they negotiated.
   */
  setEarlyData(enabled: boolean): void {
    this.earlyData = enabled;
    this.quic?.updateConfig({ enableEarlyData: enabled });
  }

  /** The idle timeout (max_idle_timeout) of connections accepted from now on, ms; established ones keep theirs. */
  setIdleTimeout(ms: number): void {
    checkRange('maxIdleTimeoutMs', ms, 100, 600000);
    this.idleTimeoutMs = ms;
    this.quic?.updateConfig({ maxIdleTimeout: ms });
  }

  /** Counters for leak checks and metrics. */
  stats(): Http3ServerStats {
    let requestStreams = 0;
    let uniStreams = 0;
    for (const s of this.sessions) {
      requestStreams += s.activeStreams;
      uniStreams += s.uniStreams;
    }
    const transport = this.quic !== undefined ? transportCounts(this.quic) : { connections: 0, streams: 0 };
    return {
      sessions: this.sessions.size,
      requestStreams,
      uniStreams,
      timers: this.timers.size,
      quicConnections: transport.connections,
      quicStreams: transport.streams,
      requests: this.requests,
    };
  }

  /**
   * The UDP socket's datagram counters (packets, drops by cause, queue bytes). After close the
   * last values stay readable (queue bytes then 0), so a caller summing servers stays monotonic.
   */
  ingressCounts(): IngressCounts {
    if (this.quic === undefined && this.closedIngress !== undefined) return { ...this.closedIngress };
    return ingressCounts(this.quic);
  }
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
