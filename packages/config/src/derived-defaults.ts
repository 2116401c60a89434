// Defaults that follow the key the operator set. Several limits are ordered by a cross-field rule
// (a probe timeout shorter than its interval, a buffer no larger than the body limit, a per-backend
// limit no larger than the per-upstream one...). With fixed defaults, setting one side of such a
// pair alone (a 1 s health-check interval, a 16 KiB body limit) ran into the other side's default
// and was refused, although nothing the operator wrote is contradictory. So before the schema
// fills fixed defaults, an absent key of an ordered pair whose other side is set takes the fixed
// default moved just far enough to respect the order. Keys the operator set are never changed: a
// contradiction between two written values is still refused by the rule (rules/*.ts).
//
// Runs on the clone of the parsed document, which may be malformed: anything that is not a plain
// object or an integer is left for the schema to report. A derived value outside the key's range
// is not written (the fixed default and the rule's message then explain the conflict).
import { HealthCheck } from './schema/upstream.ts';
import { BodyLimits, Performance, Timeouts } from './schema/performance.ts';
import { AdaptiveAdmission, Brownout, QuotaPolicy, RouteQueue, Watchdog } from './schema/resilience.ts';

type Node = Record<string, unknown>;
interface IntSchema {
  readonly default?: unknown;
  readonly minimum?: number;
  readonly maximum?: number;
}
/** The schema of one integer key, read from the TypeBox object so defaults and ranges cannot drift. */
type Props = Readonly<Record<string, unknown>>;

const isNode = (v: unknown): v is Node => v !== null && typeof v === 'object' && !Array.isArray(v);
const int = (o: Node, k: string): number | undefined => (Number.isInteger(o[k]) ? (o[k] as number) : undefined);

function schemaOf(props: Props, key: string): IntSchema {
  return props[key] as IntSchema;
}

function fixedDefault(props: Props, key: string): number {
  const d = schemaOf(props, key).default;
  if (typeof d !== 'number') throw new Error(`derived-defaults: ${key} has no numeric default`);
  return d;
}

/** Writes `value` to the absent key `k` when it lies in the key's range. */
function fill(o: Node, props: Props, k: string, value: number): void {
  if (k in o) return;
  const s = schemaOf(props, k);
  if (value < (s.minimum ?? -Infinity) || value > (s.maximum ?? Infinity)) return;
  o[k] = value;
}

/**
 * `lo <= hi` (`gap` 0) or `lo < hi` (`gap` 1): when exactly one side is set, the other's default
 * is moved to respect the order.
 */
function orderPair(o: Node, props: Props, lo: string, hi: string, gap: 0 | 1): void {
  const l = int(o, lo);
  const h = int(o, hi);
  if (l === undefined && h !== undefined && !(lo in o)) fill(o, props, lo, Math.min(fixedDefault(props, lo), h - gap));
  else if (h === undefined && l !== undefined && !(hi in o)) fill(o, props, hi, Math.max(fixedDefault(props, hi), l + gap));
}

/** `resilience.<key>`, created when `resilience` is absent or an object; undefined otherwise. */
function child(parent: Node, key: string): Node | undefined {
  if (!(key in parent)) parent[key] = {};
  const v = parent[key];
  return isNode(v) ? v : undefined;
}

const PERF = Performance.properties as Props;
const BODY = BodyLimits.properties as Props;
const TIMEOUTS = Timeouts.properties as Props;
const HEALTH = HealthCheck.properties as Props;
const ADMISSION = AdaptiveAdmission.properties as Props;
const BROWNOUT = Brownout.properties as Props;
const QUEUE = RouteQueue.properties as Props;
const WATCHDOG = Watchdog.properties as Props;
const QUOTA_POLICY = QuotaPolicy.properties as Props;

/** The ordered timeout pairs of `performance.timeouts` (and of a pool's overrides). */
const TIMEOUT_PAIRS: readonly (readonly [string, string])[] = [
  ['connect_ms', 'backend_request_ms'],
  ['backend_body_idle_ms', 'backend_body_total_ms'],
  ['client_body_idle_ms', 'client_body_total_ms'],
];

/** Fills the derived defaults into `doc` (the parsed document's clone), in place. */
export function applyDerivedDefaults(doc: Node): void {
  const perf = isNode(doc['performance']) ? doc['performance'] : undefined;
  let global: number | undefined;
  if (perf !== undefined) {
    // per_backend <= per_upstream <= global: the middle one first, from whichever neighbour is set.
    if (!('per_upstream_inflight_limit' in perf)) {
      const g = int(perf, 'global_inflight_limit');
      const b = int(perf, 'per_backend_inflight_limit');
      let up = fixedDefault(PERF, 'per_upstream_inflight_limit');
      if (g !== undefined) up = Math.min(up, g);
      if (b !== undefined) up = Math.max(up, b);
      if (g !== undefined || b !== undefined) fill(perf, PERF, 'per_upstream_inflight_limit', up);
    }
    orderPair(perf, PERF, 'per_backend_inflight_limit', 'per_upstream_inflight_limit', 0);
    orderPair(perf, PERF, 'per_upstream_inflight_limit', 'global_inflight_limit', 0);
    global = int(perf, 'global_inflight_limit');
    const body = perf['body'];
    if (isNode(body)) {
      // 0 means an unlimited body: no bound on the buffer.
      const max = int(body, 'max_request_body_bytes');
      if (max !== undefined && max > 0) fill(body, BODY, 'request_buffer_bytes', Math.min(fixedDefault(BODY, 'request_buffer_bytes'), max));
    }
  }
  const timeouts = perf !== undefined && isNode(perf['timeouts']) ? perf['timeouts'] : {};
  // What the operator wrote, before derivation: a pool override conflicting with it is refused.
  const written = new Set(Object.keys(timeouts));
  for (const [lo, hi] of TIMEOUT_PAIRS) orderPair(timeouts, TIMEOUTS, lo, hi, 0);
  const upstreams = isNode(doc['upstream']) ? doc['upstream'] : {};
  for (const pool of Object.values(upstreams)) {
    if (!isNode(pool)) continue;
    if (isNode(pool['timeouts'])) poolTimeouts(pool['timeouts'], timeouts, written);
    if (isNode(pool['health_check'])) orderPair(pool['health_check'], HEALTH, 'timeout_ms', 'interval', 1);
    if (Array.isArray(pool['backends'])) for (const b of pool['backends']) if (isNode(b) && isNode(b['health_check'])) orderPair(b['health_check'], HEALTH, 'timeout_ms', 'interval', 1);
  }
  if (doc['resilience'] !== undefined && !isNode(doc['resilience'])) return;
  const resilience = (doc['resilience'] ?? {}) as Node;
  // adaptive_admission.max_limit defaults to the global limit (SPEC); min_limit must stay below it.
  const admissionMax = isNode(resilience['adaptive_admission']) ? int(resilience['adaptive_admission'], 'max_limit') : undefined;
  const ceiling = admissionMax ?? global;
  if (ceiling !== undefined && ceiling < fixedDefault(ADMISSION, 'min_limit')) {
    const a = child(resilience, 'adaptive_admission');
    if (a !== undefined) fill(a, ADMISSION, 'min_limit', ceiling);
    doc['resilience'] = resilience;
  }
  if (isNode(resilience['brownout'])) orderPair(resilience['brownout'], BROWNOUT, 'recover_inflight_percent', 'trigger_inflight_percent', 1);
  if (isNode(resilience['watchdog'])) orderPair(resilience['watchdog'], WATCHDOG, 'check_interval_ms', 'poll_stall_timeout_ms', 0);
  // A quota policy's per-source key budget is at most its per-policy cap (a lower cap lowers it).
  const quota = resilience['quota'];
  if (isNode(quota) && Array.isArray(quota['policies'])) for (const p of quota['policies']) if (isNode(p)) orderPair(p, QUOTA_POLICY, 'max_new_keys_per_source', 'max_keys_per_window', 0);
  const q = resilience['route_queue'];
  if (isNode(q)) {
    const caps = isNode(q['caps']) ? Object.values(q['caps']).filter((c): c is number => Number.isInteger(c)) : [];
    const d = int(q, 'default_cap');
    if (!('global_cap' in q) && (d !== undefined || caps.length > 0)) fill(q, QUEUE, 'global_cap', Math.max(fixedDefault(QUEUE, 'global_cap'), d ?? 0, ...caps));
    orderPair(q, QUEUE, 'default_cap', 'global_cap', 0);
  }
}

/**
 * A pool's timeout overrides inherit absent keys from `performance.timeouts`; where the inherited
 * value is a default (fixed or derived) that would break the order against a key the pool set, it
 * follows the pool's key instead. An inherited value the operator wrote is left to the rule.
 */
function poolTimeouts(pool: Node, global: Node, written: ReadonlySet<string>): void {
  for (const [lo, hi] of TIMEOUT_PAIRS) {
    const l = int(pool, lo);
    const h = int(pool, hi);
    const inheritedLo = int(global, lo) ?? fixedDefault(TIMEOUTS, lo);
    const inheritedHi = int(global, hi) ?? fixedDefault(TIMEOUTS, hi);
    if (l === undefined && h !== undefined && !(lo in pool) && !written.has(lo) && inheritedLo > h) fill(pool, TIMEOUTS, lo, h);
    else if (h === undefined && l !== undefined && !(hi in pool) && !written.has(hi) && l > inheritedHi) fill(pool, TIMEOUTS, hi, l);
  }
}
