// Request authentication in the worker (phase `authenticate`, docs/auth.md): a pool's JWT check
// (jose, against the JWKS key sets the supervisor fetches once per node and pushes here) and then
// its external authorization call. One `RequestAuthControl` per worker holds the key store and the
// verifiers and authorization clients of every live generation, keyed by their settings, so an
// activation that does not change a pool's auth keeps its verification cache and connections, and
// each pool's fail-open budget (`fail_open_per_second`): the node's under a supervisor
// (fail-open-lease.ts), this process's own bucket alone.
import { createHash } from 'node:crypto';
import { ExternalAuthorizer, FailOpenBudget, JwtVerifier, KeyStore, poolCaPems, poolJwksSpec } from '@edge-proxy/auth';
import type { AuthRequestView, ExternalAuthPolicy, FailOpenGate, JwtOutcome, JwtPolicy } from '@edge-proxy/auth';
import type { NormalizedUpstream, ResolvedConfig } from '@edge-proxy/config';
import type { CounterSeries, Logger, Metrics } from '@edge-proxy/telemetry';
import { ERR } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { TokenLeases } from '../resilience/token-lease.ts';
import { LeasedFailOpen, failOpenBudget } from './fail-open-lease.ts';

/** The `authenticate` phase's verdict: undefined to go on, else the answer. */
/** Go on (undefined), or the answer: its error, headers, and why (the access log's `reason`). */
export type AuthVerdict = undefined | { readonly error: RequestError; readonly headers?: HeaderMap; readonly reason?: string };

/** `decideNow`: the verdict needs a signature check or a call (run `check`). */
export const PENDING = Symbol('auth pending');

/** A pool's request authentication, built when a generation is provisioned. */
export interface RouteAuth {
  readonly pool: string;
  readonly jwt: { readonly key: string; readonly header: string; readonly sourceId: string | undefined } | undefined;
  /** `failOpenPerSecond`: the pool's `fail_open_per_second` (under `allow`); absent: every failure allows. */
  readonly external: { readonly key: string; readonly failureMode: 'deny' | 'allow'; readonly failOpenPerSecond?: number } | undefined;
  /**
   * The hyphenated names (lower case) of the fields authentication reads (the JWT header, the
   * external service's `allowed_headers`): their underscore twins (`X_Auth_Token`) are not
   * forwarded, or a CGI/WSGI/Rack backend could read a client's twin where the proxy checked the
   * real field (upstream/headers.ts, `isUnderscoreTwin`). Undefined when there are none.
   */
  readonly guarded?: ReadonlySet<string>;
}

/** What the authenticate phase reads of a request (the normalized request that is forwarded). */
export interface AuthRequest extends AuthRequestView {
  readonly headers: HeaderMap;
}

const MISSING: AuthVerdict = { error: ERR.EDGE_AUTH_TOKEN_MISSING, headers: { 'www-authenticate': 'Bearer' }, reason: 'missing_token' };
const INVALID_HEADERS = { 'www-authenticate': 'Bearer error="invalid_token"' };
const DENIED: AuthVerdict = { error: ERR.EDGE_AUTH_DENIED, reason: 'denied' };
const UNAVAILABLE: AuthVerdict = { error: ERR.EDGE_AUTH_UNAVAILABLE, headers: { 'retry-after': '1' }, reason: 'authorization_unavailable' };
/** The 401 of each JWT rejection reason (a bounded set: jwt-verifier.ts), made once. */
const INVALID = new Map<string, AuthVerdict>();
function invalid(reason: string): AuthVerdict {
  let v = INVALID.get(reason);
  if (v === undefined) INVALID.set(reason, (v = { error: ERR.EDGE_AUTH_TOKEN_INVALID, headers: INVALID_HEADERS, reason }));
  return v;
}

/** Least time between two warnings about one failing authorization service, ms. */
const NOTICE_INTERVAL_MS = 10_000;

const EXTERNAL_COUNTERS = { allowed: 'svc_external_auth_allowed', denied: 'svc_external_auth_denied', timeout: 'svc_external_auth_timeout', error: 'svc_external_auth_error', overflow: 'svc_external_auth_overflow' } as const;

/** Secret slots of a pool's effective auth, under the block it comes from (its own `auth` or `default_auth`). */
const SECRET_SLOT = {
  jwt: (pool: NormalizedUpstream): string => `${pool.auth_at ?? `upstream.${pool.name}.auth`}.jwt.secret`,
  external: (pool: NormalizedUpstream): string => `${pool.auth_at ?? `upstream.${pool.name}.auth`}.external.client_secret`,
};

function digest(parts: unknown): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 24);
}

export class RequestAuthControl {
  /** Key sets pushed by the supervisor (standalone: by an in-process JWKS source set). */
  readonly keys: KeyStore;
  private readonly metrics: Metrics;
  private readonly log: Logger | undefined;
  private readonly verifiers = new Map<string, JwtVerifier>();
  private readonly authorizers = new Map<string, ExternalAuthorizer>();
  private readonly failures = new Map<string, CounterSeries>();
  private readonly notices = new Map<string, { at: number; suppressed: number }>();
  /** Each pool's fail-open gate: leased, by pool; alone, by pool and `fail_open_per_second` (a changed value starts a new bucket). */
  private readonly gates = new Map<string, FailOpenGate>();
  private leases: TokenLeases | undefined;

  constructor(metrics: Metrics, askRefresh: (sourceId: string) => void, log?: Logger) {
    this.metrics = metrics;
    this.log = log;
    this.keys = new KeyStore({ askRefresh });
  }

  /** From now on the fail-open budgets are the node's, leased through `leases` (the worker joined a supervisor). */
  lease(leases: TokenLeases): void {
    this.leases = leases;
    this.gates.clear();
  }

  /** The pool's authentication for a generation being provisioned; undefined when it has none. */
  compile(resolved: ResolvedConfig, pool: NormalizedUpstream): RouteAuth | undefined {
    const auth = pool.auth;
    if (auth?.jwt === undefined && auth?.external === undefined) return undefined;
    const secrets = resolved.material.secrets;
    let jwt: RouteAuth['jwt'];
    if (auth.jwt !== undefined) {
      const j = auth.jwt;
      const spec = poolJwksSpec(resolved, pool);
      const secret = secrets[SECRET_SLOT.jwt(pool)];
      const header = j.header.toLowerCase();
      const policy: JwtPolicy = {
        ...(j.issuer === undefined ? {} : { issuer: j.issuer }),
        audiences: j.audiences,
        algorithms: j.algorithms,
        ...(spec === undefined ? {} : { sourceId: spec.id }),
        jwksTimeoutMs: spec?.timeoutMs ?? 0,
        ...(secret === undefined ? {} : { secret: new TextEncoder().encode(String(secret.value)) }),
        clockSkewMs: j.clock_skew_ms,
        header,
        cacheEntries: j.verification_cache_entries,
      };
      const key = `jwt:${digest([{ ...policy, secret: secret?.fingerprint ?? null }])}`;
      if (!this.verifiers.has(key)) this.verifiers.set(key, new JwtVerifier(policy, this.keys));
      jwt = { key, header, sourceId: spec?.id };
    }
    let external: RouteAuth['external'];
    if (auth.external !== undefined) {
      const e = auth.external;
      const secret = secrets[SECRET_SLOT.external(pool)];
      const caPems = poolCaPems(resolved, pool);
      const policy: ExternalAuthPolicy = {
        url: e.url,
        timeoutMs: e.timeout_ms,
        ...(e.client_id === undefined ? {} : { clientId: e.client_id }),
        ...(secret === undefined ? {} : { clientSecret: String(secret.value) }),
        failureMode: e.failure_mode,
        maxPending: e.max_pending,
        allowedHeaders: e.allowed_headers.map((h) => h.toLowerCase()),
        ...(caPems === undefined ? {} : { caPems }),
      };
      const key = `external:${digest([{ ...policy, clientSecret: secret?.fingerprint ?? null }])}`;
      if (!this.authorizers.has(key)) this.authorizers.set(key, new ExternalAuthorizer(policy));
      external = { key, failureMode: e.failure_mode, ...(e.failure_mode === 'allow' && e.fail_open_per_second !== undefined ? { failOpenPerSecond: e.fail_open_per_second } : {}) };
    }
    const read = [...(jwt === undefined ? [] : [jwt.header]), ...(auth.external?.allowed_headers ?? []).map((h) => h.toLowerCase())].filter((h) => h.includes('-'));
    return { pool: pool.name, jwt, external, ...(read.length === 0 ? {} : { guarded: new Set(read) }) };
  }

  /**
   * The verdict without waiting, when it needs no signature check and no call: a pool with JWT
   * only, and a token its cache knows (or a header that decides alone). PENDING otherwise.
   */
  decideNow(auth: RouteAuth, headers: HeaderMap): AuthVerdict | typeof PENDING {
    if (auth.jwt === undefined || auth.external !== undefined) return PENDING;
    const outcome = this.verifiers.get(auth.jwt.key)?.verifyNow(headers[auth.jwt.header]);
    if (outcome === undefined) return PENDING;
    return outcome.ok ? undefined : this.rejected(outcome, auth.jwt.sourceId);
  }

  /** Runs the pool's checks on `req` and calls `done` once with the verdict. Never throws, never rejects. */
  check(auth: RouteAuth, req: AuthRequest, done: (v: AuthVerdict) => void): void {
    void this.decide(auth, req).then(done, () => done(UNAVAILABLE));
  }

  private async decide(auth: RouteAuth, req: AuthRequest): Promise<AuthVerdict> {
    if (auth.jwt !== undefined) {
      const verifier = this.verifiers.get(auth.jwt.key);
      if (verifier === undefined) return invalid('key_source_unavailable');
      const outcome = await verifier.verify(req.headers[auth.jwt.header]);
      if (!outcome.ok) return this.rejected(outcome, auth.jwt.sourceId);
    }
    if (auth.external !== undefined) {
      const authorizer = this.authorizers.get(auth.external.key);
      if (authorizer === undefined) return UNAVAILABLE;
      const perSecond = auth.external.failOpenPerSecond;
      const d = await authorizer.check(req, perSecond === undefined ? undefined : this.gate(auth.pool, perSecond));
      this.metrics.counter(EXTERNAL_COUNTERS[d.cause]).inc();
      if (d.failOpenRefused === true) this.metrics.counter('svc_external_auth_fail_open_refused').inc();
      if (d.cause !== 'allowed' && d.cause !== 'denied') this.notice(auth, d.cause, d.status, d.failOpenRefused === true);
      if (!d.allow) return d.cause === 'denied' ? DENIED : UNAVAILABLE;
    }
    return undefined;
  }

  /** The fail-open gate of `pool` (`fail_open_per_second: perSecond`): the node's budget when leased, else this process's bucket. */
  private gate(pool: string, perSecond: number): FailOpenGate {
    const id = this.leases === undefined ? `${pool}\u0000${perSecond}` : pool;
    let g = this.gates.get(id);
    if (g === undefined) {
      g = this.leases === undefined ? new FailOpenBudget(perSecond) : new LeasedFailOpen(this.leases, pool);
      this.gates.set(id, g);
    }
    return g;
  }

  /** Counts a JWT rejection by reason (and algorithm, and unknown kid) and picks the answer. */
  private rejected(outcome: Extract<JwtOutcome, { ok: false }>, sourceId: string | undefined): AuthVerdict {
    let series = this.failures.get(outcome.reason);
    if (series === undefined) {
      series = this.metrics.counterSeries('svc_jwt_validation_failures_total', { reason: outcome.reason });
      this.failures.set(outcome.reason, series);
    }
    series.inc();
    if (outcome.reason === 'algorithm_not_allowed') this.metrics.counter('svc_jwt_algorithm_rejections_total').inc({ algorithm: outcome.algorithm ?? 'other' });
    if (outcome.unknownKid === true && sourceId !== undefined) this.metrics.counter('svc_jwks_unknown_kid_total').inc({ jwks_source_id: sourceId });
    return outcome.reason === 'missing_token' ? MISSING : invalid(outcome.reason);
  }

  /** One warning per pool every NOTICE_INTERVAL_MS while its authorization service fails, with the count it stood for. */
  private notice(auth: RouteAuth, cause: 'timeout' | 'error' | 'overflow', status: number | undefined, budgetSpent: boolean): void {
    const now = Date.now();
    const last = this.notices.get(auth.pool);
    if (last !== undefined && now - last.at < NOTICE_INTERVAL_MS) {
      last.suppressed++;
      return;
    }
    this.notices.set(auth.pool, { at: now, suppressed: 0 });
    const failureMode = auth.external?.failureMode ?? 'deny';
    const what = cause === 'timeout' ? 'timed out' : cause === 'overflow' ? 'has max_pending calls waiting' : 'failed';
    const outcome = failureMode === 'deny' ? 'answered 503' : budgetSpent ? 'answered 503 (fail_open_per_second spent)' : 'allowed';
    this.log?.warn({ upstream: auth.pool, cause, ...(status === undefined ? {} : { status }), failure_mode: failureMode, suppressed_since_last: last?.suppressed ?? 0 }, `external authorization ${what}: requests ${outcome} (failure_mode ${failureMode})`);
  }

  /** Keeps the verifiers, authorization clients and fail-open gates that the live generations use; closes the rest. */
  retain(auths: Iterable<RouteAuth>): void {
    const keep = new Set<string>();
    const gates = new Set<string>();
    for (const a of auths) {
      if (a.jwt !== undefined) keep.add(a.jwt.key);
      if (a.external !== undefined) keep.add(a.external.key);
      const perSecond = a.external?.failOpenPerSecond;
      if (perSecond !== undefined) gates.add(this.leases === undefined ? `${a.pool}\u0000${perSecond}` : a.pool);
    }
    for (const k of this.verifiers.keys()) if (!keep.has(k)) this.verifiers.delete(k);
    // A leased gate's lease lapses by itself (settled when idle); a pool's contract may have changed: its lease refusing until the next token asks again at once.
    for (const k of this.gates.keys()) if (!gates.has(k)) this.gates.delete(k);
    if (this.leases !== undefined) for (const pool of gates) this.leases.reopen(failOpenBudget(pool), '');
    for (const [k, a] of this.authorizers) {
      if (keep.has(k)) continue;
      this.authorizers.delete(k);
      void a.close();
    }
  }

  async close(): Promise<void> {
    this.verifiers.clear();
    const all = [...this.authorizers.values()];
    this.authorizers.clear();
    await Promise.all(all.map((a) => a.close()));
  }
}
