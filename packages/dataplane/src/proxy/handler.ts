// The request path, one ordered list of phases (docs/request-path.md):
//   admit → validate (one normalized target) → protocol policy → route → select → forward
//   (failover once) → respond → record.
// Both ingresses call `serveRequest`, which admits the request on the runtime active then; the
// request finishes on that runtime even if a new generation is activated meanwhile.
import type { Readable } from 'node:stream';
import { checkProtocolPolicy } from '../policy/protocol-policy.ts';
import { validateRequest } from '../policy/request-validation.ts';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import { startAttempt } from './forward.ts';
import type { AttemptOwner, DownstreamResponse, ForwardOptions, ForwardResult } from './forward.ts';
import { BodyGuard } from './body-guard.ts';
import { requestMetrics } from './request-metrics.ts';
import type { RequestMetrics } from './request-metrics.ts';
import type { InflightToken } from '../balancing/backend-stats.ts';
import type { BackendRuntime, Runtime, UpstreamRuntime } from '../runtime/provision.ts';
import type { RouteResult } from '../routing/router.ts';
import type { BackendRef } from '../balancing/selector.ts';
import { STATUS_CLASSES } from '@edge-proxy/telemetry';
import type { Logger } from '@edge-proxy/telemetry';

/** A downstream request as every ingress presents it. Header names are lower case. */
export interface DownstreamRequest {
  readonly method: string;
  /** Path with query (origin form), or the authority for CONNECT. */
  readonly path: string;
  readonly authority: string | undefined;
  readonly host: string | undefined;
  readonly headers: HeaderMap;
  readonly headerCount: number;
  readonly headerBytes: number;
  readonly remoteAddress: string;
  readonly protocol: '1.1' | '2' | '3';
  readonly ingress: 'quic' | 'bootstrap-h1' | 'bootstrap-h2';
  readonly earlyData: boolean;
  /** QUIC connection id, or `address:port` of the TCP connection (sticky-cid). */
  readonly affinityKey: string;
  readonly upgrade: boolean;
  /** `:scheme` (HTTP/2, HTTP/3); absent on HTTP/1.1. */
  readonly scheme?: string | undefined;
  /** More than one Host field line arrived (see `hostFieldCount`); the request is refused. */
  readonly duplicateHost?: boolean;
  /** The request body; read only when `hasBody`. */
  readonly body: Readable;
  readonly hasBody: boolean;
}

/** What an ingress needs from the worker: the runtime to admit a request on. */
export interface RuntimeSource {
  /** The active runtime, held until `release` is called (requests finish on their generation). */
  acquire(): Runtime;
  release(rt: Runtime): void;
}

/** Name + value bytes of a header section given as flat `rawHeaders` (name, value, ...); its field count is half the length. */
export function headerBytes(raw: readonly string[]): number {
  let bytes = 0;
  for (const s of raw) bytes += s.length;
  return bytes;
}

/**
 * How many `Host` field lines a flat `rawHeaders` list holds. Node's header objects keep the first
 * of two Host lines silently; two are refused (RFC 9112 §3.2: 400).
 */
export function hostFieldCount(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string;
    // Compared by char code with the ASCII case bit set: no lower-cased copy of every name.
    if (name.length === 4 && (name.charCodeAt(0) | 0x20) === 0x68 && (name.charCodeAt(1) | 0x20) === 0x6f && (name.charCodeAt(2) | 0x20) === 0x73 && (name.charCodeAt(3) | 0x20) === 0x74) n++;
  }
  return n;
}

/** The IPv4 address of an IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`); any other address as it is. */
export function unmapIpv4(address: string): string {
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}

/**
 * Admits `req` on the runtime active now, handles it there and releases the runtime when the
 * response is done (phase 1, "admit", for every ingress). A defect answers 502 rather than leave
 * the client hanging. Never throws.
 */
export function serveRequest(runtimes: RuntimeSource, req: DownstreamRequest, res: DownstreamResponse): void {
  let rt: Runtime;
  try {
    rt = runtimes.acquire();
  } catch {
    answerDefect(res, req.method);
    return;
  }
  new Exchange(rt, req, res, runtimes, undefined).start();
}

/** 502 for a defect of ours; if even that cannot be sent, the connection is cut. */
function answerDefect(res: DownstreamResponse, method: string): void {
  try {
    sendError(res, method, 502, 'internal proxy error');
  } catch {
    res.destroy();
  }
}

/**
 * HTTP status class label, one of the catalogue's `STATUS_CLASSES` (its first five are the
 * hundreds, in order: constant strings, none built per request).
 */
export function statusClass(status: number | undefined): string {
  if (status === undefined) return 'unknown';
  if (status >= 100 && status < 600) return STATUS_CLASSES[Math.floor(status / 100) - 1] as string;
  return 'other';
}

const REASON_TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 408: 'Request Timeout', 413: 'Content Too Large', 421: 'Misdirected Request', 425: 'Too Early', 431: 'Request Header Fields Too Large', 501: 'Not Implemented', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/** Answers with a short plain-text error; never includes request data. */
export function sendError(res: DownstreamResponse, method: string, status: number, detail: string, headers: HeaderMap = {}): void {
  if (res.headersSent || res.destroyed) return;
  const body = `${status} ${REASON_TEXT[status] ?? 'Error'}: ${detail}\n`;
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), 'cache-control': 'no-store', ...headers });
  res.end(method === 'HEAD' ? undefined : body);
}

/** Failures after which another backend may be tried: nothing reached the backend's application. */
const FAILOVER_REASONS = new Set(['transport', 'tls', 'connect_timeout']);

/**
 * The pick context of one runtime, reused by every pick on it (a pick is synchronous): the
 * eligibility check is built once per runtime, and the per-request fields are overwritten.
 */
interface PickScratch {
  readonly eligible: (b: BackendRef) => boolean;
  exclude: ReadonlySet<string> | undefined;
  hashKey: string | undefined;
  affinityKey: string | undefined;
}

const PICK_SCRATCH = new WeakMap<Runtime, PickScratch>();

function pickScratch(rt: Runtime): PickScratch {
  let s = PICK_SCRATCH.get(rt);
  if (s === undefined) {
    const limit = rt.config.performance.per_backend_inflight_limit;
    const { health, stats } = rt.deps;
    s = { eligible: (b) => health.eligible(b.key) && stats.inflight(b.key) < limit, exclude: undefined, hashKey: undefined, affinityKey: undefined };
    PICK_SCRATCH.set(rt, s);
  }
  return s;
}

function pickBackend(rt: Runtime, u: UpstreamRuntime, req: DownstreamRequest, exclude: ReadonlySet<string> | undefined): BackendRuntime | undefined {
  const ctx = pickScratch(rt);
  ctx.exclude = exclude;
  ctx.hashKey = requestHashKey(u, req.remoteAddress, req.authority ?? req.host ?? '', req.path, req.headers);
  ctx.affinityKey = req.affinityKey;
  return u.selector.pick(ctx) as BackendRuntime | undefined;
}

function firstValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/** The pool's consistent-hash key for a request; undefined when the pool does not hash (nothing computed). */
export function requestHashKey(u: UpstreamRuntime, clientIp: string, host: string, path: string, headers: HeaderMap): string | undefined {
  return u.hashKey?.({ clientIp, host, path, route: u.name, header: (n) => firstValue(headers[n]) });
}

/** The Host / :authority sent to backend `b` of `u` (its `host_policy`); `downstream` is the client's. */
export function upstreamHost(u: UpstreamRuntime, b: BackendRuntime, downstream: string | undefined): string | undefined {
  const hp = u.config.host_policy;
  if (hp.mode === 'rewrite') return hp.host;
  if (hp.mode === 'backend') return b.port === (b.scheme === 'https' ? 443 : 80) ? b.host : `${b.host}:${b.port}`;
  return downstream;
}

/**
 * One route-decision log line (`observability.routing`): what was asked (method, host, path
 * without the query string, which may carry credentials) and what was decided.
 */
function logRouteDecision(log: Logger, req: DownstreamRequest, route: RouteResult, includeReason: boolean, generation: number): void {
  const q = req.path.indexOf('?');
  log.info(
    {
      generation,
      method: req.method,
      host: req.authority ?? req.host ?? null,
      path: q === -1 ? req.path : req.path.slice(0, q),
      protocol: req.protocol,
      decision: route.kind,
      route: route.kind === 'match' ? route.upstream : null,
      ...(includeReason && route.kind === 'match' ? { reason: route.reason } : {}),
    },
    'route decision',
  );
}

/**
 * Handles one request on runtime `rt`, then gives `rt` back to `runtimes` if given. The promise
 * settles when the request is over; it never rejects.
 */
export function handleRequest(rt: Runtime, req: DownstreamRequest, res: DownstreamResponse, runtimes?: RuntimeSource): Promise<void> {
  return new Promise((resolve) => {
    new Exchange(rt, req, res, runtimes, resolve).start();
  });
}

/**
 * One request on one runtime, phase after phase (docs/request-path.md). An object with methods
 * rather than an async function: the attempt reports back by calling `attemptDone`, so a request
 * costs no promise, no suspended frame and no microtask turn. Every entry point (`start`,
 * `attemptDone`, the failover turn) catches defects, and `finish` runs exactly once.
 */
class Exchange implements AttemptOwner {
  private readonly rt: Runtime;
  /** The request; replaced by its normalized form in `route` when validation rewrites it. */
  private req: DownstreamRequest;
  private readonly res: DownstreamResponse;
  private readonly runtimes: RuntimeSource | undefined;
  private readonly onDone: (() => void) | undefined;
  private readonly rm: RequestMetrics;
  private readonly started = performance.now();
  /** Set by `route` once the request has an upstream. */
  private u: UpstreamRuntime | undefined;
  private body: Readable | null = null;
  private attempts = 0;
  private attempt = 0;
  /** Backends tried by this request; built only if there is a second attempt. */
  private tried: Set<string> | undefined;
  /** The backend of the attempt in flight, its in-flight token and start time. */
  private backend: BackendRuntime | undefined;
  private token: InflightToken | undefined;
  private t0 = 0;
  private result: ForwardResult | undefined;
  /** When the last attempt ended (the end of the exchange: what follows is bookkeeping). */
  private ended = 0;
  private failed = true;
  private finished = false;

  constructor(rt: Runtime, req: DownstreamRequest, res: DownstreamResponse, runtimes: RuntimeSource | undefined, onDone: (() => void) | undefined) {
    this.rt = rt;
    this.req = req;
    this.res = res;
    this.runtimes = runtimes;
    this.onDone = onDone;
    this.rm = requestMetrics(rt.deps.metrics);
  }

  start(): void {
    this.rm.requests.inc();
    try {
      if (this.route()) {
        this.nextAttempt();
        return;
      }
    } catch (err) {
      this.defect(err);
    }
    this.finish();
  }

  /**
   * Validation (the normalized target replaces the request's), protocol policy, route and body
   * limit. True when the request goes upstream; false when it was answered here.
   */
  private route(): boolean {
    const { rt, res } = this;
    const m = rt.deps.metrics;
    const valid = validateRequest(this.req, rt.protocol.allowed_methods);
    if (valid.kind === 'reject') {
      m.counter('svc_request_validation_rejects').inc();
      sendError(res, this.req.method, valid.status, valid.reason.replace(/_/g, ' '));
      return false;
    }
    if (valid.kind === 'options') {
      // RFC 9110 §9.3.7: `OPTIONS *` asks about the server, not a resource: the proxy answers.
      res.writeHead(200, { allow: valid.allow, 'content-length': '0' });
      res.end();
      this.failed = false;
      return false;
    }
    if (valid.kind === 'rewrite') this.req = { ...this.req, path: valid.path, authority: valid.authority, host: valid.host };
    const req = this.req;
    const verdict = checkProtocolPolicy(rt.protocol, req);
    if (!verdict.ok) {
      m.counter(verdict.reason.startsWith('header') || verdict.reason === 'authority_host_mismatch' || verdict.reason === 'connect_target' || verdict.reason === 'upgrade_not_supported' ? 'svc_request_validation_rejects' : 'svc_policy_denied').inc();
      if (verdict.status === 425) m.counter('svc_early_data_rejected').inc();
      sendError(res, req.method, verdict.status, verdict.reason.replace(/_/g, ' '), verdict.allow === undefined ? {} : { allow: verdict.allow.join(', ') });
      return false;
    }
    if (req.earlyData) m.counter('svc_early_data_accepted').inc();
    const route = rt.router.resolve(req.authority ?? req.host, req.path, req.method);
    const routing = rt.config.observability.routing;
    if (routing.enabled && rt.deps.log !== undefined) logRouteDecision(rt.deps.log, req, route, routing.include_reason, rt.generation);
    if (route.kind !== 'match') {
      if (route.kind === 'method_not_allowed') sendError(res, req.method, 405, 'no route accepts this method', { allow: route.allowed.join(', ') });
      else sendError(res, req.method, 404, 'no route matches this host and path');
      return false;
    }
    const u = rt.upstreams.get(route.upstream) as UpstreamRuntime;
    const maxBody = rt.config.performance.body.max_request_body_bytes;
    const declared = Number(firstValue(req.headers['content-length']) ?? NaN);
    if (maxBody > 0 && declared > maxBody) {
      m.counter('svc_request_buffer_limit_rejects').inc();
      sendError(res, req.method, 413, 'request body larger than the limit', { connection: 'close' });
      return false;
    }
    this.u = u;
    const t = rt.config.performance.timeouts;
    this.body = req.hasBody ? req.body.pipe(new BodyGuard(maxBody, { idleMs: t.client_body_idle_ms, totalMs: t.client_body_total_ms, minBytesPerSec: rt.config.performance.body.client_body_min_bytes_per_s })) : null;
    this.attempts = req.hasBody ? 1 : Math.min(2, u.backends.length);
    return true;
  }

  /** Picks a backend and starts an attempt on it; with none left, answers with what there is. */
  private nextAttempt(): void {
    const { rt, req, res } = this;
    const u = this.u as UpstreamRuntime;
    const b = pickBackend(rt, u, req, this.tried);
    if (b === undefined) {
      this.respond();
      this.finish();
      return;
    }
    if (this.attempt + 1 < this.attempts) (this.tried ??= new Set()).add(b.key);
    if (this.attempt > 0) {
      const m = rt.deps.metrics;
      m.counter('svc_retries_total').inc();
      m.counter('svc_retry_attempts_total').inc({ reason: this.result?.reason ?? 'unknown' });
    }
    const options: ForwardOptions = {
      pool: rt.deps.pools.get(b.pool),
      method: req.method,
      path: req.path,
      headers: upstreamRequestHeaders(req.headers, req, upstreamHost(u, b, req.authority ?? req.host), req.upgrade),
      body: this.body,
      headersTimeout: u.timeouts.requestMs,
      bodyTimeout: u.timeouts.bodyIdleMs,
      bodyTotalMs: u.timeouts.bodyTotalMs,
      sendIdleMs: rt.config.performance.timeouts.client_send_idle_ms,
      backendProtocol: b.scheme === 'https' ? '2' : '1.1',
      servername: b.scheme === 'https' ? (b.pool.tls?.serverName ?? b.host) : undefined,
    };
    // From here on `attemptDone` is called exactly once, and it ends the in-flight token.
    this.backend = b;
    this.token = rt.deps.stats.begin(b.key);
    this.t0 = performance.now();
    startAttempt(res, options, this);
  }

  /** The attempt in flight ended (called by the attempt, possibly inside undici's callbacks). */
  attemptDone(result: ForwardResult): void {
    try {
      const { rt } = this;
      const u = this.u as UpstreamRuntime;
      const b = this.backend as BackendRuntime;
      const stats = rt.deps.stats;
      stats.end(this.token as InflightToken);
      this.ended = performance.now();
      this.result = result;
      this.attempt++;
      if (result.health !== undefined) rt.deps.health.passive(b.key, result.health);
      if (result.outcome === 'success') stats.observe(b.key, this.ended - this.t0, this.ended);
      if (result.outcome === 'timeout') rt.deps.metrics.counter('svc_backend_timeouts').inc();
      if (result.outcome === 'backend_error') rt.deps.metrics.counter('svc_backend_errors').inc();
      this.rm.backend(u, b, statusClass(result.status), result.outcome).inc();
      if (!result.responseStarted && FAILOVER_REASONS.has(result.reason ?? '') && this.attempt < this.attempts) {
        // The next attempt starts on a later turn, outside the failed attempt's undici callbacks.
        queueMicrotask(() => this.failover());
        return;
      }
      this.respond();
    } catch (err) {
      this.defect(err);
    }
    this.finish();
  }

  private failover(): void {
    try {
      this.nextAttempt();
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /** Answers what the attempts left unanswered, and records the upstream outcome. */
  private respond(): void {
    const { req, res, result } = this;
    const u = this.u as UpstreamRuntime;
    if (result === undefined) {
      sendError(res, req.method, 503, `no healthy backend for route ${u.name}`, { 'retry-after': '1' });
      this.rm.upstream(u, '5xx', 'backend_error').inc();
      this.logFailure(u, 503, 'no_healthy_backend');
      return;
    }
    // An HTTP/1.1 client cut for a slow body may still be sending it: close the connection rather
    // than read the rest (RFC 9110 §15.5.9).
    if (!result.responseStarted && result.status !== undefined) {
      sendError(res, req.method, result.status, (result.reason ?? 'upstream failure').replace(/_/g, ' '), result.status === 408 && req.protocol === '1.1' ? { connection: 'close' } : {});
      if (result.status === 502 || result.status === 504) this.logFailure(u, result.status, result.reason ?? 'unknown');
    }
    if (result.reason === 'request_too_large') this.rt.deps.metrics.counter('svc_request_buffer_limit_rejects').inc();
    const outcome = result.outcome;
    this.rm.upstream(u, statusClass(result.status), outcome).inc();
    const elapsed = this.ended - this.started;
    this.rm.latency(u, outcome).observe(elapsed);
    if (outcome === 'success') this.rt.deps.routeLatency.observe(u.name, elapsed, this.ended);
    this.failed = outcome !== 'success' || (result.status ?? 500) >= 500;
  }

  /** The 502, 503 or 504 just answered, to the throttled failure log (failure-log.ts). */
  private logFailure(u: UpstreamRuntime, status: number, code: string): void {
    const end = this.ended === 0 ? performance.now() : this.ended;
    this.rt.deps.failures?.note({ upstream: u.name, backend: this.backend?.id, status, code, durationMs: end - this.started, generation: this.rt.generation });
  }

  /**
   * A defect in our code: answer 502 rather than leave the client hanging, and report it (the
   * supervisor counts these as svc_runtime_panics).
   */
  private defect(err: unknown): void {
    this.failed = true;
    try {
      this.rt.deps.onPanic?.(err);
    } catch {
      // Reporting failed too; the client still gets its answer.
    }
    answerDefect(this.res, this.req.method);
  }

  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    (this.failed ? this.rm.failure : this.rm.success).inc();
    this.runtimes?.release(this.rt);
    this.onDone?.();
  }
}
