// An HTTP/3 client connection over `@matrixai/quic`'s QUICClient, with the same codecs as the
// server: many concurrent requests on one connection, opt-in resumption with a session ticket,
// GOAWAY handling (RFC 9114 §5.2), and raw streams for probes and robustness tests.

import { EventEmitter } from 'node:events';
import { isIPv6 } from 'node:net';
import { QUICClient, QUICSocket, events } from '@matrixai/quic';
import type { QUICConnection } from '@matrixai/quic';
import { ClientExchange } from './client-request.ts';
import type { ExchangeHost, Http3ClientResponse, RequestBody } from './client-request.ts';
import { ControlStreams } from './control-streams.ts';
import { H3Error } from './errors.ts';
import { appendOutgoing } from './header-object.ts';
import type { OutgoingHeaders } from './header-object.ts';
import type { Header } from './qpack/decoder.ts';
import { clientCrypto, closeConnection, closeInfoOf, codeToReason, connectionInfo, installTicketOnNextConnection, reasonToCode, sessionTicket, streamCredit, transportLogger } from './quic-adapter.ts';
import type { Http3ConnectionInfo, TransportLogRecord } from './quic-adapter.ts';
import { RawStream } from './raw-stream.ts';
import type { SessionCloseInfo } from './server-session.ts';
import { StreamIo } from './stream-io.ts';
import { TimerSet } from './timer-set.ts';

/** How often to look for new stream credit while none is left, ms. */
const CREDIT_POLL_MS = 2;

/** Options of {@link Http3ClientSession.connect}. */
export interface ClientConnectOptions {
  /** Server address or name. */
  host: string;
  port: number;
  /** TLS SNI and certificate name. Default: `host`. */
  serverName?: string;
  /** Trusted CA certificates, PEM. Default: the system store. */
  ca?: string | Uint8Array;
  /** Verify the server certificate. Default true. */
  verifyPeer?: boolean;
  /** Client certificate chain, PEM, for a server that asks for one (mutual TLS). Default none. */
  cert?: string;
  /** Private key of `cert`, PEM. */
  key?: string;
  /** Local address to bind. Default '0.0.0.0' (or '::' for an IPv6 host). */
  localHost?: string;
  /** A ticket from a previous session's `ticket()`, to resume (RFC 8446 §2.2). Default none. */
  sessionTicket?: Uint8Array;
  /** Handshake deadline, ms. Default 10000. */
  handshakeTimeoutMs?: number;
  /** Idle timeout, ms. Default 30000. */
  maxIdleTimeoutMs?: number;
  /** Send a QUIC PING this often to keep an idle connection alive, ms. Default none. */
  keepAliveIntervalMs?: number;
  /** Requests in flight at once; more wait in order. Default 100. */
  maxConcurrentRequests?: number;
  /** SETTINGS_MAX_FIELD_SECTION_SIZE we advertise, bytes. Default 65536. */
  maxFieldSectionSize?: number;
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY we advertise, bytes. Default 4096. */
  qpackMaxTableCapacity?: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS we advertise. Default 16. */
  qpackBlockedStreams?: number;
  /** Let our encoder use the server's dynamic table. Default false. */
  qpackEncoderDynamicTable?: boolean;
  /** Bytes read from QUIC per stream read. Default 16384. */
  readChunkSize?: number;
  /** Receives the QUIC library's warnings and errors. Default: dropped. */
  onTransportLog?: (record: TransportLogRecord) => void;
  /**
   * Do not open our control and QPACK streams: the caller opens raw ones (robustness tests that
   * must send a control stream without SETTINGS, or drive the QPACK encoder stream themselves).
   * The server's QPACK decoder-stream instructions are then not applied. Default false.
   */
  manualControlStreams?: boolean;
}

/** One request. */
export interface ClientRequestOptions {
  /** Default 'GET'. */
  method?: string;
  /** :path. Default '/'. */
  path?: string;
  /** :authority. Default `serverName:port`. */
  authority?: string;
  /** :scheme. Default 'https'. */
  scheme?: string;
  /**
   * :protocol of an extended CONNECT (RFC 9220, RFC 8441 §4); default none. A `CONNECT` without
   * it is a plain CONNECT, sent with :method and :authority only (RFC 9114 §4.4).
   */
  protocol?: string;
  /** Regular header fields (names are lowercased). */
  headers?: OutgoingHeaders;
  /** Request body. Default none (the stream ends after HEADERS). */
  body?: RequestBody;
  /** Trailer fields sent after the body. */
  trailers?: OutgoingHeaders;
  /** Deadline for the response head, ms. Default 30000. */
  timeoutMs?: number;
}

/**
 * The client side of an HTTP/3 connection. Emits 'goaway' (id) and 'close' (SessionCloseInfo).
 */
export class Http3ClientSession extends EventEmitter {
  /** Connection facts (SNI is ours; `resumed` tells whether the ticket was accepted). */
  readonly info: Http3ConnectionInfo;
  private readonly client: QUICClient;
  private readonly socket: QUICSocket;
  private readonly conn: QUICConnection;
  private readonly control: ControlStreams;
  private readonly defaultAuthority: string;
  private readonly maxConcurrent: number;
  private readonly exchanges = new Map<number, ClientExchange>();
  private readonly queue: Array<() => void> = [];
  private idleWaiters: Array<() => void> = [];
  private readonly creditWaiters = new Set<() => void>();
  private readonly timers = new TimerSet();
  private readonly host: ExchangeHost;
  private goawayId: number | undefined;
  private closing = false;
  private ended = false;
  private closeInfo: SessionCloseInfo = { by: 'unknown', code: undefined, isApp: false };
  private readonly closedP: Promise<void>;
  private resolveClosed!: () => void;

  private constructor(client: QUICClient, socket: QUICSocket, o: ClientConnectOptions) {
    super();
    this.client = client;
    this.socket = socket;
    this.conn = client.connection;
    this.info = connectionInfo(this.conn);
    this.defaultAuthority = `${o.serverName ?? o.host}:${o.port}`;
    this.maxConcurrent = o.maxConcurrentRequests ?? 100;
    this.closedP = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
    this.control = new ControlStreams({
      role: 'client',
      maxFieldSectionSize: o.maxFieldSectionSize ?? 65536,
      qpackMaxTableCapacity: o.qpackMaxTableCapacity ?? 4096,
      qpackBlockedStreams: o.qpackBlockedStreams ?? 16,
      qpackEncoderDynamicTable: o.qpackEncoderDynamicTable ?? false,
      externalEncoder: o.manualControlStreams === true,
      onConnectionError: (err) => this.destroy(err),
      onGoaway: (id) => {
        this.goawayId = id;
        this.emit('goaway', id);
      },
      onUnblocked: (sections) => {
        for (const s of sections) this.exchanges.get(s.streamId)?.unblocked(s);
      },
    });
    this.host = {
      control: this.control,
      onConnectionError: (err) => this.destroy(err),
      onDone: (ex) => {
        this.exchanges.delete(ex.id);
        for (const wake of [...this.creditWaiters]) wake();
        this.queue.shift()?.();
        if (this.exchanges.size === 0) this.wakeIdle();
      },
    };
  }

  /** Connects, completes the handshake and opens the control and QPACK streams. */
  static async connect(o: ClientConnectOptions): Promise<Http3ClientSession> {
    const logger = transportLogger('h3-client', o.onTransportLog);
    const socket = new QUICSocket({ logger: logger.getChild('socket') });
    await socket.start({ host: o.localHost ?? (isIPv6(o.host) ? '::' : '0.0.0.0'), port: 0 });
    if (o.sessionTicket !== undefined) installTicketOnNextConnection(socket, o.sessionTicket);
    let client: QUICClient;
    try {
      client = await QUICClient.createQUICClient(
        {
          host: o.host,
          port: o.port,
          serverName: o.serverName ?? o.host,
          socket,
          crypto: clientCrypto,
          config: {
            applicationProtos: ['h3'],
            verifyPeer: o.verifyPeer ?? true,
            ...(o.ca !== undefined ? { ca: typeof o.ca === 'string' ? o.ca : Buffer.from(o.ca).toString('utf8') } : {}),
            ...(o.cert !== undefined && o.key !== undefined ? { cert: o.cert, key: o.key } : {}),
            maxIdleTimeout: o.maxIdleTimeoutMs ?? 30000,
            ...(o.keepAliveIntervalMs !== undefined ? { keepAliveIntervalTime: o.keepAliveIntervalMs } : {}),
            // RFC 9114 §6.1: a server never opens bidirectional streams.
            initialMaxStreamsBidi: 0,
            initialMaxStreamsUni: 8,
            readableChunkSize: o.readChunkSize ?? 16384,
          },
          reasonToCode,
          codeToReason,
          logger,
        },
        { timer: o.handshakeTimeoutMs ?? 10000 },
      );
    } catch (err) {
      await socket.stop({ force: true }).catch(() => {});
      throw new H3Error('EDGE_H3_CONNECTION_LOST', `connecting to ${o.host}:${o.port} failed`, { cause: err });
    }
    const session = new Http3ClientSession(client, socket, o);
    session.start(o.manualControlStreams !== true);
    return session;
  }

  private start(openControl: boolean): void {
    this.conn.addEventListener(events.EventQUICConnectionStream.name, this.onStreamEvent);
    this.conn.addEventListener(events.EventQUICConnectionError.name, this.onErrorEvent);
    this.conn.addEventListener(events.EventQUICConnectionStopped.name, this.onStoppedEvent, { once: true });
    if (openControl) this.control.open(this.conn);
  }

  private readonly onStreamEvent = (evt: Event): void => {
    const stream = (evt as events.EventQUICConnectionStream).detail;
    if (stream.initiated !== 'peer') return;
    if (stream.type === 'uni') this.control.acceptUni(stream);
    // Peer bidirectional streams cannot exist: we allow none (initialMaxStreamsBidi 0).
  };

  private readonly onErrorEvent = (evt: Event): void => {
    const err = (evt as events.EventQUICConnectionError).detail;
    this.closing = true;
    this.control.markClosing();
    if (this.closeInfo.by === 'unknown') this.closeInfo = closeInfoOf(err);
  };

  private readonly onStoppedEvent = (): void => {
    this.closing = true;
    this.control.markClosing();
    const info = this.closeInfo;
    const detail = info.code === undefined ? info.by : `${info.by}, ${info.isApp ? 'application' : 'transport'} code 0x${info.code.toString(16)}`;
    const lost = new H3Error('EDGE_H3_CONNECTION_LOST', `the connection closed (${detail})`);
    for (const ex of [...this.exchanges.values()]) ex.abort(lost, false);
    this.exchanges.clear();
    for (const waiter of this.queue.splice(0)) waiter();
    for (const wake of [...this.creditWaiters]) wake();
    this.wakeIdle();
    this.timers.clearAll();
    this.ended = true;
    void this.socket.stop({ force: true }).catch(() => {}).finally(() => {
      this.resolveClosed();
      this.emit('close', info);
    });
  };

  /** True once the server sent GOAWAY or the connection is closing. */
  get draining(): boolean {
    return this.goawayId !== undefined || this.closing;
  }

  /** How the connection ended, once it has. */
  get closeReason(): SessionCloseInfo {
    return this.closeInfo;
  }

  /** Requests in flight. */
  get activeRequests(): number {
    return this.exchanges.size;
  }

  /** The server's SETTINGS once received (RFC defaults before). */
  get peerSettings(): ControlStreams['peerSettings'] {
    return this.control.peerSettings;
  }

  /** QPACK dynamic-table use on this connection: entries we inserted and entries the server inserted. */
  get qpackInserts(): { sent: number; received: number } {
    return { sent: this.control.encoder.insertCount, received: this.control.decoder.insertCount };
  }

  /** The current TLS session ticket, for `sessionTicket` of a later connect(); undefined until the server sent one. */
  ticket(): Uint8Array | undefined {
    return sessionTicket(this.conn);
  }

  /**
   * Sends a request and resolves with the response head once it arrives; the body streams in
   * `response.body`. Rejects with an H3Error: the server's reset code (e.g. H3_MESSAGE_ERROR,
   * H3_REQUEST_REJECTED), EDGE_H3_TIMEOUT, EDGE_H3_GOAWAY or EDGE_H3_CONNECTION_LOST.
   */
  async request(options: ClientRequestOptions = {}): Promise<Http3ClientResponse> {
    const method = options.method ?? 'GET';
    const authority = options.authority ?? this.defaultAuthority;
    const head: Header[] =
      method === 'CONNECT' && options.protocol === undefined
        ? [
            [':method', method],
            [':authority', authority],
          ]
        : [[':method', method], ...(options.protocol === undefined ? [] : ([[':protocol', options.protocol]] as Header[])), [':scheme', options.scheme ?? 'https'], [':authority', authority], [':path', options.path ?? '/']];
    appendOutgoing(head, options.headers);
    const trailers = options.trailers === undefined ? undefined : appendOutgoing([], options.trailers);
    await this.slot();
    const ex = await this.openExchange(method);
    const timeoutMs = options.timeoutMs ?? 30000;
    const timer = this.timers.set(() => ex.abort(new H3Error('EDGE_H3_TIMEOUT', `no response within ${timeoutMs} ms`, { scope: 'stream' })), timeoutMs);
    ex.start(head, options.body, trailers);
    try {
      return await ex.response;
    } finally {
      this.timers.clear(timer);
    }
  }

  /** Convenience: a request whose body is read whole; returns status, headers, body and trailers. */
  async fetch(options: ClientRequestOptions = {}): Promise<{ status: number; headers: Http3ClientResponse['headers']; body: Buffer; trailers: Http3ClientResponse['trailers']; informational: Http3ClientResponse['informational'] }> {
    const res = await this.request(options);
    const body = await res.bytes();
    return { status: res.status, headers: res.headers, body, trailers: res.trailers, informational: res.informational };
  }

  // Waits for a free request slot (bounded concurrency, FIFO).
  private async slot(): Promise<void> {
    this.assertOpen();
    while (this.exchanges.size >= this.maxConcurrent) {
      await new Promise<void>((resolve) => this.queue.push(resolve));
      this.assertOpen();
    }
  }

  private assertOpen(): void {
    if (this.ended || this.closing) throw new H3Error('EDGE_H3_CONNECTION_LOST', 'the connection is closed');
    if (this.goawayId !== undefined) throw new H3Error('EDGE_H3_GOAWAY', 'the server sent GOAWAY; open a new connection');
  }

  private async openExchange(method: string): Promise<ClientExchange> {
    const io = await this.openStream('bidi');
    const ex = new ClientExchange(io, this.host, method);
    this.exchanges.set(ex.id, ex);
    return ex;
  }

  // RFC 9000 §4.6: the server grants stream IDs with MAX_STREAMS as earlier streams finish. The
  // library reports no event when credit arrives, so wait for one of ours to finish or poll
  // briefly; the caller's deadline bounds the wait.
  private async openStream(kind: 'bidi' | 'uni'): Promise<StreamIo> {
    for (;;) {
      this.assertOpen();
      if (streamCredit(this.conn, kind) > 0) break;
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.timers.clear(timer);
          this.creditWaiters.delete(wake);
          resolve();
        };
        const timer = this.timers.set(wake, CREDIT_POLL_MS);
        this.creditWaiters.add(wake);
      });
    }
    try {
      return new StreamIo(this.conn.newStream(kind));
    } catch (err) {
      throw new H3Error('EDGE_H3_CONNECTION_LOST', 'cannot open a stream', { cause: err });
    }
  }

  /**
   * Opens a stream and gives raw access to its bytes, bypassing HTTP/3 framing: for probes and
   * robustness tests that must send what a correct client never would. Waits for stream credit.
   */
  async openRawStream(kind: 'bidi' | 'uni'): Promise<RawStream> {
    return new RawStream(await this.openStream(kind));
  }

  /**
   * Closes the connection: waits for requests in flight (each bounded by its timeout) unless
   * `force`, then sends CONNECTION_CLOSE with H3_NO_ERROR. Resolves when everything is released.
   */
  async close(force = false): Promise<void> {
    if (!force) {
      while (this.exchanges.size > 0 && !this.ended) await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
    await this.shutdown(new H3Error('H3_NO_ERROR', 'client closing'));
  }

  private wakeIdle(): void {
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  /** Closes the connection now with `err`'s code (default H3_NO_ERROR). */
  destroy(err?: H3Error): void {
    void this.shutdown(err ?? new H3Error('H3_NO_ERROR', 'closed'));
  }

  private async shutdown(err: H3Error): Promise<void> {
    if (!this.ended && !this.closing) {
      this.closing = true;
      this.control.markClosing();
      this.closeInfo = { by: 'local', code: err.wireCode, isApp: true };
      await closeConnection(this.conn, err.wireCode, err.message);
      await this.client.destroy({ isApp: true, errorCode: err.wireCode, force: true }).catch(() => {});
    }
    await this.closedP;
  }
}
