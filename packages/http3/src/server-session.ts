// The HTTP/3 server side of one QUIC connection (RFC 9114 §3-§6): accepts request streams and
// the peer's control/QPACK streams, opens ours, routes unblocked QPACK sections to their
// streams, maps connection errors to CONNECTION_CLOSE with the H3 code (RFC 9114 §8), and shuts
// down gracefully with GOAWAY and a drain period (RFC 9114 §5.2).

import { EventEmitter } from 'node:events';
import { events } from '@matrixai/quic';
import type { QUICConnection, QUICStream } from '@matrixai/quic';
import { ControlStreams } from './control-streams.ts';
import { H3Error } from './errors.ts';
import type { Http3ConnectionInfo } from './quic-adapter.ts';
import { closeConnection, closeInfoOf, connectionInfo } from './quic-adapter.ts';
import { ServerRequestStream } from './request-stream.ts';
import type { RequestStreamHost } from './request-stream.ts';
import type { Http3ServerRequest } from './server-request.ts';
import type { Http3ServerResponse } from './server-response.ts';
import { StreamIo } from './stream-io.ts';
import type { TimerSet } from './timer-set.ts';

/** Per-connection HTTP/3 settings of a server session. */
export interface ServerSessionOptions {
  /** SETTINGS_MAX_FIELD_SECTION_SIZE we advertise and enforce, bytes. */
  maxFieldSectionSize: number;
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY we advertise, bytes. */
  qpackMaxTableCapacity: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS we advertise. */
  qpackBlockedStreams: number;
  /** Let our QPACK encoder use the client's dynamic table. */
  qpackEncoderDynamicTable: boolean;
  /** Body bytes buffered per request or response before backpressure applies. */
  bodyHighWaterMark: number;
  /** Deadline for a complete request head on a new stream, ms. */
  requestHeadTimeoutMs: number;
}

/** How a session reports to its server. */
export interface ServerSessionHooks {
  onRequest(req: Http3ServerRequest, res: Http3ServerResponse, session: Http3ServerSession): void;
  onClose(session: Http3ServerSession): void;
  timers: TimerSet;
}

/** Why a session ended. */
export interface SessionCloseInfo {
  /** Who closed: us ('local'), the peer, or the idle timer. */
  by: 'local' | 'peer' | 'idle' | 'unknown';
  /** Application or transport code of the CONNECTION_CLOSE, when there was one. */
  code: number | undefined;
  /** True when `code` is an application (HTTP/3) code. */
  isApp: boolean;
}

/**
 * One HTTP/3 connection on the server. Emits 'protocolError' (err: H3Error) before closing the
 * connection for a peer's violation, and 'close' (info: SessionCloseInfo) when the connection
 * is gone and every stream was released.
 */
export class Http3ServerSession extends EventEmitter {
  /** Addresses, SNI, ALPN, connection IDs, resumption; fixed at the handshake. */
  readonly info: Http3ConnectionInfo;
  private readonly conn: QUICConnection;
  private readonly hooks: ServerSessionHooks;
  private readonly control: ControlStreams;
  private readonly streams = new Map<number, ServerRequestStream>();
  private nextStreamId = 0;
  private goawayId: number | undefined;
  private closing = false;
  private ended = false;
  private closeInfo: SessionCloseInfo = { by: 'unknown', code: undefined, isApp: false };
  private drainTimer: NodeJS.Timeout | undefined;
  private idleWaiters: Array<() => void> = [];
  private requests = 0;
  private readonly host: RequestStreamHost;

  constructor(conn: QUICConnection, options: ServerSessionOptions, hooks: ServerSessionHooks) {
    super();
    this.conn = conn;
    this.hooks = hooks;
    this.info = connectionInfo(conn);
    this.control = new ControlStreams({
      role: 'server',
      maxFieldSectionSize: options.maxFieldSectionSize,
      qpackMaxTableCapacity: options.qpackMaxTableCapacity,
      qpackBlockedStreams: options.qpackBlockedStreams,
      qpackEncoderDynamicTable: options.qpackEncoderDynamicTable,
      onConnectionError: (err) => this.destroy(err),
      onGoaway: () => {
        // RFC 9114 §5.2: a client's GOAWAY names push IDs; we never push, so there is nothing
        // to cancel. The client will close once its requests are done.
      },
      onUnblocked: (sections) => {
        for (const section of sections) this.streams.get(section.streamId)?.unblocked(section);
      },
    });
    this.host = {
      control: this.control,
      socket: this.info,
      maxFieldSectionSize: options.maxFieldSectionSize,
      bodyHighWaterMark: options.bodyHighWaterMark,
      requestHeadTimeoutMs: options.requestHeadTimeoutMs,
      timers: hooks.timers,
      onRequest: (req, res) => {
        try {
          this.hooks.onRequest(req, res, this);
        } catch (err) {
          // A throwing handler is an application bug; it costs this request, not the process.
          res.destroy(new H3Error('H3_INTERNAL_ERROR', 'request handler threw', { scope: 'stream', cause: err }));
          this.emit('handlerError', err);
        }
      },
      onConnectionError: (err) => this.destroy(err),
      onDone: (stream) => {
        this.streams.delete(stream.id);
        if (this.streams.size === 0) this.wakeIdleWaiters();
      },
    };
  }

  /** Request streams in progress. */
  get activeStreams(): number {
    return this.streams.size;
  }

  /** Peer unidirectional streams being read (control, QPACK). */
  get uniStreams(): number {
    return this.control.peerUniStreams;
  }

  /** Requests accepted on this connection so far. */
  get requestCount(): number {
    return this.requests;
  }

  /** True once GOAWAY was sent or the connection is closing. */
  get draining(): boolean {
    return this.goawayId !== undefined || this.closing;
  }

  /** True once the connection is gone. */
  get closed(): boolean {
    return this.ended;
  }

  /** Attaches to the connection and opens our control and QPACK streams. Call once. */
  start(): void {
    this.conn.addEventListener(events.EventQUICConnectionStream.name, this.onStreamEvent);
    this.conn.addEventListener(events.EventQUICConnectionError.name, this.onErrorEvent);
    this.conn.addEventListener(events.EventQUICConnectionStopped.name, this.onStoppedEvent, { once: true });
    this.control.open(this.conn);
  }

  private readonly onStreamEvent = (evt: Event): void => {
    const stream = (evt as events.EventQUICConnectionStream).detail;
    try {
      this.acceptStream(stream);
    } catch (err) {
      this.destroy(new H3Error('H3_INTERNAL_ERROR', 'failed to accept a stream', { cause: err }));
    }
  };

  private readonly onErrorEvent = (evt: Event): void => {
    const err = (evt as events.EventQUICConnectionError).detail;
    this.closing = true;
    this.control.markClosing();
    this.closeInfo = closeInfoOf(err);
  };

  private readonly onStoppedEvent = (): void => {
    this.closing = true;
    this.control.markClosing();
    this.conn.removeEventListener(events.EventQUICConnectionStream.name, this.onStreamEvent);
    this.conn.removeEventListener(events.EventQUICConnectionError.name, this.onErrorEvent);
    if (this.streams.size > 0) {
      // Built only when a request is still open: most connections end with none, and an error's
      // stack trace was a measurable part of a connection's teardown.
      const lost = new H3Error('EDGE_H3_CONNECTION_LOST', 'the connection closed');
      for (const stream of [...this.streams.values()]) stream.connectionLost(lost);
      this.streams.clear();
    }
    this.hooks.timers.clear(this.drainTimer);
    this.drainTimer = undefined;
    this.ended = true;
    this.wakeIdleWaiters();
    this.hooks.onClose(this);
    this.emit('close', this.closeInfo);
  };

  private acceptStream(stream: QUICStream): void {
    if (stream.initiated !== 'peer') return;
    if (stream.type === 'uni') {
      this.control.acceptUni(stream);
      return;
    }
    const io = new StreamIo(stream);
    const rs = new ServerRequestStream(io, this.host);
    if (this.closing || (this.goawayId !== undefined && io.id >= this.goawayId)) {
      rs.reject(); // RFC 9114 §5.2: requests at or above the GOAWAY ID are not processed
      return;
    }
    this.nextStreamId = Math.max(this.nextStreamId, io.id + 4);
    this.streams.set(io.id, rs);
    this.requests++;
    rs.start();
  }

  /**
   * Sends GOAWAY (RFC 9114 §5.2) naming the first request stream we will not process: requests
   * already received complete, later ones are rejected with H3_REQUEST_REJECTED (retryable).
   */
  goaway(): void {
    if (this.goawayId !== undefined || this.closing) return;
    this.goawayId = this.nextStreamId;
    this.control.sendGoaway(this.goawayId);
  }

  /**
   * Graceful close: GOAWAY, then wait up to `drainMs` for requests in progress, then close the
   * connection with H3_NO_ERROR. Resolves when the connection is gone.
   */
  async close(drainMs: number): Promise<void> {
    if (this.ended) return;
    this.goaway();
    if (this.streams.size > 0 && drainMs > 0) {
      await new Promise<void>((resolve) => {
        this.idleWaiters.push(resolve);
        this.hooks.timers.clear(this.drainTimer);
        this.drainTimer = this.hooks.timers.set(() => this.wakeIdleWaiters(), drainMs);
      });
    }
    await this.shutdown(new H3Error('H3_NO_ERROR', 'server closing'));
  }

  /**
   * Closes the connection now with `err`'s code (default H3_NO_ERROR); requests in progress are
   * aborted. A protocol error from the peer is emitted as 'protocolError' first.
   */
  destroy(err?: H3Error): void {
    if (err !== undefined && err.code !== 'H3_NO_ERROR' && !this.closing) this.emit('protocolError', err);
    void this.shutdown(err ?? new H3Error('H3_NO_ERROR', 'closed'));
  }

  private async shutdown(err: H3Error): Promise<void> {
    if (this.ended) return;
    if (!this.closing) {
      this.closing = true;
      this.control.markClosing();
      this.closeInfo = { by: 'local', code: err.wireCode, isApp: true };
    }
    await closeConnection(this.conn, err.wireCode, err.message);
  }

  private wakeIdleWaiters(): void {
    this.hooks.timers.clear(this.drainTimer);
    this.drainTimer = undefined;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }
}
