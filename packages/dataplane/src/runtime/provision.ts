// provision(resolved config) → Runtime: the immutable per-generation view a request reads once at
// admission. State that must outlive a swap (health, latency, in-flight counts, connection pools)
// lives in the registries passed in `RuntimeDeps`, keyed by stable backend identity.
import net from 'node:net';
import tls from 'node:tls';
import { createHash } from 'node:crypto';
import type { NormalizedUpstream, ResolvedConfig } from '@edge-proxy/config';
import type { Logger, Metrics, RequestTracer } from '@edge-proxy/telemetry';
import type { AccessLog } from '../proxy/access-log.ts';
import { Router } from '../routing/router.ts';
import { buildSelector, compileKeySpec } from '../balancing/index.ts';
import type { BackendRef, BackendStatsRegistry, KeyExtractor, Selector } from '../balancing/index.ts';
import { poolKey as poolKeyOf } from '../upstream/pools.ts';
import type { UpstreamPools, PoolSpec, UpstreamTlsParams } from '../upstream/pools.ts';
import type { HealthRegistry, ProbeSpec } from '../health/health-registry.ts';
import type { Breakers } from '../resilience/breaker-registry.ts';
import type { ProtocolPolicy } from '../policy/protocol-policy.ts';
import type { RouteLatencyWindow } from '../proxy/route-latency.ts';
import type { UpstreamFailureLog } from '../proxy/failure-log.ts';
import { buildRoutePhases, PRELUDE } from '../proxy/pipeline.ts';
import type { Phase, PickScratch, RouteLimits, RoutePhases } from '../proxy/pipeline.ts';
import { compileLimits } from '../resilience/rate-limit.ts';
import type { RateLimiter } from '../resilience/rate-limit.ts';
import { compilePolicies } from '../resilience/quota/index.ts';
import type { QuotaControl } from '../resilience/quota/index.ts';
import type { RequestAuthControl, RouteAuth } from '../auth/request-auth.ts';
import { Exchange } from '../proxy/handler.ts';
import { UpgradeExchange } from '../ingress/upgrade.ts';
import { overloadPolicies } from '../resilience/overload-control.ts';
import type { OverloadControl, OverloadPolicies } from '../resilience/overload-control.ts';
import type { Lease } from '../resilience/lease.ts';
import { retryPolicy } from '../resilience/retry-control.ts';
import type { RetryControl, RetryPolicy } from '../resilience/retry-control.ts';

/** Registries shared by every generation of one worker. */
export interface RuntimeDeps {
  readonly pools: UpstreamPools;
  readonly stats: BackendStatsRegistry;
  readonly health: HealthRegistry;
  /** Circuit breaker per backend identity (absent in tests that build their own deps). */
  readonly breakers?: Breakers;
  readonly metrics: Metrics;
  /** Recent latency per route (the p50/p95/p99 gauges). */
  readonly routeLatency: RouteLatencyWindow;
  /** The worker's logger (route-decision logs); absent in tests that do not need it. */
  readonly log?: Logger;
  /** Called with an unexpected error caught on the request path (a defect, not bad input). */
  readonly onPanic?: (err: unknown) => void;
  /** Logs the 502s and 504s the proxy answers, throttled; present with `log`. */
  readonly failures?: UpstreamFailureLog;
  /** In-flight limits, route queues, adaptive admission, brownout and circuit breakers of the worker. */
  readonly overload: OverloadControl;
  /** Retry budgets per route, request bodies held for replay, retry and hedge counters of the worker. */
  readonly retries: RetryControl;
  /** Worker processes of the node: limits enforce a share of each per worker (docs/rate-limits.md). */
  readonly workers: number;
  /** The token buckets of the scoped rate limits (this worker's share). */
  readonly limiter: RateLimiter;
  /** The quota store (Redis, its local fallback, or local counters) and its health. */
  readonly quota: QuotaControl;
  /** Request authentication: the JWKS key sets, JWT verifiers and authorization clients of the worker. */
  readonly auth: RequestAuthControl;
  /** Spans of requests and their upstream attempts (`observability.tracing`); absent when tracing is off. */
  readonly tracer?: RequestTracer;
  /** The access log (`observability.access_log`, written while `enabled`); present with `log`. */
  readonly accessLog?: AccessLog;
}

/** A backend of the runtime. */
export interface BackendRuntime extends BackendRef {
  readonly pool: PoolSpec;
  readonly scheme: 'http' | 'https';
  readonly host: string;
  readonly port: number;
  /**
   * The backend's in-flight lease in this worker (budget `backend:<pool>/<id>`, shared by every
   * generation that has the backend), or undefined when `per_backend_inflight_limit` cannot bind
   * (the backend's local count then never reaches it either).
   */
  readonly inflight: Lease | undefined;
}

/** Effective timeouts of a pool (pool overrides merged over `performance.timeouts`). */
export interface PoolTimeouts {
  readonly connectMs: number;
  readonly requestMs: number;
  readonly bodyIdleMs: number;
  readonly bodyTotalMs: number;
}

/** A pool of the runtime. */
export interface UpstreamRuntime {
  readonly name: string;
  readonly config: NormalizedUpstream;
  readonly backends: readonly BackendRuntime[];
  readonly selector: Selector;
  readonly hashKey: KeyExtractor | undefined;
  readonly timeouts: PoolTimeouts;
  /** The pool's in-flight lease in this worker (budget `upstream:<name>`; shared by every generation that has the pool). */
  readonly inflight: Lease;
  /** The route's phases for requests and for HTTP/1.1 upgrades (proxy/pipeline.ts), built here once. */
  readonly phases: RoutePhases;
  readonly upgradePhases: RoutePhases;
  /** The route's retry, body replay, prebuffer and hedging policy (docs/retries.md). */
  readonly retry: RetryPolicy;
  /** The route's scoped rate limits and quota policies (phase `limit`; docs/rate-limits.md). */
  readonly limits: RouteLimits;
  /** The pool's request authentication (phase `authenticate`; docs/auth.md); undefined when it has none. */
  readonly auth: RouteAuth | undefined;
}

/** One generation's request-path view. */
export interface Runtime {
  readonly generation: number;
  readonly config: ResolvedConfig['config'];
  readonly router: Router;
  readonly upstreams: ReadonlyMap<string, UpstreamRuntime>;
  readonly protocol: ProtocolPolicy;
  readonly probes: readonly ProbeSpec[];
  /** Every backend identity and pool key this runtime uses (registries retain these). */
  readonly backendKeys: ReadonlySet<string>;
  /** Backend identity → its pool and id (breaker views and log lines). */
  readonly backendNames: ReadonlyMap<string, { readonly upstream: string; readonly backend: string }>;
  readonly poolKeys: ReadonlySet<string>;
  readonly deps: RuntimeDeps;
  /** The phases every request runs before its route's: protocol policy, route. */
  readonly prelude: readonly Phase[];
  /**
   * The pick context of this runtime, reused by every pick on it (a pick is synchronous): its
   * eligibility check (health, per-backend in-flight limit, circuit breaker) is built once.
   */
  readonly pick: PickScratch;
  /** The breaker and brownout policies of this generation. */
  readonly policies: OverloadPolicies;
  /** The quota store's AUTH password (`resilience.quota.redis.auth_token[_ref]`), resolved; undefined when none. */
  readonly quotaAuth: string | undefined;
}

/** The secret slot of the quota store's password (the document path of `auth_token`). */
const QUOTA_AUTH_SLOT = 'resilience.quota.redis.auth_token';

/** The resolved value of secret slot `slot` as text, or undefined when the document has none. */
function secretText(resolved: ResolvedConfig, slot: string): string | undefined {
  const v = resolved.material.secrets[slot]?.value;
  return v === undefined ? undefined : String(v);
}

function tlsParams(resolved: ResolvedConfig, pool: NormalizedUpstream, host: string): UpstreamTlsParams {
  const t = pool.tls;
  const m = resolved.material;
  const ca = m.upstream_ca[pool.name];
  const cert = t.client_certificate_slot === undefined ? undefined : m.secrets[t.client_certificate_slot];
  const key = t.client_key_slot === undefined ? undefined : m.secrets[t.client_key_slot];
  // SNI is a host name (RFC 6066 §3); for an IP backend the certificate is checked against the IP.
  const serverName = t.strict_sni ? (t.server_name ?? (net.isIP(host) === 0 ? host : undefined)) : undefined;
  const fingerprint = createHash('sha256')
    .update(JSON.stringify([t.verify_certificates, serverName, ca?.fingerprint, cert?.fingerprint, key?.fingerprint]))
    .digest('hex')
    .slice(0, 16);
  const params = { verify: t.verify_certificates, serverName, ca: ca?.pems, cert: cert?.value, key: key?.value, fingerprint };
  assertUsable(pool.name, params);
  return params;
}

const usable = new Set<string>();

/**
 * Builds a TLS context from the material once per fingerprint: material that parses but that the
 * TLS library refuses (a key too weak for the security level, an unsupported algorithm) fails the
 * prepare phase, so the candidate never goes live, instead of failing every request later.
 */
function assertUsable(poolName: string, p: { ca: readonly string[] | undefined; cert: string | undefined; key: string | undefined; fingerprint: string }): void {
  if (usable.has(p.fingerprint)) return;
  try {
    tls.createSecureContext({ ...(p.ca === undefined ? {} : { ca: [...p.ca] }), ...(p.cert === undefined ? {} : { cert: p.cert, key: p.key }) });
  } catch (err) {
    throw Object.assign(new Error(`upstream ${poolName}: TLS material cannot be used (${err instanceof Error ? err.message : String(err)})`), { code: 'EDGE_UPSTREAM_TLS_UNUSABLE' });
  }
  usable.add(p.fingerprint);
}

/** Builds the runtime of a generation. Pure apart from getting (or creating) pools from `deps.pools`. */
export function provision(resolved: ResolvedConfig, generation: number, deps: RuntimeDeps): Runtime {
  const c = resolved.config;
  const upstreams = new Map<string, UpstreamRuntime>();
  const probes: ProbeSpec[] = [];
  const backendKeys = new Set<string>();
  const backendNames = new Map<string, { upstream: string; backend: string }>();
  const poolKeys = new Set<string>();
  // Limits are a node's: each worker enforces its share (docs/rate-limits.md).
  const rateLimits = compileLimits(c);
  const quotaPolicies = compilePolicies(c.resilience.quota);
  for (const pool of Object.values(c.upstream)) {
    const o = pool.timeouts ?? {};
    const timeouts: PoolTimeouts = {
      connectMs: o.connect_ms ?? c.performance.timeouts.connect_ms,
      requestMs: o.backend_request_ms ?? c.performance.timeouts.backend_request_ms,
      bodyIdleMs: o.backend_body_idle_ms ?? c.performance.timeouts.backend_body_idle_ms,
      bodyTotalMs: o.backend_body_total_ms ?? c.performance.timeouts.backend_body_total_ms,
    };
    const backends: BackendRuntime[] = pool.backends.map((b) => {
      const tls = b.scheme === 'https' ? tlsParams(resolved, pool, b.host) : undefined;
      const spec: PoolSpec = { scheme: b.scheme, host: b.host, port: b.port, connectTimeoutMs: timeouts.connectMs, connections: c.performance.per_backend_inflight_limit, tls };
      const key = `${pool.name}/${b.id}/${b.scheme}://${b.host}:${b.port}/${tls?.fingerprint ?? 'plain'}`;
      backendKeys.add(key);
      backendNames.set(key, { upstream: pool.name, backend: b.id });
      return { key, id: b.id, weight: b.weight, pool: spec, scheme: b.scheme, host: b.host, port: b.port, inflight: deps.overload.backendCounter(c, pool.name, b.id) };
    });
    for (const b of backends) {
      const hc = pool.backends.find((x) => x.id === b.id)?.health_check;
      if (hc === undefined) continue;
      probes.push({
        key: b.key,
        dispatcher: deps.pools.get(b.pool),
        path: hc.path,
        host: pool.host_policy.mode === 'rewrite' && pool.host_policy.host !== undefined ? pool.host_policy.host : b.host,
        intervalMs: hc.interval,
        timeoutMs: hc.timeout_ms,
        expectedStatus: hc.expected_status,
        thresholds: { healthyThreshold: hc.healthy_threshold, unhealthyThreshold: hc.unhealthy_threshold },
      });
    }
    const lb = pool.load_balancing;
    const base = {
      name: pool.name,
      config: pool,
      backends,
      selector: buildSelector(backends, lb, { stats: deps.stats }),
      hashKey: lb.type === 'consistent-hash' ? compileKeySpec(lb.key ?? 'client_ip') : undefined,
      timeouts,
    };
    const auth = deps.auth.compile(resolved, pool);
    const routeLimits: RouteLimits = { rate: rateLimits.get(pool.name) ?? [], quota: quotaPolicies.filter((p) => p.routes === undefined || p.routes.has(pool.name)) };
    upstreams.set(pool.name, {
      ...base,
      inflight: deps.overload.upstreamCounter(pool.name),
      limits: routeLimits,
      auth,
      phases: buildRoutePhases(pool.name, c, auth, routeLimits, Exchange.forwardPhase, Exchange.respondPhase),
      upgradePhases: buildRoutePhases(pool.name, c, auth, routeLimits, UpgradeExchange.forwardPhase, UpgradeExchange.respondPhase),
      retry: retryPolicy(pool.name, c),
    });
  }
  for (const u of upstreams.values()) for (const b of u.backends) poolKeys.add(poolKeyOf(b.pool));
  const limit = c.performance.per_backend_inflight_limit;
  const policies = overloadPolicies(c);
  const breaker = policies.breaker;
  const { health, stats, overload } = deps;
  // Under its limit: a leased backend while its lease holds an idle slot, or (unless the pick asks
  // for idle slots only) while the node may still have one for it (the request then waits for its
  // worker's ask); a backend without a budget under the limit by its local count.
  const underLimit = (b: BackendRuntime): boolean => {
    const l = b.inflight;
    return l === undefined ? stats.inflight(b.key) < limit : l.idle > 0 || !pick.idleOnly;
  };
  const pick: PickScratch = { eligible: (b) => health.eligible(b.key) && underLimit(b as BackendRuntime) && overload.breakerMayTry(breaker, b.key), exclude: undefined, hashKey: undefined, affinityKey: undefined, idleOnly: true };
  return { generation, config: c, router: new Router(Object.values(c.upstream)), upstreams, protocol: c.resilience.protocol, probes, backendKeys, backendNames, poolKeys, deps, prelude: PRELUDE, pick, policies, quotaAuth: secretText(resolved, QUOTA_AUTH_SLOT) };
}

