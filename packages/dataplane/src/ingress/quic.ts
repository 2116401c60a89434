// The native HTTP/3 ingress of a listener: an `Http3Server` (our HTTP/3 over @matrixai/quic) on the
// listener's UDP port, bound with SO_REUSEPORT; every worker shares the connection-id/Retry key and
// the session-ticket key, so a connection's packets and resumptions work whichever worker answers.
// Requests go through the same handler as the TLS bootstrap path.
//
// One certificate chain per QUIC server (the library builds the TLS context before it reads the
// ClientHello): the listener's default identity (legacy cert/key, else the first certificates[]
// entry) is served to every QUIC client (docs/decisions.md).
import { createHmac } from 'node:crypto';
import { H3Error, Http3Server } from '@edge-proxy/http3';
import { sourceKey } from './admission.ts';
import type { ConnectionAdmission } from './admission.ts';
import { refusalReason } from './refusal-log.ts';
import type { RefusalLog } from './refusal-log.ts';
import type { QuicIngressCounters } from './quic-counters.ts';
import type { Http3ServerRequest, Http3ServerResponse, Http3ServerSession } from '@edge-proxy/http3';
import type { ListenerMaterial, NormalizedListener } from '@edge-proxy/config';
import type { Metrics } from '@edge-proxy/telemetry';
import { headerBytes, hostFieldCount, serveRequest, unmapIpv4 } from '../proxy/handler.ts';
import type { DownstreamRequest, RuntimeSource } from '../proxy/handler.ts';
import type { DownstreamResponse } from '../proxy/forward.ts';
import type { HeaderMap } from '../upstream/headers.ts';

export interface QuicIngressOptions {
  readonly listener: NormalizedListener;
  readonly material: ListenerMaterial;
  readonly runtimes: RuntimeSource;
  readonly metrics: Metrics;
  /** Shared by every worker: connection ids and Retry tokens (>= 32 bytes). */
  readonly cryptoKey: Uint8Array;
  /** Shared by every worker: TLS session tickets (48 bytes). */
  readonly ticketKey: Uint8Array;
  /** QUIC idle timeout, ms (`performance.timeouts.quic_idle_ms`). */
  readonly idleTimeoutMs: number;
  /** Accept 0-RTT (`resilience.protocol.allow_0rtt`). */
  readonly allow0rtt: boolean;
  readonly maxFieldSectionSize: number;
  /** Connection caps and rate shared by the worker's ingresses; none: unlimited. */
  readonly admission?: ConnectionAdmission;
  /** Summarizes refused connections in the log; none: metrics only. */
  readonly refusals?: RefusalLog;
  /**
   * `timeouts.client_idle_ms` of the active generation: a session without a request in progress
   * for that long is closed (GOAWAY, then H3_NO_ERROR), even if the peer keeps the QUIC
   * connection alive with PINGs (which reset `quic_idle_ms`). None: only `quic_idle_ms`.
   */
  readonly clientIdleMs?: () => number;
  /** The worker's datagram counters (`svc_ingress_*`); none: not published. */
  readonly counters?: QuicIngressCounters;
  /** Port to bind instead of the configured one (tests bind 0). */
  readonly bindPort?: number;
  /**
   * SO_REUSEPORT (`performance.reuseport`); default true. Without it a cluster worker's UDP bind
   * is a handle the primary binds and shares (one socket; validation allows that with one worker).
   */
  readonly reusePort?: boolean;
}

/**
 * The client CAs QUIC verifies client certificates against: those of `client_auth.mode: required`.
 * quiche can require a verified certificate or ask for none, nothing between, so `optional` asks
 * for none on HTTP/3 (docs/decisions.md, "Client certificates on HTTP/3"): a client that wants to
 * present one uses the bootstrap ingress, where it is verified.
 */
function requiredClientCa(listener: NormalizedListener, material: ListenerMaterial): string | undefined {
  if (listener.tls.client_auth?.mode !== 'required') return undefined;
  // Without CAs nothing could be verified: refuse every client rather than none (fail closed).
  const pems = material.client_ca?.pems ?? [];
  if (pems.length === 0) throw new Error(`listener ${listener.name}: client_auth required without client CAs`);
  return pems.join('\n');
}

/**
 * The listener's own session-ticket key, derived from the worker-shared one: the same on every
 * worker (a ticket resumes whichever worker answers), different per listener. A ticket carries
 * the authentication of the handshake that issued it; with one key for all listeners, a ticket
 * won on a listener without client certificates resumed on a `client_auth: required` one with
 * no certificate (test/listener-client-auth.test.ts). The name, address, port and client-auth
 * policy are mixed in, so a listener whose policy changes also stops honouring its old tickets.
 */
function listenerTicketKey(shared: Uint8Array, listener: NormalizedListener): Uint8Array {
  const ca = listener.tls.client_auth;
  const label = JSON.stringify(['edge-proxy quic session tickets', listener.name, listener.address, listener.port, ca?.mode ?? 'none', ca?.ca_file ?? '']);
  return createHmac('sha384', shared).update(label).digest();
}

/** The `selection` label of the identity QUIC serves: the legacy `cert`/`key`, else the first `certificates[]` entry. */
function defaultSelection(material: ListenerMaterial): 'default' | 'first' {
  return material.default !== undefined ? 'default' : 'first';
}

/** Methods whose requests carry no body unless `content-length` says so (RFC 9110 §9.3.1-2). */
const BODILESS = new Set(['GET', 'HEAD']);

export class QuicIngress {
  private readonly server: Http3Server;
  private readonly opts: QuicIngressOptions;
  private untrack: (() => void) | undefined;
  /** How the identity QUIC serves was chosen (metric label `selection`). */
  private selection: 'default' | 'first';
  private idleTimer: NodeJS.Timeout | undefined;
  /** Per live session: requests seen at the last check, and since when none has been in progress. */
  private readonly idle = new Map<Http3ServerSession, { requests: number; since: number }>();

  constructor(opts: QuicIngressOptions) {
    this.opts = opts;
    const identity = opts.material.default ?? opts.material.certificates[0]?.identity;
    if (identity === undefined) throw new Error('a listener needs a default identity or a certificates[] entry');
    const clientCa = requiredClientCa(opts.listener, opts.material);
    this.server = new Http3Server({
      key: identity.key_pem,
      cert: identity.cert_pem,
      ...(clientCa === undefined ? {} : { clientCa }),
      cryptoKey: opts.cryptoKey,
      ticketKey: listenerTicketKey(opts.ticketKey, opts.listener),
      earlyData: opts.allow0rtt,
      maxIdleTimeoutMs: opts.idleTimeoutMs,
      maxFieldSectionSize: opts.maxFieldSectionSize,
    });
    this.server.on('request', (req: Http3ServerRequest, res: Http3ServerResponse) => {
      try {
        this.onRequest(req, res);
      } catch {
        res.destroy();
      }
    });
    // A session is a completed handshake: counted in the downstream TLS series as on the
    // bootstrap path, ALPN `h3`, and the default identity (one chain per QUIC server, see above).
    const m = opts.metrics;
    const listener = opts.listener.name;
    this.selection = defaultSelection(opts.material);
    this.server.on('session', () => {
      m.counter('svc_downstream_tls_handshake_success_total').inc();
      m.counter('svc_downstream_tls_alpn_total').inc({ listener, protocol: 'h3' });
      m.counter('svc_downstream_tls_certificate_selection_total').inc({ listener, selection: this.selection });
    });
    // Admission when the session starts (the QUIC library accepts the handshake itself).
    this.server.on('session', (session) => {
      const a = opts.admission;
      if (a === undefined) return;
      const source = sourceKey(session.info.remoteAddress);
      let closed = false;
      session.once('close', () => (closed = true));
      // At once from this worker's lease, or when the supervisor answers (node-wide caps).
      a.admitThen(source, (verdict) => {
        if (verdict === 'admitted') {
          if (closed) a.release(source);
          else session.once('close', () => a.release(source));
          return;
        }
        opts.metrics.counter(verdict === 'rate' ? 'svc_ingress_rate_limited_total' : 'svc_connection_cap_rejects').inc();
        opts.refusals?.note(refusalReason(verdict), session.info.remoteAddress);
        if (!closed) session.destroy(new H3Error('H3_EXCESSIVE_LOAD', verdict === 'rate' ? 'new-connection rate exceeded' : verdict === 'source' ? 'connection cap of the source reached' : verdict === 'unavailable' ? 'connection caps unavailable (lease)' : 'connection cap reached'));
      });
    });
    if (opts.clientIdleMs !== undefined) {
      this.server.on('session', (session: Http3ServerSession) => {
        this.idle.set(session, { requests: 0, since: performance.now() });
        session.once('close', () => this.idle.delete(session));
      });
    }
    // A protocol error is the peer's: the session layer already answered it with its H3 code.
    this.server.on('protocolError', () => opts.metrics.counter('svc_request_validation_rejects').inc());
  }

  /** Binds UDP (with SO_REUSEPORT unless told otherwise); resolves with the bound port. */
  async listen(): Promise<number> {
    const { port } = await this.server.listen({ host: this.opts.listener.address, port: this.opts.bindPort ?? this.opts.listener.port, reusePort: this.opts.reusePort ?? true });
    this.untrack = this.opts.counters?.track(this.server, this.opts.listener.name);
    if (this.opts.clientIdleMs !== undefined) {
      // One check a second over the live sessions (a request's start and end cost nothing).
      this.idleTimer = setInterval(() => this.closeIdle(), 1000);
      this.idleTimer.unref();
    }
    return port;
  }

  /**
   * New certificate (and client CAs) for QUIC handshakes from now on (reload-certs, activation);
   * the default identity is served.
   */
  updateMaterial(material: ListenerMaterial): void {
    const identity = material.default ?? material.certificates[0]?.identity;
    this.selection = defaultSelection(material);
    if (identity !== undefined) this.server.setCertificate(identity.cert_pem, identity.key_pem, requiredClientCa(this.opts.listener, material));
  }

  /** `allow_0rtt` is live: whether connections accepted from now on take early data. */
  setEarlyData(enabled: boolean): void {
    this.server.setEarlyData(enabled);
  }

  /** `quic_idle_ms` is live: the idle timeout connections accepted from now on advertise. */
  setIdleTimeout(ms: number): void {
    this.server.setIdleTimeout(ms);
  }

  /** Live connection and stream counts (leak checks, metrics). */
  stats(): ReturnType<Http3Server['stats']> {
    return this.server.stats();
  }

  private closeIdle(): void {
    const idleMs = this.opts.clientIdleMs?.() ?? Infinity;
    const now = performance.now();
    for (const [session, s] of this.idle) {
      if (session.activeStreams > 0 || session.requestCount !== s.requests) {
        s.requests = session.requestCount;
        s.since = now;
      } else if (now - s.since >= idleMs && !session.draining) {
        void session.close(0);
      }
    }
  }

  /** Sends GOAWAY and lets open requests finish for `drainMs`, then closes. */
  async close(drainMs = 0): Promise<void> {
    if (this.idleTimer !== undefined) clearInterval(this.idleTimer);
    this.idleTimer = undefined;
    await this.server.close(drainMs);
    this.untrack?.();
    this.untrack = undefined;
  }

  private onRequest(req: Http3ServerRequest, res: Http3ServerResponse): void {
    const headers = req.headers as HeaderMap;
    const contentLength = headers['content-length'];
    const info = req.socket;
    // Refused by the protocol phase (405: tunnelling is not built). An extended CONNECT
    // (`:protocol`, RFC 9220) is a malformed request to the HTTP/3 layer, reset before it gets here.
    if (req.method === 'CONNECT') this.opts.refusals?.note('connect_refused', unmapIpv4(info.remoteAddress));
    const request: DownstreamRequest = {
      method: req.method,
      path: req.url,
      authority: req.authority,
      host: headers['host'] as string | undefined,
      headers,
      headerCount: req.rawHeaders.length / 2,
      headerBytes: headerBytes(req.rawHeaders),
      remoteAddress: unmapIpv4(info.remoteAddress),
      protocol: '3',
      ingress: 'quic',
      listener: this.opts.listener.name,
      earlyData: info.earlyData,
      // Our connection id: derived from the client's first id with the shared key, so it is the
      // same whichever worker derived it, and it survives client migration.
      affinityKey: info.connectionId,
      upgrade: headers['upgrade'] !== undefined,
      scheme: req.scheme,
      duplicateHost: hostFieldCount(req.rawHeaders) > 1,
      body: req,
      hasBody: contentLength !== undefined ? contentLength !== '0' : !BODILESS.has(req.method),
    };
    serveRequest(this.opts.runtimes, request, res as unknown as DownstreamResponse);
  }
}
