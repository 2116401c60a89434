// The node's token ledger (limits/token-ledger.ts), with a fake clock: grants never make more
// tokens than one bucket would, blocks, the held estimate and its refill cap, settles, a dead
// worker, configuration changes, bounded memory.
import t from 'tap';
import { TokenLedger, blockSize, refilled } from '../src/limits/token-ledger.ts';
import type { TokenLimit } from '../src/limits/token-ledger.ts';

const ledger = (limits: Record<string, TokenLimit>, workers = 4, max?: number): TokenLedger => {
  const l = new TokenLedger(max);
  l.configure(new Map(Object.entries(limits)), workers);
  return l;
};

t.test('burst 5 on 4 workers: exactly 5 tokens granted, one at a time, whichever workers ask; then the wait to the next token', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 5 } });
  const grants = [0, 1, 2, 3, 0, 1, 2, 3].map((w) => l.ask(w, 'rl', 'a:127.0.0.1', 1, 1, 0, 1000));
  t.same(grants.map((g) => g.granted), [1, 1, 1, 1, 1, 0, 0, 0]);
  t.same(grants.map((g) => g.block), [1, 1, 1, 1, 1, 1, 1, 1], 'block 1: floor(5 / 8) is 0');
  t.same(grants.slice(5).map((g) => g.waitMs), [1000, 1000, 1000], 'a token a second: 1000 ms to the next');
  t.equal(l.ask(0, 'rl', 'a:127.0.0.1', 1, 1, 0, 1999).granted, 0, 'none at 999 ms');
  t.equal(l.ask(0, 'rl', 'a:127.0.0.1', 1, 1, 0, 1999).waitMs, 1, '1 ms to go');
  t.equal(l.ask(1, 'rl', 'a:127.0.0.1', 1, 1, 0, 2000).granted, 1, 'the refilled token at 1 s');
  t.equal(l.ask(2, 'rl', 'a:127.0.0.2', 1, 1, 0, 2000).granted, 1, 'another key has its own bucket');
});

t.test('waiting requests are covered past the block; asking ahead is held to the block', async (t) => {
  t.equal(blockSize({ rate: 1, burst: 200 }, 4), 25);
  t.equal(blockSize({ rate: 1, burst: 7 }, 4), 1);
  t.equal(blockSize({ rate: 1, burst: 8 }, 1), 4);
  const l = ledger({ rl: { rate: 100, burst: 200 } });
  t.same(l.ask(0, 'rl', 'k', 100, 0, 0, 0), { granted: 25, waitMs: 0, block: 25 }, 'ahead: one block, no wait (tokens remain)');
  t.same(l.ask(1, 'rl', 'k', 40, 40, 0, 0), { granted: 40, waitMs: 0, block: 25 }, '40 waiting: 40');
  t.same(l.ask(2, 'rl', 'k', 200, 150, 0, 0), { granted: 135, waitMs: 10, block: 25 }, 'the rest of the bucket, 10 ms to the next (100/s)');
  t.same(l.peek('rl', 'k', 0), { tokens: 0, held: { 0: 25, 1: 40, 2: 135 } });
});

t.test('held: the refill stops at burst minus what workers hold; an ask lowers it to what the worker reports; a settle gives the rest back', async (t) => {
  const l = ledger({ rl: { rate: 10, burst: 10 } }, 1);
  t.equal(l.ask(0, 'rl', 'k', 5, 0, 0, 0).granted, 5, 'block 5 (10 / 2)');
  t.same(l.peek('rl', 'k', 10_000), { tokens: 5, held: { 0: 5 } }, 'ten seconds later still 5: 5 may be unspent in the worker');
  t.equal(l.ask(0, 'rl', 'k', 5, 0, 2, 10_000).granted, 5, 'the worker holds 2: the bucket refilled to 8, 5 granted');
  t.same(l.peek('rl', 'k', 10_000), { tokens: 3, held: { 0: 7 } });
  l.settle(0, 'rl', 'k', 4, true, 10_000);
  t.same(l.peek('rl', 'k', 10_000), { tokens: 7, held: {} }, '4 unspent back; the 3 spent are gone until the refill');
  t.same(l.peek('rl', 'k', 10_300), { tokens: 10, held: {} }, 'refilled to the burst in 300 ms');
  l.settle(0, 'rl', 'k', 10, true, 10_300);
  t.same(l.peek('rl', 'k', 10_300), { tokens: 10, held: {} }, 'a settle of a worker holding nothing adds nothing');
  t.equal(l.ask(0, 'rl', 'k', 5, 0, 99, 10_300).granted, 5, 'a worker claiming more than it was granted is held to what it was granted');
  t.same(l.peek('rl', 'k', 10_300)?.held, { 0: 5 });
});

t.test('a dead worker: what it held is dropped as spent; the bucket refills to the full burst', async (t) => {
  const l = ledger({ rl: { rate: 10, burst: 10 } }, 2);
  l.ask(0, 'rl', 'k', 2, 0, 0, 0);
  l.ask(1, 'rl', 'k', 2, 0, 0, 0);
  t.same(l.peek('rl', 'k', 0), { tokens: 6, held: { 0: 2, 1: 2 } });
  t.same(l.views()[0]?.workers, [{ worker: 0, held: 2 }, { worker: 1, held: 2 }]);
  l.dropWorker(1, 0);
  t.same(l.peek('rl', 'k', 0), { tokens: 6, held: { 0: 2 } }, 'nothing comes back at once');
  t.same(l.peek('rl', 'k', 1000), { tokens: 8, held: { 0: 2 } }, 'the refill goes up to burst minus the live worker');
});

t.test('views: each configured budget with its contract, its keys and what each worker holds', async (t) => {
  const l = ledger({ rl: { rate: 2, burst: 4 }, conn: { rate: 0, burst: 8 }, idle: { rate: 1, burst: 1 } }, 4);
  l.ask(0, 'rl', 'a', 1, 1, 0, 0);
  l.ask(2, 'rl', 'a', 1, 1, 0, 0);
  l.ask(2, 'rl', 'b', 1, 1, 0, 0);
  l.ask(1, 'conn', '', 1, 1, 0, 0);
  t.same(l.views(), [
    { budget: 'rl', rate: 2, burst: 4, keys: 2, held: 3, workers: [{ worker: 0, held: 1 }, { worker: 2, held: 2 }] },
    { budget: 'conn', rate: 0, burst: 8, keys: 1, held: 1, workers: [{ worker: 1, held: 1 }] },
    { budget: 'idle', rate: 1, burst: 1, keys: 0, held: 0, workers: [] },
  ]);
  l.dropWorker(2, 0);
  t.same(l.views()[0], { budget: 'rl', rate: 2, burst: 4, keys: 2, held: 1, workers: [{ worker: 0, held: 1 }] }, 'a dead worker holds nothing');
});

t.test('configuration: a budget removed drops its buckets; an unknown budget grants nothing; a lowered burst clamps', async (t) => {
  const l = ledger({ a: { rate: 1, burst: 10 }, b: { rate: 1, burst: 10 } }, 1);
  l.ask(0, 'a', 'k', 1, 1, 0, 0);
  l.ask(0, 'b', 'k', 1, 1, 0, 0);
  t.equal(l.size, 2);
  l.configure(new Map([['b', { rate: 1, burst: 3 }]]), 1);
  t.equal(l.size, 1, "a's bucket dropped");
  t.same(l.ask(0, 'a', 'k', 1, 1, 0, 0), { granted: 0, waitMs: 1000, block: 1 });
  t.same(l.peek('b', 'k', 0), { tokens: 2, held: { 0: 1 } }, 'burst 3 with 1 held: at most 2 in the bucket');
});

t.test('memory: full unheld buckets are swept; past the cap the least recently used unheld go', async (t) => {
  const l = ledger({ rl: { rate: 10, burst: 2 } }, 1, 100);
  for (let i = 0; i < 100; i++) l.ask(0, 'rl', `k${i}`, 1, 1, 0, 0);
  for (let i = 0; i < 100; i++) l.settle(0, 'rl', `k${i}`, 0, true, 0);
  l.ask(0, 'rl', 'held', 1, 1, 0, 0);
  t.equal(l.size, 91, 'a tenth dropped for the new one');
  t.equal(l.evicted, 10);
  l.sweep(50);
  t.equal(l.size, 91, 'not yet refilled at 50 ms');
  l.sweep(100);
  t.equal(l.size, 1, 'refilled ones dropped; the held one stays');
  t.ok(l.peek('rl', 'held', 100));
});

t.test('slots (rate 0): granted only to waiting requests, given back as they free, never more than the cap open', async (t) => {
  const l = ledger({ src: { rate: 0, burst: 8 } }, 4);
  const got = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1].map((w) => l.ask(w, 'src', '127.0.0.1', 1, 1, 9, 0).granted);
  t.same(got, [1, 1, 1, 1, 1, 1, 1, 1, 0, 0], '8 connections node-wide, however they spread');
  t.same(l.ask(0, 'src', '127.0.0.1', 4, 0, 2, 0), { granted: 0, waitMs: 1, block: 1 }, 'nothing ahead; 1 ms: asked again after');
  l.settle(1, 'src', '127.0.0.1', 1, false, 5000);
  t.same(l.peek('src', '127.0.0.1', 5000), { tokens: 1, held: { 0: 2, 1: 1, 2: 2, 3: 2 } }, 'one closed on worker 1: one free, no refill meanwhile');
  t.equal(l.ask(3, 'src', '127.0.0.1', 1, 1, 2, 5000).granted, 1);
  l.settle(3, 'src', '127.0.0.1', 1, false, 5000);
  t.same(l.peek('src', '127.0.0.1', 5000)?.held, { 0: 2, 1: 1, 2: 2, 3: 2 }, 'a delta: a grant on its way to the worker stays counted');
  t.equal(l.ask(3, 'src', '127.0.0.1', 1, 1, 2, 5000).granted, 1);
  l.dropWorker(0, 5000);
  t.same(l.peek('src', '127.0.0.1', 5000), { tokens: 2, held: { 1: 1, 2: 2, 3: 3 } }, "a dead worker's connections are closed: the cap is free again");
});

t.test('refilled: rate, the cap, time going back', async (t) => {
  const lim = { rate: 2, burst: 10 };
  t.equal(refilled(0, 0, 0, lim, 1000), 2);
  t.equal(refilled(9, 0, 0, lim, 1000), 10);
  t.equal(refilled(0, 0, 4, lim, 10_000), 6);
  t.equal(refilled(3, 1000, 0, lim, 0), 3, 'no refill backwards');
  t.equal(refilled(3, 0, 12, lim, 1000), 0, 'held past the burst: none');
});

t.test('blocks of slots are one: a connection slot is granted only to the one waiting for it', async (t) => {
  t.equal(blockSize({ rate: 0, burst: 1000 }, 1), 1);
  const l = ledger({ conn: { rate: 0, burst: 1000 } });
  t.same(l.ask(0, 'conn', '', 5, 1, 0, 0), { granted: 1, waitMs: 0, block: 1 }, 'asked ahead for 5: the one waiting');
});

t.test('limit(): the contract in force, or undefined', async (t) => {
  const l = ledger({ rl: { rate: 3, burst: 7 } });
  t.same(l.limit('rl'), { rate: 3, burst: 7 });
  t.equal(l.limit('nope'), undefined);
});

t.test('the wait to the next token: none when all wanted were granted, none while the bucket holds a whole token', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 2 } }, 1);
  t.same(l.ask(0, 'rl', 'a', 2, 2, 0, 0), { granted: 2, waitMs: 0, block: 1 }, 'both granted, the bucket empty: no wait');
  t.same(l.ask(0, 'rl', 'b', 2, 0, 0, 0), { granted: 1, waitMs: 0, block: 1 }, 'held to the block with one token left: ask again, no wait');
  t.same(l.ask(0, 'rl', 'b', 2, 0, 1, 0), { granted: 1, waitMs: 1000, block: 1 }, 'the last token: then a second to the next');
});

t.test('settles and peeks of unknown budgets or keys are ignored', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 2 } }, 1);
  l.settle(0, 'nope', 'k', 1, true, 0);
  l.settle(0, 'rl', 'never-asked', 1, true, 0);
  t.equal(l.size, 0);
  t.equal(l.peek('nope', 'k', 0), undefined);
  t.equal(l.peek('rl', 'never-asked', 0), undefined);
  l.ask(0, 'rl', 'k', 1, 1, 0, 0);
  l.settle(0, 'rl', 'k', 1, true, 0);
  l.dropWorker(0, 0);
  t.same(l.peek('rl', 'k', 0), { tokens: 2, held: {} }, 'a bucket nobody holds survives a dead worker unchanged');
});

t.test("a dead worker's bucket keeps its refill up to the moment of the exit", async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 4 } }, 2);
  l.ask(0, 'rl', 'k', 2, 2, 0, 0);
  l.ask(0, 'rl', 'k', 0, 0, 0, 0); // worker 0 spent both
  l.ask(1, 'rl', 'k', 1, 1, 0, 0);
  t.same(l.peek('rl', 'k', 0), { tokens: 1, held: { 1: 1 } });
  l.dropWorker(1, 2000);
  t.same(l.peek('rl', 'k', 2000), { tokens: 3, held: {} }, '1 + 2 s at 1/s (the held token, spent, is not given back)');
});

t.test('bounded memory: no eviction below the cap; at the cap the least recently used unheld buckets go, held ones stay', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 5 } }, 1, 3);
  l.ask(0, 'rl', 'held', 1, 1, 0, 0);
  l.ask(0, 'rl', 'b', 0, 0, 0, 0);
  l.ask(0, 'rl', 'c', 0, 0, 0, 0);
  t.equal(l.size, 3, 'three buckets under a cap of 3: none evicted');
  l.ask(0, 'rl', 'b', 0, 0, 0, 1000); // b used again a second later: now the most recent
  l.ask(0, 'rl', 'd', 0, 0, 0, 1000);
  t.equal(l.size, 3);
  t.not(l.peek('rl', 'held', 1000), undefined, 'the held bucket stays, though the oldest');
  t.not(l.peek('rl', 'b', 1000), undefined, 'b was touched again: kept');
  t.equal(l.peek('rl', 'c', 1000), undefined, 'c, the least recently used unheld bucket, went');
  t.equal(l.evicted, 1);
});

t.test('slots (rate 0): a changed cap moves the free slots with it at once, whatever is held (a raised queue or connection cap serves the next ask)', async (t) => {
  const l = ledger({ rq: { rate: 0, burst: 5 } }, 2);
  // Each worker says how many it holds (held only falls to it): worker 0 takes 3, worker 1 takes 2.
  for (let i = 0; i < 5; i++) t.equal(l.ask(i % 2, 'rq', '', 1, 1, Math.floor(i / 2), 0).granted, 1, `place ${i + 1} of 5`);
  t.same(l.ask(0, 'rq', '', 1, 1, 3, 0), { granted: 0, waitMs: 1, block: 1 }, 'the sixth refused');
  l.configure(new Map([['rq', { rate: 0, burst: 8 }]]), 2);
  t.same(l.peek('rq', '', 0), { tokens: 3, held: { 0: 3, 1: 2 } }, 'raised to 8 with 5 held: 3 free');
  t.equal(l.ask(1, 'rq', '', 1, 1, 2, 0).granted, 1, 'granted at once');
  l.settle(0, 'rq', '', 3, false, 0);
  t.same(l.peek('rq', '', 0), { tokens: 5, held: { 1: 3 } }, 'three given back: 5 free of 8');
  l.configure(new Map([['rq', { rate: 0, burst: 2 }]]), 2);
  t.same(l.peek('rq', '', 0), { tokens: 0, held: { 1: 3 } }, 'lowered to 2 with 3 held: none free');
  l.settle(1, 'rq', '', 2, false, 0);
  t.same(l.peek('rq', '', 0), { tokens: 1, held: { 1: 1 } }, 'two back: 1 held, 1 free of 2');
  l.configure(new Map([['rq', { rate: 0, burst: 2 }]]), 4);
  t.same(l.peek('rq', '', 0), { tokens: 1, held: { 1: 1 } }, 'the same cap again (another worker count): unchanged');
});

t.test('a rate budget reconfigured: its tokens are left to the refill (the same contract changes nothing, a raised burst fills at the rate); the same cap of slots changes nothing either', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 10 } }, 1);
  t.equal(l.ask(0, 'rl', 'k', 5, 0, 0, 0).granted, 5);
  l.ask(0, 'rl', 'k', 0, 0, 0, 0); // the worker spent them
  t.same(l.peek('rl', 'k', 0), { tokens: 5, held: {} });
  l.configure(new Map([['rl', { rate: 1, burst: 10 }]]), 1);
  t.same(l.peek('rl', 'k', 0), { tokens: 5, held: {} }, 'the same contract: unchanged');
  l.configure(new Map([['rl', { rate: 1, burst: 20 }]]), 1);
  t.same(l.peek('rl', 'k', 0), { tokens: 5, held: {} }, 'a raised burst: no tokens at once');
  t.same(l.peek('rl', 'k', 15_000), { tokens: 20, held: {} }, 'filled at the rate, up to the new burst');
  const s = ledger({ src: { rate: 0, burst: 2 } }, 1);
  t.equal(s.ask(0, 'src', '', 1, 1, 0, 0).granted, 1);
  s.ask(0, 'src', '', 0, 0, 0, 0); // it reports holding none: the slot counts as gone, not free
  t.same(s.peek('src', '', 0), { tokens: 1, held: {} });
  s.configure(new Map([['src', { rate: 0, burst: 2 }]]), 2);
  t.same(s.peek('src', '', 0), { tokens: 1, held: {} }, 'the same cap (another worker count): as it was');
});

t.test('a burst lowered below what workers hold: a unit given back is not granted again until the held are under the burst', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 10 } }, 2);
  t.equal(l.ask(0, 'rl', 'k', 8, 8, 0, 0).granted, 8);
  l.configure(new Map([['rl', { rate: 1, burst: 2 }]]), 2);
  l.settle(0, 'rl', 'k', 1, false, 0);
  t.equal(l.ask(1, 'rl', 'k', 1, 1, 0, 0).granted, 0, '7 still held of a burst of 2');
  l.settle(0, 'rl', 'k', 0, true, 0); // it spent the 7
  t.same(l.peek('rl', 'k', 5000), { tokens: 0, held: {} }, 'the 7 spent count against the burst of 2: none 5 s later at 1/s');
  t.same(l.peek('rl', 'k', 7000), { tokens: 2, held: {} }, 'full at 7 s');
  const m = ledger({ rl: { rate: 1, burst: 10 } }, 2);
  t.equal(m.ask(0, 'rl', 'k', 8, 8, 0, 0).granted, 8);
  m.configure(new Map([['rl', { rate: 1, burst: 2 }]]), 2);
  m.settle(0, 'rl', 'k', 8, true, 0);
  t.same(m.peek('rl', 'k', 0), { tokens: 2, held: {} }, 'all 8 given back unspent: the lowered burst at once');
});

t.test("a dead worker's slots come back up to the cap, not past what was free with them", async (t) => {
  const l = ledger({ src: { rate: 0, burst: 3 } }, 1);
  t.equal(l.ask(0, 'src', '', 2, 2, 0, 0).granted, 2);
  l.ask(0, 'src', '', 0, 0, 1, 0); // it reports holding one: the other counts as gone
  t.same(l.peek('src', '', 0), { tokens: 1, held: { 0: 1 } });
  l.dropWorker(0, 0);
  t.same(l.peek('src', '', 0), { tokens: 2, held: {} }, 'its one slot back: 2 free');
});

t.test('a settle or an exit of a worker that holds nothing leaves the bucket as it was, even stamped earlier', async (t) => {
  for (const gone of [(l: TokenLedger) => l.settle(1, 'rl', 'k', 3, true, 0), (l: TokenLedger) => l.dropWorker(1, 0)]) {
    const l = ledger({ rl: { rate: 1, burst: 10 } }, 2);
    t.equal(l.ask(0, 'rl', 'k', 5, 5, 0, 1000).granted, 5);
    l.ask(0, 'rl', 'k', 0, 0, 0, 1000);
    gone(l);
    t.same(l.peek('rl', 'k', 1000), { tokens: 5, held: {} }, 'no refill from the earlier stamp');
  }
});

t.test('views list the workers in order of their number, whatever order they asked in', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 100 } }, 4);
  l.ask(3, 'rl', 'a', 1, 1, 0, 0);
  l.ask(1, 'rl', 'a', 1, 1, 0, 0);
  l.ask(2, 'rl', 'b', 1, 1, 0, 0);
  l.ask(0, 'rl', 'b', 2, 2, 0, 0);
  t.same(l.views()[0]?.workers, [{ worker: 0, held: 2 }, { worker: 1, held: 1 }, { worker: 2, held: 1 }, { worker: 3, held: 1 }]);
});

t.test('bounded memory: a bucket used again within a second keeps its place in the eviction order', async (t) => {
  const l = ledger({ rl: { rate: 1, burst: 5 } }, 1, 3);
  l.ask(0, 'rl', 'held', 1, 1, 0, 5000);
  l.ask(0, 'rl', 'b', 0, 0, 0, 5000);
  l.ask(0, 'rl', 'c', 0, 0, 0, 5000);
  l.ask(0, 'rl', 'b', 0, 0, 0, 5500);
  l.ask(0, 'rl', 'd', 0, 0, 0, 5500);
  t.same(['held', 'b', 'c', 'd'].map((k) => l.peek('rl', k, 5500) !== undefined), [true, false, true, true], 'b, still the oldest unheld, went');
});
