// Ordered limits whose default follows the key the operator set (src/derived-defaults.ts): setting
// one key of an ordered pair alone, to any value in its range that some value of the other key can
// satisfy, validates, and the validated pair respects the order. Before the derivation, a
// spec-shaped config that set only `health_check.interval: 1000` or `max_request_body_bytes: 16384`
// was refused by the other key's fixed default.
import t from 'tap';
import fc from 'fast-check';
import { validateConfig } from '../src/index.ts';
import type { NormalizedConfig } from '../src/index.ts';
import { base } from './fixtures/base.ts';
import type { Doc } from './fixtures/base.ts';

function set(d: Doc, path: string, value: unknown): void {
  const keys = path.split('.');
  let node = d;
  for (const k of keys.slice(0, -1)) node = node[k] ??= {};
  node[keys.at(-1) as string] = value;
}

function validated(d: Doc): NormalizedConfig {
  const r = validateConfig(d, '/tmp');
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value.config;
}

interface Ordered {
  /** The key set alone. */
  readonly key: string;
  /** Values of it that some value of the other key satisfies (the key's range, less the extremes that none does). */
  readonly min: number;
  readonly max: number;
  /** Extra document changes the key needs to be checked at all. */
  readonly prepare?: (d: Doc) => void;
  /** The order, read from the validated config. */
  readonly holds: (c: NormalizedConfig) => boolean;
}

const hc = (c: NormalizedConfig) => c.upstream['api']?.backends[0]?.health_check;
const pool = (c: NormalizedConfig) => ({ ...c.performance.timeouts, ...c.upstream['api']?.timeouts });
const perf = (c: NormalizedConfig) => c.performance;
const inflight = (c: NormalizedConfig) => perf(c).per_backend_inflight_limit <= perf(c).per_upstream_inflight_limit && perf(c).per_upstream_inflight_limit <= perf(c).global_inflight_limit;
const ms = { min: 1, max: 86_400_000 };

const ORDERED: Ordered[] = [
  // A probe needs 1 ms at least and must end before the next: an interval of 1 ms has no valid timeout.
  { key: 'upstream.api.health_check.interval', min: 2, max: ms.max, prepare: (d) => set(d, 'upstream.api.health_check.path', '/h'), holds: (c) => (hc(c)?.timeout_ms ?? 0) < (hc(c)?.interval ?? 0) },
  { key: 'upstream.api.health_check.timeout_ms', min: 1, max: ms.max - 1, prepare: (d) => set(d, 'upstream.api.health_check.path', '/h'), holds: (c) => (hc(c)?.timeout_ms ?? 0) < (hc(c)?.interval ?? 0) },
  { key: 'performance.body.max_request_body_bytes', min: 1, max: 1_099_511_627_776, holds: (c) => perf(c).body.request_buffer_bytes <= perf(c).body.max_request_body_bytes },
  { key: 'performance.body.request_buffer_bytes', min: 0, max: 67_108_864, holds: (c) => perf(c).body.max_request_body_bytes === 0 || perf(c).body.request_buffer_bytes <= perf(c).body.max_request_body_bytes },
  { key: 'performance.global_inflight_limit', min: 1, max: 10_000_000, holds: inflight },
  { key: 'performance.per_upstream_inflight_limit', min: 1, max: 10_000_000, holds: inflight },
  { key: 'performance.per_backend_inflight_limit', min: 1, max: 10_000_000, holds: inflight },
  { key: 'performance.timeouts.connect_ms', ...ms, holds: (c) => perf(c).timeouts.connect_ms <= perf(c).timeouts.backend_request_ms },
  { key: 'performance.timeouts.backend_request_ms', ...ms, holds: (c) => perf(c).timeouts.connect_ms <= perf(c).timeouts.backend_request_ms },
  { key: 'performance.timeouts.backend_body_idle_ms', ...ms, holds: (c) => perf(c).timeouts.backend_body_idle_ms <= perf(c).timeouts.backend_body_total_ms },
  { key: 'performance.timeouts.backend_body_total_ms', ...ms, holds: (c) => perf(c).timeouts.backend_body_idle_ms <= perf(c).timeouts.backend_body_total_ms },
  { key: 'performance.timeouts.client_body_idle_ms', ...ms, holds: (c) => perf(c).timeouts.client_body_idle_ms <= perf(c).timeouts.client_body_total_ms },
  { key: 'performance.timeouts.client_body_total_ms', ...ms, holds: (c) => perf(c).timeouts.client_body_idle_ms <= perf(c).timeouts.client_body_total_ms },
  { key: 'upstream.api.timeouts.connect_ms', ...ms, holds: (c) => (pool(c).connect_ms ?? 0) <= (pool(c).backend_request_ms ?? 0) },
  { key: 'upstream.api.timeouts.backend_request_ms', ...ms, holds: (c) => (pool(c).connect_ms ?? 0) <= (pool(c).backend_request_ms ?? 0) },
  { key: 'upstream.api.timeouts.backend_body_idle_ms', ...ms, holds: (c) => (pool(c).backend_body_idle_ms ?? 0) <= (pool(c).backend_body_total_ms ?? 0) },
  { key: 'upstream.api.timeouts.backend_body_total_ms', ...ms, holds: (c) => (pool(c).backend_body_idle_ms ?? 0) <= (pool(c).backend_body_total_ms ?? 0) },
  { key: 'resilience.route_queue.default_cap', min: 0, max: 1_000_000, holds: (c) => c.resilience.route_queue.default_cap <= c.resilience.route_queue.global_cap },
  { key: 'resilience.route_queue.global_cap', min: 0, max: 10_000_000, holds: (c) => c.resilience.route_queue.default_cap <= c.resilience.route_queue.global_cap },
  // max_limit defaults to global_inflight_limit and may not exceed it (SPEC): the limits above the global default conflict by specification.
  { key: 'resilience.adaptive_admission.max_limit', min: 1, max: 4096, holds: (c) => c.resilience.adaptive_admission.min_limit <= (c.resilience.adaptive_admission.max_limit ?? 0) },
  // recover < trigger, both 0-100: trigger 0 and recover 100 have no partner.
  { key: 'resilience.brownout.trigger_inflight_percent', min: 1, max: 100, holds: (c) => c.resilience.brownout.recover_inflight_percent < c.resilience.brownout.trigger_inflight_percent },
  { key: 'resilience.brownout.recover_inflight_percent', min: 0, max: 99, holds: (c) => c.resilience.brownout.recover_inflight_percent < c.resilience.brownout.trigger_inflight_percent },
  {
    key: 'resilience.watchdog.check_interval_ms',
    ...ms,
    prepare: (d) => set(d, 'resilience.watchdog.enabled', true),
    holds: (c) => c.resilience.watchdog.check_interval_ms <= c.resilience.watchdog.poll_stall_timeout_ms,
  },
  {
    key: 'resilience.watchdog.poll_stall_timeout_ms',
    ...ms,
    prepare: (d) => set(d, 'resilience.watchdog.enabled', true),
    holds: (c) => c.resilience.watchdog.check_interval_ms <= c.resilience.watchdog.poll_stall_timeout_ms,
  },
];

t.test('each ordered key set alone validates, at its bounds and at random values, and the order holds', async (t) => {
  const check = (o: Ordered, value: number): void => {
    const d = base();
    o.prepare?.(d);
    set(d, o.key, value);
    const r = validateConfig(d, '/tmp');
    if (!r.ok) throw new Error(`${o.key}: ${value} alone refused: ${JSON.stringify(r.issues)}`);
    if (!o.holds(r.value.config)) throw new Error(`${o.key}: ${value}: the validated pair breaks its order`);
    // The key the operator set is never moved.
    const read = o.key.split('.').reduce<unknown>((n, k) => (n as Record<string, unknown>)[k], d);
    if (read !== value) throw new Error(`${o.key}: the document was changed`);
  };
  for (const o of ORDERED) for (const v of [o.min, o.min + 1, o.max - 1, o.max]) check(o, v);
  fc.assert(
    fc.property(
      fc.constantFrom(...ORDERED).chain((o) => fc.tuple(fc.constant(o), fc.integer({ min: o.min, max: o.max }))),
      ([o, v]) => check(o, v),
    ),
    { numRuns: 600 },
  );
  t.pass(`${ORDERED.length} ordered keys`);
});

t.test('a health-check interval alone below the timeout default: the timeout follows it', async (t) => {
  const d = base();
  d.upstream.api.health_check = { path: '/healthz', interval: 1000 };
  t.same(hc(validated(d)), { path: '/healthz', interval: 1000, timeout_ms: 999, healthy_threshold: 2, unhealthy_threshold: 3, expected_status: '2xx' });
});

t.test('a health-check interval alone above the timeout default keeps the fixed default', async (t) => {
  const d = base();
  d.upstream.api.health_check = { path: '/healthz', interval: 10_000 };
  t.equal(hc(validated(d))?.timeout_ms, 2000);
});

t.test('a health-check timeout alone above the interval default: the interval follows it', async (t) => {
  const d = base();
  d.upstream.api.backends[0].health_check = { path: '/healthz', timeout_ms: 8000 };
  t.equal(hc(validated(d))?.interval, 8001);
});

t.test('max_request_body_bytes alone below the buffer default: the buffer follows it', async (t) => {
  const d = base();
  d.performance = { body: { max_request_body_bytes: 16_384 } };
  const b = validated(d).performance.body;
  t.equal(b.max_request_body_bytes, 16_384);
  t.equal(b.request_buffer_bytes, 16_384);
});

t.test('max_request_body_bytes 0 (unlimited) keeps the buffer default', async (t) => {
  const d = base();
  d.performance = { body: { max_request_body_bytes: 0 } };
  t.equal(validated(d).performance.body.request_buffer_bytes, 65_536);
});

t.test('global_inflight_limit alone: the per-upstream, per-backend and admission minimum follow it', async (t) => {
  const d = base();
  d.performance = { global_inflight_limit: 10 };
  const c = validated(d);
  t.same([c.performance.global_inflight_limit, c.performance.per_upstream_inflight_limit, c.performance.per_backend_inflight_limit], [10, 10, 10]);
  t.same([c.resilience.adaptive_admission.min_limit, c.resilience.adaptive_admission.max_limit], [10, 10]);
});

t.test('a pool timeout override alone below the inherited one: the inherited key follows it for that pool only', async (t) => {
  const d = base();
  d.upstream.api.timeouts = { backend_request_ms: 100 };
  const c = validated(d);
  t.same(c.upstream['api']?.timeouts, { backend_request_ms: 100, connect_ms: 100 });
  t.equal(c.performance.timeouts.connect_ms, 5000);
  t.equal(c.upstream['web']?.timeouts, undefined);
});

t.test('two keys the operator set in the wrong order are still refused', async (t) => {
  const refused = (change: (d: Doc) => void, path: string): void => {
    const d = base();
    change(d);
    const r = validateConfig(d, '/tmp');
    t.notOk(r.ok, path);
    if (!r.ok) t.ok(r.issues.some((i) => i.path === path), `${path} named`);
  };
  refused((d) => (d.upstream.api.health_check = { path: '/h', interval: 1000, timeout_ms: 1000 }), 'upstream.api.health_check.timeout_ms');
  refused((d) => (d.performance = { body: { max_request_body_bytes: 1000, request_buffer_bytes: 1001 } }), 'performance.body.request_buffer_bytes');
  refused((d) => (d.performance = { global_inflight_limit: 10, per_upstream_inflight_limit: 11 }), 'performance.per_upstream_inflight_limit');
  refused((d) => (d.performance = { timeouts: { connect_ms: 2, backend_request_ms: 1 } }), 'performance.timeouts.connect_ms');
  // With the inherited key set explicitly, a pool override below it is a conflict the operator wrote.
  refused((d) => {
    d.performance = { timeouts: { connect_ms: 5000 } };
    d.upstream.api.timeouts = { backend_request_ms: 100 };
  }, 'upstream.api.timeouts.connect_ms');
});

t.test('a route queue cap alone above the global cap default: the global cap follows it', async (t) => {
  const d = base();
  d.resilience = { route_queue: { caps: { api: 3000 } } };
  t.equal(validated(d).resilience.route_queue.global_cap, 3000);
});

// Completeness: every key a rule checks against another (an `*_ORDER` issue) is in the table above,
// so a new ordered pair cannot be added without the "set alone validates" check.
t.test('every key an ordering rule reports is set alone by the table', async (t) => {
  const { readdirSync, readFileSync } = await import('node:fs');
  const dir = new URL('../src/rules/', import.meta.url);
  // Keys whose feature is refused as not built (a config that sets them does not validate anyway),
  // and per-route queue caps (keyed by route name: the table's default_cap row stands for them).
  const exempt = new Set(['resilience.hedging.delay_ms', 'resilience.route_queue.caps.${route}']);
  const reported: string[] = [];
  for (const f of readdirSync(dir).filter((n) => n.endsWith('.ts'))) {
    const src = readFileSync(new URL(f, dir), 'utf8');
    for (const m of src.matchAll(/issue\(\s*(?:'([^']+)'|`([^`]+)`),\s*'EDGE_CONFIG_\w*_ORDER'/g)) reported.push(m[1] ?? m[2] ?? '');
  }
  t.ok(reported.length >= 10, `${reported.length} ordering issues found in the rules`);
  const keys = ORDERED.map((o) => o.key);
  const missing = reported.filter((p) => !exempt.has(p)).filter((p) => {
    const tail = p.replace(/^\$\{at\}\./, '');
    return !keys.some((k) => k === p || k.endsWith(`.${tail}`));
  });
  t.same(missing, [], 'no ordering rule reports a key the table does not set alone');
});

t.test("a quota policy's max_keys_per_window alone below 100: the per-source budget follows it; the budget alone above the cap raises the cap; both written in contradiction: refused", async (t) => {
  const withPolicy = (o: Record<string, unknown>): Doc => {
    const d = base();
    d.resilience = { quota: { policies: [{ name: 'tenant', dimensions: ['header:x-tenant'], sustained: { limit: 10, window_ms: 60_000 }, ...o }] } };
    return d;
  };
  const policyOf = (d: Doc) => validated(d).resilience.quota.policies[0];
  t.match(policyOf(withPolicy({})), { key_fallback: 'client_ip', max_keys_per_window: 100_000, max_new_keys_per_source: 100 }, 'the fixed defaults');
  t.match(policyOf(withPolicy({ max_keys_per_window: 20 })), { max_keys_per_window: 20, max_new_keys_per_source: 20 }, 'a cap of 20: the per-source budget is 20');
  t.match(policyOf(withPolicy({ max_new_keys_per_source: 500_000 })), { max_keys_per_window: 500_000, max_new_keys_per_source: 500_000 }, 'a budget of 500,000: the cap follows it');
  const r = validateConfig(withPolicy({ max_keys_per_window: 10, max_new_keys_per_source: 11 }), '/tmp');
  t.same(r.ok ? [] : r.issues.map((i) => [i.code, i.path]), [['EDGE_CONFIG_QUOTA', 'resilience.quota.policies[0].max_new_keys_per_source']], 'both written, budget over cap: refused');
  t.match(validated(withPolicy({ key_fallback: 'none' })).resilience.quota.policies[0], { key_fallback: 'none' });
  const bad = validateConfig(withPolicy({ key_fallback: 'reject' }), '/tmp');
  t.notOk(bad.ok, 'key_fallback outside client_ip | none: refused');
});
