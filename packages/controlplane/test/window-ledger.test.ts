// The node's window budgets (limits/window-ledger.ts), with a fake clock: a route's retry budget
// (floor 30 + ratio % of the primaries over ten 1 s buckets) and a fixed window; units granted
// never pass what one window would allow, whichever workers ask, and count in the bucket they are
// granted for (the current one, or the next when asked ahead); deposits dated into their bucket;
// settles back to the grant's own bucket; a dead worker; live changes.
import t from 'tap';
import { WindowLedger, allowance } from '../src/limits/window-ledger.ts';
import type { WindowLimit } from '../src/limits/window-ledger.ts';

const RETRY: WindowLimit = { base: 30, ratioPercent: 0, buckets: 10, bucketMs: 1000 };
const ledger = (limits: Record<string, WindowLimit>, workers = 4): WindowLedger => {
  const l = new WindowLedger();
  l.configure(new Map(Object.entries(limits)), workers);
  return l;
};
/** Asks of worker `w` for `want` units ahead (nothing waiting, holding `holding`). */
const ask = (l: WindowLedger, w: number, want: number, now: number, holding = 0, ahead = false) => l.ask(w, 'r', '', want, 0, holding, now, ahead);

t.test('floor 30, ratio 0, 4 workers: exactly 30 units granted in a window whoever asks, in blocks that shrink with what is left; none more until its bucket leaves the window', async (t) => {
  const l = ledger({ r: RETRY });
  const grants: number[] = [];
  const blocks: number[] = [];
  for (let i = 0; i < 40; i++) {
    const g = ask(l, i % 4, 100, 5000 + i);
    grants.push(g.granted);
    blocks.push(g.block);
  }
  t.equal(grants.reduce((a, b) => a + b, 0), 30, '30 in all');
  t.same(grants.slice(0, 4), [3, 3, 3, 2], 'blocks of floor(left / 8): 30 -> 3, 27 -> 3, 24 -> 3, 21 -> 2');
  t.ok(blocks.slice(-5).every((b) => b === 1), 'at the end one at a time');
  const last = ask(l, 0, 1, 5999);
  t.same([last.granted, last.waitMs, last.from, last.until], [0, 1, 5000, 6000], 'empty: 1 ms to the next bucket; units count in [5000, 6000)');
  t.equal(ask(l, 1, 1, 14_999).granted, 0, 'at 14.999 s the 5 s bucket is still in the window');
  t.equal(ask(l, 1, 100, 15_000).granted, 3, 'at 15 s it left: 30 again (a block of them)');
  t.same(l.peek('r', '', 15_000), { deposits: 0, spent: 3, left: 27, held: { 1: 3 } }, 'the window ending at 15 s: only the new grant');
});

t.test('ratio: deposits raise the allowance by ratio % of the primaries in the window, floored', async (t) => {
  t.equal(allowance({ base: 30, ratioPercent: 10, buckets: 10, bucketMs: 1000 }, 99), 39);
  const l = ledger({ r: { ...RETRY, ratioPercent: 10 } }, 1);
  l.deposit('r', '', 100, 1000, 1000);
  t.equal(ask(l, 0, 1000, 1500).granted, 20, 'block: floor(40 / 2)');
  t.equal(l.ask(0, 'r', '', 1000, 1000, 20, 1500).granted, 20, 'waiting requests past the block: the 20 left');
  t.equal(ask(l, 0, 1, 1500, 0).granted, 0, '40 = 30 + 10 % of 100, no more');
  l.deposit('r', '', 10, 1500, 1500);
  t.equal(ask(l, 0, 5, 1500, 0).granted, 1, '10 more primaries: one more retry');
});

t.test('deposits are counted in the bucket of their date: an old batch leaves the window with it, one older than the window counts nothing', async (t) => {
  const l = ledger({ r: { ...RETRY, base: 0, ratioPercent: 100 } }, 1);
  l.deposit('r', '', 5, 500, 10_500);
  l.deposit('r', '', 7, 4200, 10_500);
  t.same(l.peek('r', '', 10_500), { deposits: 7, spent: 0, left: 7, held: {} }, 'dated 0.5 s: outside the window of buckets 1 to 10; dated 4.2 s: inside');
  t.same(l.peek('r', '', 13_999)?.deposits, 7, 'still in the window at 13.999 s');
  t.same(l.peek('r', '', 14_000)?.deposits, 0, 'gone at 14 s with its bucket (not 10 s after it was heard)');
  l.deposit('r', '', 3, 99_000, 20_000);
  t.same(l.peek('r', '', 20_000)?.deposits, 3, 'a date in the future counts now');
});

t.test('a settle gives units back to the bucket they were granted in, newest first, while it is in the window; forget drops the rest as spent', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  ask(l, 0, 10, 1000);
  ask(l, 0, 5, 2000, 10);
  t.same(l.peek('r', '', 2000), { deposits: 0, spent: 15, left: 15, held: { 0: 15 } });
  l.settle(0, 'r', '', 7, false, 2500);
  t.same(l.peek('r', '', 2500), { deposits: 0, spent: 8, left: 22, held: { 0: 8 } }, '7 back: 5 of the 2 s bucket, 2 of the 1 s bucket');
  t.same(l.peek('r', '', 10_999)?.spent, 8);
  t.same(l.peek('r', '', 11_000)?.spent, 0, 'the 1 s bucket (8 left there) leaves at 11 s; nothing was moved to a later bucket');
  const m = ledger({ r: RETRY }, 1);
  ask(m, 0, 10, 1000);
  m.settle(0, 'r', '', 4, false, 11_500);
  t.same(m.peek('r', '', 11_500), { deposits: 0, spent: 0, left: 30, held: { 0: 6 } }, 'units of a bucket out of the window come back to none');
  m.settle(0, 'r', '', 0, true, 11_500);
  t.same(m.peek('r', '', 11_500)?.held, {}, 'forget: nothing held');
  const n = ledger({ r: RETRY }, 1);
  ask(n, 0, 10, 1000);
  t.equal(ask(n, 0, 10, 1100, 4).granted, 10, 'holding 4 of 10: 6 were spent, stay counted');
  n.settle(0, 'r', '', 100, true, 1200);
  t.same(n.peek('r', '', 1200), { deposits: 0, spent: 6, left: 24, held: {} }, 'the 14 held come back, the 6 spent stay');
});

t.test('asked ahead: units of the next bucket count in it, not in the current window; the next window counts them', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  t.equal(ask(l, 0, 30, 1000).granted, 15);
  t.equal(ask(l, 0, 30, 1000, 15).granted, 7, 'block floor(15 / 2)');
  const a = ask(l, 0, 100, 1900, 22, true);
  t.same([a.granted, a.from, a.until], [4, 2000, 3000], 'ahead: floor(8 / 2) of the 2 s bucket, spendable in [2000, 3000)');
  t.same(l.peek('r', '', 1900)?.spent, 22, 'the window ending now does not count them');
  t.same(l.peek('r', '', 2000)?.spent, 26, 'the window ending at the 2 s bucket does');
  t.equal(ask(l, 0, 100, 2000, 26).granted, 2, 'what is left for 2 s: 30 - 26, a block of 2');
  l.settle(0, 'r', '', 2, false, 2100);
  t.same(l.peek('r', '', 2100)?.spent, 26, 'given back: the newest grant first');
  t.same(l.peek('r', '', 11_000)?.spent, 4, 'the 1 s bucket left; the 2 s bucket still counts its 4');
});

t.test('units granted ahead bound what the current bucket may still grant: the next window holds both', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  t.equal(ask(l, 0, 20, 1000, 0).granted, 15, 'block floor(30 / 2)');
  t.equal(ask(l, 0, 100, 1900, 15, true).granted, 7, 'ahead for the 2 s bucket: floor(15 / 2)');
  t.equal(l.ask(0, 'r', '', 100, 100, 22, 1950).granted, 8, 'the 1 s bucket may grant only 8 more: the window ending at 2 s holds 15 + 7 + 8 = 30');
  t.equal(l.ask(0, 'r', '', 1, 1, 30, 1950).granted, 0);
  t.same(l.peek('r', '', 2000)?.spent, 30, 'never more than 30 in any window');
});

t.test('a dead worker: its units count as spent; a fixed window (one bucket) is whole again at each boundary', async (t) => {
  const l = ledger({ r: RETRY, q: { base: 5, ratioPercent: 0, buckets: 1, bucketMs: 60_000 } }, 2);
  ask(l, 0, 10, 1000);
  l.dropWorker(0);
  t.same(l.peek('r', '', 1000), { deposits: 0, spent: 7, left: 23, held: {} }, 'block floor(30 / 4) = 7, counted spent');
  const q = (w: number, now: number) => l.ask(w, 'q', 'k', 1, 1, 0, now).granted;
  t.same([q(0, 60_000), q(1, 60_001), q(0, 70_000), q(1, 100_000), q(0, 119_999), q(1, 119_999)], [1, 1, 1, 1, 1, 0], 'limit 5 per window: the sixth refused');
  t.equal(l.ask(1, 'q', 'k', 1, 1, 0, 119_999).waitMs, 1, 'until the window ends');
  t.equal(q(1, 120_000), 1, 'the next window: whole again');
  t.equal(l.ask(0, 'q', 'other', 1, 1, 0, 120_000).granted, 1, 'each key its own window');
});

t.test('configure: a changed ratio applies at once; changed buckets or a removed budget drop the windows; sweep drops empty ones', async (t) => {
  const l = ledger({ r: RETRY, s: RETRY }, 1);
  l.deposit('r', '', 100, 1000, 1000);
  ask(l, 0, 15, 1000);
  l.configure(new Map([['r', { ...RETRY, ratioPercent: 50 }], ['s', { ...RETRY, bucketMs: 500 }]]), 1);
  t.same(l.peek('r', '', 1000), { deposits: 100, spent: 15, left: 65, held: { 0: 15 } }, 'ratio 50 %: 30 + 50 - 15');
  ask(l, 0, 1, 1000);
  l.configure(new Map([['r', { ...RETRY, buckets: 5 }]]), 1);
  t.equal(l.peek('r', '', 1000), undefined, 'buckets changed: the window starts again');
  t.equal(l.has('s'), false);
  ask(l, 0, 1, 1000);
  l.settle(0, 'r', '', 1, true, 1000);
  l.sweep(1000);
  t.equal(l.size, 0, 'an empty window nobody holds is dropped');
});

t.test('never more than one window allows: random asks, spends, settles and deposits from 4 workers over 40 s, checked against every window', async (t) => {
  const limit: WindowLimit = { base: 30, ratioPercent: 20, buckets: 10, bucketMs: 1000 };
  const l = ledger({ r: limit });
  let seed = 7;
  const rnd = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  // What each worker holds: lots of units spendable in [from, until), as the worker's lease keeps them.
  const lots: { w: number; n: number; from: number; until: number }[] = [];
  const spends: number[] = [];
  const deposits: number[] = [];
  for (let now = 0; now < 40_000; now += 1 + rnd(7)) {
    const w = rnd(4);
    const dice = rnd(10);
    if (dice < 3) {
      const n = 1 + rnd(5);
      l.deposit('r', '', n, now - rnd(300), now);
      for (let i = 0; i < n; i++) deposits.push(now);
    } else if (dice < 6) {
      const held = lots.filter((x) => x.w === w && now < x.until).reduce((s, x) => s + x.n, 0);
      const g = l.ask(w, 'r', '', 1 + rnd(6), 0, held, now, rnd(5) === 0);
      if (g.granted > 0) lots.push({ w, n: g.granted, from: g.from, until: g.until });
    } else {
      const lot = lots.find((x) => x.w === w && x.n > 0 && now >= x.from && now < x.until);
      if (lot !== undefined) {
        lot.n--;
        spends.push(now);
      }
    }
  }
  let worst = 0;
  for (let end = 0; end <= 40_000; end += 1000) {
    const spent = spends.filter((s) => s >= end - 9000 && s < end + 1000).length;
    // Deposits count from when they are heard, dated earlier: the window's allowance is at most this.
    const dep = deposits.filter((s) => s >= end - 9000 - 300 && s < end + 1000).length;
    worst = Math.max(worst, spent - allowance(limit, dep));
  }
  t.ok(spends.length > 200, `${spends.length} units spent`);
  t.ok(worst <= 0, `every 10 s window of buckets spent at most its allowance (worst margin ${worst})`);
});

t.test('views: each configured budget with its contract, keys, the deposits and spends of the windows now, and what each worker holds', async (t) => {
  const l = ledger({ r: { base: 2, ratioPercent: 50, buckets: 10, bucketMs: 1000 }, q: { base: 5, ratioPercent: 0, buckets: 1, bucketMs: 60_000 } });
  l.deposit('r', '', 4, 1000, 1000);
  t.equal(l.ask(2, 'r', '', 3, 3, 0, 1000).granted, 3);
  t.equal(l.ask(0, 'r', '', 1, 0, 0, 1000).granted, 1);
  t.same(l.views(1000), [
    { budget: 'r', base: 2, ratio_percent: 50, window_ms: 10_000, keys: 1, deposits: 4, spent: 4, held: 4, workers: [{ worker: 0, held: 1 }, { worker: 2, held: 3 }] },
    { budget: 'q', base: 5, ratio_percent: 0, window_ms: 60_000, keys: 0, deposits: 0, spent: 0, held: 0, workers: [] },
  ]);
  t.same(l.views(20_000)[0], { budget: 'r', base: 2, ratio_percent: 50, window_ms: 10_000, keys: 1, deposits: 0, spent: 0, held: 4, workers: [{ worker: 0, held: 1 }, { worker: 2, held: 3 }] }, 'the window moved on: nothing counted now, the holdings until settled');
  l.dropWorker(2);
  t.same(l.views(1000)[0]?.workers, [{ worker: 0, held: 1 }], 'a dead worker holds nothing');
});

t.test('aligned fixed windows (alignMs): on multiples of their length since the epoch; a changed alignment, bucket length or a removed budget starts them again', async (t) => {
  const Q: WindowLimit = { base: 1, ratioPercent: 0, buckets: 1, bucketMs: 60_000, alignMs: 10_000 };
  const l = ledger({ q: Q }, 1);
  t.same(l.ask(0, 'q', 'k', 1, 1, 0, 49_999), { granted: 1, waitMs: 0, block: 1, from: -10_000, until: 50_000 }, 'the window [-10 s, 50 s)');
  t.same(l.ask(0, 'q', 'k', 1, 1, 0, 49_999), { granted: 0, waitMs: 1, block: 1, from: -10_000, until: 50_000 }, 'spent: 1 ms to its end');
  t.same(l.ask(0, 'q', 'k', 1, 1, 0, 50_000), { granted: 1, waitMs: 0, block: 1, from: 50_000, until: 110_000 }, 'at 50 s the next window');
  l.configure(new Map([['q', Q]]), 1);
  t.equal(l.size, 1, 'the same contract again: the window stays');
  l.configure(new Map([['q', { ...Q, alignMs: 0 }]]), 1);
  t.equal(l.size, 0, 'another alignment: dropped');
  l.ask(0, 'q', 'k', 1, 1, 0, 50_000);
  l.configure(new Map([['q', { ...Q, alignMs: 0, bucketMs: 30_000 }]]), 1);
  t.equal(l.size, 0, 'another length: dropped');
  l.ask(0, 'q', 'k', 1, 1, 0, 50_000);
  l.configure(new Map(), 1);
  t.equal(l.size, 0, 'the budget removed: dropped');
});

t.test('deposits: none for an unknown budget or a count of 0 or less; one dated before the window leaves the live buckets as they are', async (t) => {
  const l = ledger({ r: { ...RETRY, base: 0, ratioPercent: 100 } }, 1);
  l.deposit('nope', '', 5, 1000, 1000);
  l.deposit('r', '', 0, 1000, 1000);
  l.deposit('r', '', -3, 1000, 1000);
  t.equal(l.size, 0, 'no window made');
  l.deposit('r', '', 7, 20_500, 20_500);
  l.deposit('r', '', 5, 9_500, 20_500);
  t.same(l.peek('r', '', 20_500), { deposits: 7, spent: 0, left: 7, held: {} }, 'dated 11 buckets back: counts nothing, the 7 of now stay');
  t.same(l.ask(0, 'r', '', 3, 0, 0, 20_900, true), { granted: 3, waitMs: 0, block: 3, from: 21_000, until: 22_000 }, '3 ahead for the 21 s bucket');
  l.deposit('r', '', 4, 10_500, 20_900);
  t.same(l.peek('r', '', 21_000), { deposits: 7, spent: 3, left: 4, held: { 0: 3 } }, 'dated in the bucket that just left the window: counts nothing, the units ahead stay counted');
});

t.test('an unknown budget or key: an ask grants nothing for a second, settles and a dead worker change nothing; limit() is the contract', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  t.same(l.ask(0, 'nope', 'k', 1, 1, 0, 5000), { granted: 0, waitMs: 1000, block: 1, from: 5000, until: 5000 });
  t.same(l.limit('r'), RETRY);
  t.equal(l.limit('nope'), undefined);
  l.settle(0, 'nope', 'k', 1, true, 5000);
  l.settle(0, 'r', 'never', 1, true, 5000);
  l.deposit('r', 'd', 2, 5000, 5000);
  l.settle(0, 'r', 'd', 1, true, 5000);
  t.equal(l.ask(1, 'r', 'h', 1, 1, 0, 5000).granted, 1);
  l.settle(0, 'r', 'h', 1, false, 5000);
  l.dropWorker(3);
  t.same(l.peek('r', 'd', 5000), { deposits: 2, spent: 0, left: 30, held: {} }, 'a window nobody holds: unchanged');
  t.same(l.peek('r', 'h', 5000), { deposits: 0, spent: 1, left: 29, held: { 1: 1 } }, "a settle of a worker holding nothing there: worker 1's unit stays");
  t.equal(l.size, 2);
});

t.test('the wait: none when all wanted were granted or units are left; else to the next bucket, or at most RATIO_RECHECK_MS with a ratio', async (t) => {
  const l = ledger({ r: { ...RETRY, base: 2 }, p: { ...RETRY, base: 1, ratioPercent: 10 } }, 1);
  const at = { from: 1000, until: 2000 };
  t.same(l.ask(0, 'r', 'a', 2, 0, 0, 1000), { granted: 1, waitMs: 0, block: 1, ...at }, 'held to the block with one left: ask again, no wait');
  t.same(l.ask(0, 'r', 'a', 1, 0, 1, 1000), { granted: 1, waitMs: 0, block: 1, ...at }, 'the last one, all that was wanted: no wait');
  t.same(l.ask(0, 'r', 'a', 1, 0, 2, 1000), { granted: 0, waitMs: 1000, block: 1, ...at }, 'none left, no ratio: until the next bucket');
  t.same(l.ask(0, 'r', 'b', 5, 5, 0, 1000), { granted: 2, waitMs: 1000, block: 1, ...at }, '2 of 5 waiting, none left: until the next bucket');
  t.same(l.ask(0, 'p', '', 1, 1, 0, 1000), { granted: 1, waitMs: 0, block: 1, ...at });
  t.same(l.ask(0, 'p', '', 1, 1, 1, 1000), { granted: 0, waitMs: 100, block: 1, ...at }, 'a ratio: deposits may earn one, asked again in 100 ms');
  t.same(l.ask(0, 'p', '', 1, 1, 1, 1950), { granted: 0, waitMs: 50, block: 1, ...at }, 'or at the end of the bucket if sooner');
});

t.test('asked ahead: bounded by the deposits of the window the units count in (not of the one after it)', async (t) => {
  const l = ledger({ r: { ...RETRY, base: 0, ratioPercent: 100 } }, 1);
  l.deposit('r', '', 10, 2000, 2000);
  t.same(l.ask(0, 'r', '', 100, 0, 0, 10_900, true), { granted: 5, waitMs: 0, block: 5, from: 11_000, until: 12_000 }, 'the window of buckets 2 to 11 holds the 10 deposits: a block of 5');
});

t.test('settles: to the bucket named by `until` only; the slots of late buckets; the oldest bucket of the window; a reused slot; nothing held after all came back', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  t.equal(ask(l, 0, 10, 21_000).granted, 10);
  t.same(ask(l, 0, 4, 21_900, 10, true).granted, 4, '4 ahead for the 22 s bucket');
  l.settle(0, 'r', '', 6, false, 21_950, 22_000);
  t.same(l.peek('r', '', 21_950), { deposits: 0, spent: 4, left: 26, held: { 0: 8 } }, 'units of the 21 s bucket only: 6 of its 10 back, the 4 ahead kept');
  t.same(l.peek('r', '', 22_000)?.spent, 8);
  l.settle(0, 'r', '', 8, false, 21_950);
  t.same(l.peek('r', '', 21_950), { deposits: 0, spent: 0, left: 30, held: {} }, 'the other 8 back: nothing held');
  const m = ledger({ r: RETRY }, 1);
  t.equal(ask(m, 0, 15, 1000).granted, 15);
  m.settle(0, 'r', '', 5, false, 10_500);
  t.same(m.peek('r', '', 10_500), { deposits: 0, spent: 10, left: 20, held: { 0: 10 } }, 'the 1 s bucket is the oldest of the window at 10.5 s: 5 back to it');
  t.equal(m.ask(1, 'r', '', 4, 0, 0, 12_000).granted, 4, 'the 12 s bucket takes the slot the 1 s bucket had');
  m.settle(0, 'r', '', 5, false, 12_000);
  t.same(m.peek('r', '', 12_000), { deposits: 0, spent: 4, left: 26, held: { 0: 5, 1: 4 } }, 'units of the 1 s bucket, gone from the window: nothing leaves the 12 s bucket');
  const n = ledger({ r: RETRY }, 1);
  ask(n, 0, 5, 1000);
  ask(n, 0, 5, 10_000, 5);
  t.same(n.peek('r', '', 10_000), { deposits: 0, spent: 10, left: 20, held: { 0: 10 } }, 'the first and the last bucket of one window both count');
});

t.test('sweep keeps every window that counts something now or next, or that somebody holds', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  t.equal(l.ask(0, 'r', 'held', 10, 0, 0, 1000).granted, 10);
  t.equal(l.ask(1, 'r', 'spent', 3, 0, 0, 1000).granted, 3);
  t.equal(l.ask(1, 'r', 'ahead', 3, 0, 0, 10_900, true).granted, 3);
  l.deposit('r', 'edge', 5, 1000, 1000);
  t.equal(l.ask(1, 'r', 'edge', 5, 5, 0, 1000).granted, 5);
  l.deposit('r', 'mix', 3, 1000, 1000);
  t.equal(l.ask(1, 'r', 'mix', 3, 0, 0, 10_900, true).granted, 3);
  l.deposit('r', 'gone', 1, 0, 0);
  l.dropWorker(1);
  l.sweep(10_900);
  t.equal(l.size, 5, 'only the window of the 0 s bucket went');
  t.same(l.peek('r', 'spent', 10_900), { deposits: 0, spent: 3, left: 27, held: {} }, 'spent by a dead worker: still counts');
  t.same(l.peek('r', 'ahead', 11_000), { deposits: 0, spent: 3, left: 27, held: {} }, 'units of the next bucket: counted when it begins');
  t.same(l.peek('r', 'edge', 10_900), { deposits: 5, spent: 5, left: 25, held: {} });
  t.same(l.peek('r', 'mix', 10_900), { deposits: 3, spent: 0, left: 30, held: {} });
  l.sweep(25_000);
  t.equal(l.size, 1, 'all counted out; the held one stays');
  t.same(l.peek('r', 'held', 25_000), { deposits: 0, spent: 0, left: 30, held: { 0: 10 } }, 'held, though its bucket left the window');
});

t.test('bounded memory: at the cap a tenth of it goes, the least recently used windows nobody holds; a window used again a second later moves to the back', async (t) => {
  const capped = (max: number): WindowLedger => {
    const l = new WindowLedger(max);
    l.configure(new Map([['r', RETRY]]), 1);
    return l;
  };
  const l = capped(20);
  l.ask(0, 'r', 'held', 1, 1, 0, 0);
  for (let i = 0; i < 19; i++) l.deposit('r', `k${i}`, 1, 0, 0);
  t.equal(l.size, 20, 'at the cap: none evicted yet');
  l.deposit('r', 'new', 1, 0, 0);
  t.equal(l.size, 19, 'two (a tenth of 20) went for the new one');
  t.equal(l.evicted, 2);
  t.same(['held', 'k0', 'k1', 'k2', 'new'].map((k) => l.peek('r', k, 0) !== undefined), [true, false, false, true, true], 'the two oldest unheld');
  const m = capped(3);
  m.ask(0, 'r', 'held', 1, 1, 0, 5000);
  m.deposit('r', 'b', 1, 5000, 5000);
  m.deposit('r', 'c', 1, 5000, 5000);
  m.deposit('r', 'b', 1, 5500, 5500);
  m.deposit('r', 'd', 1, 5500, 5500);
  t.same(['held', 'b', 'c', 'd'].map((k) => m.peek('r', k, 5500) !== undefined), [true, false, true, true], 'b used again within a second: not moved, the oldest unheld');
  m.deposit('r', 'c', 1, 6000, 6000);
  m.deposit('r', 'e', 1, 6000, 6000);
  t.same(['held', 'c', 'd', 'e'].map((k) => m.peek('r', k, 6000) !== undefined), [true, true, false, true], 'c used again a second later: moved to the back, d went');
  t.equal(m.evicted, 2);
});

t.test('views: a window nobody holds counts its deposits, with no workers', async (t) => {
  const l = ledger({ r: RETRY }, 1);
  l.deposit('r', 'k', 3, 1000, 1000);
  t.same(l.views(1000), [{ budget: 'r', base: 30, ratio_percent: 0, window_ms: 10_000, keys: 1, deposits: 3, spent: 0, held: 0, workers: [] }]);
});
