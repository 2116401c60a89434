// Token buckets of the scoped rate limits (resilience/rate-limit.ts): the burst, the refill, the
// Retry-After, a worker's share, several limits on one request, and bounded memory.
import t from 'tap';
import { RateLimiter, compileLimits } from '../src/resilience/rate-limit.ts';
import type { CompiledLimit } from '../src/resilience/rate-limit.ts';
import type { KeySource } from '../src/balancing/request-key.ts';
import type { ResolvedConfig } from '@edge-proxy/config';

const src = (clientIp: string, headers: Record<string, string> = {}): KeySource => ({ clientIp, host: 'h', path: '/p', route: 'api', header: (n) => headers[n] });

function limits(rateLimits: unknown[], routes = ['api', 'web']): ReadonlyMap<string, readonly CompiledLimit[]> {
  const config = { upstream: Object.fromEntries(routes.map((r) => [r, {}])), resilience: { rate_limits: rateLimits } } as unknown as ResolvedConfig['config'];
  return compileLimits(config);
}

t.test('a burst, then one request per 1/rate, with Retry-After the seconds to the next token', async (t) => {
  const l = limits([{ name: 'a', routes: [], key: 'client_ip', requests_per_second: 2, burst: 3 }]).get('api') ?? [];
  const r = new RateLimiter();
  t.same([0, 1, 2, 3].map(() => r.take(l, src('1.1.1.1'), 1000)), [0, 0, 0, 1], 'three at once, the fourth waits 1 s (0.5 s rounded up)');
  t.equal(r.take(l, src('2.2.2.2'), 1000), 0, 'another key has its own bucket');
  t.equal(r.take(l, src('1.1.1.1'), 1499), 1, 'not yet at 499 ms');
  t.equal(r.take(l, src('1.1.1.1'), 1500), 0, 'a token after 500 ms (2/s)');
  const slow = limits([{ name: 's', routes: [], key: 'client_ip', requests_per_second: 1, burst: 1 }]).get('api') ?? [];
  r.take(slow, src('3.3.3.3'), 0);
  t.equal(r.take(slow, src('3.3.3.3'), 0), 1);
});

t.test("the whole contract, not a worker's share (the node's bucket is the supervisor's), under its ledger budget", async (t) => {
  const [l] = limits([{ name: 'a', routes: [], key: 'client_ip', requests_per_second: 100, burst: 10 }]).get('api') ?? [];
  t.equal(l?.burst, 10);
  t.equal(l?.perMs, 0.1);
  t.equal(l?.budget, 'rl:a');
});

t.test('scoped to routes; key specs; several limits take a token only when all allow', async (t) => {
  const byRoute = limits([
    { name: 'api-only', routes: ['api'], key: 'header:x-tenant', requests_per_second: 1, burst: 1 },
    { name: 'all', routes: [], key: 'client_ip', requests_per_second: 1, burst: 2 },
  ]);
  t.same(byRoute.get('web')?.map((l) => l.name), ['all']);
  t.same(byRoute.get('api')?.map((l) => l.name), ['api-only', 'all']);
  const api = byRoute.get('api') ?? [];
  const r = new RateLimiter();
  t.equal(r.take(api, src('1.1.1.1', { 'x-tenant': 'a' }), 0), 0);
  t.equal(r.take(api, src('1.1.1.1', { 'x-tenant': 'a' }), 0), 1, "tenant a's bucket is empty");
  t.equal(r.take(api, src('1.1.1.1', { 'x-tenant': 'b' }), 0), 0, "tenant b's is not: the client's second token");
  t.equal(r.take(api, src('1.1.1.1', { 'x-tenant': 'c' }), 0), 1, 'now the client bucket is empty');
  t.equal(r.take(byRoute.get('web') ?? [], src('9.9.9.9'), 0), 0);
  // The refused request above took nothing from tenant c.
  t.equal(r.take(byRoute.get('api') ?? [], src('8.8.8.8', { 'x-tenant': 'c' }), 0), 0, "tenant c's token was not spent by the refusal");
});

t.test('memory: full buckets are swept; past the cap the least recently used go', async (t) => {
  const l = limits([{ name: 'a', routes: [], key: 'client_ip', requests_per_second: 10, burst: 10 }]).get('api') ?? [];
  const passes: number[] = [];
  const r = new RateLimiter(1000, (n) => passes.push(n));
  t.teardown(() => r.close());
  for (let i = 0; i < 100_000; i++) r.take(l, src(`k${i}`), 0);
  t.ok(r.size <= 1000 && r.size > 900, `100,000 distinct keys: ${r.size} buckets kept (cap 1,000)`);
  t.ok(passes.length > 0 && passes.every((n) => n === 100), `evicted a tenth of the cap per pass (${passes.length} passes)`);
  t.equal(passes.reduce((a, b) => a + b, 0), 100_000 - r.size, 'every bucket not kept was reported evicted');
  // A key in use survives a flood of new ones: its bucket stays empty (a new one would be full).
  const slow = limits([{ name: 'slow', routes: [], key: 'client_ip', requests_per_second: 1, burst: 10 }]).get('api') ?? [];
  for (let i = 0; i < 10; i++) r.take(slow, src('hot'), 5000);
  t.equal(r.take(slow, src('hot'), 5000), 1, 'hot is empty');
  for (let i = 0; i < 800; i++) r.take(l, src(`n${i}`), 5500);
  t.equal(r.take(slow, src('hot'), 5500), 1, 'hot kept its bucket through 800 new keys: still empty after 0.5 s at 1/s');
  r.sweep(1_000_000);
  t.equal(r.size, 0, 'every bucket refilled by then: all swept');
});

t.test('a header key is its own key space: a client sending x-api-key: <an address> does not spend the bucket of the header-less clients behind that address', async (t) => {
  const [l] = limits([{ name: 'k', routes: [], key: 'header:x-api-key', key_fallback: 'client_ip', requests_per_second: 1, burst: 3 }]).get('api') ?? [];
  const r = new RateLimiter();
  t.teardown(() => r.close());
  const spoofer = src('10.1.2.3', { 'x-api-key': '10.1.2.3' });
  t.same([1, 2, 3, 4, 5].map(() => r.take([l as CompiledLimit], spoofer, 0)), [0, 0, 0, 1, 1], 'the spoofer: its own burst of 3, then refused');
  t.same([1, 2, 3, 4].map(() => r.take([l as CompiledLimit], src('10.1.2.3'), 0)), [0, 0, 0, 1], 'the header-less clients of 10.1.2.3: their whole burst of 3, untouched');
  t.equal(r.take([l as CompiledLimit], src('10.9.9.9', { 'x-api-key': '10.1.2.3' }), 0), 1, 'the header value is the key: another address sending it shares the spoofer’s bucket');
  t.equal(r.size, 2, 'two buckets: h:10.1.2.3 and a:10.1.2.3');
});

t.test('key_fallback none: a request without the header is not limited by that limit, and is still by the others', async (t) => {
  const api = limits([
    { name: 'per-key', routes: [], key: 'header:x-api-key', key_fallback: 'none', requests_per_second: 1, burst: 1 },
    { name: 'per-ip', routes: [], key: 'client_ip', key_fallback: 'client_ip', requests_per_second: 1, burst: 3 },
  ]).get('api') ?? [];
  const r = new RateLimiter();
  t.teardown(() => r.close());
  t.same([1, 2, 3, 4].map(() => r.take(api, src('1.1.1.1'), 0)), [0, 0, 0, 1], 'no header: per-key skipped, per-ip allows its 3');
  t.same([0, 1].map(() => r.take(api, src('2.2.2.2', { 'x-api-key': 'k' }), 0)), [0, 1], 'with the header: per-key (burst 1) applies');
  t.equal(r.size, 3, 'no bucket for the missing key: per-ip 1.1.1.1, per-key k, per-ip 2.2.2.2');
});
