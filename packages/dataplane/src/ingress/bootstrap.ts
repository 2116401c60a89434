// The TLS bootstrap ingress of a listener: HTTP/2 and HTTP/1.1 over TLS (ALPN) on the listener's
// TCP port, bound with SO_REUSEPORT so every worker accepts. Every response advertises
// `Alt-Svc: h3=":<port>"` so browsers move to the QUIC ingress. Requests go through the same
// handler, router and balancing as the QUIC path, on the runtime active at admission.
import http2 from 'node:http2';
import { ServerResponse } from 'node:http';
import type { IncomingMessage, OutgoingHttpHeader, OutgoingHttpHeaders } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { once } from 'node:events';
import type { EventEmitter } from 'node:events';
import type { ListenOptions, Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { ListenerMaterial, NormalizedListener } from '@edge-proxy/config';
import type { Metrics } from '@edge-proxy/telemetry';
import { ListenerContexts } from './tls-contexts.ts';
import { acceptsUpgrade, declinedUpgrade, proxyUpgrade } from './upgrade.ts';
import { sourceKey } from './admission.ts';
import type { ConnectionAdmission } from './admission.ts';
import { ConnectionDeadlines } from './connection-deadlines.ts';
import type { DownstreamTimeouts } from './connection-deadlines.ts';
import { clientErrorReply, closeAfterClientError } from './client-error.ts';
import { refusalReason } from './refusal-log.ts';
import type { RefusalLog } from './refusal-log.ts';
import { normalizeHost } from '../routing/router.ts';
import { headerBytes, hostFieldCount, serveRequest, unmapIpv4 } from '../proxy/handler.ts';
import type { DownstreamRequest, RuntimeSource } from '../proxy/handler.ts';
import type { DownstreamResponse } from '../proxy/forward.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { Runtime } from '../runtime/provision.ts';

export interface BootstrapOptions {
  readonly listener: NormalizedListener;
  readonly material: ListenerMaterial;
  readonly runtimes: RuntimeSource;
  readonly metrics: Metrics;
  /** Connection caps and rate shared by the worker's ingresses; none: unlimited. */
  readonly admission?: ConnectionAdmission;
  /** Summarizes refused and cut connections in the log; none: metrics only. */
  readonly refusals?: RefusalLog;
  /** The connection timeouts of the active generation, read for each new connection (live). */
  readonly timeouts: () => DownstreamTimeouts;
  /** Port to bind instead of the configured one (tests bind 0). */
  readonly bindPort?: number;
  /** SO_REUSEPORT (`performance.reuseport`); default true. */
  readonly reusePort?: boolean;
}

/**
 * An HTTP/1.1 response that adds Alt-Svc to the header object `writeHead` is given (and takes
 * ownership of it, as `H2StreamResponse` does). A `setHeader` before `writeHead` would send node's
 * `writeHead` down its slow path: every other header set and validated one at a time, with an
 * array allocated for each. Node's implicit headers (`write` without `writeHead`) come through
 * here too.
 */
export class Http1Response extends ServerResponse {
  /** The Alt-Svc value for this response, or undefined not to advertise HTTP/3. */
  altSvc: string | undefined;

  /** `100 Continue`, never to an HTTP/1.0 client (RFC 9110 §15.2.1), nor after the response began. */
  override writeContinue(cb?: () => void): void {
    if (this.req.httpVersionMinor === 0 || this.headersSent) return;
    super.writeContinue(cb);
  }

  override writeHead(statusCode: number, reasonOrHeaders?: string | OutgoingHttpHeaders | OutgoingHttpHeader[], headers?: OutgoingHttpHeaders | OutgoingHttpHeader[]): this {
    // A response before the request body is complete (answered here, or early by the backend):
    // close the connection after it. Keeping it alive made node read and discard the rest of the
    // body, and a client dribbling it held the connection until node's request timeout. A request
    // without a body has nothing left to read (node sets `complete` only after the 'request'
    // handler returns): its connection stays open, or every answer the proxy gives at once (a
    // shed 503, a 404) would cost the client a new TLS connection, under overload above all.
    if (!this.req.complete && hasRequestBody(this.req)) this.shouldKeepAlive = false;
    const alt = this.altSvc;
    if (alt === undefined) return typeof reasonOrHeaders === 'string' ? super.writeHead(statusCode, reasonOrHeaders, headers) : super.writeHead(statusCode, reasonOrHeaders);
    if (typeof reasonOrHeaders === 'string') return super.writeHead(statusCode, reasonOrHeaders, withAltSvc(headers, alt));
    return super.writeHead(statusCode, withAltSvc(reasonOrHeaders, alt));
  }
}

/**
 * An HTTP/1.1 request (plain, an Upgrade, or a CONNECT) as the request path takes it. `upgrade`:
 * node handed it over as an upgrade `acceptsUpgrade` took (a plain request's `Upgrade` and
 * `Connection` are hop-by-hop fields, dropped before forwarding).
 */
function http1Request(req: IncomingMessage, facts: ConnectionFacts, listener: string, upgrade: boolean): DownstreamRequest {
  const headers = req.headers as HeaderMap;
  const host = headers['host'] as string | undefined;
  return {
    method: req.method ?? 'GET',
    path: req.url ?? '/',
    authority: host,
    host,
    headers,
    headerCount: req.rawHeaders.length / 2,
    headerBytes: headerBytes(req.rawHeaders),
    remoteAddress: facts.remoteAddress,
    protocol: '1.1',
    ingress: 'bootstrap-h1',
    listener,
    earlyData: false,
    affinityKey: facts.affinityKey,
    upgrade,
    scheme: undefined,
    duplicateHost: hostFieldCount(req.rawHeaders) > 1,
    body: req,
    hasBody: hasRequestBody(req),
  };
}

/** Whether an HTTP/1.1 request announces a body (RFC 9112 §6.1, §6.2). */
function hasRequestBody(req: IncomingMessage): boolean {
  const h = req.headers;
  return h['transfer-encoding'] !== undefined || (h['content-length'] !== undefined && h['content-length'] !== '0');
}

function withAltSvc(headers: OutgoingHttpHeaders | OutgoingHttpHeader[] | undefined, alt: string): OutgoingHttpHeaders | OutgoingHttpHeader[] {
  if (headers === undefined) return { 'alt-svc': alt };
  if (Array.isArray(headers)) return [...headers, 'alt-svc', alt];
  headers['alt-svc'] = alt;
  return headers;
}

/**
 * A response on an HTTP/2 stream in the shape the handler writes, over Node's core stream API.
 * The compatibility layer (Http2ServerRequest/Response) builds two objects per request and
 * validates every response header twice (setHeader, then respond); this writes them once.
 * `writeHead` takes ownership of the headers object it is given (callers build a fresh one).
 */
class H2StreamResponse {
  private readonly stream: http2.ServerHttp2Stream;
  private readonly altSvc: string | undefined;
  private readonly deadlines: ConnectionDeadlines;
  private ended = false;

  /** `deadlines`: told of a header block refused for its size (431), which counts against the session. */
  constructor(stream: http2.ServerHttp2Stream, altSvc: string | undefined, deadlines: ConnectionDeadlines) {
    this.stream = stream;
    this.altSvc = altSvc;
    this.deadlines = deadlines;
  }

  get headersSent(): boolean {
    return this.stream.headersSent;
  }

  /** Destroyed, or closed by the peer (RST_STREAM): either way nothing more can be sent. */
  get destroyed(): boolean {
    return this.stream.destroyed || this.stream.closed;
  }

  /**
   * Whether we ended the response. Not the stream's `writableEnded`: node ends a stream's
   * writable side itself when the peer resets it, and the request path reads this flag to tell
   * "we finished" from "the client went away".
   */
  get writableEnded(): boolean {
    return this.ended;
  }

  writeHead(status: number, headers: HeaderMap = {}): this {
    // A stream the peer already reset cannot be answered ('close' tells the request path).
    if (this.destroyed) return this;
    const out = headers as http2.OutgoingHttpHeaders;
    // RFC 9113 §8.2.2: connection-specific fields are not HTTP/2 (node throws on them). The
    // handler's `Connection: close` (a 413, say) means "end this exchange", which a stream does.
    if (out['connection'] !== undefined) delete out['connection'];
    // A header block over the protocol policy's limits, which node's own field limits let through:
    // one more refused block of the session's (h2-refused-blocks.ts).
    if (status === 431) this.deadlines.headerBlockRefused(this.stream.session as http2.Http2Session);
    out[':status'] = status;
    if (this.altSvc !== undefined) out['alt-svc'] = this.altSvc;
    this.stream.respond(out);
    return this;
  }

  /** `100 Continue` as an interim HEADERS frame (RFC 9113 §8.1), before the response's own. */
  writeContinue(): void {
    if (!this.destroyed && !this.stream.headersSent) this.stream.additionalHeaders({ ':status': 100 });
  }

  write(chunk: Buffer | string): boolean {
    return this.stream.write(chunk);
  }

  end(chunk?: Buffer | string): this {
    this.ended = true;
    if (this.destroyed) return this;
    if (!this.stream.headersSent) this.writeHead(200);
    if (chunk === undefined) this.stream.end();
    else this.stream.end(chunk);
    return this;
  }

  destroy(err?: Error): void {
    this.stream.destroy(err);
  }

  on(event: 'close' | 'drain', fn: () => void): this {
    this.stream.on(event, fn);
    return this;
  }

  removeListener(event: 'close' | 'drain', fn: () => void): this {
    this.stream.removeListener(event, fn);
    return this;
  }
}

/**
 * A peer that resets a stream with an error code (RST_STREAM INTERNAL_ERROR...) makes node emit
 * 'error' on it; the stream is closed and 'close' tells the request path. Without a listener the
 * 'error' would be thrown and take the worker down.
 */
function ignoreStreamError(): void {}

/**
 * HTTP/2 session limits (docs/decisions.md "HTTP/2 abuse"). node advertises no
 * SETTINGS_MAX_CONCURRENT_STREAMS by default (unlimited): one session could run thousands of
 * streams, each with its buffers, and a peer that never opens its flow-control window held them
 * all. RFC 9113 §6.5.2 recommends no less than 100. Rapid reset (CVE-2023-44487): node answers
 * GOAWAY ENHANCE_YOUR_CALM past `streamResetBurst` resets refilled at `streamResetRate` per
 * second; its burst (1000) let every connection start a thousand proxied requests first.
 */
const H2_LIMITS = {
  settings: { maxConcurrentStreams: 100 },
  streamResetBurst: 200,
  streamResetRate: 33,
} as const;

/** What every request on one TLS connection shares, worked out on its first request. */
interface ConnectionFacts {
  /** Whether responses advertise HTTP/3 (see `BootstrapIngress.connectionFacts`). */
  readonly advertises: boolean;
  /** The peer address, IPv4-mapped IPv6 unmapped. */
  readonly remoteAddress: string;
  /** `address:port` of the connection (sticky-cid on this path). */
  readonly affinityKey: string;
}

const FACTS_BY_SOCKET = new WeakMap<object, ConnectionFacts>();

/** TLS alert reasons (SPEC label values) from a handshake error. */
export function handshakeFailureReason(err: unknown): string {
  const code = String((err as { code?: unknown })?.code ?? '');
  const message = String((err as { message?: unknown })?.message ?? '');
  if (/NO_APPLICATION_PROTOCOL|ALPN/i.test(code + message)) return 'alpn';
  if (/PEER_DID_NOT_RETURN_A_CERTIFICATE|CERTIFICATE_REQUIRED/i.test(code + message)) return 'missing_client_cert';
  if (/CERT.*EXPIRED/i.test(code + message)) return 'expired_client_cert';
  if (/UNKNOWN_CA|UNABLE_TO_GET_ISSUER|unknown issuer/i.test(code + message)) return 'unknown_issuer';
  if (/BAD_CERTIFICATE|CERTIFICATE_VERIFY_FAILED|certificate verify failed/i.test(code + message)) return 'invalid_client_cert';
  return 'handshake';
}

export class BootstrapIngress {
  private readonly server: http2.Http2SecureServer;
  private contexts: ListenerContexts;
  private readonly opts: BootstrapOptions;
  private altSvc: string;
  private readonly name: string;
  private readonly deadlines = new ConnectionDeadlines();

  constructor(opts: BootstrapOptions) {
    this.opts = opts;
    this.name = opts.listener.name;
    this.contexts = new ListenerContexts(opts.material);
    const clientAuth = opts.listener.tls.client_auth;
    this.altSvc = `h3=":${opts.listener.port}"; ma=${opts.listener.alt_svc_max_age_s}`;
    const m = opts.metrics;
    this.server = http2.createSecureServer(
      {
        allowHTTP1: true,
        // node:https sets TCP_NODELAY on accepted sockets, http2's secure server does not: without
        // it Nagle held back response segments (bench: 56 → 52 µs CPU/request, p99 lower).
        noDelay: true,
        Http1ServerResponse: Http1Response,
        // node:http's option, honoured with allowHTTP1 (not in the http2 typings): how often node
        // checks the HTTP/1.1 header and request timeouts (default 30 s), so a slowloris is cut
        // within a second of `client_header_ms`.
        ...({ connectionsCheckingInterval: 1000 } as object),
        ALPNProtocols: ['h2', 'http/1.1'],
        ...H2_LIMITS,
        cert: this.contexts.defaultIdentity.cert_pem,
        key: this.contexts.defaultIdentity.key_pem,
        requestCert: clientAuth !== undefined,
        rejectUnauthorized: clientAuth?.mode === 'required',
        ...(opts.material.client_ca === undefined ? {} : { ca: [...opts.material.client_ca.pems] }),
        SNICallback: (servername, cb) => {
          const { context, selection } = this.contexts.select(servername);
          m.counter('svc_downstream_tls_certificate_selection_total').inc({ listener: this.name, selection });
          cb(null, context);
        },
      },
      // HTTP/1.1 only: HTTP/2 streams are taken from the core API below.
      (req, res) => this.http1Request(req as unknown as IncomingMessage, res as unknown as Http1Response),
    );
    // `expect: 100-continue` (RFC 9110 §10.1.1): with a 'checkContinue' listener node leaves the
    // `100 Continue` to us instead of sending it before the request is even looked at. The request
    // path sends it once it reads the body (proxy/handler.ts), after every refusal that needs none.
    (this.server as unknown as EventEmitter).on('checkContinue', (req: IncomingMessage, res: Http1Response) => this.http1Request(req, res));
    // The 'request' listener made node install its HTTP/2 compatibility layer on 'stream'; serve
    // HTTP/2 from the streams themselves instead (see H2StreamResponse).
    this.server.removeAllListeners('stream');
    this.server.on('stream', (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, _flags: number, rawHeaders: string[]) => {
      this.deadlines.streamOpened(stream.session as http2.Http2Session, stream);
      try {
        this.onHttp2Stream(stream, headers, rawHeaders);
      } catch {
        stream.destroy();
      }
    });
    // node creates a session inside its own 'secureConnection' listener and emits 'session' from
    // there with no way back to the TLS socket (`session.socket` is a proxy that refuses
    // `destroy`): a listener put before node's hands the socket over (and ours after node's lets
    // go of it).
    let accepting: TLSSocket | undefined;
    this.server.prependListener('secureConnection', (socket: TLSSocket) => {
      accepting = socket;
    });
    if (clientAuth?.mode === 'optional') {
      // `optional` verifies a certificate when one is presented (docs/configuration.md): node has
      // no such mode (rejectUnauthorized also refuses clients without one), so a presented
      // certificate the client CAs did not issue closes the connection here. Prepended: node's own
      // 'secureConnection' listener hands the socket to HTTP/1.1 or HTTP/2, which parse the request
      // bytes already buffered at once (a request that came with the client's Finished was
      // forwarded before a listener added after it ran).
      this.server.prependListener('secureConnection', (socket: TLSSocket) => {
        if (socket.authorized || Object.keys(socket.getPeerCertificate()).length === 0) return;
        m.counter('svc_downstream_tls_handshake_failure_total').inc({ listener: this.name, reason: 'invalid_client_cert' });
        socket.destroy();
      });
    }
    this.server.on('secureConnection', (socket: TLSSocket) => {
      accepting = undefined;
      if (socket.destroyed) return;
      this.deadlines.secured(socket);
      m.counter('svc_downstream_tls_handshake_success_total').inc();
      m.counter('svc_downstream_tls_alpn_total').inc({ listener: this.name, protocol: socket.alpnProtocol || 'none' });
      // Without SNI the SNICallback is not called: the default identity was served.
      if (!(socket as TLSSocket & { servername?: string | false }).servername) {
        m.counter('svc_downstream_tls_certificate_selection_total').inc({ listener: this.name, selection: this.contexts.defaultSelection });
      }
    });
    // Admission at accept: a refused TCP connection costs no TLS handshake. Then the handshake
    // deadline (connection-deadlines.ts).
    this.server.on('connection', (socket: Socket) => {
      const t = opts.timeouts();
      // node reads these for every HTTP/1.1 connection it checks, so the active generation's apply.
      const h1 = this.server as unknown as { headersTimeout: number; requestTimeout: number; keepAliveTimeout: number };
      h1.headersTimeout = t.headerMs;
      h1.requestTimeout = t.requestMs;
      h1.keepAliveTimeout = t.idleMs;
      const a = opts.admission;
      if (a !== undefined) {
        const source = sourceKey(socket.remoteAddress ?? '');
        // Decided at once from this worker's lease, or when the supervisor answers (node-wide caps:
        // the handshake goes on meanwhile and a refused connection is closed then).
        let late = false;
        a.admitThen(source, (verdict) => {
          if (verdict === 'admitted') {
            if (socket.destroyed) a.release(source);
            else socket.once('close', () => a.release(source));
            return;
          }
          m.counter(verdict === 'rate' ? 'svc_ingress_rate_limited_total' : 'svc_connection_cap_rejects').inc();
          opts.refusals?.note(refusalReason(verdict), socket.remoteAddress ?? '');
          // Decided late, the TLS socket over it has started: destroying the TCP socket alone would
          // leave an HTTP/2 session holding the connection, so it is reset.
          if (late) socket.resetAndDestroy();
          else socket.destroy();
        });
        if (socket.destroyed) return;
        late = true;
      }
      this.deadlines.accepted(socket, t.tlsHandshakeMs, () => {
        m.counter('svc_downstream_tls_handshake_failure_total').inc({ listener: this.name, reason: 'timeout' });
        opts.refusals?.note('tls_handshake_timeout', socket.remoteAddress ?? '');
      });
      socket.once('close', () => this.deadlines.forget(socket));
    });
    this.server.on('session', (session: http2.ServerHttp2Session) => {
      const t = opts.timeouts();
      const socket = accepting;
      accepting = undefined;
      this.deadlines.session(session, socket, {
        firstMs: Math.min(t.headerMs, t.idleMs),
        idleMs: t.idleMs,
        sendIdleMs: t.sendIdleMs,
        onStall: () => {
          m.counter('svc_downstream_send_stalls_total').inc();
          opts.refusals?.note('send_stalled', socket?.remoteAddress ?? '');
        },
        onRefusedBlocks: () => {
          m.counter('svc_downstream_h2_refused_block_closes_total').inc();
          opts.refusals?.note('h2_refused_blocks', socket?.remoteAddress ?? '');
        },
      });
    });
    this.server.on('tlsClientError', (err) => {
      m.counter('svc_downstream_tls_handshake_failure_total').inc({ listener: this.name, reason: handshakeFailureReason(err) });
    });
    // A failed TLS handshake, a malformed HTTP/1.1 request or node's header timeout: close the
    // connection, after the responses to the requests pipelined before it and a one-line answer for
    // the HTTP ones (client-error.ts). Never crash, never hang.
    (this.server as unknown as EventEmitter).on('clientError', (err: Error, socket?: Socket) => {
      if (socket === undefined) return;
      closeAfterClientError(socket, clientErrorReply(String((err as { code?: unknown }).code ?? '')), opts.timeouts().sendIdleMs);
    });
    // Which HTTP/1.1 upgrades node hands over as 'upgrade' events: those offering WebSocket
    // (upgrade.ts, `acceptsUpgrade`). Any other (`Upgrade: h2c` above all) is parsed on as a
    // plain request and comes as a 'request' event, its Upgrade ignored (RFC 9110 §7.8). node's
    // `shouldUpgradeCallback` (node:http's option; the HTTP/1.1 side of an allowHTTP1 server
    // reads it from the server object, not from http2's options).
    (this.server as unknown as { shouldUpgradeCallback: (req: IncomingMessage) => boolean }).shouldUpgradeCallback = (req) => acceptsUpgrade(req.headers as HeaderMap);
    // HTTP/1.1 Upgrade requests (WebSocket) arrive here, not as 'request' events.
    (this.server as unknown as EventEmitter).on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      let rt: Runtime;
      try {
        rt = this.opts.runtimes.acquire();
      } catch {
        socket.destroy();
        return;
      }
      proxyUpgrade(rt, http1Request(req, this.connectionFacts(socket as TLSSocket, req.headers['host']), this.name, true), socket, head, () => this.opts.runtimes.release(rt));
    });
    // HTTP/1.1 CONNECT (RFC 9110 §9.3.6): without a listener node destroyed the connection with
    // no answer and no log. It runs the request path on the raw socket, as an upgrade does, whose
    // protocol phase refuses every CONNECT (405 with Allow: tunnelling is not built), answered on
    // the socket, which then closes; nothing is forwarded.
    (this.server as unknown as EventEmitter).on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      opts.refusals?.note('connect_refused', unmapIpv4(socket.remoteAddress ?? ''));
      let rt: Runtime;
      try {
        rt = this.opts.runtimes.acquire();
      } catch {
        socket.destroy();
        return;
      }
      proxyUpgrade(rt, http1Request(req, this.connectionFacts(socket as TLSSocket, req.headers['host']), this.name, false), socket, head, () => this.opts.runtimes.release(rt));
    });
    this.server.on('sessionError', () => {
      /* a broken HTTP/2 session is closed by node; nothing is shared with other sessions */
    });
    this.publishExpiry();
  }

  /** Binds the listener's address and port (with SO_REUSEPORT unless told otherwise). Resolves with the bound port. */
  async listen(): Promise<number> {
    // `exclusive`: in a cluster worker, bind our own socket rather than share the primary's handle;
    // with `reusePort` every worker has one and the kernel spreads connections (DESIGN "Processes").
    this.server.listen({ host: this.opts.listener.address, port: this.opts.bindPort ?? this.opts.listener.port, reusePort: this.opts.reusePort ?? true, exclusive: true } as ListenOptions);
    await once(this.server, 'listening');
    return (this.server.address() as AddressInfo).port;
  }

  /** New certificate and client-CA material for new handshakes; existing connections keep theirs. */
  updateMaterial(material: ListenerMaterial): void {
    const next = new ListenerContexts(material);
    this.contexts = next;
    this.server.setSecureContext({ cert: next.defaultIdentity.cert_pem, key: next.defaultIdentity.key_pem, ...(material.client_ca === undefined ? {} : { ca: [...material.client_ca.pems] }) });
    this.publishExpiry();
  }

  /** `alt_svc_max_age_s` is live: the `ma` advertised from the next response on. */
  setAltSvcMaxAge(seconds: number): void {
    this.altSvc = `h3=":${this.opts.listener.port}"; ma=${seconds}`;
  }

  /** Stops accepting; open connections finish their requests. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private publishExpiry(): void {
    const m = this.opts.metrics;
    const now = Date.now() / 1000;
    for (const { serverName, identity } of this.contexts.identities) {
      m.gauge('svc_downstream_tls_certificate_not_after_seconds').set({ listener: this.name, server_name: serverName }, identity.not_after_unix_seconds);
      m.gauge('svc_downstream_tls_certificate_days_remaining').set({ listener: this.name, server_name: serverName }, Math.floor((identity.not_after_unix_seconds - now) / 86400));
    }
  }

  /**
   * The facts of `socket`'s connection, worked out on its first request: among them whether to
   * advertise HTTP/3, only where the QUIC certificate is valid for the name the client used (SNI,
   * else the first request's host).
   */
  private connectionFacts(socket: TLSSocket, host: string | undefined): ConnectionFacts {
    let facts = FACTS_BY_SOCKET.get(socket);
    if (facts === undefined) {
      const servername = (socket as TLSSocket & { servername?: string | false }).servername;
      const name = typeof servername === 'string' && servername.length > 0 ? servername : normalizeHost(host ?? '');
      const peer = socket.remoteAddress ?? '';
      facts = { advertises: name.length > 0 && this.contexts.defaultCovers(name), remoteAddress: unmapIpv4(peer), affinityKey: `${peer}:${socket.remotePort ?? 0}` };
      FACTS_BY_SOCKET.set(socket, facts);
    }
    return facts;
  }

  /** node's 'request' and 'checkContinue' events: never throws. */
  private http1Request(req: IncomingMessage, res: Http1Response): void {
    try {
      this.onHttp1Request(req, res);
    } catch {
      res.destroy();
    }
  }

  private onHttp1Request(req: IncomingMessage, res: Http1Response): void {
    const facts = this.connectionFacts(req.socket as TLSSocket, req.headers['host']);
    if (facts.advertises) res.altSvc = this.altSvc;
    // An upgrade we declined (h2c...): answered as a plain request, then the connection closes.
    if (declinedUpgrade(req.headers as HeaderMap)) res.shouldKeepAlive = false;
    serveRequest(this.opts.runtimes, http1Request(req, facts, this.name, false), res as unknown as DownstreamResponse);
  }

  private onHttp2Stream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, rawHeaders: string[]): void {
    stream.on('error', ignoreStreamError);
    const socket = stream.session?.socket as TLSSocket | undefined;
    if (socket === undefined) {
      stream.destroy();
      return;
    }
    const authority = headers[':authority'] as string | undefined;
    const host = headers['host'] as string | undefined;
    const facts = this.connectionFacts(socket, authority ?? host);
    // Refused by the protocol phase (405: tunnelling is not built). An extended CONNECT
    // (`:protocol`, RFC 8441) never gets here: we do not send SETTINGS_ENABLE_CONNECT_PROTOCOL, so
    // nghttp2 resets it as malformed (PROTOCOL_ERROR, RFC 8441 §3, RFC 9113 §8.1.1).
    if (headers[':method'] === 'CONNECT') this.opts.refusals?.note('connect_refused', facts.remoteAddress);
    const res = new H2StreamResponse(stream, facts.advertises ? this.altSvc : undefined, this.deadlines);
    const request: DownstreamRequest = {
      method: (headers[':method'] as string | undefined) ?? 'GET',
      path: (headers[':path'] as string | undefined) ?? '/',
      authority,
      host,
      headers: headers as HeaderMap,
      headerCount: rawHeaders.length / 2,
      headerBytes: headerBytes(rawHeaders),
      remoteAddress: facts.remoteAddress,
      protocol: '2',
      ingress: 'bootstrap-h2',
      listener: this.name,
      earlyData: false,
      affinityKey: facts.affinityKey,
      upgrade: false,
      scheme: headers[':scheme'] as string | undefined,
      duplicateHost: hostFieldCount(rawHeaders) > 1,
      body: stream,
      hasBody: !stream.endAfterHeaders,
    };
    serveRequest(this.opts.runtimes, request, res as unknown as DownstreamResponse);
  }
}
