// `resilience`: admission, queueing, circuit breaking, retries, hedging, brownout, protocol policy,
// watchdog, scoped rate limits and distributed quota (SPEC "Configuration (YAML)" tables).
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Defaulted, Enum, Methods, Millis, Obj, Percent, POOL_NAME, Rec, secretPair } from './common.ts';

const RouteName = Type.String({ minLength: 1, maxLength: 128, description: 'upstream pool (route) name' });

export const AdaptiveAdmission = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'adapt the global in-flight limit of each worker to observed backend latency (docs/overload.md)' }),
    min_limit: Type.Integer({ minimum: 0, maximum: 10_000_000, default: 64, description: 'lowest dynamic limit; must be > 0; set without it, at most `max_limit`' }),
    max_limit: Type.Optional(Type.Integer({ minimum: 0, maximum: 10_000_000, description: 'highest dynamic limit; default `performance.global_inflight_limit`', 'x-example': 2048 })),
    decrease_step: Type.Integer({ minimum: 1, maximum: 1_000_000, default: 16, description: 'subtracted on a high-latency observation' }),
    increase_step: Type.Integer({ minimum: 1, maximum: 1_000_000, default: 16, description: 'added on a healthy observation' }),
    high_latency_ms: Millis(500, 'latency above which an observation counts as high'),
  },
  { description: "adaptive admission: one dynamic global in-flight limit for the node (the supervisor's, whatever the worker count)" },
);

export const CircuitBreaker = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'per-backend circuit breaking, one breaker per backend for the whole node (the supervisor decides, every worker follows); it owns consecutive-failure ejection (docs/overload.md)' }),
    failure_threshold: Type.Integer({ minimum: 1, maximum: 10_000, default: 3, description: 'consecutive failures that open the breaker' }),
    open_ms: Millis(30_000, 'time the breaker stays open before it turns half-open (by a timer: without traffic too)'),
    half_open_max_probes: Type.Integer({ minimum: 1, maximum: 1000, default: 1, description: 'probe requests allowed while half-open' }),
    failure_statuses: Type.Array(Type.Integer({ minimum: 500, maximum: 599 }), {
      uniqueItems: true,
      maxItems: 100,
      default: [502, 503, 504],
      description:
        'backend response statuses (5xx only) that count as breaker failures, beside transport, TLS and timeout failures, which always count; the default is the gateway failures: a 500 (which any client that makes the application throw can cause) counts only when listed; empty: only transport, TLS and timeout failures count',
    }),
    max_ejection_percent: Percent(50, 'most of a pool\'s backends whose breakers may be open or half-open at once (rounded down, at least one unless 0): a backend that would open past it is held closed and keeps serving (svc_circuit_breaker_ejections_capped_total); 100: every backend may be ejected; 0: none ever is'),
  },
  { description: 'circuit breaker' },
);

export const RetryBudget = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'retry failed idempotent requests (GET, HEAD, OPTIONS, PUT, DELETE) within a budget (docs/retries.md); false: no request is ever retried or hedged' }),
    ratio_percent: Type.Integer({ minimum: 0, default: 10, description: 'retries (and hedges) allowed as a percentage of the route\'s primary requests over a 10 s window, plus 30 per window (0-100); one budget per route for the node, whatever the worker count (the supervisor holds the window and leases retries to the workers)', 'x-unit': 'percent' }),
    per_route_ratio_percent: Rec(POOL_NAME, Type.Integer({ minimum: 0 }), {
      default: {},
      description: 'per-route (pool name) override of `ratio_percent` (0-100), for the node; live',
    }),
    max_attempts: Type.Integer({ minimum: 1, maximum: 10, default: 2, description: 'attempts per request, the first and a hedge included; 1: never retried' }),
  },
  { description: 'retry budget' },
);

export const Hedging = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'send a second attempt to another backend when the first has no response head after `delay_ms` (docs/retries.md); needs the retry budget enabled, whose budget and `max_attempts` it counts against' }),
    delay_ms: Type.Integer({ minimum: 0, maximum: 86_400_000, default: 100, description: 'delay before the hedge; > 0 when enabled', 'x-unit': 'ms' }),
    safe_methods: Methods(['GET', 'HEAD'], 'methods that may be hedged: only GET, HEAD, OPTIONS, PUT, DELETE, the methods the request path may send twice (RFC 9110 §9.2.2 idempotent, TRACE aside: it is never retried); any other is refused (EDGE_CONFIG_HEDGING_METHOD)'),
    route_allowlist: Type.Array(RouteName, { uniqueItems: true, default: [], description: 'routes that may be hedged; empty means all' }),
  },
  { description: 'hedging' },
);

export const Brownout = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'shed non-core routes under overload (docs/overload.md)' }),
    trigger_inflight_percent: Percent(90, 'node-wide in-flight percentage of the limit in force that activates brownout; set without it, at least `recover_inflight_percent` + 1'),
    recover_inflight_percent: Percent(60, 'percentage at or below which brownout ends; must be < trigger; set without it, at most `trigger_inflight_percent` - 1'),
    core_routes: Type.Array(RouteName, { uniqueItems: true, default: [], description: 'pools exempt from shedding; empty means every route is shed' }),
  },
  { description: "brownout: one state for the node, from the node's in-flight percent of the limit in force" },
);

export const RouteQueue = Obj(
  {
    default_cap: Type.Integer({ minimum: 0, maximum: 1_000_000, default: 512, description: 'waiting requests per route, on the node; set without it, at most `global_cap`' }),
    global_cap: Type.Integer({ minimum: 0, maximum: 10_000_000, default: 2048, description: 'waiting requests across routes, on the node; set without it, at least `default_cap` and every `caps` entry' }),
    shed_retry_after_seconds: Type.Integer({ minimum: 0, maximum: 3600, default: 1, description: '`Retry-After` of a queue shed 503', 'x-unit': 's' }),
    max_wait_ms: Millis(1000, 'longest time a request waits for admission before it is shed'),
    caps: Rec(POOL_NAME, Type.Integer({ minimum: 0, maximum: 1_000_000 }), { default: {}, description: 'per-route override of `default_cap`' }),
  },
  { description: 'route queues: requests over an in-flight limit wait FIFO per route; the caps bound the node\'s queues whatever the worker count (places leased by the supervisor), and a waiter is admitted when a slot of the node frees on any worker (docs/overload.md)' },
);

export const Protocol = Obj(
  {
    allow_0rtt: Type.Boolean({ default: false, description: 'accept 0-RTT early data' }),
    early_data_safe_methods: Methods(['GET', 'HEAD'], 'methods accepted in early data'),
    max_headers_count: Type.Integer({ minimum: 1, maximum: 10_000, default: 128, description: 'request header fields (431 above)' }),
    max_headers_bytes: Type.Integer({ minimum: 256, maximum: 1_048_576, default: 16_384, description: 'request header bytes (431 above)', 'x-unit': 'bytes' }),
    enforce_authority_host_match: Type.Boolean({ default: true, description: 'reject a request whose :authority differs from Host' }),
    allow_connect: Type.Boolean({ default: false, description: 'CONNECT tunnelling; not built yet: `true` is refused (EDGE_CONFIG_NOT_BUILT) and every CONNECT is answered 405 with `Allow` on every protocol, never forwarded' }),
    connect_allowed_ports: Type.Array(Type.Integer({ minimum: 1, maximum: 65535 }), { uniqueItems: true, default: [], description: 'port allowlist for CONNECT; not built yet with CONNECT tunnelling: a non-empty list is refused (EDGE_CONFIG_NOT_BUILT)' }),
    connect_allowed_authorities: Type.Array(Type.String({ minLength: 3, maxLength: 261 }), { uniqueItems: true, default: [], description: 'exact `host:port` allowlist for CONNECT; not built yet with CONNECT tunnelling: a non-empty list is refused (EDGE_CONFIG_NOT_BUILT)' }),
    allowed_methods: Methods([], 'methods allowed at all (405 otherwise); empty means all'),
    denied_path_prefixes: Type.Array(Type.String({ pattern: '^/', maxLength: 2048 }), { uniqueItems: true, default: [], description: 'paths always rejected with 403' }),
  },
  { description: 'protocol policy' },
);

export const Watchdog = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'watch worker health and restart when degraded' }),
    check_interval_ms: Millis(1000, 'length of one health window; set without it, at most `poll_stall_timeout_ms`'),
    poll_stall_timeout_ms: Millis(5000, 'event loop not polled for this long counts as a stall; set without it, at least `check_interval_ms`'),
    timeout_error_rate_percent: Percent(60, 'timeout/error share of requests that makes a window unhealthy'),
    min_requests_per_window: Type.Integer({ minimum: 0, maximum: 10_000_000, default: 20, description: 'requests a window needs before its error rate counts' }),
    overload_inflight_percent: Percent(95, 'global in-flight percentage that makes a window unhealthy'),
    unhealthy_consecutive_windows: Type.Integer({ minimum: 1, maximum: 10_000, default: 3, description: 'unhealthy windows in a row before a restart is requested' }),
    drain_grace_ms: Millis(8000, 'time in-flight work gets before a restart proceeds'),
    restart_cooldown_ms: Millis(120_000, 'minimum time between restart invocations', { minimum: 0 }),
    restart_command: Type.Array(Type.String({ minLength: 1 }), {
      default: [],
      maxItems: 64,
      description: 'argv run on restart (index 0 the executable, no shell); empty: re-fork workers',
    }),
    restart_command_timeout_ms: Millis(30_000, 'time `restart_command` has to restart the service: a command that fails, is still running then (killed), or exited 0 while this process is still not stopping, counts as failed, and the workers are re-forked on the active generation', { minimum: 100 }),
    restart_hook: Type.Optional(Type.Unknown({ description: 'deprecated; setting it is a hard configuration error' })),
  },
  { description: 'watchdog' },
);

/** `key_fallback` of a rate limit or quota policy: what keys a request lacking its selector's value. Default `client_ip`. */
function KeyFallback(description: string) {
  return Enum(['client_ip', 'none'], { default: 'client_ip', description });
}

/** A scoped rate limit (token bucket per key). */
export const RateLimit = Obj(
  {
    name: Type.String({ pattern: '^[a-z0-9][a-z0-9_-]{0,62}$', description: 'limit name (metrics, logs)', 'x-example': 'per-client' }),
    routes: Type.Array(RouteName, { uniqueItems: true, default: [], description: 'routes the limit applies to; empty means all' }),
    key: Type.String({ minLength: 1, maxLength: 256, default: 'client_ip', description: 'bucket key: `client_ip`, `host`, `path`, `header:NAME`, `cookie:NAME`, `query:NAME`; each selector has its own key space (a header value never shares a bucket with a client address)' }),
    key_fallback: KeyFallback('a request without the value `key` names (no such header, cookie or query parameter, no Host): `client_ip` keys it by its client address, in the client-address key space; `none` leaves it unlimited by this limit (pair it with a `client_ip` limit)'),
    requests_per_second: Type.Integer({ minimum: 1, maximum: 10_000_000, description: 'sustained rate', 'x-example': 100 }),
    burst: Type.Integer({ minimum: 1, maximum: 10_000_000, description: 'bucket size', 'x-example': 200 }),
  },
  { description: 'scoped rate limit' },
);

const QuotaWindow = Obj(
  {
    limit: Type.Integer({ minimum: 1, maximum: 1_000_000_000, description: 'requests allowed per window', 'x-example': 100 }),
    window_ms: Millis(undefined, 'window length', { minimum: 100 }),
  },
  { description: 'quota contract' },
);

/** A distributed quota policy: burst and sustained contracts per selector. */
export const QuotaPolicy = Obj(
  {
    name: Type.String({ pattern: '^[a-z0-9][a-z0-9_-]{0,62}$', description: 'policy name (metrics `policy` label)', 'x-example': 'tenant' }),
    routes: Type.Array(RouteName, { uniqueItems: true, default: [], description: 'routes the policy applies to; empty means all' }),
    dimensions: Type.Array(Type.String({ minLength: 1, maxLength: 256 }), {
      minItems: 1,
      maxItems: 8,
      uniqueItems: true,
      description: 'selector dimensions forming the quota key: `client_ip`, `host`, `route`, `header:NAME`, `cookie:NAME`, `query:NAME`; each selector has its own key space (a header value never counts with a client address)',
      'x-example': ['header:x-tenant-id'],
    }),
    key_fallback: KeyFallback('a request missing the value of a dimension: `client_ip` counts that dimension under its client address, in the client-address key space; `none` leaves the request outside this policy'),
    max_keys_per_window: Type.Integer({
      minimum: 1,
      maximum: 10_000_000,
      default: 100_000,
      description: 'selector keys one worker may create in Redis for this policy per window of each contract (a selector not yet sent in that window); past it the `failure_mode` decides requests with a new selector. Per worker: the node figure is × workers (docs/quota.md "Redis sizing")',
    }),
    max_new_keys_per_source: Type.Integer({
      minimum: 1,
      maximum: 10_000_000,
      default: 100,
      description: 'selector keys one client source (an IPv4 address, an IPv6 /64) may create per window of each contract, per worker and policy (it bounds what each process keeps in memory, so it stays per worker); past it the `failure_mode` decides that source\'s requests with a new selector. Default 100, or `max_keys_per_window` when that is lower',
    }),
    burst: Type.Optional(QuotaWindow),
    sustained: Type.Optional(QuotaWindow),
  },
  { description: 'quota policy' },
);

export const Quota = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'enforce quota policies (docs/rate-limits.md, docs/quota.md)' }),
    backend: Enum(['local', 'redis'], { default: 'local', description: 'quota store: the node\'s `local` counters (one window per key for all workers, held by the supervisor) or a shared `redis`' }),
    redis: Type.Optional(
      Obj(
        {
          address: Type.String({ minLength: 1, maxLength: 261, description: 'Redis `host:port`', 'x-example': '127.0.0.1:6379' }),
          key_prefix: Type.String({ minLength: 1, maxLength: 128, default: 'edge-proxy:quota:', description: 'prefix of every quota key' }),
          timeout_ms: Millis(50, 'command timeout; on expiry the local fallback decides'),
          ...secretPair('auth_token', 'Redis AUTH password'),
        },
        { description: 'Redis store' },
      ),
    ),
    failure_mode: Enum(['local_fallback', 'allow', 'deny'], {
      default: 'local_fallback',
      description: 'decision source when the store is unreachable (`local_fallback`: the node\'s local counters)',
    }),
    policies: Type.Array(QuotaPolicy, { maxItems: 256, default: [], description: 'quota policies' }),
  },
  { description: 'distributed quota' },
);

export const Resilience = Obj(
  {
    adaptive_admission: Defaulted(AdaptiveAdmission),
    circuit_breaker: Defaulted(CircuitBreaker),
    retry_budget: Defaulted(RetryBudget),
    hedging: Defaulted(Hedging),
    brownout: Defaulted(Brownout),
    route_queue: Defaulted(RouteQueue),
    protocol: Defaulted(Protocol),
    watchdog: Defaulted(Watchdog),
    rate_limits: Type.Array(RateLimit, { maxItems: 256, default: [], description: 'scoped rate limits: a token bucket per request key for the node, held by the supervisor and leased to the workers, so a contract holds whatever the worker count (docs/rate-limits.md)' }),
    quota: Defaulted(Quota),
  },
  { description: 'resilience' },
);

export type ResilienceConfig = Static<typeof Resilience>;
export type WatchdogConfig = Static<typeof Watchdog>;
