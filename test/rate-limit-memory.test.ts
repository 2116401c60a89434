// Memory of scoped rate limits under a flood of distinct keys (issue 15, "Must show": "100,000
// distinct keys → bounded memory"): a real `edge-proxy serve` (one worker), a limit keyed on
// `header:x-key` on route `app`, and requests each with a random 1,024-character key never seen
// before, sent as fast as the worker takes them over a few HTTP/2 connections. Each new key is a
// new bucket (full: the request is admitted), and the bucket's map key holds the key's value, so
// the keys are what the worker must drop: refilled buckets are swept every 10 s, and past 100,000
// the least recently used are evicted (docs/rate-limits.md, "Memory"). First 100,000 requests on
// route `free` (no limit): proxying alone grew a fresh worker by 160 MiB over its first 100,000
// requests (the heap settling; measured with no limit in force, at 4485958), so growth measured
// after that warm-up is mostly the buckets'. Then 4 × 100,000 new keys, the worker's resident
// memory read after each. Long keys make the buckets weigh more than the heap's own fluctuation
// (which reached 80 MiB over 200,000 requests with 256-character keys): 400,000 buckets kept would
// be about 460 MiB, the bounds below are well under half of it. After the flood the limit still
// limits.
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
/** Rounds of KEYS new keys. */
const ROUNDS = 4;
/** Characters of each key (hex of random bytes). */
const KEY_CHARS = 1024;
const CONNECTIONS = 4;
/** Requests in flight per connection (the proxy allows 100 streams per connection). */
const WINDOW = 50;
/**
 * What one bucket weighs, bytes: its map key (the limit's name and the 1,024-character value, a
 * one-byte V8 string of about 1,050 bytes), a small object (tokens, two timestamps, the limit:
 * about 50 bytes) and the map's own slots: about 1,200 bytes, 115 MiB per 100,000 buckets.
 */
const BUCKET_BYTES = 1200;
const perRoundMiB = (KEYS * BUCKET_BYTES) / 2 ** 20;
/**
 * Bound on the growth of the worker's resident memory over the 400,000 keys, MiB, over its RSS
 * after the warm-up. Buckets kept without bound: 4 × 115 = 460 MiB. Swept (refilled buckets every
 * 10 s; these refill in 1 s) and capped at 100,000, at most 115 MiB of them are alive at once; the
 * rest of the bound is the heap's fluctuation.
 */
const TOTAL_GROWTH_BOUND_MIB = 200;
/** Bound on the growth over the last round, MiB: kept without bound, it would add 115 MiB. */
const LAST_ROUND_BOUND_MIB = 64;

/** Sends `n` requests, each with a fresh random `x-key`, over `conns` with `WINDOW` in flight on each; the status tally. */
async function flood(conns: readonly H2Connection[], n: number, route: string): Promise<Record<string, number>> {
  const tally: Record<string, number> = {};
  let next = 0;
  const lane = async (conn: H2Connection): Promise<void> => {
    while (next < n) {
      next++;
      const a = await conn.request({ path: `/${route}/x`, headers: { 'x-key': randomBytes(KEY_CHARS / 2).toString('hex') }, timeoutMs: 30_000 });
      const k = a.status === 0 ? `error ${a.error ?? ''}` : String(a.status);
      tally[k] = (tally[k] ?? 0) + 1;
    }
  };
  await Promise.all(conns.flatMap((c) => Array.from({ length: WINDOW }, () => lane(c))));
  return tally;
}

t.test('400,000 distinct header keys: the worker memory stays bounded, and the limit still works after', async (t) => {
  const be = await controlledBackend(t, 'flood');
  const p = await startProxy(t, files, 'rl-memory', {
    performance: 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000',
    upstream: `{ ${['app', 'free'].map((n) => `${n}: { route: { path_prefix: /${n} }, backends: [{ id: flood, address: "127.0.0.1:${be.port}" }] }`).join(', ')} }`,
    resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, rate_limits: [{ name: per-key, routes: [app], key: "header:x-key", requests_per_second: 1, burst: 1 }] }',
  });
  const pid = (await workers(p))[0]?.pid ?? 0;
  const conns = await Promise.all(Array.from({ length: CONNECTIONS }, () => connectH2(t, p)));

  t.same(await flood(conns, KEYS, 'free'), { 200: KEYS }, `warm-up: ${KEYS} requests on the route without a limit`);
  const rss = [rssMiB(pid)];
  const rates: number[] = [];
  for (let r = 1; r <= ROUNDS; r++) {
    const t0 = performance.now();
    t.same(await flood(conns, KEYS, 'app'), { 200: KEYS }, `round ${r}: ${KEYS} new keys, each admitted (a new bucket is full)`);
    rates.push(KEYS / ((performance.now() - t0) / 1000));
    rss.push(rssMiB(pid));
  }
  const at = (i: number): number => rss[i] as number;
  t.comment(`worker RSS, MiB: ${rss.map((v, i) => `${i * KEYS} keys ${v.toFixed(1)}`).join(', ')} (${rates.map((x) => x.toFixed(0)).join(', ')} requests/s)`);
  t.ok(at(ROUNDS) - at(0) < TOTAL_GROWTH_BOUND_MIB, `${ROUNDS * KEYS} keys grew the worker by ${(at(ROUNDS) - at(0)).toFixed(1)} MiB, under ${TOTAL_GROWTH_BOUND_MIB} MiB (kept without bound: about ${(ROUNDS * perRoundMiB).toFixed(0)} MiB)`);
  t.ok(at(ROUNDS) - at(ROUNDS - 1) < LAST_ROUND_BOUND_MIB, `the last ${KEYS} by ${(at(ROUNDS) - at(ROUNDS - 1)).toFixed(1)} MiB, under ${LAST_ROUND_BOUND_MIB} MiB (kept without bound: about ${perRoundMiB.toFixed(0)} MiB)`);

  // The limit still limits: a key's second request at once is denied, a new key is served.
  const [c0] = conns as [H2Connection];
  const burst: Answer[] = [];
  for (let i = 0; i < 3; i++) burst.push(await c0.request({ path: '/app/after', headers: { 'x-key': 'after-the-flood' } }));
  t.same(statuses(burst), { 200: 1, 429: 2 }, 'after the flood, one key: 1 served, the next 2 limited');
  for (const a of burst.slice(1)) assertLimited(t, a, 'EDGE_RATE_LIMITED', 'after the flood', 1);
  t.equal((await c0.request({ path: '/app/after', headers: { 'x-key': 'another-new-key' } })).status, 200, 'a new key is served');
  t.equal(await metric(p, 'svc_request_rate_limited'), 2, 'svc_request_rate_limited 2: the flood itself was never limited');
});
