// The seam between our HTTP/3 layer and `@matrixai/quic`: crypto callbacks, a quiet logger,
// mapping stream errors to and from H3 wire codes, and connection facts the library keeps on its
// internal native connection (SNI, resumption). Every reach into library internals is in this
// file, behind narrow types, so a library upgrade has one place to check.

import { createHmac, createSecretKey, randomFillSync, timingSafeEqual } from 'node:crypto';
import Logger, { Handler, LogLevel } from '@matrixai/logger';
import type { LogRecord } from '@matrixai/logger';
import type { QUICConnection, QUICServer, QUICSocket, QUICStream } from '@matrixai/quic';
import { H3Error, errorCodeFromWire, isH3Error } from './errors.ts';
import type { SessionCloseInfo } from './server-session.ts';

/** The server-side crypto the library needs: HMAC for connection IDs and Retry tokens. */
export interface ServerCrypto {
  key: ArrayBuffer;
  ops: {
    sign(key: ArrayBuffer, data: ArrayBuffer): Promise<ArrayBuffer>;
    verify(key: ArrayBuffer, data: ArrayBuffer, sig: ArrayBuffer): Promise<boolean>;
  };
}

/** The client-side crypto the library needs: random connection IDs. */
export interface ClientCrypto {
  ops: { randomBytes(data: ArrayBuffer): Promise<void> };
}

/**
 * HMAC-SHA256 over `key`. The library derives server connection IDs and signs Retry tokens
 * with it, so every worker behind one port must share the key (sticky-CID routing and Retry
 * validation across processes depend on it).
 */
export function serverCrypto(key: Uint8Array): ServerCrypto {
  const keyBuffer = toArrayBuffer(key);
  // The library passes back the key it was given, once or twice per new connection: the key
  // object is prepared once (a raw key makes createHmac build one per call).
  const keyObject = createSecretKey(Buffer.from(keyBuffer));
  const mac = (k: ArrayBuffer, data: ArrayBuffer): Buffer => createHmac('sha256', k === keyBuffer ? keyObject : Buffer.from(k)).update(Buffer.from(data)).digest();
  return {
    key: keyBuffer,
    ops: {
      sign: async (k, data) => toArrayBuffer(mac(k, data)),
      verify: async (k, data, sig) => {
        const expected = mac(k, data);
        const given = Buffer.from(sig);
        return given.length === expected.length && timingSafeEqual(given, expected);
      },
    },
  };
}

/** Random bytes for client connection IDs. */
export const clientCrypto: ClientCrypto = {
  ops: {
    randomBytes: async (data) => {
      randomFillSync(new Uint8Array(data));
    },
  },
};

function toArrayBuffer(bytes: Uint8Array): ArrayBuffer {
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return copy.buffer;
}

/** A library log record forwarded to the application. */
export interface TransportLogRecord {
  level: 'warn' | 'error';
  message: string;
}

/**
 * A logger for the library at WARN: it logs at INFO for every stream it creates, which costs
 * more than the request itself. Records go to `sink` (default: dropped).
 */
export function transportLogger(name: string, sink?: (record: TransportLogRecord) => void): Logger {
  return new Logger(name, LogLevel.WARN, [new SinkHandler(sink)]);
}

class SinkHandler extends Handler {
  private readonly sink: ((record: TransportLogRecord) => void) | undefined;

  constructor(sink: ((record: TransportLogRecord) => void) | undefined) {
    super();
    this.sink = sink;
  }

  override handle(record: LogRecord): void {
    this.sink?.({ level: record.level >= LogLevel.ERROR ? 'error' : 'warn', message: `${record.keys}: ${record.msg ?? ''}` });
  }

  emit(_output: string): void {}
}

/**
 * Maps the reason a stream is cancelled or aborted locally to the code the library puts in
 * STOP_SENDING / RESET_STREAM. Our own H3Errors carry their wire code; the library passes its
 * "connection stopping" error class when it turns away a stream, which RFC 9114 §4.1.1 calls a
 * rejected request; anything else is a cancellation (RFC 9114 §4.1.1: H3_REQUEST_CANCELLED).
 */
export function reasonToCode(_type: 'read' | 'write', reason?: unknown): number {
  if (isH3Error(reason) && typeof (reason as H3Error).wireCode === 'number') return (reason as H3Error).wireCode;
  if (typeof reason === 'function' && reason.name === 'ErrorQUICConnectionStopping') return 0x10b;
  return 0x10c;
}

/** An H3Error raised because the peer reset or stopped a stream; `peerCode` is the raw wire code. */
export interface PeerStreamError extends H3Error {
  readonly peerCode: number;
}

/**
 * Maps a peer's RESET_STREAM / STOP_SENDING code to the error our reads and writes fail with.
 * RFC 9114 §9: unknown codes are treated as H3_NO_ERROR.
 */
export function codeToReason(type: 'read' | 'write', code: number): PeerStreamError {
  const known = errorCodeFromWire(code) ?? 'H3_NO_ERROR';
  const what = type === 'read' ? 'reset the stream (RESET_STREAM)' : 'stopped reading the stream (STOP_SENDING)';
  const err = new H3Error(known, `the peer ${what} with code 0x${code.toString(16)}`, { scope: 'stream' });
  return Object.assign(err, { peerCode: code });
}

/** The peer's code when `err` came from codeToReason, else undefined. */
export function peerCodeOf(err: unknown): number | undefined {
  const code = (err as { peerCode?: unknown } | null)?.peerCode;
  return typeof code === 'number' ? code : undefined;
}

/** What we use of quiche's native connection object (`QUICConnection.conn`, internal to the library). */
interface NativeConnection {
  serverName(): string | null;
  isResumed(): boolean;
  isInEarlyData(): boolean;
  applicationProto(): Uint8Array;
  session(): Uint8Array | null;
  setSession(session: Uint8Array): void;
  isEstablished(): boolean;
  peerStreamsLeftBidi(): number;
  peerStreamsLeftUni(): number;
  close(app: boolean, err: number, reason: Uint8Array): void | null;
}

function native(conn: QUICConnection): NativeConnection {
  return (conn as unknown as { conn: NativeConnection }).conn;
}

/**
 * What is known about one QUIC connection once it is established: addresses, TLS facts and
 * connection IDs. Shaped like the `socket` of Node's http/http2 requests (remoteAddress,
 * remotePort, encrypted, alpnProtocol, servername) plus the QUIC-specific facts.
 */
export interface Http3ConnectionInfo {
  /** The peer's address (as the library reports it: IPv4 or IPv6 text). */
  readonly remoteAddress: string;
  readonly remotePort: number;
  readonly localAddress: string;
  readonly localPort: number;
  /** Always true: QUIC is always encrypted. */
  readonly encrypted: true;
  /** Negotiated ALPN, 'h3'. */
  readonly alpnProtocol: string;
  /** TLS SNI the client sent, or '' when none (also as `servername`, Node's TLS spelling). */
  readonly serverName: string;
  readonly servername: string;
  /** Our connection ID (hex): what the client addresses packets to, the sticky-CID routing key. */
  readonly connectionId: string;
  /** The peer's connection ID (hex). */
  readonly peerConnectionId: string;
  /** The handshake resumed a session from a ticket (RFC 8446 §2.2). */
  readonly resumed: boolean;
  /** The connection was still in 0-RTT when it was handed to us (RFC 9001 §4.6.1). */
  readonly earlyData: boolean;
}

/** Reads the facts of an established connection; never throws. */
export function connectionInfo(conn: QUICConnection): Http3ConnectionInfo {
  const n = native(conn);
  const safe = <T>(f: () => T, fallback: T): T => {
    try {
      return f();
    } catch {
      return fallback;
    }
  };
  const serverName = safe(() => n.serverName() ?? '', '');
  return Object.freeze({
    remoteAddress: safe(() => String(conn.remoteHost), ''),
    remotePort: safe(() => Number(conn.remotePort), 0),
    localAddress: safe(() => String(conn.localHost), ''),
    localPort: safe(() => Number(conn.localPort), 0),
    encrypted: true as const,
    alpnProtocol: safe(() => Buffer.from(n.applicationProto()).toString('latin1'), ''),
    serverName,
    servername: serverName,
    connectionId: safe(() => conn.connectionId.toString(), ''),
    peerConnectionId: safe(() => conn.connectionIdPeer.toString(), ''),
    resumed: safe(() => n.isResumed(), false),
    earlyData: safe(() => n.isInEarlyData(), false),
  });
}

/** The client's current TLS session (ticket) for resumption, or undefined before one arrived. */
export function sessionTicket(conn: QUICConnection): Uint8Array | undefined {
  try {
    const s = native(conn).session();
    return s === null || s.length === 0 ? undefined : new Uint8Array(s);
  } catch {
    return undefined;
  }
}

/**
 * Arranges for `ticket` to be installed on the next client connection created on `socket`,
 * before its first flight. The library builds and starts the connection inside
 * `createQUICClient` with no hook in between; it registers the connection in the socket's map
 * just before starting it, so we hook that one call on a socket we own.
 */
export function installTicketOnNextConnection(socket: QUICSocket, ticket: Uint8Array): void {
  const map = (socket as unknown as { connectionMap: { set(id: unknown, conn: QUICConnection): unknown } }).connectionMap;
  const original = map.set.bind(map);
  map.set = (id: unknown, conn: QUICConnection) => {
    map.set = original;
    try {
      native(conn).setSession(ticket);
    } catch {
      // A stale or foreign ticket: quiche rejects it and the handshake is simply a full one.
    }
    return original(id, conn);
  };
}

/**
 * Sends what the streams of `conn` queued in this event-loop turn. The patched library coalesces
 * sends into one pass per turn (docs/decisions.md, "Performance patches"); data queued before a
 * native close would otherwise never leave, since a closing connection sends only
 * CONNECTION_CLOSE. `send()` is internal to the library (not in its typings).
 */
async function flushQueued(conn: QUICConnection): Promise<void> {
  try {
    await (conn as unknown as { send(): Promise<void> }).send();
  } catch {
    // Not running any more: nothing can be sent, and stop() below still releases everything.
  }
}

/**
 * Closes `conn` with an application (HTTP/3) error code and releases it. The library's own
 * stop() first resets every stream, one packet each, and only then sends CONNECTION_CLOSE: a
 * peer would see its control stream reset and report H3_CLOSED_CRITICAL_STREAM. Closing the
 * native connection first puts quiche in the closing state, where only CONNECTION_CLOSE is sent
 * (RFC 9000 §10.2.1), then stop() releases the streams quietly.
 */
export async function closeConnection(conn: QUICConnection, code: number, reason: string): Promise<void> {
  const why = Buffer.from(reason.slice(0, 100));
  await flushQueued(conn);
  try {
    native(conn).close(true, code, why);
  } catch {
    // Already closing or closed: stop() below still releases everything.
  }
  await conn.stop({ isApp: true, errorCode: code, reason: why, force: true }).catch(() => {});
}

/**
 * Streams of `kind` the peer still lets us open (RFC 9000 §4.6: MAX_STREAMS credit);
 * 0 when unknown.
 */
export function streamCredit(conn: QUICConnection, kind: 'bidi' | 'uni'): number {
  try {
    return kind === 'bidi' ? native(conn).peerStreamsLeftBidi() : native(conn).peerStreamsLeftUni();
  } catch {
    return 0;
  }
}

/** Library-internal counts, for leak checks after clients are gone. */
export interface TransportCounts {
  /** Connections in the socket's connection map (handshaking, running or draining). */
  connections: number;
  /** QUIC streams the library still tracks, over all connections. */
  streams: number;
}

/** Counts what the library still holds for `server`. */
export function transportCounts(server: QUICServer): TransportCounts {
  const socket = (server as unknown as { socket?: { connectionMap?: { serverConnections: ReadonlyMap<string, QUICConnection>; size: number } } }).socket;
  const map = socket?.connectionMap;
  if (map === undefined) return { connections: 0, streams: 0 };
  let streams = 0;
  for (const conn of map.serverConnections.values()) streams += streamCount(conn);
  return { connections: map.serverConnections.size, streams };
}

/**
 * Datagram counters of a server's UDP socket (our patch to the library's QUICSocket counts them as
 * plain numbers; see docs/decisions.md). Monotonic for the socket's lifetime, except `queueBytes`.
 */
export interface IngressCounts {
  /** Datagrams received. */
  packets: number;
  /** Datagrams whose QUIC header did not parse. */
  badHeader: number;
  /** Datagrams for no known connection that could not start one (not Initial, bad Retry token). */
  unroutable: number;
  /** Datagrams for new connections while the server drains (it no longer accepts). */
  drainingDrops: number;
  /** New connections whose handshake failed or timed out. */
  connectionCreateFailed: number;
  /** Datagrams in a QUIC version we do not speak, answered with Version Negotiation. */
  versionNegotiations: number;
  /** Datagrams dropped because the ingress queue was over its byte bound. */
  queueDrops: number;
  queueDropBytes: number;
  /** Bytes of datagrams received and still being processed (a gauge). */
  queueBytes: number;
}

const INGRESS_COUNT_KEYS = ['packets', 'badHeader', 'unroutable', 'drainingDrops', 'connectionCreateFailed', 'versionNegotiations', 'queueDrops', 'queueDropBytes', 'queueBytes'] as const satisfies readonly (keyof IngressCounts)[];

/** The socket of a QUIC server as our patch extends it. */
interface CountingSocket {
  ingressCounts?: IngressCounts;
  ingressQueueLimitBytes?: number;
}

function countingSocket(server: QUICServer | undefined): CountingSocket | undefined {
  return (server as unknown as { socket?: CountingSocket } | undefined)?.socket;
}

/** A copy of the socket's ingress counters (zeros without a server). */
export function ingressCounts(server: QUICServer | undefined): IngressCounts {
  const c = countingSocket(server)?.ingressCounts;
  const out = {} as IngressCounts;
  for (const k of INGRESS_COUNT_KEYS) out[k] = c?.[k] ?? 0;
  return out;
}

/** Sets the byte bound of the socket's ingress queue. */
export function setIngressQueueLimit(server: QUICServer, bytes: number): void {
  const socket = countingSocket(server);
  if (socket?.ingressCounts === undefined) throw new Error('@matrixai/quic is not patched: run `npm ci` (patch-package) to apply patches/');
  socket.ingressQueueLimitBytes = bytes;
}

/** QUIC streams the library tracks on one connection. */
export function streamCount(conn: QUICConnection): number {
  return (conn as unknown as { streamMap?: Map<number, QUICStream> }).streamMap?.size ?? 0;
}

/**
 * Who closed a connection and with which code, from the library's connection error (its class
 * names tell idle timeout, peer close and local close apart; `data` carries the CONNECTION_CLOSE).
 */
export function closeInfoOf(err: unknown): SessionCloseInfo {
  const data = (err as { data?: { isApp?: boolean; errorCode?: number } }).data;
  const name = (err as { constructor?: { name?: string } })?.constructor?.name ?? '';
  const by = name === 'ErrorQUICConnectionIdleTimeout' ? 'idle' : name.startsWith('ErrorQUICConnectionPeer') ? 'peer' : name.startsWith('ErrorQUICConnectionLocal') ? 'local' : 'unknown';
  return { by, code: data?.errorCode, isApp: data?.isApp === true };
}
