// The new-key budgets of the quota (resilience/quota/key-budget.ts), with a fake clock: the source
// of a client address (IPv4, IPv6 /64), a source's budget and the policy's cap per contract
// window, keys already charged never refused, a new window starting the budgets again, the
// all-or-nothing charge across policies, and the memory of a flood.
import t from 'tap';
import { KeyBudget, sourceOf } from '../src/resilience/quota/key-budget.ts';
import { compilePolicies } from '../src/resilience/quota/index.ts';
import type { CompiledPolicy } from '../src/resilience/quota/index.ts';
import { policy, quotaSettings } from './support/quota.ts';

const HOUR = 3_600_000;
const compile = (...ps: ReturnType<typeof policy>[]): CompiledPolicy[] => compilePolicies(quotaSettings({ policies: ps }).resilience.quota);
const ok = (v: ReturnType<KeyBudget['admit']>): string => (v.ok ? `ok ${v.created.join(',')}` : `${v.reason} ${v.policy.name} ${v.contract}`);

t.test('sourceOf: an IPv4 address, an IPv6 /64, an IPv4-mapped address as its IPv4', async (t) => {
  const table: [string, string][] = [
    ['192.0.2.1', '192.0.2.1'],
    ['::ffff:192.0.2.1', '192.0.2.1'],
    ['::FFFF:192.0.2.1', '192.0.2.1'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['2001:db8:1:2::7', '2001:db8:1:2::/64'],
    ['2001:0DB8:0001:0002:ffff::', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['::', '0:0:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['a:b::c:d:e:1.2.3.4', 'a:b:0:c::/64'],
    ['64:ff9b::1.2.3.4', '64:ff9b:0:0::/64'],
    ['/run/edge.sock', '/run/edge.sock'],
    ['', ''],
  ];
  for (const [address, source] of table) t.equal(sourceOf(address), source, address || '(empty)');
  t.equal(sourceOf('2001:db8:1:2:aaaa::1'), sourceOf('2001:db8:1:2:bbbb::2'), 'two addresses of one /64: one source');
  t.not(sourceOf('2001:db8:1:2::1'), sourceOf('2001:db8:1:3::1'), 'another /64: another source');
});

t.test("a source's budget: its new keys per contract window, then refused; its known keys never; other sources unaffected", async (t) => {
  const [p] = compile(policy('tenant', { max_new_keys_per_source: 3, max_keys_per_window: 100 })) as CompiledPolicy[];
  const b = new KeyBudget();
  const now = 10 * HOUR + 1000;
  const got = ['k0', 'k1', 'k2', 'k3', 'k4'].map((k) => ok(b.admit([p as CompiledPolicy], [k], '10.0.0.1', now)));
  t.same(got, ['ok 1', 'ok 1', 'ok 1', 'source_budget tenant sustained', 'source_budget tenant sustained'], 'three new keys, then refused');
  t.same(['k0', 'k1', 'k2'].map((k) => ok(b.admit([p as CompiledPolicy], [k], '10.0.0.1', now + 5))), ['ok 0', 'ok 0', 'ok 0'], 'its three known keys: admitted, nothing charged');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k9'], '10.0.0.2', now)), 'ok 1', 'another source: its own budget');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k3'], '10.0.0.2', now)), 'ok 1', "the key the first source was refused, from another source: the first's refusal charged nothing");
  const refused = b.admit([p as CompiledPolicy], ['k5'], '10.0.0.1', now);
  t.equal(refused.ok ? -1 : refused.retryAfterMs, HOUR - 1000, 'retryAfterMs: until the window ends (its budget starts again)');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k5'], '10.0.0.1', 11 * HOUR)), 'ok 1', 'the next window: a new budget');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k0'], '10.0.0.1', 11 * HOUR)), 'ok 1', 'and a key of the last window is new again (its Redis key of this window does not exist yet)');
  t.same(['a', 'b'].map((k) => ok(b.admit([p as CompiledPolicy], [k], '2001:db8:1:2::1', now))), ['ok 1', 'ok 1']);
  t.same(['c', 'd'].map((k) => ok(b.admit([p as CompiledPolicy], [k], '2001:db8:1:2::ffff', now))), ['ok 1', 'source_budget tenant sustained'], 'IPv6: the addresses of one /64 share one budget');
});

t.test("the policy's cap: new keys per window every source together, then refused whoever asks; per contract", async (t) => {
  const [p] = compile(policy('tenant', { max_keys_per_window: 10, max_new_keys_per_source: 10, burst: { limit: 5, window_ms: 1000 } })) as CompiledPolicy[];
  const b = new KeyBudget();
  const now = 100 * HOUR;
  // Ten sources, one new key each: each key is new in both contracts (2 keys).
  t.same(Array.from({ length: 10 }, (_, i) => ok(b.admit([p as CompiledPolicy], [`k${i}`], `10.0.0.${i}`, now))), Array.from({ length: 10 }, () => 'ok 2'), 'ten new selectors: burst and sustained keys each (2 per request)');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k10'], '10.0.1.1', now)), 'policy_cap tenant burst', 'the eleventh new selector, from a fresh source: the policy cap (burst checked first)');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k3'], '10.0.0.3', now + 10)), 'ok 0', 'a known selector: admitted');
  // The next burst window: the burst keys are new again (Redis makes a key per window), the sustained ones are not.
  t.equal(ok(b.admit([p as CompiledPolicy], ['k3'], '10.0.0.3', now + 1000)), 'ok 1', 'next burst window: only the burst key is new');
  t.equal(ok(b.admit([p as CompiledPolicy], ['k10'], '10.0.1.1', now + 1000)), 'policy_cap tenant sustained', 'a new selector still finds the sustained cap full');
  t.equal(b.size, 10 + 1, 'memory: the sustained window holds 10 selectors, the new burst window 1 (the old burst window dropped)');
});

t.test('several policies: all or nothing; a refused request charges no budget', async (t) => {
  const [a, c] = compile(policy('a', { max_keys_per_window: 100, max_new_keys_per_source: 100 }), policy('c', { max_keys_per_window: 3, max_new_keys_per_source: 2 })) as CompiledPolicy[];
  const b = new KeyBudget();
  const both = [a, c] as CompiledPolicy[];
  t.same(['x', 'y', 'z'].map((k) => ok(b.admit(both, [`a-${k}`, `c-${k}`], '10.0.0.1', 0))), ['ok 1,1', 'ok 1,1', 'source_budget c sustained'], "c's budget refuses the third");
  t.equal(ok(b.admit([a as CompiledPolicy], ['a-w'], '10.0.0.1', 0)), 'ok 1', 'a alone still admits');
  t.equal(b.size, 2 + 3, "a: x, y, w (not z: the refused request charged nothing); c: x, y");
  b.retain(new Set(['a']));
  t.equal(b.size, 3, 'retain: the budgets of a removed policy are dropped');
});

t.test('a flood: 100,000 new selectors from one source and from 100,000 sources; memory stays at the cap', async (t) => {
  const [p] = compile(policy('tenant', { max_keys_per_window: 1000, max_new_keys_per_source: 100 })) as CompiledPolicy[];
  const b = new KeyBudget();
  const counts: Record<string, number> = {};
  for (let i = 0; i < 100_000; i++) {
    const v = ok(b.admit([p as CompiledPolicy], [`one-${i}`], '10.0.0.1', 5 * HOUR));
    counts[v] = (counts[v] ?? 0) + 1;
  }
  t.same(counts, { 'ok 1': 100, 'source_budget tenant sustained': 99_900 }, 'one source: 100 new keys');
  for (let i = 0; i < 100_000; i++) {
    const v = ok(b.admit([p as CompiledPolicy], [`many-${i}`], `10.${1 + ((i >> 16) & 255)}.${(i >> 8) & 255}.${i & 255}`, 5 * HOUR));
    counts[v] = (counts[v] ?? 0) + 1;
  }
  t.equal(counts['ok 1'], 1000, '100,000 sources: the policy cap, 1,000 new keys in all');
  t.equal(counts['policy_cap tenant sustained'], 99_100, 'the rest refused by the cap');
  t.equal(b.size, 1000, 'memory: 1,000 selectors remembered');
});
