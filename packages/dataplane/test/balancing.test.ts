// Load-balancing strategies: exact sequences, weighted distributions, consistent-hash remapping,
// and the health contract (never an ineligible backend; always one when any is eligible).
import t from 'tap';
import fc from 'fast-check';
import { buildSelector, BackendStatsRegistry, ConsistentHashSelector } from '../src/balancing/index.ts';
import type { BackendRef, PickContext } from '../src/balancing/index.ts';
import { LB_TYPES } from '@edge-proxy/config';

const refs = (weights: number[]): BackendRef[] => weights.map((w, i) => ({ key: `pool/b${i}/10.0.0.${i}:80`, id: `b${i}`, weight: w }));
const all: PickContext = { eligible: () => true };

/** Deterministic PRNG (mulberry32) so distribution tests cannot flake. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

function counts(pick: () => BackendRef | undefined, n: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (let i = 0; i < n; i++) {
    const b = pick();
    const k = b?.id ?? 'none';
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

const deps = { stats: new BackendStatsRegistry() };

t.test('round-robin: smooth weighted interleaving and exact shares', async (t) => {
  const s = buildSelector(refs([5, 1, 1]), { type: 'round-robin' }, deps);
  t.same(Array.from({ length: 7 }, () => s.pick(all)?.id), ['b0', 'b0', 'b1', 'b0', 'b2', 'b0', 'b0']);
  t.same(counts(() => s.pick(all), 700), { b0: 500, b1: 100, b2: 100 });
  const down: PickContext = { eligible: (b) => b.id !== 'b0' };
  t.same(counts(() => s.pick(down), 100), { b1: 50, b2: 50 }, 'ineligible backend skipped, the rest share evenly');
  t.same(counts(() => buildSelector(refs([0, 2]), { type: 'round-robin' }, deps).pick(all), 10), { b1: 10 }, 'weight 0 takes a backend out');
});

t.test('random: weighted shares within 3 % with a seeded source', async (t) => {
  const s = buildSelector(refs([1, 2, 7]), { type: 'random' }, deps);
  const random = seeded(42);
  const c = counts(() => s.pick({ eligible: () => true, random }), 100_000);
  t.ok(Math.abs((c['b0'] ?? 0) / 100_000 - 0.1) < 0.03 && Math.abs((c['b1'] ?? 0) / 100_000 - 0.2) < 0.03 && Math.abs((c['b2'] ?? 0) / 100_000 - 0.7) < 0.03, JSON.stringify(c));
  const c2 = counts(() => s.pick({ eligible: (b) => b.id !== 'b2', random }), 30_000);
  t.equal(c2['b2'], undefined, 'never the ineligible backend');
  t.ok(Math.abs((c2['b1'] ?? 0) / 30_000 - 2 / 3) < 0.03, `shares among the rest ${JSON.stringify(c2)}`);
});

t.test('consistent-hash: stable owners, even spread, minimal remapping when a backend leaves', async (t) => {
  const ten = refs(Array(10).fill(1));
  const s = new ConsistentHashSelector(ten);
  const keys = Array.from({ length: 50_000 }, (_, i) => `user-${i}`);
  const owners = keys.map((k) => s.pick({ eligible: () => true, hashKey: k })?.id);
  t.same(keys.slice(0, 100).map((k) => s.pick({ eligible: () => true, hashKey: k })?.id), owners.slice(0, 100), 'same key, same backend');
  const c: Record<string, number> = {};
  for (const o of owners) c[o as string] = (c[o as string] ?? 0) + 1;
  for (const [id, n] of Object.entries(c)) t.ok(Math.abs(n / 5000 - 1) < 0.1, `${id} holds ${n} of 50,000 keys (±10 % of 5,000)`);
  const nine = new ConsistentHashSelector(ten.filter((b) => b.id !== 'b3'));
  let movedOthers = 0;
  let fromRemoved = 0;
  keys.forEach((k, i) => {
    const now = nine.pick({ eligible: () => true, hashKey: k })?.id;
    if (owners[i] === 'b3') fromRemoved++;
    else if (now !== owners[i]) movedOthers++;
  });
  t.ok(fromRemoved > 0);
  t.ok(movedOthers / (keys.length - fromRemoved) < 0.02, `keys of remaining backends that moved: ${movedOthers} of ${keys.length - fromRemoved} (< 2 %)`);
  // Health at pick time: the owner is down, the key falls back deterministically; others stay.
  const down: PickContext = { eligible: (b) => b.id !== 'b3', hashKey: 'x' };
  const k3 = keys.find((_, i) => owners[i] === 'b3') as string;
  const fallback = s.pick({ ...down, hashKey: k3 })?.id;
  t.not(fallback, 'b3');
  t.equal(s.pick({ ...down, hashKey: k3 })?.id, fallback, 'deterministic fallback');
  const k0 = keys.find((_, i) => owners[i] === 'b0') as string;
  t.equal(s.pick({ ...down, hashKey: k0 })?.id, 'b0', 'other keys keep their owner');
});

t.test('consistent-hash weights: a weight-3 backend owns about three times the keys', async (t) => {
  const s = new ConsistentHashSelector(refs([1, 3]));
  const c = counts(() => undefined, 0);
  for (let i = 0; i < 40_000; i++) {
    const id = s.pick({ eligible: () => true, hashKey: `k${i}` })?.id as string;
    c[id] = (c[id] ?? 0) + 1;
  }
  t.ok(Math.abs((c['b1'] ?? 0) / 40_000 - 0.75) < 0.03, JSON.stringify(c));
});

t.test('sticky-cid: one connection id, one backend; spread across ids', async (t) => {
  const s = buildSelector(refs([1, 1, 1, 1]), { type: 'sticky-cid' }, deps);
  const first = s.pick({ eligible: () => true, affinityKey: 'cid-abc' })?.id;
  for (let i = 0; i < 20; i++) t.equal(s.pick({ eligible: () => true, affinityKey: 'cid-abc' })?.id, first);
  const spread = new Set(Array.from({ length: 200 }, (_, i) => s.pick({ eligible: () => true, affinityKey: `cid-${i}` })?.id));
  t.equal(spread.size, 4);
});

t.test('least-connections: the less loaded backend takes most new requests', async (t) => {
  const stats = new BackendStatsRegistry();
  const backends = refs([1, 1]);
  const tokens = Array.from({ length: 10 }, () => stats.begin((backends[0] as BackendRef).key));
  const s = buildSelector(backends, { type: 'least-connections' }, { stats });
  const random = seeded(7);
  const c = counts(() => s.pick({ eligible: () => true, random }), 1000);
  t.equal(c['b1'], 1000, 'with two backends, P2C always compares both: the idle one wins');
  t.equal(stats.inflight((backends[0] as BackendRef).key), 10);
  for (const token of tokens) stats.end(token);
  t.equal(stats.inflight((backends[0] as BackendRef).key), 0);
});

t.test('latency-aware: slow backends get less traffic; unmeasured ones are tried', async (t) => {
  const stats = new BackendStatsRegistry();
  const backends = refs([1, 1, 1]);
  const now = performance.now();
  stats.observe((backends[0] as BackendRef).key, 5, now);
  stats.observe((backends[1] as BackendRef).key, 200, now);
  const s = buildSelector(backends, { type: 'latency-aware' }, { stats });
  const random = seeded(9);
  const c = counts(() => s.pick({ eligible: () => true, random }), 3000);
  t.ok((c['b1'] ?? 0) < (c['b0'] ?? 0) / 5, `slow b1 gets little: ${JSON.stringify(c)}`);
  t.ok((c['b2'] ?? 0) > 300, `cold b2 is tried: ${JSON.stringify(c)}`);
});

t.test('every strategy: never an ineligible backend, always one when any is eligible', async (t) => {
  const stats = new BackendStatsRegistry();
  for (const type of LB_TYPES) {
    t.doesNotThrow(() => {
      fc.assert(
        fc.property(
          fc.array(fc.integer({ min: 0, max: 5 }), { minLength: 1, maxLength: 12 }),
          fc.array(fc.boolean(), { minLength: 12, maxLength: 12 }),
          fc.string({ maxLength: 8 }),
          (weights, healthy, key) => {
            const backends = refs(weights);
            const s = buildSelector(backends, { type, ...(type === 'consistent-hash' ? { key: 'client_ip' } : {}) }, { stats });
            const ctx: PickContext = { eligible: (b) => healthy[Number(b.id.slice(1))] === true, hashKey: key, affinityKey: key, random: seeded(weights.length) };
            const anyEligible = backends.some((b) => b.weight > 0 && healthy[Number(b.id.slice(1))] === true);
            for (let i = 0; i < 5; i++) {
              const b = s.pick(ctx);
              if (b !== undefined && (!ctx.eligible(b) || b.weight === 0)) return false;
              if (anyEligible && b === undefined) return false;
              if (!anyEligible && b !== undefined) return false;
            }
            return true;
          },
        ),
        { numRuns: 150 },
      );
    }, `${type}: health contract holds`);
  }
});

// Below: cases the mutation run (docs/testing.md) found unchecked.

/** A random source that returns the given values in order (then the last one). */
function fixed(...values: number[]): () => number {
  let i = 0;
  return () => values[Math.min(i++, values.length - 1)] as number;
}

t.test('round-robin: equal weights take turns in order; nothing usable gives undefined', async (t) => {
  const s = buildSelector(refs([1, 1, 1]), { type: 'round-robin' }, deps);
  t.same(Array.from({ length: 6 }, () => s.pick(all)?.id), ['b0', 'b1', 'b2', 'b0', 'b1', 'b2']);
  t.equal(s.pick({ eligible: () => false }), undefined);
});

t.test('random: exact draws on the cumulative weights (boundaries belong to the next backend)', async (t) => {
  const s = buildSelector(refs([1, 1, 2]), { type: 'random' }, deps);
  const pick = (r: number): string | undefined => s.pick({ eligible: () => true, random: fixed(r) })?.id;
  t.same([0, 0.2499, 0.25, 0.4999, 0.5, 0.9999].map(pick), ['b0', 'b0', 'b1', 'b1', 'b2', 'b2']);
  t.equal(buildSelector(refs([0, 0]), { type: 'random' }, deps).pick(all), undefined, 'all weights 0: nothing');
});

t.test('random: after three ineligible draws, one weighted draw among the usable backends', async (t) => {
  const s = buildSelector(refs([1, 1, 1]), { type: 'random' }, deps);
  const noB2: PickContext = { eligible: (b) => b.id !== 'b2', random: fixed(0.9, 0.9, 0.9, 0.5) };
  t.equal(s.pick(noB2)?.id, 'b1', 'fallback: 0.5 of the weight of b0 + b1 falls on b1');
  t.equal(s.pick({ eligible: (b) => b.id !== 'b2', random: fixed(0.9, 0.9, 0.9, 0.49) })?.id, 'b0');
  t.equal(s.pick({ eligible: (b) => b.id !== 'b2', random: fixed(0.9, 0.9, 0.1) })?.id, 'b0', 'the third draw still counts');
  t.equal(s.pick({ eligible: (b) => b.id === 'b2', random: fixed(0.1) })?.id, 'b2', 'the only usable one is found by the fallback');
  t.equal(s.pick({ eligible: () => false, random: fixed(0.1) }), undefined);
});

t.test('every strategy: an excluded backend (already tried by this request) is not picked again', async (t) => {
  const stats = new BackendStatsRegistry();
  const backends = refs([1, 1, 1]);
  for (const type of LB_TYPES) {
    const s = buildSelector(backends, { type, ...(type === 'consistent-hash' ? { key: 'client_ip' } : {}) }, { stats });
    for (let i = 0; i < 30; i++) {
      const exclude = new Set([(backends[i % 3] as BackendRef).key, (backends[(i + 1) % 3] as BackendRef).key]);
      t.equal(s.pick({ eligible: () => true, exclude, hashKey: `k${i}`, affinityKey: `k${i}`, random: seeded(i) })?.id, (backends[(i + 2) % 3] as BackendRef).id, `${type}: the one not excluded`);
    }
    t.equal(s.pick({ eligible: () => true, exclude: new Set(backends.map((b) => b.key)), hashKey: 'k', affinityKey: 'k', random: seeded(1) }), undefined, `${type}: all excluded`);
  }
});

t.test('least-connections: in-flight per unit of weight; one usable backend is picked alone', async (t) => {
  const stats = new BackendStatsRegistry();
  const backends = refs([1, 4]);
  const busy = Array.from({ length: 2 }, () => stats.begin((backends[1] as BackendRef).key));
  const s = buildSelector(backends, { type: 'least-connections' }, { stats });
  const c = counts(() => s.pick({ eligible: () => true, random: seeded(3) }), 200);
  t.same(c, { b1: 200 }, 'b1: 3/4 per weight beats b0: 1/1');
  for (const tk of busy) stats.end(tk);
  t.equal(buildSelector(refs([1]), { type: 'least-connections' }, { stats }).pick({ eligible: () => true, random: seeded(1) })?.id, 'b0');
  t.equal(s.pick({ eligible: (b) => b.id === 'b0', random: seeded(2) })?.id, 'b0', 'the second draw finds nothing: the first is kept');
});

t.test('latency-aware: with no sample at all it is least-connections; weight divides the cost', async (t) => {
  const stats = new BackendStatsRegistry();
  const backends = refs([1, 1]);
  const busy = Array.from({ length: 3 }, () => stats.begin((backends[0] as BackendRef).key));
  const s = buildSelector(backends, { type: 'latency-aware' }, { stats });
  t.same(counts(() => s.pick({ eligible: () => true, random: seeded(4) }), 200), { b1: 200 }, 'unmeasured: the idle one');
  for (const tk of busy) stats.end(tk);
  const now = performance.now();
  const heavy = refs([1, 10]);
  stats.observe((heavy[0] as BackendRef).key, 10, now);
  stats.observe((heavy[1] as BackendRef).key, 50, now);
  const w = buildSelector(heavy, { type: 'latency-aware' }, { stats });
  t.same(counts(() => w.pick({ eligible: () => true, random: seeded(5) }), 200), { b1: 200 }, '50 ms / weight 10 beats 10 ms / weight 1');
  const coldStats = new BackendStatsRegistry(); // fresh: refs() reuses the keys measured above
  const cold = refs([1, 1]);
  coldStats.observe((cold[0] as BackendRef).key, 40, now);
  const busyCold = coldStats.begin((cold[1] as BackendRef).key);
  const cs = buildSelector(cold, { type: 'latency-aware' }, { stats: coldStats });
  t.same(counts(() => cs.pick({ eligible: () => true, random: seeded(6) }), 200), { b0: 200 }, 'a cold backend costs the fastest measured latency: with one in flight it loses');
  coldStats.end(busyCold);
});

t.test('consistent-hash: owner() agrees with pick when all are usable; no backends, no owner', async (t) => {
  const s = new ConsistentHashSelector(refs([1, 2, 1]));
  for (let i = 0; i < 50; i++) t.equal(s.owner(`k${i}`)?.id, s.pick({ eligible: () => true, hashKey: `k${i}` })?.id);
  const none = new ConsistentHashSelector([]);
  t.equal(none.owner('k'), undefined);
  t.equal(none.pick({ eligible: () => true, hashKey: 'k' }), undefined);
});

t.test('each selector names its strategy as the policy does (logs and metrics label picks by it)', async (t) => {
  for (const type of LB_TYPES) t.equal(buildSelector(refs([1]), { type, ...(type === 'consistent-hash' ? { key: 'client_ip' } : {}) }, deps).strategy, type);
});

t.test('consistent-hash: a weight-0 backend and an ineligible one: nothing, after a bounded walk', async (t) => {
  const s = new ConsistentHashSelector(refs([0, 1]));
  t.equal(s.pick({ eligible: (b) => b.id !== 'b1', hashKey: 'k' }), undefined);
  t.equal(s.pick({ eligible: () => true, hashKey: 'k' })?.id, 'b1');
});

t.test('random: a usable first draw is taken as is; least-connections never compares against an excluded backend', async (t) => {
  const s = buildSelector(refs([1, 1, 2]), { type: 'random' }, deps);
  t.equal(s.pick({ eligible: () => true, random: fixed(0.1, 0.9) })?.id, 'b0', 'no fallback draw when the first one is usable');
  const lc = buildSelector(refs([1, 10]), { type: 'least-connections' }, deps);
  const exclude = new Set([(refs([1, 10])[1] as BackendRef).key]);
  t.equal(lc.pick({ eligible: () => true, exclude, random: seeded(8) })?.id, 'b0', 'the cheaper b1 was already tried');
});
