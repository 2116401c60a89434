// Memory of scoped rate limits under a flood of distinct keys (issue 15, "Must show": "100,000
// distinct keys → bounded memory"): a real `edge-proxy serve` (one worker), a limit keyed on
// `header:x-key` on route `app`, and requests each with a random key never seen before, sent as
// fast as the worker takes them over a few HTTP/2 connections. Each new key is a new bucket (full:
// the request is admitted), so the keys are what the worker must hold or evict. First 100,000
// requests on route `free` (no limit): proxying alone grew a fresh worker by 160 MiB over its
// first 100,000 requests (the heap settling; measured with the limit doing nothing, at 4485958),
// so the growth measured after that warm-up is the buckets'. The worker's resident memory is read
// after the warm-up and after each 100,000 keys: it must stay under a stated bound, and the second
// 100,000 (past the 100,000-bucket cap, so the least recently used are evicted) must grow it by
// little. After the flood the limit still limits.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { connectH2, metric, startProxy } from './support/overload.ts';
import { assertLimited, statuses } from './support/limits.ts';
import { workers } from './support/workers.ts';
import { rssMiB } from '../scripts/lib/proc-stats.ts';
import type { Answer, H2Connection } from './support/overload.ts';

const files = serviceFiles(t, 'edge-rate-limit-memory-');

const KEYS = 100_000;
const CONNECTIONS = 4;
/** Requests in flight per connection (the proxy allows 100 streams per connection). */
const WINDOW = 50;
/**
 * Bound on the growth of the worker's resident memory over the first 100,000 keys, MiB, over its
 * RSS after the warm-up. A bucket is a map entry: the key string (the limit's name and
 * a 32-character value), a token count and a timestamp, about 200-300 bytes with the map's own
 * slots, so 100,000 of them are 20-30 MiB; the bound leaves as much again for the garbage of
 * 100,000 proxied requests that collection has not returned yet. Unbounded buckets would not fail
 * this bound at 100,000 keys; the next check would.
 */
const GROWTH_BOUND_MIB = 64;
/**
 * The second 100,000 keys, past the cap of 100,000 buckets per worker, may grow the worker by at
 * most this much more, MiB: with eviction the bucket map does not grow at all, and what remains is
 * the heap's own fluctuation. Without eviction it would grow by as much as the first 100,000 did.
 */
const SECOND_GROWTH_BOUND_MIB = 24;

/** Sends `n` requests, each with a fresh random `x-key`, over `conns` with `WINDOW` in flight on each; the status tally. */
async function flood(conns: readonly H2Connection[], n: number, route: string): Promise<Record<string, number>> {
  const tally: Record<string, number> = {};
  let next = 0;
  const lane = async (conn: H2Connection): Promise<void> => {
    while (next < n) {
      next++;
      const a = await conn.request({ path: `/${route}/x`, headers: { 'x-key': randomBytes(16).toString('hex') }, timeoutMs: 30_000 });
      const k = a.status === 0 ? `error ${a.error ?? ''}` : String(a.status);
      tally[k] = (tally[k] ?? 0) + 1;
    }
  };
  await Promise.all(conns.flatMap((c) => Array.from({ length: WINDOW }, () => lane(c))));
  return tally;
}

t.test('200,000 distinct header keys: the worker memory stays bounded, and the limit still works after', async (t) => {
  const be = await controlledBackend(t, 'flood');
  const p = await startProxy(t, files, 'rl-memory', {
    performance: 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000',
    upstream: `{ ${['app', 'free'].map((n) => `${n}: { route: { path_prefix: /${n} }, backends: [{ id: flood, address: "127.0.0.1:${be.port}" }] }`).join(', ')} }`,
    resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, rate_limits: [{ name: per-key, routes: [app], key: "header:x-key", requests_per_second: 1, burst: 1 }] }',
  });
  const pid = (await workers(p))[0]?.pid ?? 0;
  const conns = await Promise.all(Array.from({ length: CONNECTIONS }, () => connectH2(t, p)));

  t.same(await flood(conns, KEYS, 'free'), { 200: KEYS }, `warm-up: ${KEYS} requests on the route without a limit`);
  const warm = rssMiB(pid);
  const t0 = performance.now();
  t.same(await flood(conns, KEYS, 'app'), { 200: KEYS }, `${KEYS} new keys, each admitted (a new bucket is full)`);
  const s1 = (performance.now() - t0) / 1000;
  const first = rssMiB(pid);
  t.same(await flood(conns, KEYS, 'app'), { 200: KEYS }, `${KEYS} more new keys, each admitted`);
  const second = rssMiB(pid);
  t.comment(`worker RSS: ${warm.toFixed(1)} MiB after the warm-up, ${first.toFixed(1)} MiB after ${KEYS} keys (+${(first - warm).toFixed(1)}; ${(KEYS / s1).toFixed(0)} requests/s), ${second.toFixed(1)} MiB after ${2 * KEYS} (+${(second - first).toFixed(1)} more)`);
  t.ok(first - warm < GROWTH_BOUND_MIB, `the first ${KEYS} keys grew the worker by ${(first - warm).toFixed(1)} MiB, under ${GROWTH_BOUND_MIB} MiB`);
  t.ok(second - first < SECOND_GROWTH_BOUND_MIB, `the next ${KEYS} (past the 100,000-bucket cap) by ${(second - first).toFixed(1)} MiB more, under ${SECOND_GROWTH_BOUND_MIB} MiB`);

  // The limit still limits: a key's second request at once is denied, a new key is served.
  const [c0] = conns as [H2Connection];
  const burst: Answer[] = [];
  for (let i = 0; i < 3; i++) burst.push(await c0.request({ path: '/app/after', headers: { 'x-key': 'after-the-flood' } }));
  t.same(statuses(burst), { 200: 1, 429: 2 }, 'after the flood, one key: 1 served, the next 2 limited');
  for (const a of burst.slice(1)) assertLimited(t, a, 'EDGE_RATE_LIMITED', 'after the flood', 1);
  t.equal((await c0.request({ path: '/app/after', headers: { 'x-key': 'another-new-key' } })).status, 200, 'a new key is served');
  t.equal(await metric(p, 'svc_request_rate_limited'), 2, 'svc_request_rate_limited 2: the flood itself was never limited');
});
