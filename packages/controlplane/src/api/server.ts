// The control API server: HTTPS, HTTP/1.1 only (ALPN offers only `http/1.1`, so a client that
// offers only h2 fails the handshake). Connections pass the ConnectionGuard first (allowlist at
// accept, limits with displacement of unauthenticated connections, handshake/idle/lifetime
// timeouts); request bodies are bounded (`max_body_bytes`). Every route's role is checked in
// `Authenticator.decide`; every outcome is audited without credentials. Every operation runs
// under a deadline and is abandoned when its caller disconnects (`operation_timeout_ms`).
// Error payload: {"reason": "<canonical_reason>", "message": "..."}.
import https from 'node:https';
import { randomUUID } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { auditEvent, parseTraceparent } from '@edge-proxy/telemetry';
import type { AuditAction, AuditEvent, AuditSink, Metrics } from '@edge-proxy/telemetry';
import { printable } from '@edge-proxy/config';
import type { NormalizedConfig } from '@edge-proxy/config';
import type { Authenticator, Identity } from './auth.ts';
import { matchRoute, routeTable } from './routes.ts';
import { ConnectionGuard } from '../net/connection-guard.ts';
import type { GuardEvent } from '../net/connection-guard.ts';
import { NoticeThrottle } from '../net/notice-throttle.ts';
import { operationSignal } from '../generations/operation-queue.ts';
import type { OperationAbandoned } from '../generations/operation-queue.ts';
import type { OperationContext } from '../generations/activation.ts';
import type { RouteAction, RouteDef } from './routes.ts';
import { generationProblem, isGenerationNumber } from '../generations/generation-number.ts';

/** A handler's answer. */
export interface ApiAnswer {
  readonly status: number;
  readonly body: unknown;
  /** Canonical reason for audit (`invalid_config`, `stale_generation`, ...). */
  readonly reason?: string;
  readonly generation?: number;
  /** The operation was not carried out: its caller left or its deadline passed. */
  readonly abandoned?: boolean;
}

/** Longest `requested_by` note kept (characters). */
export const MAX_NOTE_CHARS = 256;

/**
 * The answer to an abandoned operation: 503 `control_plane_busy` when its deadline passed while it
 * waited behind another operation, 504 `operation_deadline_exceeded` when it passed while it ran
 * (before it changed anything), `caller_gone` (nobody to answer; audited) when the caller left.
 */
export function abandonedAnswer(e: OperationAbandoned): ApiAnswer {
  if (e.reason === 'caller_gone') return { status: 499, reason: 'caller_gone', abandoned: true, body: { reason: 'caller_gone', message: 'the caller disconnected; the operation was not carried out' } };
  if (e.phase === 'queued') return { status: 503, reason: 'control_plane_busy', abandoned: true, body: { reason: 'control_plane_busy', message: 'the operation deadline passed while another operation was running; nothing was done' } };
  return { status: 504, reason: 'operation_deadline_exceeded', abandoned: true, body: { reason: 'operation_deadline_exceeded', message: 'the operation deadline passed before it could be carried out; nothing was done' } };
}

/** What the server calls; implemented by the supervisor. */
export interface ControlPlaneHandlers {
  health(): ApiAnswer;
  ready(): ApiAnswer;
  snapshot(): Promise<ApiAnswer>;
  history(): ApiAnswer;
  historyGeneration(generation: number): ApiAnswer;
  validate(body: Record<string, unknown>, identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  preview(body: Record<string, unknown>, identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  activate(body: Record<string, unknown>, identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  rollback(body: Record<string, unknown>, identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  reload(body: Record<string, unknown>, identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  reloadCerts(identity: Identity, ctx: OperationContext): Promise<ApiAnswer>;
  restart(identity: Identity): Promise<ApiAnswer>;
}

/** Settings that follow the active generation (applied by `setSettings`). */
export interface ControlApiSettings {
  readonly maxConnections: number;
  /** Connections from one source address (default 32). */
  readonly maxConnectionsPerSource?: number;
  readonly connectionTimeoutMs: number;
  /** TLS handshake deadline (default 5000 ms). */
  readonly handshakeTimeoutMs?: number;
  /** Idle connection timeout (default 10000 ms). */
  readonly idleTimeoutMs?: number;
  /** Operation deadline, queueing included (default 30000 ms). */
  readonly operationTimeoutMs?: number;
  readonly maxBodyBytes: number;
  readonly auditEnabled: boolean;
  /** POST paths of the legacy reload and of reload-certs (default the documented ones). */
  readonly reloadPath?: string;
  readonly reloadCertsPath?: string;
}

/** The control API settings of a configuration. */
export function controlApiSettings(c: NormalizedConfig): ControlApiSettings {
  const api = c.observability.control_api;
  return {
    maxConnections: api.max_connections,
    maxConnectionsPerSource: api.max_connections_per_source,
    connectionTimeoutMs: api.connection_timeout_ms,
    handshakeTimeoutMs: api.handshake_timeout_ms,
    idleTimeoutMs: api.idle_timeout_ms,
    operationTimeoutMs: api.operation_timeout_ms,
    maxBodyBytes: api.max_body_bytes,
    auditEnabled: api.audit.enabled,
    reloadPath: api.reload_path,
    reloadCertsPath: api.reload_certs_path,
  };
}

export interface ControlApiOptions extends ControlApiSettings {
  readonly address: string;
  readonly port: number;
  readonly cert: string;
  readonly key: string;
  readonly clientAuth: { readonly mode: 'optional' | 'required'; readonly ca: readonly string[] } | undefined;
  readonly reloadPath: string;
  readonly reloadCertsPath: string;
  /** One log line (warn) for connection refusals and abandoned operations; rate-limited by the server. */
  readonly notice?: (fields: Record<string, unknown>, message: string) => void;
}

/** `generation`: a generation number (generations/generation-number.ts), what the state directory can hold. */
type FieldType = 'string' | 'generation';
const fieldsOf = (o: Record<string, FieldType>): ReadonlyMap<string, FieldType> => new Map(Object.entries(o));
const ACTIVATION_FIELDS = fieldsOf({ config_path: 'string', expected_generation: 'generation', requested_by: 'string', reason: 'string' });

/**
 * Body fields each mutating route accepts (unknown fields are rejected: 400 invalid_request). A
 * Map, not an object literal: a key such as `__proto__` or `constructor` must not find
 * Object.prototype's members and pass as "known".
 */
const BODY_FIELDS: Partial<Record<RouteAction, ReadonlyMap<string, FieldType>>> = {
  validate: ACTIVATION_FIELDS,
  preview: ACTIVATION_FIELDS,
  activate: ACTIVATION_FIELDS,
  reload: ACTIVATION_FIELDS,
  rollback: fieldsOf({ target_generation: 'generation', expected_active_generation: 'generation', requested_by: 'string', reason: 'string' }),
  reload_certs: new Map(),
  restart: new Map(),
};

/** Refusal audit events and log lines per reason: at most one a second each. */
const NOTICE_INTERVAL_MS = 1000;

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
  private readonly guard: ConnectionGuard;
  private readonly opts: ControlApiOptions;
  private settings: ControlApiSettings;
  private readonly handlers: ControlPlaneHandlers;
  private readonly metrics: Metrics;
  private readonly sink: AuditSink;
  private auth: Authenticator;
  private routes: ReturnType<typeof routeTable>;
  /** Per notice kind: when it was last emitted and how many were suppressed since. */
  private readonly notices = new NoticeThrottle(NOTICE_INTERVAL_MS);

  constructor(opts: ControlApiOptions, auth: Authenticator, handlers: ControlPlaneHandlers, metrics: Metrics, sink: AuditSink) {
    this.opts = opts;
    this.settings = opts;
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
        requestTimeout: Math.min(opts.connectionTimeoutMs, 30_000),
        // Idle keep-alive connections are closed by the guard (idle_timeout_ms), not by Node's 5 s.
        keepAliveTimeout: 0,
      },
      (req, res) => void this.onRequest(req, res),
    );
    // The https server never listens: the guard accepts, checks and hands connections over.
    this.guard = new ConnectionGuard(this.guardSettings(), (source) => this.auth.sourceAllowed(source), (socket) => this.server.emit('connection', socket), (e) => this.onGuardEvent(e));
    this.server.on('secureConnection', (socket: TLSSocket) => this.guard.secured(socket));
    this.server.on('tlsClientError', (err: Error, socket: TLSSocket) => {
      const reason = tlsReason(err);
      const event = { event_type: 'authentication', action: 'authenticate', result: 'denied', reason, failure_class: 'tls_handshake', peer_addr: socket.remoteAddress ?? null, authn: 'mtls' } as const;
      // A connection closed before its handshake (a flood, a scan, one the guard displaced or timed
      // out) is the generic `handshake` failure: audited at most once a second, not once each.
      if (reason === 'handshake') this.notice('tls_handshake', { peer_addr: event.peer_addr, reason }, 'control API TLS handshake failed', event);
      else this.audit(event);
    });
  }

  /** Binds the configured address and port (tests may pass 0). Resolves with the bound port. */
  listen(port = this.opts.port): Promise<number> {
    return this.guard.listen(this.opts.address, port);
  }

  private guardSettings(): ConstructorParameters<typeof ConnectionGuard>[0] {
    const s = this.settings;
    return { maxConnections: s.maxConnections, maxPerSource: s.maxConnectionsPerSource ?? 32, handshakeTimeoutMs: s.handshakeTimeoutMs ?? 5000, idleTimeoutMs: s.idleTimeoutMs ?? 10_000, lifetimeMs: s.connectionTimeoutMs };
  }

  /** New limits and timeouts (a generation was activated); open connections keep their place. */
  setSettings(settings: ControlApiSettings): void {
    this.settings = settings;
    this.guard.setSettings(this.guardSettings());
    // The reload paths are live too: the next request is matched against the new table.
    this.routes = routeTable(settings.reloadPath ?? this.opts.reloadPath, settings.reloadCertsPath ?? this.opts.reloadCertsPath);
  }

  /** At most one log line and one audit event per kind and second; the line counts what it stood for. */
  private notice(kind: string, fields: Record<string, unknown>, message: string, audit?: Parameters<typeof auditEvent>[0]): void {
    const suppressed = this.notices.admit(kind);
    if (suppressed === undefined) return;
    this.opts.notice?.({ ...fields, suppressed_since_last: suppressed }, message);
    if (audit !== undefined) this.audit(audit);
  }

  private onGuardEvent(e: GuardEvent): void {
    switch (e.kind) {
      case 'source_refused':
        return this.notice('source_refused', { peer_addr: e.source }, 'control API connection refused at accept: source address not allowed', {
          event_type: 'authentication',
          action: 'authenticate',
          result: 'denied',
          reason: 'source_ip_not_allowed',
          failure_class: 'connection',
          peer_addr: e.source,
        });
      case 'dropped':
      case 'evicted':
        this.metrics.gauge('svc_control_api_connection_limit_drops').inc();
        return this.notice(e.kind, { peer_addr: e.source, limit: e.limit }, e.kind === 'dropped' ? 'control API connection dropped: connection limit reached' : 'control API connection displaced by a newer one: connection limit reached');
      case 'timeout':
        return this.notice(`timeout_${e.phase}`, { peer_addr: e.source, phase: e.phase }, `control API connection closed: ${e.phase} timeout`);
    }
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
    await this.guard.close();
    this.server.closeAllConnections();
  }

  private audit(input: Parameters<typeof auditEvent>[0]): AuditEvent | undefined {
    if (!this.settings.auditEnabled) return undefined;
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
    if (declared > this.settings.maxBodyBytes) return 'too_large';
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req) {
      size += (chunk as Buffer).length;
      if (size > this.settings.maxBodyBytes) return 'too_large';
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
    const fields = BODY_FIELDS[action] ?? new Map<string, FieldType>();
    for (const [k, v] of Object.entries(body)) {
      const type = fields.get(k);
      if (type === undefined) return `unknown field '${k.slice(0, 64)}'`;
      // Refused before anything runs or is recorded: a number the history and the state file cannot hold.
      if (type === 'generation' && !isGenerationNumber(v)) return generationProblem(k);
      if (type === 'string' && (typeof v !== 'string' || v.length === 0 || v.length > MAX_FIELD_CHARS)) return `'${k}' must be a non-empty string of at most ${MAX_FIELD_CHARS} characters`;
      // A path is echoed in answers, history and logs: no control characters (NUL included).
      if (k === 'config_path' && /\p{Cc}/u.test(v as string)) return "'config_path' must not contain control characters";
    }
    if (action === 'rollback' && body['target_generation'] === undefined) return "'target_generation' is required";
    return undefined;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const requestId = randomUUID();
    res.setHeader('x-request-id', requestId);
    // The caller's W3C trace context, when it sent one: its audit events carry trace_id and span_id.
    const trace = parseTraceparent(req.headers['traceparent']);
    const corr = { request_id: requestId, ...(trace === undefined ? {} : { trace_id: trace.trace_id, span_id: trace.span_id }) };
    const socket = req.socket as TLSSocket;
    const peer = socket.remoteAddress ?? null;
    this.guard.requestStarted(socket);
    res.once('close', () => this.guard.requestEnded(socket));
    try {
      const path = (req.url ?? '/').split('?')[0] ?? '/';
      const match = matchRoute(this.routes, req.method ?? 'GET', path);
      if (match === 'not_found') return this.fail(res, 404, 'not_found', 'no such control API route');
      if (match === 'method_not_allowed') return this.fail(res, 405, 'method_not_allowed', 'the route does not accept this method');
      const route: RouteDef = match.route;
      // `/admin/runtime/history/N` with N no generation number: refused once the caller may read history.
      const badGeneration = match.generation === undefined && route.action === 'history_generation';
      const decision = this.auth.decide(socket, peer ?? undefined, req.headers.authorization, route.role);
      const authn = decision.ok ? decision.identity.authn : req.headers.authorization !== undefined ? 'bearer' : socket.authorized ? 'mtls' : 'none';
      if (!decision.ok) {
        const type = decision.reason === 'insufficient_role' ? 'authorization' : 'authentication';
        this.audit({
          event_type: type,
          action: type === 'authorization' ? 'authorize' : 'authenticate',
          result: 'denied',
          reason: decision.reason,
          ...corr,
          target: path,
          peer_addr: peer,
          authn,
          ...(decision.identity === undefined ? {} : { actor: { id: decision.identity.actor, roles: [decision.identity.role] } }),
        });
        return this.fail(res, decision.status, decision.reason, decision.status === 401 ? 'authentication required' : 'not permitted', decision.status === 401 ? { 'www-authenticate': 'Bearer' } : {});
      }
      const identity = decision.identity;
      if (route.role !== undefined) {
        this.guard.prove(socket);
        this.audit({ event_type: 'authentication', action: 'authenticate', result: 'succeeded', ...corr, target: path, peer_addr: peer, authn: identity.authn, actor: { id: identity.actor, roles: [identity.role] } });
      }
      if (badGeneration) return this.fail(res, 400, 'invalid_request', generationProblem('N'));
      let body: Record<string, unknown> = {};
      if (route.mutating) {
        const read = await this.readBody(req);
        if (read === 'too_large') return this.fail(res, 413, 'body_too_large', `request bodies are limited to ${this.settings.maxBodyBytes} bytes`, { connection: 'close' });
        if (read === 'invalid') return this.fail(res, 400, 'invalid_request', 'the body must be a JSON object');
        const bad = this.checkFields(route.action, read);
        if (bad !== undefined) return this.fail(res, 400, 'invalid_request', bad);
        body = read;
      } else {
        req.resume();
      }
      const action = ACTION_OF[route.action];
      // The authenticated actor is the record; the body's requested_by is only a note.
      const note = typeof body['requested_by'] === 'string' ? printable(body['requested_by'], MAX_NOTE_CHARS) : undefined;
      const actor = { id: identity.actor, roles: [identity.role], ...(note === undefined ? {} : { requested_by_note: note }) };
      const attempt = action === undefined ? undefined : this.audit({ event_type: 'operation_attempt', action, result: 'attempted', ...corr, target: path, peer_addr: peer, authn: identity.authn, actor });
      const op = operationSignal(this.settings.operationTimeoutMs ?? 30_000);
      // A caller that disconnects before its answer is written has gone: its operation is abandoned.
      res.once('close', () => {
        if (!res.writableFinished) op.callerGone();
      });
      let answer: ApiAnswer;
      try {
        answer = await this.dispatch(route.action, body, identity, match.generation, { signal: op.signal });
      } catch (e) {
        if ((e as { code?: string }).code !== 'EDGE_OPERATION_ABANDONED') throw e;
        answer = abandonedAnswer(e as OperationAbandoned);
        this.metrics.counter('svc_runtime_rejections_total').inc({ reason: answer.reason ?? 'abandoned' });
        this.notice(`abandoned_${answer.reason ?? ''}`, { ...corr, action: action ?? route.action, reason: answer.reason, phase: (e as OperationAbandoned).phase, actor: identity.actor }, 'control operation abandoned: not carried out');
      } finally {
        op.dispose();
      }
      if (action !== undefined) {
        const ok = answer.status < 300;
        this.audit({
          event_type: 'operation_result',
          action,
          result: ok ? 'succeeded' : answer.status >= 500 || answer.abandoned === true ? 'failed' : 'denied',
          ...corr,
          target: path,
          peer_addr: peer,
          authn: identity.authn,
          actor,
          ...(answer.generation === undefined ? {} : { generation: answer.generation }),
          ...(answer.reason === undefined ? {} : { reason: answer.reason }),
          ...(ok ? {} : { failure_class: answer.abandoned === true ? 'abandoned' : answer.status >= 500 ? 'internal' : 'request' }),
          ...(attempt === undefined ? {} : { attempt_event_id: attempt.event_id }),
        });
      }
      this.send(res, answer.status, answer.body);
    } catch {
      this.fail(res, 500, 'internal_error', 'the control plane failed to answer');
    }
  }

  private dispatch(action: RouteAction, body: Record<string, unknown>, identity: Identity, generation: number | undefined, ctx: OperationContext): Promise<ApiAnswer> | ApiAnswer {
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
        return h.validate(body, identity, ctx);
      case 'preview':
        return h.preview(body, identity, ctx);
      case 'activate':
        return h.activate(body, identity, ctx);
      case 'rollback':
        return h.rollback(body, identity, ctx);
      case 'reload':
        return h.reload(body, identity, ctx);
      case 'reload_certs':
        return h.reloadCerts(identity, ctx);
      case 'restart':
        return h.restart(identity);
    }
  }
}
