// What the retry, hedging and body-replay end-to-end tests (issue 14) share: a pool whose backend
// is chosen by consistent hashing on the `x-key` header, so a test sends a request whose first
// attempt goes to the backend it names (found by probing: which backend a key owns is the
// proxy's business, the test only observes it), and the retry and hedge counters read in one
// scrape, so a test compares what moved with what it made happen.
import { metricValue, scrape } from './exposition.ts';
import { request } from './overload.ts';
import type { ControlledBackend } from './controlled-backend.ts';
import type { Proxy } from './overload.ts';

/** The header the pools of `hashedPool` hash on. */
export const HASH_HEADER = 'x-key';

/** One pool `name` on `path_prefix`, balanced by consistent hashing on `x-key`, over `backends` (ids: their names); YAML flow style. */
export function hashedPool(name: string, prefix: string, backends: readonly ControlledBackend[]): string {
  const list = backends.map((b) => `{ id: ${b.name}, address: "127.0.0.1:${b.port}" }`).join(', ');
  return `${name}: { route: { path_prefix: ${prefix} }, load_balancing: { type: consistent-hash, key: "header:${HASH_HEADER}" }, backends: [${list}] }`;
}

/**
 * A value of `x-key` whose first attempt goes to `backend`: GETs `probePath` (a path of the pool on
 * which every backend answers at once with its `x-backend` header) with keys `k0`, `k1`... until
 * `backend` answers. Throws after 64 keys (with two backends, each owns about half of them).
 */
export async function keyOwnedBy(p: Proxy, backend: ControlledBackend, probePath: string): Promise<string> {
  for (let i = 0; i < 64; i++) {
    const key = `k${i}`;
    const a = await request(p, 'h1', { path: `${probePath}/${key}`, headers: { [HASH_HEADER]: key } });
    if (a.status !== 200) throw new Error(`probe ${probePath} with key ${key}: ${a.status} ${a.error ?? a.body.slice(0, 80)}`);
    if (a.headers['x-backend'] === backend.name) return key;
  }
  throw new Error(`no key among 64 owned by backend ${backend.name}`);
}

/** The counters and gauges of issue 14, as one record; labelled series are `name{label="value"}`. */
export type RetryCounters = Readonly<Record<string, number>>;

/** Every series `retryCounters` reads. */
export const RETRY_SERIES: ReadonlyArray<readonly [string, Readonly<Record<string, string>>]> = [
  ['svc_retries_total', {}],
  ...['connect_timeout', 'transport', 'tls', 'headers_timeout', 'body_timeout', 'status_502', 'status_503'].map((reason) => ['svc_retry_attempts_total', { reason }] as const),
  ['svc_retry_denied_total', {}],
  ...['budget_exhausted', 'max_attempts', 'body_not_buffered', 'no_backend'].map((reason) => ['svc_retry_denied_total', { reason }] as const),
  ['svc_request_buffer_limit_rejects', {}],
  ['svc_response_prebuffer_limit_rejects', {}],
  ['svc_hedge_triggered_total', {}],
  ['svc_hedge_won_total', {}],
  ['svc_hedge_wasted_total', {}],
  ['svc_hedge_primary_won_after_trigger_total', {}],
  ['svc_hedge_primary_late_ms_total', {}],
  ['svc_hedge_primary_late_samples_total', {}],
];

const seriesName = (name: string, labels: Readonly<Record<string, string>>): string => {
  const l = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  return l.length === 0 ? name : `${name}{${l.join(',')}}`;
};

/** Every series of RETRY_SERIES from one scrape (0 for a counter never incremented). */
export async function retryCounters(p: Proxy): Promise<RetryCounters> {
  const text = await scrape(p.mport);
  return Object.fromEntries(RETRY_SERIES.map(([name, labels]) => [seriesName(name, labels), metricValue(text, name, labels)]));
}

/** The series that moved between two reads, with how much (series that did not move are left out, so `t.same(delta, {...})` states every change). */
export function moved(after: RetryCounters, before: RetryCounters): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v !== (before[k] ?? 0)) out[k] = v - (before[k] ?? 0);
  return out;
}
