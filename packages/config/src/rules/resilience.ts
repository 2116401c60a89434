// Resilience, timeout and limit rules, including every row of SPEC "Errors / Configuration errors".
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';
import { entriesOf, itemsOf, KEY_SPEC, repeats } from './context.ts';
import type { Rule } from './context.ts';

type Check = (ctx: Parameters<Rule['check']>[0]) => ConfigIssue[];
const rule = (name: string, check: Check): Rule => ({ name, check });

export const brownoutHysteresis = rule('brownout-hysteresis', (ctx) => {
  const b = ctx.doc.resilience?.brownout;
  if (typeof b?.recover_inflight_percent !== 'number' || typeof b.trigger_inflight_percent !== 'number') return [];
  return b.recover_inflight_percent >= b.trigger_inflight_percent
    ? [issue('resilience.brownout.recover_inflight_percent', 'EDGE_CONFIG_BROWNOUT_HYSTERESIS', `brownout hysteresis inverted: recover_inflight_percent (${b.recover_inflight_percent}) must be < trigger_inflight_percent (${b.trigger_inflight_percent})`)]
    : [];
});

export const admissionLimits = rule('adaptive-admission-limits', (ctx) => {
  const a = ctx.doc.resilience?.adaptive_admission;
  const global = ctx.doc.performance?.global_inflight_limit;
  const at = 'resilience.adaptive_admission';
  const out: ConfigIssue[] = [];
  if (a === undefined || a === null) return out;
  if (a.min_limit === 0) out.push(issue(`${at}.min_limit`, 'EDGE_CONFIG_ADMISSION_MIN_LIMIT', 'min_limit must be > 0'));
  if (a.max_limit === 0) out.push(issue(`${at}.max_limit`, 'EDGE_CONFIG_ADMISSION_MAX_LIMIT', 'max_limit must be > 0 when provided'));
  const max = a.max_limit ?? global;
  if (typeof max === 'number' && max > 0 && typeof a.min_limit === 'number' && max < a.min_limit) {
    const what = a.max_limit === undefined ? `performance.global_inflight_limit (${max}), the default max_limit,` : `max_limit (${max})`;
    out.push(issue(`${at}.max_limit`, 'EDGE_CONFIG_ADMISSION_LIMIT_ORDER', `max_limit must be >= min_limit: ${what} is below min_limit (${a.min_limit})`));
  }
  if (typeof a.max_limit === 'number' && typeof global === 'number' && a.max_limit > global) {
    out.push(issue(`${at}.max_limit`, 'EDGE_CONFIG_ADMISSION_ABOVE_GLOBAL', `max_limit (${a.max_limit}) must be <= performance.global_inflight_limit (${global})`));
  }
  return out;
});

export const retryRatios = rule('retry-ratios', (ctx) => {
  const r = ctx.doc.resilience?.retry_budget;
  const out: ConfigIssue[] = [];
  if (typeof r?.ratio_percent === 'number' && r.ratio_percent > 100) {
    out.push(issue('resilience.retry_budget.ratio_percent', 'EDGE_CONFIG_RETRY_RATIO', `ratio must be 0-100, got ${r.ratio_percent}`));
  }
  for (const [route, ratio] of entriesOf(r?.per_route_ratio_percent)) {
    if (typeof ratio === 'number' && ratio > 100) out.push(issue(`resilience.retry_budget.per_route_ratio_percent.${route}`, 'EDGE_CONFIG_RETRY_RATIO', `ratio must be 0-100, got ${ratio}`));
  }
  return out;
});

export const hedgingDelay = rule('hedging-delay', (ctx) => {
  const h = ctx.doc.resilience?.hedging;
  const out: ConfigIssue[] = [];
  if (h?.enabled !== true) return out;
  if (h.delay_ms === 0) out.push(issue('resilience.hedging.delay_ms', 'EDGE_CONFIG_HEDGING_DELAY', 'delay_ms must be > 0 when hedging is enabled'));
  const budget = ctx.doc.resilience?.retry_budget;
  if (budget?.enabled === false || budget?.max_attempts === 1) {
    out.push(issue('resilience.hedging.enabled', 'EDGE_CONFIG_HEDGING_NEEDS_RETRY', 'hedging needs resilience.retry_budget enabled with max_attempts >= 2: a hedge is an attempt counted against them'));
  }
  const request = ctx.doc.performance?.timeouts?.backend_request_ms;
  if (typeof h.delay_ms === 'number' && typeof request === 'number' && h.delay_ms >= request) {
    out.push(issue('resilience.hedging.delay_ms', 'EDGE_CONFIG_TIMEOUT_ORDER', `hedge delay ${h.delay_ms} ms must be shorter than backend_request_ms ${request} ms`));
  }
  return out;
});

/**
 * Methods a hedge may duplicate: a hedge sends the request to a second backend while the first may
 * still be running it, so only a method whose effect is the same once or twice (RFC 9110 §9.2.2
 * idempotent) may be listed; and of those only the ones the request path ever sends twice (its
 * retry methods, docs/retries.md): TRACE is safe but never retried, so listing it would validate
 * and do nothing. POST, PATCH and any other method are refused.
 */
export const HEDGE_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE']);

export const hedgingMethods = rule('hedging-methods', (ctx) =>
  itemsOf(ctx.doc.resilience?.hedging?.safe_methods)
    .map((m, i) => ({ m, i }))
    .filter(({ m }) => typeof m === 'string' && !HEDGE_METHODS.has(m))
    .map(({ m, i }) =>
      issue(`resilience.hedging.safe_methods[${i}]`, 'EDGE_CONFIG_HEDGING_METHOD', `${String(m)} cannot be hedged: a hedge sends the request twice, and only GET, HEAD, OPTIONS, PUT and DELETE are sent twice (RFC 9110 §9.2.2)`),
    ),
);

export const watchdogSettings = rule('watchdog-settings', (ctx) => {
  const w = ctx.doc.resilience?.watchdog;
  const at = 'resilience.watchdog';
  const out: ConfigIssue[] = [];
  if (w === undefined || w === null) return out;
  if (w.restart_hook !== undefined && w.restart_hook !== null) {
    out.push(issue(`${at}.restart_hook`, 'EDGE_CONFIG_WATCHDOG_RESTART_HOOK', 'restart_hook is deprecated and rejected; use restart_command (an argv list, no shell)'));
  }
  const cmd = itemsOf(w.restart_command);
  if (cmd.length > 0 && typeof cmd[0] === 'string' && !cmd[0].startsWith('/')) {
    out.push(issue(`${at}.restart_command[0]`, 'EDGE_CONFIG_WATCHDOG', 'the restart executable must be an absolute path (no shell, no PATH lookup)'));
  }
  if (w.enabled === true) {
    if (w.timeout_error_rate_percent === 0) out.push(issue(`${at}.timeout_error_rate_percent`, 'EDGE_CONFIG_WATCHDOG', 'a 0 % error-rate threshold marks every window unhealthy'));
    if (w.overload_inflight_percent === 0) out.push(issue(`${at}.overload_inflight_percent`, 'EDGE_CONFIG_WATCHDOG', 'a 0 % overload threshold marks every window unhealthy'));
    if (typeof w.poll_stall_timeout_ms === 'number' && typeof w.check_interval_ms === 'number' && w.poll_stall_timeout_ms < w.check_interval_ms) {
      out.push(issue(`${at}.poll_stall_timeout_ms`, 'EDGE_CONFIG_TIMEOUT_ORDER', 'poll_stall_timeout_ms must be >= check_interval_ms, or a healthy loop between checks looks stalled'));
    }
  }
  return out;
});

export const timeoutOrder = rule('timeout-order', (ctx) => {
  const out: ConfigIssue[] = [];
  const t = ctx.doc.performance?.timeouts;
  const check = (
    v: { connect_ms?: number | undefined; backend_request_ms?: number | undefined; backend_body_idle_ms?: number | undefined; backend_body_total_ms?: number | undefined },
    at: string,
  ): void => {
    if (typeof v.connect_ms === 'number' && typeof v.backend_request_ms === 'number' && v.connect_ms > v.backend_request_ms) {
      out.push(issue(`${at}.connect_ms`, 'EDGE_CONFIG_TIMEOUT_ORDER', `connect_ms (${v.connect_ms}) must not exceed backend_request_ms (${v.backend_request_ms}), which includes the connect`));
    }
    if (typeof v.backend_body_idle_ms === 'number' && typeof v.backend_body_total_ms === 'number' && v.backend_body_idle_ms > v.backend_body_total_ms) {
      out.push(issue(`${at}.backend_body_idle_ms`, 'EDGE_CONFIG_TIMEOUT_ORDER', `backend_body_idle_ms (${v.backend_body_idle_ms}) must not exceed backend_body_total_ms (${v.backend_body_total_ms})`));
    }
  };
  if (t !== undefined && t !== null) {
    check(t, 'performance.timeouts');
    if (typeof t.client_body_idle_ms === 'number' && typeof t.client_body_total_ms === 'number' && t.client_body_idle_ms > t.client_body_total_ms) {
      out.push(issue('performance.timeouts.client_body_idle_ms', 'EDGE_CONFIG_TIMEOUT_ORDER', `client_body_idle_ms (${t.client_body_idle_ms}) must not exceed client_body_total_ms (${t.client_body_total_ms})`));
    }
  }
  for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
    if (pool?.timeouts === undefined || pool.timeouts === null) continue;
    check({ ...(t ?? {}), ...pool.timeouts }, `upstream.${name}.timeouts`);
  }
  return out;
});

export const limitOrder = rule('limit-order', (ctx) => {
  const out: ConfigIssue[] = [];
  const p = ctx.doc.performance;
  if (p !== undefined && p !== null) {
    if (typeof p.per_upstream_inflight_limit === 'number' && typeof p.global_inflight_limit === 'number' && p.per_upstream_inflight_limit > p.global_inflight_limit) {
      out.push(issue('performance.per_upstream_inflight_limit', 'EDGE_CONFIG_LIMIT_ORDER', `per_upstream_inflight_limit (${p.per_upstream_inflight_limit}) exceeds global_inflight_limit (${p.global_inflight_limit})`));
    }
    if (typeof p.per_backend_inflight_limit === 'number' && typeof p.per_upstream_inflight_limit === 'number' && p.per_backend_inflight_limit > p.per_upstream_inflight_limit) {
      out.push(issue('performance.per_backend_inflight_limit', 'EDGE_CONFIG_LIMIT_ORDER', `per_backend_inflight_limit (${p.per_backend_inflight_limit}) exceeds per_upstream_inflight_limit (${p.per_upstream_inflight_limit})`));
    }
    const body = p.body;
    if (typeof body?.max_request_body_bytes === 'number' && body.max_request_body_bytes > 0 && typeof body.request_buffer_bytes === 'number' && body.request_buffer_bytes > body.max_request_body_bytes) {
      out.push(issue('performance.body.request_buffer_bytes', 'EDGE_CONFIG_LIMIT_ORDER', 'request_buffer_bytes exceeds max_request_body_bytes'));
    }
  }
  const q = ctx.doc.resilience?.route_queue;
  if (q !== undefined && q !== null && typeof q.global_cap === 'number') {
    if (typeof q.default_cap === 'number' && q.default_cap > q.global_cap) out.push(issue('resilience.route_queue.default_cap', 'EDGE_CONFIG_LIMIT_ORDER', `default_cap (${q.default_cap}) exceeds global_cap (${q.global_cap})`));
    for (const [route, cap] of entriesOf(q.caps)) {
      if (typeof cap === 'number' && cap > q.global_cap) out.push(issue(`resilience.route_queue.caps.${route}`, 'EDGE_CONFIG_LIMIT_ORDER', `cap (${cap}) exceeds global_cap (${q.global_cap})`));
    }
  }
  return out;
});

const AUTHORITY = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/;

export const connectPolicy = rule('connect-policy', (ctx) => {
  const p = ctx.doc.resilience?.protocol;
  const at = 'resilience.protocol';
  const out: ConfigIssue[] = [];
  if (p === undefined || p === null) return out;
  // Non-empty allowlists, with or without `allow_connect`, are refused as not built (features.ts).
  if (p.allow_connect !== true) {
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      if (itemsOf(pool?.route?.methods).includes('CONNECT')) out.push(issue(`upstream.${name}.route.methods`, 'EDGE_CONFIG_CONNECT_CONFLICT', 'a route accepts CONNECT but `resilience.protocol.allow_connect` is false'));
    }
  } else {
    const allowed = itemsOf(p.allowed_methods);
    if (allowed.length > 0 && !allowed.includes('CONNECT')) out.push(issue(`${at}.allowed_methods`, 'EDGE_CONFIG_CONNECT_CONFLICT', '`allow_connect` is true but CONNECT is not in allowed_methods'));
  }
  itemsOf(p.connect_allowed_authorities).forEach((a, i) => {
    const m = typeof a === 'string' ? AUTHORITY.exec(a) : null;
    if (m === null || Number(m[2]) < 1 || Number(m[2]) > 65535) out.push(issue(`${at}.connect_allowed_authorities[${i}]`, 'EDGE_CONFIG_CONNECT_CONFLICT', `'${String(a)}' is not host:port`));
  });
  return out;
});

/** RFC 9110 §9.2: safe and idempotent methods are the only ones that may ride in replayable early data. */
const EARLY_DATA_OK = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE']);

export const earlyDataMethods = rule('early-data-methods', (ctx) =>
  itemsOf(ctx.doc.resilience?.protocol?.early_data_safe_methods)
    .map((m, i) => ({ m, i }))
    .filter(({ m }) => typeof m === 'string' && !EARLY_DATA_OK.has(m))
    .map(({ m, i }) => issue(`resilience.protocol.early_data_safe_methods[${i}]`, 'EDGE_CONFIG_EARLY_DATA', `${m} is not safe to accept in replayable 0-RTT data`)),
);

export const rateLimits = rule('rate-limits', (ctx) => {
  const limits = itemsOf(ctx.doc.resilience?.rate_limits);
  const out: ConfigIssue[] = repeats(limits, (rl) => (typeof rl?.name === 'string' ? rl.name : undefined)).map(({ item, index }) =>
    issue(`resilience.rate_limits[${index}].name`, 'EDGE_CONFIG_RATE_LIMIT', `rate limit name '${item.name}' is used twice`),
  );
  limits.forEach((rl, i) => {
    if (typeof rl?.key === 'string' && !KEY_SPEC.test(rl.key)) out.push(issue(`resilience.rate_limits[${i}].key`, 'EDGE_CONFIG_KEY_SPEC', `'${rl.key}' is not a key spec`));
  });
  return out;
});

/** A Redis address the quota store can use (the same form `parseRedisAddress` of the data plane reads). */
const REDIS_ADDRESS = /^(?:redis:\/\/)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})\/?$/;

export const quotaPolicies = rule('quota-policies', (ctx) => {
  const q = ctx.doc.resilience?.quota;
  const at = 'resilience.quota';
  const out: ConfigIssue[] = [];
  if (q === undefined || q === null) return out;
  if (q.backend === 'redis' && q.redis === undefined) out.push(issue(`${at}.redis`, 'EDGE_CONFIG_QUOTA', '`backend: redis` needs a `redis` block'));
  const address = q.redis?.address;
  if (typeof address === 'string') {
    if (/^rediss:\/\//i.test(address)) out.push(issue(`${at}.redis.address`, 'EDGE_CONFIG_QUOTA', 'TLS to Redis (`rediss://`) is not supported (docs/quota.md): use a loopback or private-network Redis'));
    else if (!REDIS_ADDRESS.test(address)) out.push(issue(`${at}.redis.address`, 'EDGE_CONFIG_QUOTA', `'${address}' is not a Redis address: \`host:port\`, \`[v6]:port\` or \`redis://host:port\``));
  }
  if (q.enabled === true && itemsOf(q.policies).length === 0) out.push(issue(`${at}.policies`, 'EDGE_CONFIG_QUOTA', 'quota is enabled but defines no policy'));
  const policies = itemsOf(q.policies);
  for (const { item, index } of repeats(policies, (p) => (typeof p?.name === 'string' ? p.name : undefined))) {
    out.push(issue(`${at}.policies[${index}].name`, 'EDGE_CONFIG_QUOTA', `policy name '${item.name}' is used twice`));
  }
  policies.forEach((p, i) => {
    const pat = `${at}.policies[${i}]`;
    if (p?.burst === undefined && p?.sustained === undefined) out.push(issue(pat, 'EDGE_CONFIG_QUOTA', 'a policy needs a `burst` or a `sustained` contract'));
    if (typeof p?.burst?.window_ms === 'number' && typeof p.sustained?.window_ms === 'number' && p.burst.window_ms >= p.sustained.window_ms) {
      out.push(issue(`${pat}.burst.window_ms`, 'EDGE_CONFIG_QUOTA', 'the burst window must be shorter than the sustained window'));
    }
    itemsOf(p?.dimensions).forEach((d, j) => {
      if (typeof d === 'string' && !KEY_SPEC.test(d)) out.push(issue(`${pat}.dimensions[${j}]`, 'EDGE_CONFIG_KEY_SPEC', `'${d}' is not a key spec`));
    });
    if (typeof p?.max_new_keys_per_source === 'number' && typeof p.max_keys_per_window === 'number' && p.max_new_keys_per_source > p.max_keys_per_window) {
      out.push(issue(`${pat}.max_new_keys_per_source`, 'EDGE_CONFIG_QUOTA', 'the per-source key budget cannot exceed the policy\'s `max_keys_per_window`'));
    }
  });
  return out;
});

export const RESILIENCE_RULES: readonly Rule[] = [
  brownoutHysteresis,
  admissionLimits,
  retryRatios,
  hedgingDelay,
  hedgingMethods,
  watchdogSettings,
  timeoutOrder,
  limitOrder,
  connectPolicy,
  earlyDataMethods,
  rateLimits,
  quotaPolicies,
];
