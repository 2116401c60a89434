// The request path as an ordered list of phases over one typed per-request context
// (docs/request-path.md; the model is Pingora's `ProxyHttp` phases and Envoy's filter chain):
//
//   admit → protocol policy → route → [authenticate] → [limit] → shed → select → forward → respond → record
//
// `admit` (acquire the active runtime) is the ingress's call to `serveRequest`; `protocol` and
// `route` are the runtime's prelude, the same for every request; the rest is the route's own list,
// built once per route when a generation is provisioned (`routePhases`), with only the phases the
// route's configuration needs (no brownout phase when brownout is off, no `authenticate` for a
// pool without `auth`, no `limit` without rate limits or quota). `record` runs in `finish`,
// exactly once, whatever ended the request.
//
// Phases are plain functions run synchronously, one after the other, by `RequestContext.run`: a
// request costs no promise. A phase returns NEXT to go on, or STOP when it answered the request
// or handed it to something that resumes it later (the forwarding attempt's callback, the route
// queue). Both ingress paths run these phases: `Exchange` (proxy/handler.ts) for requests and
// `UpgradeExchange` (ingress/upgrade.ts) for HTTP/1.1 Upgrade, which differ only in how they
// forward and how they answer.
import { checkProtocolPolicy } from '../policy/protocol-policy.ts';
import type { PolicyReason } from '../policy/protocol-policy.ts';
import { validateRequest } from '../policy/request-validation.ts';
import { canonicalContentLength } from '../policy/content-length.ts';
import type { ValidationReason } from '../policy/request-validation.ts';
import { ERR } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { InflightToken } from '../balancing/backend-stats.ts';
import type { BackendRef } from '../balancing/selector.ts';
import type { BackendRuntime, Runtime, UpstreamRuntime } from '../runtime/provision.ts';
import type { RouteResult } from '../routing/router.ts';
import type { DownstreamRequest } from './handler.ts';
import { requestMetrics, statusClass } from './request-metrics.ts';
import type { RequestMetrics } from './request-metrics.ts';
import type { ForwardResult } from './forward.ts';
import { parseTraceparent } from '@edge-proxy/telemetry';
import type { Logger, RequestFacts, RequestSpan } from '@edge-proxy/telemetry';
import { requestIdOf } from './request-id.ts';
import { AccessLog } from './access-log.ts';
import { shedReason } from '../resilience/overload-control.ts';
import type { QueueScope, Waiter } from '../resilience/overload-control.ts';
import type { Lease } from '../resilience/lease.ts';
import type { QueueSlot } from '../resilience/route-queue.ts';
import type { PlaceVerdict, Places } from '../resilience/queue-places.ts';
import { RETRY_METHODS } from '../resilience/retry-control.ts';
import type { CompiledLimit } from '../resilience/rate-limit.ts';
import { PENDING as LEASE_PENDING, UNAVAILABLE as LEASE_UNAVAILABLE } from '../resilience/token-lease.ts';
import type { KeySource } from '../balancing/request-key.ts';
import type { CompiledPolicy, QuotaVerdict } from '../resilience/quota/index.ts';
import { PENDING } from '../auth/request-auth.ts';
import type { AuthRequest, AuthVerdict, RouteAuth } from '../auth/request-auth.ts';

/** Go on with the next phase. */
export const NEXT = 0;
/** Stop running phases: the request was answered, or something resumes it later. */
export const STOP = 1;
export type PhaseResult = typeof NEXT | typeof STOP;

/** One phase of the request path. */
export type Phase = (x: RequestContext) => PhaseResult;

/** A route's phases, from `shed` on, and where a request admitted from the queue resumes. */
export interface RoutePhases {
  readonly list: readonly Phase[];
  /** Index of the first phase after `select` (a request admitted from the route queue holds its slots and backend). */
  readonly afterSelect: number;
  /** Index of `admission` (a request whose lease wait for a backend slot ended runs admission and select again). */
  readonly admitAt: number;
}

/** Body detail of a validation rejection: its reason in words (`invalid target character`). */
function words(reason: string): string {
  return reason.replace(/_/g, ' ');
}

/** The error of a validation rejection. */
export function validationError(reason: ValidationReason): RequestError {
  switch (reason) {
    case 'unsupported_transfer_coding':
      return ERR.EDGE_REQUEST_UNSUPPORTED_CODING;
    case 'invalid_scheme':
    case 'invalid_authority':
    case 'duplicate_host':
    case 'invalid_header_value':
    case 'invalid_content_length':
      return ERR.EDGE_REQUEST_INVALID_HEADER;
    default:
      return ERR.EDGE_REQUEST_INVALID_TARGET;
  }
}

/** The error of a protocol-policy rejection. */
export function policyError(reason: PolicyReason): RequestError {
  switch (reason) {
    case 'header_count':
    case 'header_bytes':
      return ERR.EDGE_REQUEST_HEADERS_TOO_LARGE;
    case 'authority_host_mismatch':
      return ERR.EDGE_REQUEST_AUTHORITY_MISMATCH;
    case 'method_not_allowed':
    case 'connect_disabled':
      return ERR.EDGE_POLICY_METHOD_NOT_ALLOWED;
    case 'denied_path':
      return ERR.EDGE_POLICY_PATH_DENIED;
    case 'upgrade_not_supported':
      return ERR.EDGE_REQUEST_UPGRADE_UNSUPPORTED;
    case 'early_data_unsafe':
      return ERR.EDGE_POLICY_TOO_EARLY;
  }
}

function firstValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
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
function logRouteDecision(log: Logger, req: DownstreamRequest, route: RouteResult, includeReason: boolean, generation: number, requestId: string): void {
  const q = req.path.indexOf('?');
  log.info(
    {
      request_id: requestId,
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

/** A picked backend, its in-flight token (undefined once ended) and whether the attempt is a breaker probe. */
export interface Selection {
  readonly backend: BackendRuntime | undefined;
  token: InflightToken | undefined;
  readonly probe: boolean;
}

/** Why a pick found no backend: every usable one at its in-flight limit, breakers, or health. */
type NoBackend = 'busy' | 'circuit_open' | 'unhealthy';

/**
 * One request on one runtime, as every phase sees it. Subclasses say how the request is forwarded
 * and answered; everything else (policy, routing, admission, queueing, selection, the slots and
 * their release) is here, once. `finish` runs exactly once and releases whatever is still held.
 */
export abstract class RequestContext implements Waiter {
  readonly rt: Runtime;
  /** The request; replaced by its normalized form in `protocol` when validation rewrites it. */
  req: DownstreamRequest;
  readonly started = performance.now();
  /** Set by `route`. */
  u: UpstreamRuntime | undefined;
  /** The backend picked by `select` for the attempt in flight, its in-flight token, and whether it is a breaker probe. */
  backend: BackendRuntime | undefined;
  token: InflightToken | undefined;
  probe = false;
  /**
   * Backends tried by this request: the first one's key, and the set of all of them, built only
   * when a second attempt picks (most requests make one: no set for them).
   */
  private firstTried: string | undefined;
  private tried: Set<string> | undefined;
  /** Attempts allowed (1 for a request that is never retried), and attempts started. */
  attempts = 1;
  attempt = 0;
  /** Slots held: the global in-flight slot and the upstream's. */
  private holdsGlobal = false;
  private holdsUpstream = false;
  /** The upstream slot held is a leased one (false while `per_upstream_inflight_limit` cannot bind: OverloadControl.upstreamBinds). */
  private upstreamLeased = false;
  /** The phases being run and the next one's index. */
  private phases: readonly Phase[];
  private index = 0;
  /** Route queue bookkeeping (Waiter): the route, when it was queued, what it waits for, and the queue's own slot. */
  route = '';
  queuedAt = 0;
  scope: QueueScope = 'global';
  queueSlot: QueueSlot | null = null;
  /** The node's queue places held while queued (OverloadControl sets and clears it: docs/overload.md "Queue caps"). */
  queuePlaces: Places | undefined = undefined;
  /**
   * Lease bookkeeping: the lease this request counts itself on while it waits (the worker's
   * standing need for that budget), whether it waits for its lease to be topped up (a lease wait,
   * not a route queue), the lease's ask count when it started waiting on it, and whether the
   * node answered that it has no slot for it.
   */
  private waitsOn: Lease | undefined = undefined;
  /** Queued for a backend: counted in the standing need of every leased backend of its pool. */
  private waitsOnPool = false;
  /**
   * Backends the node has no slot for, for this request (its lease wait for each was answered
   * `exhausted`): its next picks pass them over until it is queued. Built only then.
   */
  private busy: Set<string> | undefined = undefined;
  /** The backend the last pick chose whose lease held no idle slot (`pickBackend` returned false for it). */
  private shortBackend: BackendRuntime | undefined = undefined;
  /** The backend whose slot this request's lease wait is for (undefined: none, or a global or upstream slot). */
  private waitBackend: BackendRuntime | undefined = undefined;
  /** Its lease wait is decided so that admission and selection run again (onAdmit). */
  private again = false;
  private inLeaseWait = false;
  private leaseSince = 0;
  private leaseDenied = false;
  protected readonly rm: RequestMetrics;
  /** Whether the request counts as failed (`svc_requests_failure`) when it is recorded. */
  protected failed = true;
  protected finished = false;
  /** The request's id (proxy/request-id.ts): the client's `x-request-id` when kept, else generated. */
  readonly requestId: string;
  /** The request's server span, when tracing is on (started once the request is validated). */
  span: RequestSpan | undefined;
  /**
   * What the request came to, for its access log line and span (`facts`): the status answered
   * (0: none), the response body bytes sent, the error answered or failed with, why, and the
   * `outcome` label recorded.
   */
  protected status = 0;
  protected bytesOut = 0;
  protected error: RequestError | undefined;
  reason: string | undefined;
  protected outcome = 'success';
  /** Whether the request passed validation (its target is normalized and clean). */
  private validated = false;

  constructor(rt: Runtime, req: DownstreamRequest) {
    this.rt = rt;
    this.req = req;
    this.phases = rt.prelude;
    this.rm = requestMetrics(rt.deps.metrics);
    this.requestId = requestIdOf(req.headers['x-request-id'], rt.config.observability.request_id.accept_incoming);
  }

  // --- what an ingress path provides --------------------------------------------------------

  /** Answers `err` downstream (status, `detail` or the error's own, extra headers); never throws. */
  protected abstract answer(err: RequestError, detail: string | undefined, headers: HeaderMap | undefined): void;
  /** Phase `forward`: starts the attempt on `this.backend`; STOP (the attempt resumes the exchange). */
  abstract forward(): PhaseResult;
  /** Phase `respond`: answers what the attempt left unanswered and records the upstream outcome. */
  abstract respond(): PhaseResult;
  /** Gives the runtime back (and tells whoever waits for the request), after it is recorded. */
  protected abstract done(): void;
  /** Answers 502 for a defect of ours, or cuts the connection if even that cannot be sent. */
  protected abstract answerDefect(): void;
  /** The request's route phases (the upgrade path has its own `forward`). */
  protected abstract routePhases(u: UpstreamRuntime): RoutePhases;
  /** Watches for the client going away while the request waits in a queue (and stops watching). */
  protected abstract watchAbandon(on: boolean): void;

  // --- the runner ---------------------------------------------------------------------------

  /** Runs phases from the current one until one stops. Catches defects: the client gets a 502. */
  run(): void {
    try {
      const phases = this.phases;
      while (this.index < phases.length) {
        const phase = phases[this.index++] as Phase;
        if (phase(this) === STOP) return;
        // `route` switched to the route's list.
        if (this.phases !== phases) {
          this.run();
          return;
        }
      }
      this.finish();
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /** Continues at phase `index` of the current list (a failover goes back to `select`). */
  resumeAt(index: number): void {
    this.index = index;
    this.run();
  }

  /** Answers `err` and finishes: the phase then returns STOP. */
  fail(err: RequestError, detail?: string, headers?: HeaderMap): PhaseResult {
    this.count(err);
    this.error = err;
    this.outcome = err.outcome;
    this.reason ??= shedReason(err);
    this.answer(err, detail, headers);
    this.finish();
    return STOP;
  }

  /** The counters of an error by its class (metrics read the class, never the message). */
  protected count(err: RequestError): void {
    const m = this.rt.deps.metrics;
    switch (err.class) {
      case 'malformed':
        m.counter('svc_request_validation_rejects').inc();
        return;
      case 'policy':
        m.counter('svc_policy_denied').inc();
        if (err === ERR.EDGE_POLICY_TOO_EARLY) m.counter('svc_early_data_rejected').inc();
        return;
      case 'client':
        if (err === ERR.EDGE_REQUEST_BODY_TOO_LARGE) m.counter('svc_request_buffer_limit_rejects').inc();
        return;
      case 'overload':
        this.rt.deps.overload.countShed(err);
        return;
      case 'auth':
        // Counted by the authenticate phase, with its reason (svc_jwt_validation_failures_total, svc_external_auth_*).
        return;
      case 'limited':
        // A quota denial is counted by the quota control, with its policy and reason.
        if (err === ERR.EDGE_RATE_LIMITED) m.counter('svc_request_rate_limited').inc();
        return;
      default:
        return;
    }
  }

  /** Switches to the route's phases (called by `route`). */
  private enterRoute(u: UpstreamRuntime): void {
    this.u = u;
    this.route = u.name;
    // Idempotent requests may be tried again (docs/retries.md); upgrades and other methods never.
    this.attempts = this.req.upgrade || !RETRY_METHODS.has(this.req.method) ? 1 : u.retry.maxAttempts;
    this.phases = this.routePhases(u).list;
    this.index = 0;
  }

  // --- phases shared by every ingress path --------------------------------------------------

  /** Phase `protocol`: validation (one normalized target) and protocol policy. */
  static protocol(x: RequestContext): PhaseResult {
    const { rt } = x;
    const valid = validateRequest(x.req, rt.protocol.allowed_methods);
    if (valid.kind === 'reject') {
      x.reason = valid.reason;
      return x.fail(validationError(valid.reason), words(valid.reason));
    }
    // The target is clean from here on (normalized when validation rewrote it): the span starts.
    x.validated = true;
    if (valid.kind === 'rewrite') x.req = { ...x.req, path: valid.path, authority: valid.authority, host: valid.host };
    if (rt.deps.tracer !== undefined) x.startSpan();
    if (valid.kind === 'options') return x.options(valid.allow);
    const req = x.req;
    const verdict = checkProtocolPolicy(rt.protocol, req);
    if (!verdict.ok) {
      x.reason = verdict.reason;
      return x.fail(policyError(verdict.reason), words(verdict.reason), verdict.allow === undefined ? undefined : { allow: verdict.allow.join(', ') });
    }
    if (req.earlyData) rt.deps.metrics.counter('svc_early_data_accepted').inc();
    return NEXT;
  }

  /** `OPTIONS *`, answered by the proxy (RFC 9110 §9.3.7); the upgrade path refuses it. */
  protected abstract options(allow: string): PhaseResult;

  /** Phase `route`: host, path and method to a pool; then the pool's declared body limit. */
  static route(x: RequestContext): PhaseResult {
    const { rt, req } = x;
    const route = rt.router.resolve(req.authority ?? req.host, req.path, req.method);
    const routing = rt.config.observability.routing;
    if (routing.enabled && rt.deps.log !== undefined) logRouteDecision(rt.deps.log, req, route, routing.include_reason, rt.generation, x.requestId);
    if (route.kind !== 'match') {
      x.reason = route.kind;
      if (route.kind === 'method_not_allowed') return x.fail(ERR.EDGE_ROUTE_METHOD_NOT_ALLOWED, undefined, { allow: route.allowed.join(', ') });
      return x.fail(ERR.EDGE_ROUTE_NOT_FOUND);
    }
    const maxBody = rt.config.performance.body.max_request_body_bytes;
    const declared = Number(canonicalContentLength(req.headers['content-length']) ?? NaN);
    if (maxBody > 0 && declared > maxBody) return x.fail(ERR.EDGE_REQUEST_BODY_TOO_LARGE, undefined, { connection: 'close' });
    x.enterRoute(rt.upstreams.get(route.upstream) as UpstreamRuntime);
    return NEXT;
  }

  /** What the request keys of rate limits, quota and consistent hashing read (built on first use). */
  private source: KeySource | undefined;

  keySource(): KeySource {
    if (this.source !== undefined) return this.source;
    const req = this.req;
    const headers = req.headers;
    this.source = { clientIp: req.remoteAddress, host: req.authority ?? req.host ?? '', path: req.path, route: this.route, header: (n) => firstValue(headers[n]) };
    return this.source;
  }

  /**
   * Phase `authenticate` (docs/auth.md): the pool's JWT check, then its external authorization,
   * on the normalized request; resumes with the verdict (a token verified, maybe keys awaited, a
   * call to the authorization service). The request holds no slot while it waits. A token the
   * verification cache knows is decided at once, without a promise.
   */
  static authenticate(x: RequestContext): PhaseResult {
    const control = x.rt.deps.auth;
    const auth = (x.u as UpstreamRuntime).auth as RouteAuth;
    const now = control.decideNow(auth, x.req.headers);
    if (now === PENDING) {
      control.check(auth, x.authRequest(), (v) => x.resume(v));
      return STOP;
    }
    return now === undefined ? NEXT : x.fail(now.error, undefined, now.headers);
  }

  /** What authentication reads of the request: the normalized method, path and host, and its headers. */
  private authRequest(): AuthRequest {
    const req = this.req;
    const headers = req.headers;
    return { method: req.method, path: req.path, host: req.authority ?? req.host ?? '', clientAddress: req.remoteAddress, headers, header: (n) => firstValue(headers[n]) };
  }

  /**
   * Resumes a request that waited for a verdict (authentication, quota): the next phase, or the
   * verdict's answer; a client gone meanwhile just finishes. Never throws.
   */
  private resume(verdict: AuthVerdict): void {
    if (this.finished) return;
    try {
      if (this.gone()) {
        this.finish();
        return;
      }
      if (verdict === undefined) this.run();
      else {
        this.reason = verdict.reason;
        this.fail(verdict.error, undefined, verdict.headers);
      }
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /**
   * Phase `limit` (scoped rate limits): a token from each of the route's limits, or 429. The tokens
   * are the node's, leased: spent at once while this worker's lease of the key holds one, else the
   * request waits for the supervisor's answer (one round trip, at most `LEASE_WAIT_MS`; past it,
   * 503 `lease_unavailable`).
   */
  static rateLimit(x: RequestContext): PhaseResult {
    const limits = (x.u as UpstreamRuntime).limits.rate;
    const limiter = x.rt.deps.limiter;
    const wait = limiter.take(limits, x.keySource(), performance.now());
    if (wait === 0) return NEXT;
    if (wait === LEASE_PENDING) {
      limiter.wait(limits, x.keySource(), (v) => x.rateDecided(v));
      return STOP;
    }
    if (wait === LEASE_UNAVAILABLE) return x.shed(ERR.EDGE_SHED_LEASE_UNAVAILABLE);
    return x.fail(ERR.EDGE_RATE_LIMITED, undefined, { 'retry-after': String(wait) });
  }

  /** The supervisor answered a request waiting for rate-limit tokens (or did not in time). Never throws. */
  private rateDecided(v: number): void {
    if (v === 0) this.resume(undefined);
    else if (v === LEASE_UNAVAILABLE) this.resume({ error: ERR.EDGE_SHED_LEASE_UNAVAILABLE, headers: { 'retry-after': String(this.rt.config.resilience.route_queue.shed_retry_after_seconds) } });
    else this.resume({ error: ERR.EDGE_RATE_LIMITED, headers: { 'retry-after': String(v) } });
  }

  /** Phase `limit` (quota): asks the quota store and resumes with its verdict (a round trip to Redis). */
  static quota(x: RequestContext): PhaseResult {
    x.rt.deps.quota.check((x.u as UpstreamRuntime).limits.quota, x.keySource(), (v) => x.quotaDecided(v));
    return STOP;
  }

  /**
   * The quota's verdict: go on with the next phase, or 429; or, when the node's counters could not
   * be asked (the supervisor left the lease unanswered past LEASE_WAIT_MS), 503
   * `lease_unavailable`, a shed like every other limit's: the client did not exceed anything.
   * Never throws.
   */
  private quotaDecided(v: QuotaVerdict): void {
    if (v.allowed) this.resume(undefined);
    else if (v.reason === 'lease_unavailable') this.resume({ error: ERR.EDGE_SHED_LEASE_UNAVAILABLE, headers: { 'retry-after': String(this.rt.config.resilience.route_queue.shed_retry_after_seconds) } });
    else this.resume({ error: ERR.EDGE_QUOTA_EXCEEDED, headers: { 'retry-after': String(v.retryAfterS) }, reason: v.reason });
  }

  /** Whether the client went away (checked when the request resumes after waiting for something). */
  protected gone(): boolean {
    return false;
  }

  /** Phase `shed` (brownout), for a route in `core_routes`: samples the state, never sheds. */
  static brownoutSample(x: RequestContext): PhaseResult {
    x.rt.deps.overload.brownoutSample(x.rt);
    return NEXT;
  }

  /** Phase `shed` (brownout), for a route not in `core_routes`: sheds while brownout is active. */
  static brownoutShed(x: RequestContext): PhaseResult {
    if (x.rt.deps.overload.brownoutSample(x.rt)) return x.shed(ERR.EDGE_SHED_BROWNOUT);
    return NEXT;
  }

  /**
   * Phase `shed` (admission): a global slot (the adaptive limit, or `global_inflight_limit`) and
   * one of the upstream's; when either is full, or earlier requests of the route wait, the request
   * waits in its route's queue.
   */
  static admission(x: RequestContext): PhaseResult {
    const ov = x.rt.deps.overload;
    if (ov.hasWaiters(x.route)) return x.wait('global');
    const full = x.takeSlots();
    return full === undefined ? NEXT : x.short(full);
  }

  /**
   * A slot of `scope` is missing. When its lease is empty, the request waits for the supervisor's
   * answer to the worker's ask (a lease wait: a slot may be free elsewhere on the node); else, or
   * once the node answered it has none, it waits in its route's queue or is refused there. A
   * supervisor that left the ask unanswered past LEASE_WAIT_MS: 503 `lease_unavailable`.
   */
  private short(scope: QueueScope): PhaseResult {
    const l = this.rt.deps.overload.leaseShort(this.rt, scope, (this.u as UpstreamRuntime).inflight);
    if (l === undefined) return this.wait(scope);
    return this.leaseWait(scope, l);
  }

  /** Waits for the answer to its worker's ask of `l` (a lease wait), or 503 `lease_unavailable` when an ask of it is unanswered past LEASE_WAIT_MS. */
  private leaseWait(scope: QueueScope, l: Lease): PhaseResult {
    const ov = this.rt.deps.overload;
    if (ov.leaseUnavailable(l)) return this.shed(ERR.EDGE_SHED_LEASE_UNAVAILABLE);
    this.scope = scope;
    this.inLeaseWait = true;
    this.waitingOn(l);
    ov.enqueueLease(this);
    this.watchAbandon(true);
    return STOP;
  }

  /** The lease a wait for `scope` counts on (a wait for a backend counts on its pool's: `waitingForBackend`). */
  private leaseFor(scope: QueueScope): Lease | undefined {
    return scope === 'global' ? this.rt.deps.overload.globalLease : scope === 'upstream' ? (this.u as UpstreamRuntime).inflight : undefined;
  }

  /** Counts this waiter on `l` (and off the lease it counted on). */
  private waitingOn(l: Lease | undefined): void {
    if (this.waitsOnPool) this.countOnPool(false);
    if (l === this.waitsOn) return;
    this.rt.deps.overload.countWaiting(this.waitsOn, l);
    this.waitsOn = l;
    if (l !== undefined) this.leaseSince = l.asked;
  }

  /**
   * Counts this waiter, queued for a backend, in the standing need of every leased backend of its
   * pool (and off any other lease): a slot of any of them freed on any worker may admit it.
   */
  private waitingForBackend(): void {
    if (this.waitsOnPool) return;
    this.waitingOn(undefined);
    this.countOnPool(true);
  }

  private countOnPool(on: boolean): void {
    this.waitsOnPool = on;
    const ov = this.rt.deps.overload;
    for (const b of (this.u as UpstreamRuntime).backends) if (b.inflight !== undefined) ov.countWaiting(on ? undefined : b.inflight, on ? b.inflight : undefined);
  }

  /**
   * Phase `select`: a backend by the pool's strategy among those healthy, under their in-flight
   * limit and allowed by their circuit breaker. None at all because every usable one is busy: the
   * request waits; because of breakers: 503 `circuit_open`; else 503 no healthy backend. (A
   * retry picks its backend when it is granted, and resumes after this phase.)
   */
  static select(x: RequestContext): PhaseResult {
    if (x.pickBackend(undefined, true)) return NEXT;
    const short = x.shortBackend;
    if (short !== undefined) {
      // The node may have a slot of the backend picked: the request waits for its worker's ask, holding nothing.
      x.releaseSlots(false);
      x.waitBackend = short;
      return x.leaseWait('backend', short.inflight as Lease);
    }
    const why = x.whyNoBackend();
    if (why === 'busy') {
      x.releaseSlots(false);
      // The node has no slot for any usable backend: the route's queue decides (its head picks afresh).
      x.busy = undefined;
      return x.wait('backend');
    }
    x.releaseSlots(true);
    if (why === 'circuit_open') return x.shed(ERR.EDGE_SHED_CIRCUIT_OPEN);
    x.reason = 'no_healthy_backend';
    return x.fail(ERR.EDGE_NO_HEALTHY_BACKEND, `no healthy backend for route ${(x.u as UpstreamRuntime).name}`, { 'retry-after': '1' });
  }

  // --- slots, selection and the queue -------------------------------------------------------

  /** Takes the global and the upstream slot; undefined when both are held, else which one is full (nothing held then). */
  takeSlots(): QueueScope | undefined {
    const ov = this.rt.deps.overload;
    if (!this.holdsGlobal) {
      if (!ov.tryGlobal(this.rt)) return 'global';
      this.holdsGlobal = true;
    }
    if (!this.holdsUpstream) {
      const leased = ov.upstreamBinds(this.rt);
      if (leased && !ov.tryUpstream(this.rt, (this.u as UpstreamRuntime).inflight)) {
        this.releaseSlots(false);
        return 'upstream';
      }
      this.holdsUpstream = true;
      this.upstreamLeased = leased;
    }
    return undefined;
  }

  /** Gives back the global and upstream slots once (and lets the queue use them when `wake`). */
  releaseSlots(wake: boolean): void {
    const ov = this.rt.deps.overload;
    if (this.holdsGlobal) {
      this.holdsGlobal = false;
      ov.releaseGlobal();
    }
    if (this.holdsUpstream) {
      this.holdsUpstream = false;
      if (this.upstreamLeased) ov.releaseUpstream((this.u as UpstreamRuntime).inflight);
    }
    if (wake) ov.wake();
  }

  /**
   * Picks a backend not tried yet and takes its in-flight slot (and a breaker probe when it is
   * one). A retry (`again` names the backend that just failed) falls back to a backend already
   * tried, never the one that just failed unless it is the pool's only one.
   *
   * A leased backend (`per_backend_inflight_limit` node-wide) is under its limit while its lease
   * holds an idle slot. With `wait` (the request's first attempt; retries and hedges take held
   * slots only) it also is while the node may have a slot for it: the pick prefers a backend
   * whose slot the worker holds, then takes one the node may have a slot for; false with
   * `shortBackend` set when that backend's lease is empty (the request waits for its worker's
   * ask). A keyed balancer (consistent-hash, sticky-cid) gets no preference: its key's owner is
   * waited for, not passed over for a momentarily empty lease; it falls back only once the node
   * said it has no slot for the owner (`busy`).
   */
  pickBackend(again?: BackendRuntime, wait = false): boolean {
    const { rt } = this;
    const u = this.u as UpstreamRuntime;
    const ctx = rt.pick;
    this.shortBackend = undefined;
    if (this.attempt > 0 && this.tried === undefined && this.firstTried !== undefined) this.tried = new Set([this.firstTried]);
    ctx.exclude = this.tried ?? this.busy;
    // The pool's consistent-hash key, from the same request view as rate limits and quota (nothing built for a pool that does not hash).
    ctx.hashKey = u.hashKey === undefined ? undefined : u.hashKey(this.keySource());
    ctx.affinityKey = this.req.affinityKey;
    const waits = wait && u.backends[0]?.inflight !== undefined && !rt.deps.overload.leaseTable.solo;
    ctx.idleOnly = !waits || u.selector.keyed !== true;
    let b = u.selector.pick(ctx) as BackendRuntime | undefined;
    if (b === undefined && waits && ctx.idleOnly) {
      ctx.idleOnly = false;
      b = u.selector.pick(ctx) as BackendRuntime | undefined;
    }
    ctx.idleOnly = true;
    ctx.exclude = undefined;
    if (b === undefined && again !== undefined && this.tried !== undefined) {
      ctx.exclude = u.backends.length === 1 ? undefined : new Set([again.key]);
      b = u.selector.pick(ctx) as BackendRuntime | undefined;
      ctx.exclude = undefined;
    }
    if (b === undefined) return false;
    if (b.inflight !== undefined && !b.inflight.tryTake()) {
      this.shortBackend = b;
      return false;
    }
    this.busy = undefined;
    this.backend = b;
    this.token = rt.deps.stats.begin(b.key);
    this.probe = rt.deps.overload.breakerBegin(rt.policies.breaker, b.key);
    if (this.attempts > 1) {
      if (this.tried !== undefined) this.tried.add(b.key);
      else if (this.firstTried === undefined) this.firstTried = b.key;
      else this.tried = new Set([this.firstTried, b.key]);
    }
    return true;
  }

  /** Ends the backend slot of `sel` (the request's own selection by default) once, and lets the queue use it. */
  endBackend(sel: Selection = this): void {
    if (sel.token === undefined) return;
    this.rt.deps.stats.end(sel.token);
    sel.token = undefined;
    // The backend's leased slot, taken with the token (pickBackend).
    sel.backend?.inflight?.release();
    this.rt.deps.overload.wake();
  }

  /** Why no backend could be picked (walks the pool once; only on that path). */
  private whyNoBackend(): NoBackend {
    const { rt } = this;
    const u = this.u as UpstreamRuntime;
    const limit = rt.config.performance.per_backend_inflight_limit;
    let breakers = false;
    for (const b of u.backends as readonly BackendRef[]) {
      if (b.weight <= 0 || this.tried?.has(b.key) === true || !rt.deps.health.eligible(b.key)) continue;
      if (!rt.deps.overload.breakerMayTry(rt.policies.breaker, b.key)) {
        breakers = true;
        continue;
      }
      const l = (b as BackendRuntime).inflight;
      if (l === undefined ? rt.deps.stats.inflight(b.key) >= limit : l.idle === 0 || this.busy?.has(b.key) === true) return 'busy';
    }
    return breakers ? 'circuit_open' : 'unhealthy';
  }

  /**
   * Waits in the route's queue for `scope`, or is shed at once when the queue is full. Under a
   * supervisor the queue's places are the node's: when its worker holds none, the request waits for
   * the supervisor's answer first (`placesDecided`), counted as a waiter meanwhile, and its
   * `max_wait_ms` runs from now.
   */
  private wait(scope: QueueScope): PhaseResult {
    this.scope = scope;
    const entry = this.rt.deps.overload.enqueue(this.rt, this);
    if (entry === 'full') return this.shed(ERR.EDGE_SHED_QUEUE_FULL);
    if (entry === 'unavailable') return this.shed(ERR.EDGE_SHED_LEASE_UNAVAILABLE);
    // Queued: its worker keeps asking the node for the slot it waits for, which a slot freed anywhere can meet.
    if (scope === 'backend') this.waitingForBackend();
    else this.waitingOn(this.leaseFor(scope));
    this.watchAbandon(true);
    return STOP;
  }

  /** The supervisor answered this request's ask for queue places (`since`: when it began to wait). Never throws. */
  placesDecided(v: PlaceVerdict, since: number): void {
    const ov = this.rt.deps.overload;
    if (this.finished) {
      // Gone while it waited for them: the places go straight back.
      ov.releasePlaces(this);
      return;
    }
    try {
      if (v === 'granted' && ov.enqueueHolding(this.rt, this, since)) {
        // A slot may have come meanwhile (its standing need was counted): the queue's head tries it.
        ov.wake();
        return;
      }
      ov.releasePlaces(this);
      this.watchAbandon(false);
      this.waitingOn(undefined);
      this.shed(v === 'unavailable' ? ERR.EDGE_SHED_LEASE_UNAVAILABLE : ERR.EDGE_SHED_QUEUE_FULL);
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /**
   * Called by the queue for the waiter at the head of its route: true when the request's fate is
   * decided (admitted with its slots and backend, or refused for a reason that waiting cannot
   * change), false to keep waiting.
   */
  tryAdmit(): boolean {
    const full = this.takeSlots();
    if (full !== undefined) {
      this.waitingOn(this.leaseFor(full));
      return false;
    }
    if (this.pickBackend(undefined, true)) return true;
    const short = this.shortBackend;
    if (short !== undefined && this.inLeaseWait) {
      // A lease wait for a global or upstream slot now needs a backend's: decided, it waits for that one (onAdmit).
      this.releaseSlots(false);
      this.again = true;
      return true;
    }
    if (short !== undefined || this.whyNoBackend() === 'busy') {
      this.releaseSlots(false);
      // Queued for a backend: counted on every leased backend of its pool (a lease wait: on none, its route's queue decides).
      if (this.inLeaseWait) this.waitingOn(undefined);
      else this.waitingForBackend();
      return false;
    }
    return true;
  }

  /**
   * Called for the head of a lease wait: admitted as `tryAdmit`; or decided (`leaseDenied`) when
   * the lease it waits on was answered `exhausted` for an ask sent since it began waiting on it (the
   * node had no slot free), or it now waits for a backend: it then goes to its route's queue.
   */
  tryAdmitLease(): boolean {
    const wb = this.waitBackend;
    if (wb !== undefined) {
      // Waiting for a slot of one backend: decided once a slot came, or once the node said it has
      // none for it (the next pick passes that backend over: each backend once, so bounded).
      const l = wb.inflight as Lease;
      if (l.idle === 0) {
        if (!this.rt.deps.overload.leaseDenied(l, this.leaseSince)) return false;
        (this.busy ??= new Set()).add(wb.key);
      }
      this.again = true;
      return true;
    }
    if (this.tryAdmit()) return true;
    const l = this.waitsOn;
    if (l !== undefined && !this.rt.deps.overload.leaseDenied(l, this.leaseSince)) return false;
    this.leaseDenied = true;
    return true;
  }

  /** The lease-wait FIFO this request joins: the backend whose slot it waits for, else its route. */
  get leaseFifo(): string {
    return this.waitBackend?.key ?? this.route;
  }

  /** The queue admitted (or decided) this waiter: resumes after `select` on a later microtask. */
  onAdmit(): void {
    this.watchAbandon(false);
    this.rt.deps.overload.releasePlaces(this);
    const waitedFor = this.scope;
    // A lease wait admitted is no queue admission (svc_inflight_wait_admit_total counts those).
    const queued = !this.inLeaseWait;
    this.inLeaseWait = false;
    if (this.again) {
      // Its lease wait is over, for a backend slot come or refused: admission and selection again.
      this.again = false;
      this.waitBackend = undefined;
      this.waitingOn(undefined);
      queueMicrotask(() => {
        if (!this.finished) this.resumeAt(this.routePhases(this.u as UpstreamRuntime).admitAt);
      });
      return;
    }
    if (this.leaseDenied) {
      // The node has no slot for it now: its route's queue decides (waits, or 503 queue_full).
      this.leaseDenied = false;
      this.busy = undefined;
      const scope: QueueScope = this.waitsOn === undefined ? 'backend' : this.waitsOn === this.rt.deps.overload.globalLease ? 'global' : 'upstream';
      queueMicrotask(() => {
        if (this.finished) return;
        try {
          this.wait(scope);
        } catch (err) {
          this.defect(err);
          this.finish();
        }
      });
      return;
    }
    this.waitingOn(undefined);
    queueMicrotask(() => {
      if (this.finished) return;
      if (this.backend === undefined) {
        // Decided without a backend: the route has none it may use now.
        try {
          const why = this.whyNoBackend();
          this.releaseSlots(true);
          if (why === 'circuit_open') this.shed(ERR.EDGE_SHED_CIRCUIT_OPEN);
          else {
            this.reason = 'no_healthy_backend';
            this.fail(ERR.EDGE_NO_HEALTHY_BACKEND, `no healthy backend for route ${this.route}`, { 'retry-after': '1' });
          }
        } catch (err) {
          this.defect(err);
          this.finish();
        }
        return;
      }
      if (queued) this.rt.deps.overload.countWaitAdmit(waitedFor);
      this.resumeAt(this.routePhases(this.u as UpstreamRuntime).afterSelect);
    });
  }

  /** The request waited `max_wait_ms`: shed. */
  onExpire(): void {
    this.watchAbandon(false);
    this.rt.deps.overload.releasePlaces(this);
    const lease = this.inLeaseWait;
    this.inLeaseWait = false;
    this.waitingOn(undefined);
    try {
      this.shed(lease ? ERR.EDGE_SHED_LEASE_UNAVAILABLE : ERR.EDGE_SHED_QUEUE_TIMEOUT);
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /** The client went away while the request waited: out of the queue, nothing answered. */
  protected abandonWait(): void {
    if (this.finished) return;
    if (this.inLeaseWait) this.rt.deps.overload.cancelLease(this);
    else this.rt.deps.overload.cancel(this);
    this.rt.deps.overload.releasePlaces(this);
    this.inLeaseWait = false;
    this.waitingOn(undefined);
    this.clientGone();
    this.finish();
  }

  /** The client went away before anything was answered: recorded as such (status 0, `client_closed`). */
  protected clientGone(): void {
    this.error = ERR.EDGE_CLIENT_CLOSED;
    this.outcome = ERR.EDGE_CLIENT_CLOSED.outcome;
    this.reason = 'client_closed';
  }

  /** A shed answer: 503 with `Retry-After: shed_retry_after_seconds`. */
  shed(err: RequestError): PhaseResult {
    return this.fail(err, undefined, { 'retry-after': String(this.rt.config.resilience.route_queue.shed_retry_after_seconds) });
  }

  /**
   * An error answered after routing is the route's: counted per upstream with its outcome, and an
   * upstream failure or a defect goes to the throttled failure log (sheds of our own protection,
   * brownout and queues, are counted, not logged per request).
   */
  protected noteAnswered(err: RequestError, status: number): void {
    const u = this.u;
    if (u === undefined) return;
    this.rm.upstream(u, statusClass(status), err.outcome).inc();
    if (err.source === 'upstream' || err.class === 'internal') this.logFailure(status, err.code, performance.now());
  }

  /**
   * A 502, 503 or 504 just answered, to the throttled failure log (failure-log.ts); `end`: when the
   * exchange ended; `cause`: the upstream client's own words for a backend's failure.
   */
  protected logFailure(status: number, code: string, end: number, cause?: string): void {
    this.rt.deps.failures?.note({ upstream: (this.u as UpstreamRuntime).name, backend: this.backend?.id, status, code, durationMs: end - this.started, generation: this.rt.generation, requestId: this.requestId, ...(cause === undefined ? {} : { cause }) });
  }

  /**
   * The attempt on the backend of `sel` (by default the request's own selection) ended with
   * `result` (started at `t0`, ended at `ended`): the breaker and the adaptive limit hear it, the
   * backend's slot is given back, passive health and the backend counters record it.
   */
  protected attemptRecorded(result: ForwardResult, t0: number, ended: number, sel: Selection = this): void {
    const { rt } = this;
    const b = sel.backend as BackendRuntime;
    rt.deps.overload.attemptEnded(rt, b.key, sel.probe, result, t0, ended);
    this.endBackend(sel);
    if (result.health !== undefined) rt.deps.health.passive(b.key, result.health);
    const cls = result.error?.class;
    if (cls === 'timeout') rt.deps.metrics.counter('svc_backend_timeouts').inc();
    else if (cls === 'transport' || cls === 'tls') rt.deps.metrics.counter('svc_backend_errors').inc();
    this.rm.backend(this.u as UpstreamRuntime, b, statusClass(result.status), result.outcome).inc();
  }

  /**
   * A defect in our code: answer 502 rather than leave the client hanging, and report it (the
   * supervisor counts these as svc_runtime_panics).
   */
  protected defect(err: unknown): void {
    this.failed = true;
    this.error = ERR.EDGE_INTERNAL;
    this.outcome = ERR.EDGE_INTERNAL.outcome;
    this.reason = 'internal';
    try {
      this.rt.deps.onPanic?.(err);
    } catch {
      // Reporting failed too; the client still gets its answer.
    }
    this.answerDefect();
  }

  /** Phase `record` and the release of everything held; exactly once. */
  finish(): void {
    if (this.finished) return;
    this.finished = true;
    try {
      this.waitingOn(undefined);
      this.rt.deps.overload.releasePlaces(this);
      this.endBackend();
      this.releaseSlots(true);
      (this.failed ? this.rm.failure : this.rm.success).inc();
      this.record();
      this.done();
    } catch (err) {
      this.rt.deps.onPanic?.(err);
    }
  }

  // --- the request's record: its span and its access log line -------------------------------

  /** Starts the request's server span (tracing on): after validation, or at its end for a request refused before. */
  private startSpan(): void {
    const req = this.req;
    const q = req.path.indexOf('?');
    this.span = (this.rt.deps.tracer as NonNullable<Runtime['deps']['tracer']>).startRequest(req.headers, {
      requestId: this.requestId,
      method: req.method,
      path: q === -1 ? req.path : req.path.slice(0, q),
      authority: req.authority ?? req.host,
      protocol: req.protocol,
      listener: req.listener,
      clientAddress: req.remoteAddress,
      generation: this.rt.generation,
    });
  }

  /** Request body bytes received from the client (the paths that read a body say). */
  protected bytesIn(): number {
    return 0;
  }

  /** The backend that answered or last failed, if any. */
  protected lastBackend(): BackendRuntime | undefined {
    return this.backend;
  }

  /** How the request ended, for its span and access log line. */
  private facts(): RequestFacts {
    const err = this.error;
    return {
      status: this.status,
      outcome: this.outcome,
      code: err?.code,
      reason: this.reason,
      failureClass: err?.class,
      upstream: this.u?.name,
      backend: this.lastBackend()?.id,
      attempts: this.attempt,
      bytesIn: this.bytesIn(),
      bytesOut: this.bytesOut,
      durationMs: performance.now() - this.started,
    };
  }

  /**
   * Phase `record`, its span and access log part: ends the span and writes the access log line
   * (each when on). Nothing is built when both are off.
   */
  private record(): void {
    const { rt } = this;
    const tracer = rt.deps.tracer;
    const al = rt.config.observability.access_log;
    const accessLog = al.enabled ? rt.deps.accessLog : undefined;
    if (tracer === undefined && accessLog === undefined) return;
    const facts = this.facts();
    if (tracer !== undefined) {
      if (this.span === undefined) this.startSpan();
      (this.span as RequestSpan).end(facts);
    }
    if (accessLog === undefined || !AccessLog.keeps(facts, al.sample_ratio, al.log_failures, Math.random())) return;
    const req = this.req;
    accessLog.write(
      {
        requestId: this.requestId,
        traceId: this.span?.traceId ?? parseTraceparent(req.headers['traceparent'])?.trace_id,
        listener: req.listener,
        protocol: req.protocol,
        method: req.method,
        authority: req.authority ?? req.host,
        path: req.path,
        generation: rt.generation,
        validated: this.validated,
      },
      facts,
    );
  }
}

/**
 * A route's phase list, built once when a generation is provisioned: brownout (sampling only for
 * a core route; absent when brownout is off), admission, select, then the ingress path's own
 * forward and respond.
 */
export function buildRoutePhases(route: string, config: Runtime['config'], auth: RouteAuth | undefined, limits: RouteLimits, forward: Phase, respond: Phase): RoutePhases {
  const list: Phase[] = [];
  if (auth !== undefined) list.push(RequestContext.authenticate);
  if (limits.rate.length > 0) list.push(RequestContext.rateLimit);
  if (limits.quota.length > 0) list.push(RequestContext.quota);
  const b = config.resilience.brownout;
  if (b.enabled) list.push(b.core_routes.length === 0 || !b.core_routes.includes(route) ? RequestContext.brownoutShed : RequestContext.brownoutSample);
  const admitAt = list.length;
  list.push(RequestContext.admission, RequestContext.select);
  const afterSelect = list.length;
  list.push(forward, respond);
  return { list, afterSelect, admitAt };
}

/** What phase `limit` applies to a route: its scoped rate limits and its quota policies. */
export interface RouteLimits {
  readonly rate: readonly CompiledLimit[];
  readonly quota: readonly CompiledPolicy[];
}

/** The prelude every request runs on a runtime: protocol policy, then route. */
export const PRELUDE: readonly Phase[] = [RequestContext.protocol, RequestContext.route];

/** The pick context of one runtime, reused by every pick on it (a pick is synchronous). */
export interface PickScratch {
  readonly eligible: (b: BackendRef) => boolean;
  exclude: ReadonlySet<string> | undefined;
  hashKey: string | undefined;
  affinityKey: string | undefined;
  /** Leased backends are eligible only while their lease holds an idle slot (else: while the node may have one). */
  idleOnly: boolean;
}
