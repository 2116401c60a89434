// The control API server: HTTPS, HTTP/1.1 only (ALPN offers only `http/1.1`, so a client that
// offers only h2 fails the handshake). Connections are bounded in number (`max_connections`, the
// excess dropped and counted) and lifetime (`connection_timeout_ms`); request bodies in size
// (`max_body_bytes`). Every route's role is checked in `Authenticator.decide`; every outcome is
// audited without credentials. Error payload: {"reason": "<canonical_reason>", "message": "..."}.
import https from 'node:https';
import { once } from 'node:events';
import { randomUUID } from 'node:crypto';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { auditEvent } from '@edge-proxy/telemetry';
import type { AuditAction, AuditEvent, AuditSink, Metrics } from '@edge-proxy/telemetry';
import type { Authenticator, Identity } from './auth.ts';
import { matchRoute, routeTable } from './routes.ts';
import { trackConnections } from '../net/connection-lifetime.ts';
import type { RouteAction, RouteDef } from './routes.ts';

/** A handler's answer. */
export interface ApiAnswer {
  readonly status: number;
  readonly body: unknown;
  /** Canonical reason for audit (`invalid_config`, `stale_generation`, ...). */
  readonly reason?: string;
  readonly generation?: number;
}

/** What the server calls; implemented by the supervisor. */
export interface ControlPlaneHandlers {
  health(): ApiAnswer;
  ready(): ApiAnswer;
  snapshot(): Promise<ApiAnswer>;
  history(): ApiAnswer;
  historyGeneration(generation: number): ApiAnswer;
  validate(body: Record<string, unknown>, identity: Identity): Promise<ApiAnswer>;
  preview(body: Record<string, unknown>, identity: Identity): Promise<ApiAnswer>;
  activate(body: Record<string, unknown>, identity: Identity): Promise<ApiAnswer>;
  rollback(body: Record<string, unknown>, identity: Identity): Promise<ApiAnswer>;
  reload(body: Record<string, unknown>, identity: Identity): Promise<ApiAnswer>;
  reloadCerts(identity: Identity): Promise<ApiAnswer>;
  restart(identity: Identity): Promise<ApiAnswer>;
}

export interface ControlApiOptions {
  readonly address: string;
  readonly port: number;
  readonly cert: string;
  readonly key: string;
  readonly clientAuth: { readonly mode: 'optional' | 'required'; readonly ca: readonly string[] } | undefined;
  readonly maxConnections: number;
  readonly connectionTimeoutMs: number;
  readonly maxBodyBytes: number;
  readonly reloadPath: string;
  readonly reloadCertsPath: string;
  readonly auditEnabled: boolean;
}

/** Body fields each mutating route accepts (unknown fields are rejected: 400 invalid_request). */
const BODY_FIELDS: Partial<Record<RouteAction, Record<string, 'string' | 'integer'>>> = {
  validate: { config_path: 'string', expected_generation: 'integer', requested_by: 'string', reason: 'string' },
  preview: { config_path: 'string', expected_generation: 'integer', requested_by: 'string', reason: 'string' },
  activate: { config_path: 'string', expected_generation: 'integer', requested_by: 'string', reason: 'string' },
  reload: { config_path: 'string', expected_generation: 'integer', requested_by: 'string', reason: 'string' },
  rollback: { target_generation: 'integer', expected_active_generation: 'integer', requested_by: 'string', reason: 'string' },
  reload_certs: {},
  restart: {},
};

/** Longest accepted text field (requested_by, reason, config_path). */
const MAX_FIELD_CHARS = 4096;

const ACTION_OF: Partial<Record<RouteAction, AuditAction>> = { validate: 'validate', preview: 'preview', activate: 'activate', rollback: 'rollback', reload: 'reload', reload_certs: 'cert_reload', restart: 'restart' };

/** Handshake failure reasons (SPEC downstream TLS failure labels) from a TLS client error. */
function tlsReason(err: Error): string {
  const text = `${(err as { code?: string }).code ?? ''} ${err.message}`;
  if (/CERTIFICATE_REQUIRED|PEER_DID_NOT_RETURN_A_CERTIFICATE/i.test(text)) return 'missing_client_cert';
  if (/EXPIRED/i.test(text)) return 'expired_client_cert';
  if (/UNKNOWN_CA|UNABLE_TO_GET_ISSUER|unknown ca/i.test(text)) return 'unknown_issuer';
  if (/NO_APPLICATION_PROTOCOL|ALPN/i.test(text)) return 'alpn';
  // OpenSSL reports a rejected client certificate only as "certificate verify failed": the specific
  // verify error (unknown issuer, bad signature) is not exposed when the handshake is refused.
  if (/BAD_CERTIFICATE|CERTIFICATE_VERIFY_FAILED|certificate verify failed/i.test(text)) return 'invalid_client_cert';
  return 'handshake';
}

export class ControlApiServer {
  private readonly server: https.Server;
  private readonly opts: ControlApiOptions;
  private readonly handlers: ControlPlaneHandlers;
  private readonly metrics: Metrics;
  private readonly sink: AuditSink;
  private auth: Authenticator;
  private readonly routes: ReturnType<typeof routeTable>;
  private readonly sockets: Set<Socket>;

  constructor(opts: ControlApiOptions, auth: Authenticator, handlers: ControlPlaneHandlers, metrics: Metrics, sink: AuditSink) {
    this.opts = opts;
    this.auth = auth;
    this.handlers = handlers;
    this.metrics = metrics;
    this.sink = sink;
    this.routes = routeTable(opts.reloadPath, opts.reloadCertsPath);
    this.server = https.createServer(
      {
        cert: opts.cert,
        key: opts.key,
        ALPNProtocols: ['http/1.1'],
        requestCert: opts.clientAuth !== undefined,
        rejectUnauthorized: opts.clientAuth?.mode === 'required',
        ...(opts.clientAuth === undefined ? {} : { ca: [...opts.clientAuth.ca] }),
        maxHeaderSize: 16_384,
        // Keep-alive connections are bounded by connectionTimeoutMs below.
        requestTimeout: Math.min(opts.connectionTimeoutMs, 30_000),
      },
      (req, res) => void this.onRequest(req, res),
    );
    this.server.maxConnections = opts.maxConnections;
    this.server.on('drop', () => this.metrics.gauge('svc_control_api_connection_limit_drops').inc());
    // SPEC: connection_timeout_ms is the per-connection lifetime.
    this.sockets = trackConnections(this.server, opts.connectionTimeoutMs);
    this.server.on('tlsClientError', (err: Error, socket: TLSSocket) => {
      this.audit({ event_type: 'authentication', action: 'authenticate', result: 'denied', reason: tlsReason(err), failure_class: 'tls_handshake', peer_addr: socket.remoteAddress ?? null, authn: 'mtls' });
    });
  }

  /** Binds the configured address and port (tests may pass 0). Resolves with the bound port. */
  async listen(port = this.opts.port): Promise<number> {
    this.server.listen({ host: this.opts.address, port });
    await once(this.server, 'listening');
    return (this.server.address() as AddressInfo).port;
  }

  /** New authentication settings (a generation was activated). */
  setAuthenticator(auth: Authenticator): void {
    this.auth = auth;
  }

  /** New certificate for new handshakes (reload-certs). */
  setCertificate(cert: string, key: string, clientCa: readonly string[] | undefined): void {
    this.server.setSecureContext({ cert, key, ...(clientCa === undefined ? {} : { ca: [...clientCa] }) });
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private audit(input: Parameters<typeof auditEvent>[0]): AuditEvent | undefined {
    if (!this.opts.auditEnabled) return undefined;
    const e = auditEvent(input);
    this.sink(e);
    return e;
  }

  private send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    if (res.headersSent) return;
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), 'cache-control': 'no-store', ...headers });
    res.end(text);
  }

  private fail(res: ServerResponse, status: number, reason: string, message: string, headers: Record<string, string> = {}): void {
    this.send(res, status, { reason, message }, headers);
  }

  /** Reads a JSON object body of at most maxBodyBytes; undefined for an empty body. */
  private async readBody(req: IncomingMessage): Promise<Record<string, unknown> | 'too_large' | 'invalid'> {
    const declared = Number(req.headers['content-length'] ?? NaN);
    if (declared > this.opts.maxBodyBytes) return 'too_large';
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req) {
      size += (chunk as Buffer).length;
      if (size > this.opts.maxBodyBytes) return 'too_large';
      chunks.push(chunk as Buffer);
    }
    if (size === 0) return {};
    try {
      const v = JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
      return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : 'invalid';
    } catch {
      return 'invalid';
    }
  }

  private checkFields(action: RouteAction, body: Record<string, unknown>): string | undefined {
    const fields = BODY_FIELDS[action] ?? {};
    for (const [k, v] of Object.entries(body)) {
      const type = fields[k];
      if (type === undefined) return `unknown field '${k.slice(0, 64)}'`;
      if (type === 'integer' && !Number.isSafeInteger(v)) return `'${k}' must be an integer`;
      if (type === 'string' && (typeof v !== 'string' || v.length === 0 || v.length > MAX_FIELD_CHARS)) return `'${k}' must be a non-empty string of at most ${MAX_FIELD_CHARS} characters`;
    }
    if (action === 'rollback' && body['target_generation'] === undefined) return "'target_generation' is required";
    return undefined;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const requestId = randomUUID();
    res.setHeader('x-request-id', requestId);
    const socket = req.socket as TLSSocket;
    const peer = socket.remoteAddress ?? null;
    try {
      const path = (req.url ?? '/').split('?')[0] ?? '/';
      const match = matchRoute(this.routes, req.method ?? 'GET', path);
      if (match === 'not_found') return this.fail(res, 404, 'not_found', 'no such control API route');
      if (match === 'method_not_allowed') return this.fail(res, 405, 'method_not_allowed', 'the route does not accept this method');
      const route: RouteDef = match.route;
      const decision = this.auth.decide(socket, peer ?? undefined, req.headers.authorization, route.role);
      const authn = decision.ok ? decision.identity.authn : req.headers.authorization !== undefined ? 'bearer' : socket.authorized ? 'mtls' : 'none';
      if (!decision.ok) {
        const type = decision.reason === 'insufficient_role' ? 'authorization' : 'authentication';
        this.audit({
          event_type: type,
          action: type === 'authorization' ? 'authorize' : 'authenticate',
          result: 'denied',
          reason: decision.reason,
          request_id: requestId,
          target: path,
          peer_addr: peer,
          authn,
          ...(decision.identity === undefined ? {} : { actor: { id: decision.identity.actor, roles: [decision.identity.role] } }),
        });
        return this.fail(res, decision.status, decision.reason, decision.status === 401 ? 'authentication required' : 'not permitted', decision.status === 401 ? { 'www-authenticate': 'Bearer' } : {});
      }
      const identity = decision.identity;
      if (route.role !== undefined) {
        this.audit({ event_type: 'authentication', action: 'authenticate', result: 'succeeded', request_id: requestId, target: path, peer_addr: peer, authn: identity.authn, actor: { id: identity.actor, roles: [identity.role] } });
      }
      let body: Record<string, unknown> = {};
      if (route.mutating) {
        const read = await this.readBody(req);
        if (read === 'too_large') return this.fail(res, 413, 'body_too_large', `request bodies are limited to ${this.opts.maxBodyBytes} bytes`, { connection: 'close' });
        if (read === 'invalid') return this.fail(res, 400, 'invalid_request', 'the body must be a JSON object');
        const bad = this.checkFields(route.action, read);
        if (bad !== undefined) return this.fail(res, 400, 'invalid_request', bad);
        body = read;
      } else {
        req.resume();
      }
      const action = ACTION_OF[route.action];
      const actor = { id: identity.actor, roles: [identity.role], ...(typeof body['requested_by'] === 'string' ? { requested_by: body['requested_by'] } : {}) };
      const attempt = action === undefined ? undefined : this.audit({ event_type: 'operation_attempt', action, result: 'attempted', request_id: requestId, target: path, peer_addr: peer, authn: identity.authn, actor });
      const answer = await this.dispatch(route.action, body, identity, match.generation);
      if (action !== undefined) {
        const ok = answer.status < 300;
        this.audit({
          event_type: 'operation_result',
          action,
          result: ok ? 'succeeded' : answer.status >= 500 ? 'failed' : 'denied',
          request_id: requestId,
          target: path,
          peer_addr: peer,
          authn: identity.authn,
          actor,
          ...(answer.generation === undefined ? {} : { generation: answer.generation }),
          ...(answer.reason === undefined ? {} : { reason: answer.reason }),
          ...(ok ? {} : { failure_class: answer.status >= 500 ? 'internal' : 'request' }),
          ...(attempt === undefined ? {} : { attempt_event_id: attempt.event_id }),
        });
      }
      this.send(res, answer.status, answer.body);
    } catch {
      this.fail(res, 500, 'internal_error', 'the control plane failed to answer');
    }
  }

  private dispatch(action: RouteAction, body: Record<string, unknown>, identity: Identity, generation: number | undefined): Promise<ApiAnswer> | ApiAnswer {
    const h = this.handlers;
    switch (action) {
      case 'health':
        return h.health();
      case 'ready':
        return h.ready();
      case 'snapshot':
        return h.snapshot();
      case 'history':
        return h.history();
      case 'history_generation':
        return h.historyGeneration(generation ?? 0);
      case 'validate':
        return h.validate(body, identity);
      case 'preview':
        return h.preview(body, identity);
      case 'activate':
        return h.activate(body, identity);
      case 'rollback':
        return h.rollback(body, identity);
      case 'reload':
        return h.reload(body, identity);
      case 'reload_certs':
        return h.reloadCerts(identity);
      case 'restart':
        return h.restart(identity);
    }
  }
}
