// The TLS bootstrap ingress of a listener: HTTP/2 and HTTP/1.1 over TLS (ALPN) on the listener's
// TCP port, bound with SO_REUSEPORT so every worker accepts. Every response advertises
// `Alt-Svc: h3=":<port>"` so browsers move to the QUIC ingress. Requests go through the same
// handler, router and balancing as the QUIC path, on the runtime active at admission.
import http2 from 'node:http2';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { once } from 'node:events';
import type { EventEmitter } from 'node:events';
import type { ListenOptions, Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { ListenerMaterial, NormalizedListener } from '@edge-proxy/config';
import type { Metrics } from '@edge-proxy/telemetry';
import { ListenerContexts } from './tls-contexts.ts';
import { proxyUpgrade } from './upgrade.ts';
import type { ConnectionAdmission } from './admission.ts';
import { normalizeHost } from '../routing/router.ts';
import { handleRequest, sendError } from '../proxy/handler.ts';
import type { DownstreamRequest } from '../proxy/handler.ts';
import type { DownstreamResponse } from '../proxy/forward.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { Runtime } from '../runtime/provision.ts';

/** What the ingress needs from the worker: the runtime to admit a request on. */
export interface RuntimeSource {
  /** The active runtime, held until `release` is called (requests finish on their generation). */
  acquire(): Runtime;
  release(rt: Runtime): void;
}

export interface BootstrapOptions {
  readonly listener: NormalizedListener;
  readonly material: ListenerMaterial;
  readonly runtimes: RuntimeSource;
  readonly metrics: Metrics;
  /** Connection caps and rate shared by the worker's ingresses; none: unlimited. */
  readonly admission?: ConnectionAdmission;
  /** Port to bind instead of the configured one (tests bind 0). */
  readonly bindPort?: number;
}

type CompatRequest = IncomingMessage | http2.Http2ServerRequest;
type CompatResponse = ServerResponse | http2.Http2ServerResponse;

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

function headerStats(raw: readonly string[]): { count: number; bytes: number } {
  let bytes = 0;
  for (const s of raw) bytes += s.length;
  return { count: raw.length / 2, bytes };
}

export class BootstrapIngress {
  private readonly server: http2.Http2SecureServer;
  private contexts: ListenerContexts;
  private readonly opts: BootstrapOptions;
  private readonly altSvc: string;
  private readonly name: string;

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
        ALPNProtocols: ['h2', 'http/1.1'],
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
      (req, res) => {
        this.onRequest(req, res).catch(() => res.destroy());
      },
    );
    this.server.on('secureConnection', (socket: TLSSocket) => {
      m.counter('svc_downstream_tls_handshake_success_total').inc();
      m.counter('svc_downstream_tls_alpn_total').inc({ listener: this.name, protocol: socket.alpnProtocol || 'none' });
      // Without SNI the SNICallback is not called: the default identity was served.
      if (!(socket as TLSSocket & { servername?: string | false }).servername) {
        m.counter('svc_downstream_tls_certificate_selection_total').inc({ listener: this.name, selection: this.contexts.defaultSelection });
      }
    });
    // Admission at accept: a refused TCP connection costs no TLS handshake.
    this.server.on('connection', (socket: Socket) => {
      const a = opts.admission;
      if (a === undefined) return;
      const verdict = a.admit();
      if (verdict !== 'admitted') {
        m.counter(verdict === 'cap' ? 'svc_connection_cap_rejects' : 'svc_ingress_rate_limited_total').inc();
        socket.destroy();
        return;
      }
      socket.once('close', () => a.release());
    });
    this.server.on('tlsClientError', (err) => {
      m.counter('svc_downstream_tls_handshake_failure_total').inc({ listener: this.name, reason: handshakeFailureReason(err) });
    });
    // A malformed HTTP/1.1 request: answer 400 on the raw socket and close (never crash, never hang).
    (this.server as unknown as EventEmitter).on('clientError', (_err: Error, socket?: Socket) => {
      if (socket !== undefined && socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
    });
    // HTTP/1.1 Upgrade requests (WebSocket) arrive here, not as 'request' events.
    (this.server as unknown as EventEmitter).on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      let rt: Runtime;
      try {
        rt = this.opts.runtimes.acquire();
      } catch {
        socket.destroy();
        return;
      }
      void proxyUpgrade(rt, req, socket, head, () => this.opts.runtimes.release(rt));
    });
    this.server.on('sessionError', () => {
      /* a broken HTTP/2 session is closed by node; nothing is shared with other sessions */
    });
    this.publishExpiry();
  }

  /** Binds the listener's address and port with SO_REUSEPORT. Resolves with the bound port. */
  async listen(): Promise<number> {
    // `exclusive`: in a cluster worker, bind our own socket rather than share the primary's handle;
    // with `reusePort` every worker has one and the kernel spreads connections (DESIGN "Processes").
    this.server.listen({ host: this.opts.listener.address, port: this.opts.bindPort ?? this.opts.listener.port, reusePort: true, exclusive: true } as ListenOptions);
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

  private async onRequest(req: CompatRequest, res: CompatResponse): Promise<void> {
    let rt: Runtime | undefined;
    try {
      // Advertise HTTP/3 only where the QUIC certificate is valid for the name the client used.
      const servername = (req.socket as TLSSocket & { servername?: string | false }).servername;
      const name = typeof servername === 'string' && servername.length > 0 ? servername : normalizeHost(String(req.headers[':authority'] ?? req.headers.host ?? ''));
      if (name.length > 0 && this.contexts.defaultCovers(name)) res.setHeader('alt-svc', this.altSvc);
      rt = this.opts.runtimes.acquire();
      const h2 = req.httpVersionMajor === 2;
      const headers = req.headers as HeaderMap;
      const stats = headerStats(req.rawHeaders);
      const authority = h2 ? (headers[':authority'] as string | undefined) : undefined;
      const host = headers['host'] as string | undefined;
      const upgrade = !h2 && (headers['upgrade'] !== undefined || /\bupgrade\b/i.test(String(headers['connection'] ?? '')));
      const hasBody = h2 ? !(req as http2.Http2ServerRequest).stream.endAfterHeaders : headers['content-length'] !== undefined ? headers['content-length'] !== '0' : headers['transfer-encoding'] !== undefined;
      const socket = req.socket;
      const peer = socket.remoteAddress ?? '';
      const request: DownstreamRequest = {
        method: req.method ?? 'GET',
        path: req.url ?? '/',
        authority: authority ?? host,
        host,
        headers,
        headerCount: stats.count,
        headerBytes: stats.bytes,
        remoteAddress: peer.startsWith('::ffff:') ? peer.slice(7) : peer,
        protocol: h2 ? '2' : '1.1',
        ingress: h2 ? 'bootstrap-h2' : 'bootstrap-h1',
        earlyData: false,
        affinityKey: `${peer}:${socket.remotePort ?? 0}`,
        upgrade,
        body: req,
        hasBody,
      };
      await handleRequest(rt, request, res as unknown as DownstreamResponse);
    } catch {
      sendError(res as unknown as DownstreamResponse, req.method ?? 'GET', 502, 'internal proxy error');
    } finally {
      if (rt !== undefined) this.opts.runtimes.release(rt);
    }
  }
}
