// Spoofed selectors and unbounded quota keys (issue 38, findings 4 and 5) against a real
// `edge-proxy serve` with two workers, a real backend, a real `redis-server` on a free loopback
// port, HTTP/1.1, HTTP/2 and HTTP/3 clients. Every client here is 127.0.0.1.
//
// Finding 4: a `header:` key used to fall back to the client IP in the same key space, so a client
// sending `x-api-key: 127.0.0.1` spent the rate limit and the quota of every header-less client
// behind 127.0.0.1. Now each selector has its own key space: the spoofer is limited in its own, and
// the header-less clients keep their whole budget.
//
// Finding 5: each new selector value created keys in the shared Redis (one client rotating a
// header at 500 req/s: 8,877 keys in 20 s). Now each worker charges every new key to the source's
// budget (`max_new_keys_per_source`) and the policy's cap (`max_keys_per_window`) before Redis is
// asked; past them the `failure_mode` decides. The Redis key count is read with DBSIZE against the
// documented bound (docs/quota.md "Redis sizing"): workers × budget × contracts.
//
// Windows are an hour (burst) and a day (sustained) long, and no test starts in the last minute of
// an hour, so no window edge falls inside a test.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { pollUntil, request, snapshot, startProxy } from './support/overload.ts';
import { metricValue, parseExposition, scrape } from './support/exposition.ts';
import { assertLimited, connectionsOnEveryWorker, statuses } from './support/limits.ts';
import { startRedis } from './support/redis.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Answer, Proxy, StartedProxy } from './support/overload.ts';
import type { PinnedConnection } from './support/limits.ts';
import type { RedisServer } from './support/redis.ts';
import type { Test } from 'tap';

const files = serviceFiles(t, 'edge-selector-keys-');

const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const LIMITS = 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000';
const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;
const WORKERS = 2;
/** The address every client of the test has, sent as the spoofed header value. */
const CLIENT_IP = '127.0.0.1';

t.beforeEach(async () => {
  const left = HOUR_MS - (Date.now() % HOUR_MS);
  if (left < 60_000) await new Promise((r) => setTimeout(r, left + 10));
});

/** Routes `app` (limited) and `probe` (not: it finds each connection's worker), both on `be`. */
const pools = (be: ControlledBackend): string =>
  `{ app: { route: { path_prefix: /app }, backends: [{ id: ${be.name}, address: "127.0.0.1:${be.port}" }] }, probe: { route: { path_prefix: /probe }, backends: [{ id: ${be.name}, address: "127.0.0.1:${be.port}" }] } }`;

/** Two HTTP/2 connections, one on each worker. */
async function pinned(t: Test, p: Proxy, be: ControlledBackend): Promise<PinnedConnection[]> {
  be.set({ kind: 'hold' }, '/probe');
  return connectionsOnEveryWorker(t, p, be, '/probe', WORKERS, 1);
}

/** `requests` spread over `conns` in turn, all at once. */
function spread(conns: readonly PinnedConnection[], paths: readonly string[], headers: (i: number) => Record<string, string>): Promise<Answer[]> {
  return Promise.all(paths.map((path, i) => (conns[i % conns.length] as PinnedConnection).request({ path, headers: headers(i) })));
}

/** A proxy under quota policy `key` (`policy` its YAML flow entries after the name), resolved once every worker has its Redis connection. */
async function quotaProxy(t: Test, name: string, be: ControlledBackend, redis: RedisServer, policy: string, o: { failureMode?: string; prefix?: string } = {}): Promise<StartedProxy> {
  const p = await startProxy(t, files, name, {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be),
    resilience: `{ ${QUIET}, quota: { enabled: true, backend: redis, redis: { address: "${redis.address}", timeout_ms: 2000${o.prefix === undefined ? '' : `, key_prefix: "${o.prefix}"`} }, failure_mode: ${o.failureMode ?? 'local_fallback'}, policies: [{ name: key, routes: [app], ${policy} }] } }`,
  });
  const s = await pollUntil(
    async () => ((await snapshot(p))['observability'] as Record<string, unknown>)['quota_backend_health_summary'] as { availability?: string },
    (x) => x.availability === 'available',
    10_000,
  );
  if (s.availability !== 'available') throw new Error(`${name}: the quota store is not available: ${JSON.stringify(s)}`);
  return p;
}

/** Counter series of `name` that are not 0, as their labels in `keys` joined by ' ' → value. */
async function series(p: Proxy, name: string, keys: readonly string[]): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const s of parseExposition(await scrape(p.mport))) {
    if (s.name !== name || s.value === 0) continue;
    const k = keys.map((l) => s.labels[l]).join(' ');
    out[k] = (out[k] ?? 0) + s.value;
  }
  return out;
}

/** Keys under `prefix` in Redis (KEYS: a test database of at most a few hundred). */
async function keysUnder(redis: RedisServer, prefix: string): Promise<string[]> {
  return (await redis.command('KEYS', `${prefix}*`)).split('\r\n').filter((l) => l.startsWith(prefix));
}

const dbsize = async (redis: RedisServer): Promise<number> => Number(/^:(\d+)/.exec(await redis.command('DBSIZE'))?.[1] ?? NaN);

t.test('rate limit keyed on header:x-api-key: a client sending x-api-key: 127.0.0.1 is limited in its own bucket; the header-less clients of 127.0.0.1 keep theirs, on h1, h2 and h3', async (t) => {
  const be = await controlledBackend(t, 'rl-spoof');
  // burst 10 over 2 workers: 5 tokens a worker; 1 token a second for the node, half a token a second per worker.
  const p = await startProxy(t, files, 'rl-spoof', {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be),
    resilience: `{ ${QUIET}, rate_limits: [{ name: per-key, routes: [app], key: "header:x-api-key", requests_per_second: 1, burst: 10 }] }`,
  });
  const conns = await pinned(t, p, be);
  const t0 = performance.now();
  const spoofed = await spread(conns, Array.from({ length: 30 }, (_, i) => `/app/spoof-${i}`), () => ({ 'x-api-key': CLIENT_IP }));
  const s = statuses(spoofed);
  t.comment(`spoofer: ${JSON.stringify(s)} in ${(performance.now() - t0).toFixed(0)} ms`);
  t.ok((s['200'] ?? 0) >= 10 && (s['200'] ?? 0) <= 12, `the spoofer gets its own burst: 10 (5 a worker, + at most 1 refilled a worker) of 30 served (${s['200']})`);
  t.equal((s['200'] ?? 0) + (s['429'] ?? 0), 30, 'the rest 429');
  assertLimited(t, spoofed.find((a) => a.status === 429) as Answer, 'EDGE_RATE_LIMITED', 'a spoofed request past its burst');
  // The header-less clients of 127.0.0.1, right after: 4 on the pinned connections (2 a worker), one over HTTP/1.1, one over HTTP/3.
  const plain = [...(await spread(conns, ['/app/plain-0', '/app/plain-1', '/app/plain-2', '/app/plain-3'], () => ({}))), await request(p, 'h1', { path: '/app/plain-h1' }), await request(p, 'h3', { path: '/app/plain-h3' })];
  t.same(
    plain.map((a) => a.status),
    [200, 200, 200, 200, 200, 200],
    'every header-less request is served: the spoofer spent its own bucket (h:127.0.0.1), not theirs (a:127.0.0.1)',
  );
  t.equal(be.arrivalsUnder('/app/plain').length, 6, 'and reached the backend');
  // The header value is the key: a client sending it over another protocol shares the spoofer's bucket.
  const again = await request(p, 'h1', { path: '/app/spoof-again', headers: { 'x-api-key': CLIENT_IP } });
  t.equal(again.status, 429, `the spoofed value over HTTP/1.1: still limited (${again.status})`);
  t.equal(metricValue(await scrape(p.mport), 'svc_request_rate_limited'), (s['429'] ?? 0) + 1, 'svc_request_rate_limited counts the spoofer only');
});

t.test('rate limit key_fallback none: header-less requests are not limited by the header limit, and are by a client_ip limit beside it', async (t) => {
  const be = await controlledBackend(t, 'rl-none');
  const p = await startProxy(t, files, 'rl-none', {
    performance: LIMITS,
    upstream: pools(be),
    resilience: `{ ${QUIET}, rate_limits: [{ name: per-key, routes: [app], key: "header:x-api-key", key_fallback: none, requests_per_second: 1, burst: 1 }, { name: per-ip, routes: [app], key: client_ip, requests_per_second: 1, burst: 4 }] }`,
  });
  const answers: Answer[] = [];
  for (const protocol of PROTOCOLS) answers.push(await request(p, protocol, { path: `/app/none-${protocol}` }));
  answers.push(await request(p, 'h1', { path: '/app/none-4' }));
  t.same(answers.map((a) => a.status), [200, 200, 200, 200], 'four header-less requests: per-key (burst 1) does not apply, per-ip (burst 4) admits them');
  const fifth = await request(p, 'h2', { path: '/app/none-5' });
  assertLimited(t, fifth, 'EDGE_RATE_LIMITED', 'the fifth header-less request (per-ip)');
});

t.test('quota on header:x-api-key: the spoofer spends its own quota; the header-less clients of 127.0.0.1 theirs; two counters in Redis', async (t) => {
  const redis = await startRedis(t);
  const be = await controlledBackend(t, 'q-spoof');
  const p = await quotaProxy(t, 'q-spoof', be, redis, `dimensions: ["header:x-api-key"], burst: { limit: 10, window_ms: ${DAY_MS} }`);
  const conns = await pinned(t, p, be);
  const spoofed = await spread(conns, Array.from({ length: 16 }, (_, i) => `/app/spoof-${i}`), () => ({ 'x-api-key': CLIENT_IP }));
  t.same(statuses(spoofed), { 200: 10, 429: 6 }, 'the spoofer: its quota of 10 (shared by both workers in Redis), then 429');
  assertLimited(t, spoofed.find((a) => a.status === 429) as Answer, 'EDGE_QUOTA_EXCEEDED', 'a spoofed request past the quota');
  const plain: Answer[] = [...(await spread(conns, ['/app/plain-0', '/app/plain-1'], () => ({})))];
  for (const protocol of PROTOCOLS) plain.push(await request(p, protocol, { path: `/app/plain-${protocol}` }));
  t.same(plain.map((a) => a.status), [200, 200, 200, 200, 200], 'every header-less request is served (h2 on both workers, h1, h2, h3)');
  t.same(
    await series(p, 'svc_quota_policy_outcomes_total', ['decision', 'reason', 'backend_mode', 'selector_dimensions']),
    { 'allow within_quota distributed header:x-api-key': 15, 'deny burst_exceeded distributed header:x-api-key': 6 },
    'decided by Redis: 10 + 5 allowed, 6 denied',
  );
  const keys = await keysUnder(redis, 'edge-proxy:quota:key:');
  t.equal(keys.length, 2, `two counters: the header value's and the client address's (${keys.join(', ')})`);
  t.ok(keys.every((k) => /^edge-proxy:quota:key:[A-Za-z0-9_-]{22}:b:\d+$/.test(k) && !k.includes(CLIENT_IP)), 'fixed-length digests, never the value');
});

t.test('one client rotating x-api-key: the Redis keys stay at workers × max_new_keys_per_source × contracts; the excess is decided by failure_mode deny; the metrics count both', async (t) => {
  const BUDGET = 20;
  const ROTATIONS = 200;
  const CONTRACTS = 2;
  const redis = await startRedis(t);
  const be = await controlledBackend(t, 'q-rotate');
  const p = await quotaProxy(t, 'q-rotate', be, redis, `dimensions: ["header:x-api-key"], max_new_keys_per_source: ${BUDGET}, burst: { limit: 100, window_ms: ${HOUR_MS} }, sustained: { limit: 1000, window_ms: ${DAY_MS} }`, { failureMode: 'deny' });
  const conns = await pinned(t, p, be);
  // A tenant known before the flood, from the same address: its key is not new, so the flood does not refuse it.
  t.equal((await (conns[0] as PinnedConnection).request({ path: '/app/known-0', headers: { 'x-api-key': 'known-tenant' } })).status, 200, 'a known tenant is served');
  const answers: Answer[] = [];
  for (let i = 0; i < ROTATIONS; i += 20) answers.push(...(await spread(conns, Array.from({ length: 20 }, (_, j) => `/app/rot-${i + j}`), (j) => ({ 'x-api-key': `rotated-${i + j}` }))));
  const bound = WORKERS * BUDGET * CONTRACTS;
  const size = await dbsize(redis);
  t.comment(`${ROTATIONS} rotated values: ${JSON.stringify(statuses(answers))}; DBSIZE ${size} (bound ${bound})`);
  // Per worker: the known tenant took 1 of worker 0's budget; each worker admits BUDGET new selectors in all.
  t.same(statuses(answers), { 200: WORKERS * BUDGET - 1, 429: ROTATIONS - (WORKERS * BUDGET - 1) }, `${WORKERS} workers × ${BUDGET} new selectors served (one of worker 0's went to the known tenant), the rest 429`);
  t.ok(size <= bound, `DBSIZE ${size} ≤ ${WORKERS} workers × ${BUDGET} × ${CONTRACTS} contracts = ${bound}`);
  t.equal(size, bound, 'exactly the bound: every admitted selector has its burst and its sustained counter');
  const refused = answers.filter((a) => a.status === 429);
  assertLimited(t, refused[0] as Answer, 'EDGE_QUOTA_EXCEEDED', 'a rotated request past the budget');
  t.ok(refused.every((a) => Number(a.headers['retry-after']) >= 1), 'every refusal has a Retry-After');
  t.same(await series(p, 'svc_quota_keys_created_total', ['policy', 'selector_dimensions']), { 'key header:x-api-key': bound }, `svc_quota_keys_created_total: ${bound}, as many as DBSIZE`);
  t.same(await series(p, 'svc_quota_keys_refused_total', ['policy', 'reason']), { 'key source_budget': refused.length }, `svc_quota_keys_refused_total{reason="source_budget"}: ${refused.length}`);
  t.same(
    await series(p, 'svc_quota_policy_outcomes_total', ['decision', 'reason']),
    { 'allow within_quota': WORKERS * BUDGET, 'deny key_budget_exceeded': refused.length },
    'outcomes: the refused are decided by failure_mode deny, reason key_budget_exceeded',
  );
  // The known tenant and the admitted selectors keep working during the flood.
  const during = await spread(conns, ['/app/known-1', '/app/rot-again'], (j) => ({ 'x-api-key': j === 0 ? 'known-tenant' : 'rotated-1' }));
  t.same(during.map((a) => a.status), [200, 200], 'the known tenant (worker 0) and an admitted selector (worker 1, rotated-1) are still served by Redis');
  t.equal(await dbsize(redis), bound, 'and no key was added for them');
  const text = await scrape(p.mport);
  t.notMatch(text, /rotated-|known-tenant/, 'no selector value in /metrics');
});

t.test('the policy cap: max_keys_per_window reached → failure_mode local_fallback decides, Redis holds workers × cap keys', async (t) => {
  const CAP = 8;
  const ROTATIONS = 60;
  const PREFIX = 'edge-proxy:cap:';
  const redis = await startRedis(t);
  const be = await controlledBackend(t, 'q-cap');
  // One contract; the per-source budget follows the cap (derived default: min(100, cap)).
  const p = await quotaProxy(t, 'q-cap', be, redis, `dimensions: ["header:x-api-key"], max_keys_per_window: ${CAP}, sustained: { limit: 1, window_ms: ${DAY_MS} }`, { prefix: PREFIX });
  const conns = await pinned(t, p, be);
  const answers: Answer[] = [];
  for (let i = 0; i < ROTATIONS; i += 10) answers.push(...(await spread(conns, Array.from({ length: 10 }, (_, j) => `/app/cap-${i + j}`), (j) => ({ 'x-api-key': `cap-${i + j}` }))));
  t.same(statuses(answers), { 200: ROTATIONS }, 'local_fallback: every one served (a new selector is within its local limit of 1)');
  const keys = await keysUnder(redis, PREFIX);
  t.equal(keys.length, WORKERS * CAP, `Redis: ${keys.length} keys = ${WORKERS} workers × cap ${CAP}`);
  t.same(await series(p, 'svc_quota_keys_refused_total', ['reason']), { policy_cap: ROTATIONS - WORKERS * CAP }, 'the rest refused by the policy cap');
  t.same(
    await series(p, 'svc_quota_policy_outcomes_total', ['decision', 'backend_mode']),
    { 'allow distributed': WORKERS * CAP, 'allow local_fallback': ROTATIONS - WORKERS * CAP },
    'decided by Redis up to the cap, by the local counters past it',
  );
  // The local counters still enforce the contract for a refused selector: its second request is denied.
  // cap-58 came in the last batch, on conns[58 % 2] (worker 0): long past that worker's cap.
  const last = ROTATIONS - 2;
  const second = await (conns[last % conns.length] as PinnedConnection).request({ path: '/app/cap-second', headers: { 'x-api-key': `cap-${last}` } });
  assertLimited(t, second, 'EDGE_QUOTA_EXCEEDED', 'a refused selector asking again on its worker (local limit 1)');
});
