// The quota without Redis: policy compilation (routes, dimensions, the hashed key, the label),
// local fixed-window counters with a fake clock (contracts, the worker share, atomicity across
// policies, Retry-After), the memory bound, and QuotaControl with backend `local`.
import t from 'tap';
import fc from 'fast-check';
import { Metrics } from '@edge-proxy/telemetry';
import { compilePolicies, LocalCounters, MAX_LOCAL_KEYS, QuotaControl, parseRedisAddress, reconnectDelay, retryAfterSeconds, selectorDigest, workerShare } from '../src/resilience/quota/index.ts';
import type { CompiledPolicy } from '../src/resilience/quota/index.ts';
import { check, clearOfWindowEnd, counterValue, facts, policy, quotaSettings } from './support/quota.ts';

const quota = (o: Parameters<typeof quotaSettings>[0]) => quotaSettings(o).resilience.quota;

t.test('policies: routes filter, label, key = prefix + name + 128-bit digest of the values, never the values', async (t) => {
  const [a, b] = compilePolicies(quota({ policies: [policy('tenant', { routes: ['api'], dimensions: ['header:X-Tenant', 'client_ip'] }), policy('per-host', { dimensions: ['host'] })] })) as CompiledPolicy[];
  t.same([...(a?.routes ?? [])], ['api']);
  t.equal(b?.routes, undefined, 'empty routes: every route');
  t.equal(a?.selectorDimensions, 'header:X-Tenant,client_ip');
  const secret = 'tok_live_abcdef';
  const key = a?.key(facts({ 'x-tenant': secret })) ?? '';
  t.match(key, /^edge-proxy:quota:tenant:[A-Za-z0-9_-]{22}$/);
  t.notMatch(key, secret);
  t.equal(key, `edge-proxy:quota:tenant:${selectorDigest([`h:${secret}`, 'a:192.0.2.1'])}`);
  t.not(a?.key(facts({ 'x-tenant': 'other' })), key, 'another value, another key');
  t.not(a?.key(facts({ 'x-tenant': secret }, { clientIp: '192.0.2.2' })), key, 'every dimension counts');
  t.not(selectorDigest(['a', 'bc']), selectorDigest(['ab', 'c']), 'values are length-prefixed');
  t.equal(b?.key(facts({}, { host: 'x.example' })), `edge-proxy:quota:per-host:${selectorDigest(['n:x.example'])}`);
  t.same(compilePolicies({ ...quota({}), enabled: false }), [], 'disabled: no policies');
  const perRoute = compilePolicies({ ...quotaSettings({ policies: [policy('tenant', { routes: ['api'] }), policy('all')] }), upstream: { api: {}, web: {}, static: {} } });
  t.same([...perRoute].map(([route, list]) => [route, list.map((p) => p.name)]), [['api', ['tenant', 'all']], ['web', ['all']], ['static', ['all']]], 'per route, given the whole configuration');
  t.same(compilePolicies(quota({ redis: { address: 'h:1', key_prefix: 'p:', timeout_ms: 50 } }))[0]?.key(facts({ 'x-tenant': 'a' }))?.slice(0, 9), 'p:tenant:');
});

t.test('dimensions reuse the request-key extractors, tagged by selector: cookie, query, route; a missing value counts under the client address', async (t) => {
  const [c, q, r] = compilePolicies(quota({ policies: [policy('c', { dimensions: ['cookie:sid'] }), policy('q', { dimensions: ['query:key'] }), policy('r', { dimensions: ['route'] })] })) as CompiledPolicy[];
  t.equal(c?.key(facts({ cookie: 'a=1; sid=s1' })), `edge-proxy:quota:c:${selectorDigest(['c:s1'])}`);
  t.equal(q?.key(facts({}, { path: '/x?key=k%201' })), `edge-proxy:quota:q:${selectorDigest(['q:k 1'])}`);
  t.equal(r?.key(facts({}, { route: 'api' })), `edge-proxy:quota:r:${selectorDigest(['r:api'])}`);
  t.equal(c?.key(facts({})), `edge-proxy:quota:c:${selectorDigest(['a:192.0.2.1'])}`, 'no cookie: the client IP, in its own key space');
});

t.test('local counters: burst and sustained fixed windows, the worker share, Retry-After to the window end', async (t) => {
  const [p] = compilePolicies(quota({ policies: [policy('t', { burst: { limit: 4, window_ms: 1000 }, sustained: { limit: 6, window_ms: 60_000 } })] })) as CompiledPolicy[];
  const pol = [p as CompiledPolicy];
  const keys = ['k'];
  const c = new LocalCounters();
  const run = (n: number, now: number, workers = 1) => Array.from({ length: n }, () => c.decide(pol, keys, workers, now));
  const first = run(6, 120_250);
  t.same(first.map((d) => d.allowed), [true, true, true, true, false, false], 'burst 4');
  t.equal(first[4]?.contract, 'burst');
  t.equal(first[4]?.retryAfterMs, 750, 'until the burst window ends');
  const second = run(4, 121_000);
  t.same(second.map((d) => d.allowed), [true, true, false, false], 'the next burst window: the sustained 6 stops it');
  t.equal(second[2]?.contract, 'sustained');
  t.equal(second[2]?.retryAfterMs, 59_000);
  t.same(run(1, 180_000).map((d) => d.allowed), [true], 'a new sustained window');
  const shared = new LocalCounters();
  let allowed = 0;
  for (let i = 0; i < 10; i++) if (shared.decide(pol, ['s'], 3, 0).allowed) allowed++;
  t.equal(allowed, 2, 'three workers: ceil(4 / 3) = 2 each');
  t.same([workerShare(10, 1), workerShare(10, 2), workerShare(10, 3), workerShare(1, 8), workerShare(5, 0)], [10, 5, 4, 1, 5]);
  t.same([retryAfterSeconds(0), retryAfterSeconds(1), retryAfterSeconds(1000), retryAfterSeconds(1001)], [1, 1, 1, 2]);
});

t.test('local counters: counted in every policy only when all allow', async (t) => {
  const [wide, narrow] = compilePolicies(quota({ policies: [policy('wide', { sustained: { limit: 100, window_ms: 60_000 } }), policy('narrow', { sustained: { limit: 2, window_ms: 60_000 } })] })) as CompiledPolicy[];
  const c = new LocalCounters();
  const both = [wide as CompiledPolicy, narrow as CompiledPolicy];
  const out = Array.from({ length: 5 }, () => c.decide(both, ['w', 'n'], 1, 0));
  t.same(out.map((d) => d.allowed), [true, true, false, false, false]);
  t.equal(out[2]?.policy?.name, 'narrow');
  let wideLeft = 0;
  while (c.decide([wide as CompiledPolicy], ['w'], 1, 0).allowed) wideLeft++;
  t.equal(wideLeft, 98, 'the three denied requests were not counted in the wide policy');
});

t.test('property: whatever the requests and times, no window of any key admits more than the share, and a denial names a full contract', async (t) => {
  const [p] = compilePolicies(quota({ policies: [policy('t', { burst: { limit: 3, window_ms: 100 }, sustained: { limit: 7, window_ms: 1000 } })] })) as CompiledPolicy[];
  const pol = [p as CompiledPolicy];
  fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 3 }),
      fc.array(fc.tuple(fc.integer({ min: 0, max: 3 }), fc.integer({ min: 0, max: 40 })), { maxLength: 300 }),
      (workers, steps) => {
        const c = new LocalCounters(8);
        const admitted = new Map<string, number>();
        let now = 0;
        for (const [key, dt] of steps) {
          now += dt;
          const d = c.decide(pol, [`k${key}`], workers, now);
          if (!d.allowed) {
            if (d.retryAfterMs <= 0 || d.retryAfterMs > 1000) return false;
            continue;
          }
          for (const [w, limit] of [[100, 3], [1000, 7]] as const) {
            const id = `${key}/${w}/${Math.floor(now / w)}`;
            const n = (admitted.get(id) ?? 0) + 1;
            admitted.set(id, n);
            if (n > workerShare(limit, workers)) return false;
          }
        }
        return true;
      },
    ),
    { seed: 15, numRuns: 300 },
  );
  t.pass('300 random runs');
});

t.test(`local counters stay bounded: ${MAX_LOCAL_KEYS + 50_000} distinct keys, at most ${MAX_LOCAL_KEYS} counters, least recently used evicted`, async (t) => {
  const [p] = compilePolicies(quota({ policies: [policy('t', { sustained: { limit: 1, window_ms: 3_600_000 } })] })) as CompiledPolicy[];
  const pol = [p as CompiledPolicy];
  const c = new LocalCounters();
  t.equal(c.decide(pol, ['hot'], 1, 0).allowed, true);
  let max = 0;
  for (let i = 0; i < MAX_LOCAL_KEYS + 50_000; i++) {
    c.decide(pol, [`k${i}`], 1, 1);
    if (i % 1000 === 0) t.equal(c.decide(pol, ['hot'], 1, 1).allowed, false, 'the hot key, used all along, keeps its count');
    if (c.size > max) max = c.size;
  }
  t.equal(max, MAX_LOCAL_KEYS);
  t.equal(c.decide(pol, ['k0'], 1, 1).allowed, true, 'the oldest keys were evicted (their count restarts)');
  t.equal(c.decide(pol, [`k${MAX_LOCAL_KEYS + 49_999}`], 1, 1).allowed, false, 'the newest is still counted');
  const small = new LocalCounters(10);
  for (let i = 0; i < 10; i++) small.decide(pol, [`a${i}`], 1, 0);
  for (let i = 0; i < 10; i++) small.decide(pol, [`b${i}`], 1, 3_600_000);
  t.equal(small.size, 10, 'expired windows are dropped as new keys come');
});

t.test('QuotaControl with backend local: decisions, mode, metrics, health', async (t) => {
  const metrics = new Metrics('worker');
  const q = new QuotaControl(metrics, 2);
  await clearOfWindowEnd(); // the real clock's hour: counted within one window
  q.configure(quotaSettings({ backend: 'local', redis: undefined, policies: [policy('tenant', { routes: ['api'], sustained: { limit: 10, window_ms: 3_600_000 } })] }), undefined);
  t.same(q.policiesFor('other'), []);
  const pols = q.policiesFor('api');
  t.equal(pols.length, 1);
  t.equal(q.policiesFor('api'), pols, 'the same array per route until the next generation');
  const verdicts = [];
  for (let i = 0; i < 8; i++) verdicts.push(await check(q, pols, facts({ 'x-tenant': 'acme' })));
  t.equal(verdicts.filter((v) => v.allowed).length, 5, 'two workers: 5 of 10 each');
  t.match(verdicts[7], { allowed: false, policy: 'tenant', reason: 'sustained_exceeded', mode: 'local' });
  t.ok((verdicts[7]?.retryAfterS ?? 0) >= 1);
  t.same(q.health(), { backend_mode: 'local', availability: 'available' });
  t.equal(await counterValue(metrics, 'svc_quota_policy_outcomes_total', { policy: 'tenant', decision: 'allow', backend_mode: 'local', selector_dimensions: 'header:x-tenant' }), 5);
  t.equal(await counterValue(metrics, 'svc_quota_policy_outcomes_total', { policy: 'tenant', decision: 'deny', reason: 'sustained_exceeded', backend_mode: 'local' }), 3);
  q.configure(quotaSettings({ enabled: false }), undefined);
  t.same(q.policiesFor('api'), [], 'quota off: no policies');
  t.same(q.health(), { backend_mode: 'distributed', availability: 'disabled' });
  t.same(new QuotaControl(metrics, 1).health(), { backend_mode: 'local', availability: 'disabled' }, 'never configured');
  await q.close();
});

t.test('QuotaControl: 110,000 distinct tenants through the local backend keep at most 100,000 counters', async (t) => {
  const q = new QuotaControl(new Metrics('worker'), 1);
  q.configure(quotaSettings({ backend: 'local', policies: [policy('tenant', { sustained: { limit: 5, window_ms: 3_600_000 } })] }), undefined);
  const pols = q.policiesFor('api');
  let allowed = 0;
  for (let i = 0; i < 110_000; i++) q.check(pols, facts({ 'x-tenant': `t${i}` }), (v) => (allowed += v.allowed ? 1 : 0));
  t.equal(allowed, 110_000, 'each new tenant is within its quota');
  t.equal(q.localKeys, MAX_LOCAL_KEYS);
  await q.close();
});

t.test('addresses and backoff', async (t) => {
  t.same(parseRedisAddress('127.0.0.1:6379'), { host: '127.0.0.1', port: 6379 });
  t.same(parseRedisAddress('[::1]:6380'), { host: '::1', port: 6380 });
  t.same(parseRedisAddress('redis://cache.internal:6379'), { host: 'cache.internal', port: 6379 });
  t.equal(parseRedisAddress('rediss://cache.internal:6379'), undefined, 'TLS is not supported');
  t.equal(parseRedisAddress('cache.internal'), undefined, 'a port is required');
  t.equal(parseRedisAddress('h:70000'), undefined);
  t.same([1, 2, 3, 4, 5, 6, 7, 20].map((n) => reconnectDelay(n, () => 0)), [50, 100, 200, 400, 800, 1600, 2000, 2000]);
  t.equal(reconnectDelay(20, () => 1), 2400, 'jitter adds at most 20 %');
});
