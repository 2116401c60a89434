// The node's lease ledger (limits/lease-ledger.ts), with a fake clock: grants never pass the
// limit, standing needs are served FIFO when units come back anywhere, contention makes holders
// give idle units back before a starved worker is told `exhausted`, a dead worker's units return,
// a lowered limit revokes, tokens refill up to the burst.
import t from 'tap';
import { LeaseLedger } from '../src/limits/lease-ledger.ts';
import type { BudgetSpec, Outgoing } from '../src/limits/lease-ledger.ts';
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';

const slots = (limit: number): BudgetSpec => ({ kind: 'slots', limit });

function ask(key: string, a: Partial<LeaseAsk> = {}): LeaseAsk {
  const need = a.need ?? 0;
  const extra = a.extra ?? 0;
  return { key, need, extra, give: a.give ?? 0, used: a.used ?? 0, asks: a.asks ?? (need > 0 || extra > 0) };
}

/** The grant of `key` to `worker` in `out`, or undefined. */
function grantOf(out: Outgoing[], worker: number, key = 'global'): LeaseGrant | undefined {
  return out.find((o) => o.worker === worker)?.grants.find((g) => g.key === key);
}

function ledger(limit: number, workers = 4, specs?: Map<string, BudgetSpec>): LeaseLedger {
  const l = new LeaseLedger({ workers, ackMs: 50, relaxMs: 200 });
  l.configure(specs ?? new Map([['global', slots(limit)]]), 0);
  return l;
}

function granted(l: LeaseLedger, key = 'global'): number {
  return l.view(0).find((b) => b.key === key)?.granted ?? 0;
}

t.test('block: a quarter of an even share per worker, at least 1', async (t) => {
  const l = new LeaseLedger({ workers: 4 });
  const cases: [number, number][] = [
    [0, 1],
    [8, 1],
    [15, 1],
    [16, 1],
    [31, 1],
    [32, 2],
    [4096, 256],
  ];
  for (const [limit, block] of cases) t.equal(l.blockOf(slots(limit)), block, `limit ${limit}`);
  t.equal(new LeaseLedger({ workers: 0 }).blockOf(slots(8)), 2, 'workers below 1 count as 1');
  t.equal(l.blockOf({ kind: 'tokens', burst: 64, perSecond: 1 }), 4);
});

t.test('needs are met from free units, never past the limit', async (t) => {
  const l = ledger(8);
  const out = l.ask(0, [ask('global', { need: 5 })], 0);
  t.same(grantOf(out, 0), { key: 'global', add: 5, revoke: 0, reply: true, exhausted: false, contended: false, block: 1, limit: 8, nodeHeld: 0 }, 'nodeHeld: in use as reported (none yet)');
  const out2 = l.ask(1, [ask('global', { need: 2, extra: 1 })], 1);
  t.equal(grantOf(out2, 1)?.add, 3, 'need 2 plus 1 of headroom');
  t.equal(granted(l), 8);
  // Nothing free: worker 2's need makes the budget contended; holders 0 and 1 are told and must answer first.
  const out3 = l.ask(2, [ask('global', { need: 1 })], 2);
  t.equal(grantOf(out3, 2), undefined, 'the starved worker waits for the holders');
  t.equal(grantOf(out3, 0)?.contended, true);
  t.equal(grantOf(out3, 1)?.contended, true);
  t.equal(grantOf(out3, 0)?.add, 0);
  t.equal(granted(l), 8);
  // Worker 0 answers: 5 in use, nothing idle. Worker 1 gives its idle headroom unit: it goes to worker 2.
  const a0 = l.ask(0, [ask('global', { used: 5 })], 3);
  t.equal(grantOf(a0, 2), undefined, 'still waiting for worker 1');
  const a1 = l.ask(1, [ask('global', { used: 2, give: 1 })], 4);
  t.same(grantOf(a1, 2), { key: 'global', add: 1, revoke: 0, reply: true, exhausted: false, contended: true, block: 1, limit: 8, nodeHeld: 7 }, 'nodeHeld: 5 + 2 in use as reported');
  t.equal(granted(l), 8, 'never more than the limit');
});

t.test('a starved worker is told exhausted once every holder answered with nothing idle', async (t) => {
  const l = ledger(2);
  l.ask(0, [ask('global', { need: 1 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 0);
  const out = l.ask(2, [ask('global', { need: 1 })], 1);
  t.equal(grantOf(out, 2), undefined);
  t.equal(grantOf(l.ask(0, [ask('global', { used: 1 })], 2), 2), undefined, 'one holder still to answer');
  const done = l.ask(1, [ask('global', { used: 1 })], 3);
  t.same(grantOf(done, 2), { key: 'global', add: 0, revoke: 0, reply: true, exhausted: true, contended: true, block: 1, limit: 2, nodeHeld: 2 });
  // Its need stands: a unit that comes back anywhere goes to it.
  const back = l.ask(0, [ask('global', { give: 1 })], 10);
  t.same(grantOf(back, 2), { key: 'global', add: 1, revoke: 0, reply: false, exhausted: false, contended: true, block: 1, limit: 2, nodeHeld: 1 });
  t.equal(granted(l), 2);
});

t.test('a holder that never answers: the starved worker is answered at ackMs', async (t) => {
  const l = ledger(1);
  l.ask(0, [ask('global', { need: 1 })], 0);
  t.equal(grantOf(l.ask(1, [ask('global', { need: 1 })], 100), 1), undefined);
  t.equal(l.nextDue(100), 150);
  t.equal(grantOf(l.tick(149), 1), undefined, 'before the deadline');
  t.same(grantOf(l.tick(150), 1)?.exhausted, true, 'at the deadline');
});

t.test('standing needs are served FIFO across workers', async (t) => {
  const l = ledger(1);
  l.ask(0, [ask('global', { need: 1 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 1);
  l.ask(0, [ask('global', { used: 1 })], 1); // the ack: exhausted for 1
  l.ask(2, [ask('global', { need: 1 })], 2);
  l.ask(3, [ask('global', { need: 1 })], 3);
  const order: number[] = [];
  let holder = 0;
  for (let i = 0; i < 3; i++) {
    const out = l.ask(holder, [ask('global', { give: 1 })], 10 + i);
    const to = out.find((o) => o.grants.some((g) => g.add === 1));
    if (to === undefined) break;
    order.push(to.worker);
    holder = to.worker;
  }
  t.same(order, [1, 2, 3]);
});

t.test('contention ends relaxMs after the last need, and holders are told', async (t) => {
  const l = ledger(1);
  l.ask(0, [ask('global', { need: 1 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 0);
  l.ask(0, [ask('global', { used: 1 })], 1);
  // Worker 1 withdraws its need (its request was refused).
  l.ask(1, [ask('global', { need: 0 })], 5);
  t.equal(l.nextDue(5), 205);
  t.equal(l.view(100)[0]?.contended, true);
  const out = l.tick(205);
  t.equal(grantOf(out, 0)?.contended, false, 'the holder hears contention ended');
  t.equal(l.view(205)[0]?.contended, false);
  t.equal(l.nextDue(205), undefined);
});

t.test('no headroom while contended; headroom never past free units or a block', async (t) => {
  const l = ledger(40, 4); // block 2
  t.equal(grantOf(l.ask(0, [ask('global', { extra: 10 })], 0), 0)?.add, 2, 'extra capped at a block');
  l.ask(1, [ask('global', { need: 38 })], 0);
  t.equal(granted(l), 40);
  l.ask(2, [ask('global', { need: 1 })], 1);
  l.ask(0, [ask('global', { give: 2 })], 2); // its headroom comes back: to worker 2
  const out = l.ask(3, [ask('global', { extra: 2 })], 3);
  t.same(grantOf(out, 3), { key: 'global', add: 0, revoke: 0, reply: true, exhausted: false, contended: true, block: 2, limit: 40, nodeHeld: 0 }, 'a unit is free, but no headroom while contended');
});

t.test('a dead worker gives back everything; standing needs get it', async (t) => {
  const l = ledger(4);
  l.ask(0, [ask('global', { need: 4 })], 0);
  l.ask(1, [ask('global', { need: 2 })], 1);
  t.equal(granted(l), 4);
  const out = l.drop(0, 2);
  t.equal(grantOf(out, 1)?.add, 2);
  t.equal(granted(l), 2);
  t.same(l.view(2)[0]?.holders.map((h) => h.worker), [1]);
  t.same(l.drop(7, 3), [], 'an unknown worker changes nothing');
});

t.test('a lowered limit revokes idle units first, then in-use ones as they free; nothing is granted meanwhile', async (t) => {
  const l = ledger(8);
  l.ask(0, [ask('global', { need: 4 })], 0);
  l.ask(1, [ask('global', { need: 4 })], 0);
  l.ask(0, [ask('global', { used: 2 })], 1); // 2 idle
  l.ask(1, [ask('global', { used: 4 })], 1);
  const out = l.configure(new Map([['global', slots(3)]]), 2);
  t.equal(grantOf(out, 0)?.revoke, 2, 'the idle units first');
  t.equal(grantOf(out, 1)?.revoke, 3, 'then in use');
  t.equal(grantOf(out, 1)?.limit, 3);
  t.equal(grantOf(l.ask(2, [ask('global', { need: 1 })], 3), 2), undefined, 'nothing granted while the excess is out');
  l.ask(0, [ask('global', { give: 2, used: 2 })], 4);
  l.ask(1, [ask('global', { give: 3, used: 1 })], 5);
  t.equal(granted(l), 3);
  // Configured again with the same limit: nothing more to revoke.
  t.equal(grantOf(l.configure(new Map([['global', slots(3)]]), 6), 0)?.revoke ?? 0, 0);
  // Raised: the standing need of worker 2 is met at once.
  t.equal(grantOf(l.configure(new Map([['global', slots(4)]]), 7), 2)?.add, 1);
});

t.test('a retired key is forgotten once nobody holds it; an unknown key is answered exhausted', async (t) => {
  const l = ledger(0, 4, new Map([['global', slots(4)], ['upstream:a', slots(2)]]));
  l.ask(0, [ask('upstream:a', { need: 1 })], 0);
  l.configure(new Map([['global', slots(4)]]), 1);
  t.same(l.view(1).map((b) => [b.key, b.limit, b.granted]), [['global', 4, 0], ['upstream:a', 0, 1]]);
  l.ask(0, [ask('upstream:a', { give: 1 })], 2);
  t.same(l.view(2).map((b) => b.key), ['global']);
  t.same(grantOf(l.ask(0, [ask('upstream:zz', { need: 1 })], 3), 0, 'upstream:zz'), { key: 'upstream:zz', add: 0, revoke: 0, reply: true, exhausted: true, contended: false, block: 1, limit: 0, nodeHeld: 0 });
});

t.test('gives beyond what a worker holds are capped; used is capped at granted', async (t) => {
  const l = ledger(4);
  l.ask(0, [ask('global', { need: 2 })], 0);
  l.ask(0, [ask('global', { give: 9, used: 9 })], 1);
  t.equal(granted(l), 0);
  l.ask(0, [ask('global', { need: 1 })], 2);
  l.ask(0, [ask('global', { used: 9 })], 3);
  t.equal(l.view(3)[0]?.holders[0]?.used, 1);
});

t.test('tokens: consumed units are gone, unused ones return, the bucket refills at the rate up to the burst', async (t) => {
  const l = ledger(0, 4, new Map([['rl', { kind: 'tokens', burst: 5, perSecond: 10 }]]));
  t.equal(grantOf(l.ask(0, [ask('rl', { need: 4 })], 0), 0, 'rl')?.add, 4);
  t.equal(grantOf(l.ask(1, [ask('rl', { need: 4 })], 0), 1, 'rl')?.add, 1, 'the burst is the node bucket');
  // Worker 0 spent 3, gives back 1: the refill may add only while bucket + held stays within the burst.
  l.ask(0, [ask('rl', { used: 3, give: 1 })], 0);
  let v = l.view(0)[0];
  t.equal(v?.granted, 2, 'the given-back token went to the standing need of worker 1');
  t.equal(v?.free, 0);
  // 100 ms at 10/s: one more token (the bucket may hold 5 − 2 held); worker 1's need (2 left) gets it at the tick.
  t.equal(l.nextDue(0), 100);
  t.equal(grantOf(l.tick(99), 1, 'rl'), undefined);
  t.equal(grantOf(l.tick(100), 1, 'rl')?.add, 1);
  v = l.view(100)[0];
  t.equal(v?.free, 0);
  // After a long idle time the bucket is full again, counting what workers hold.
  l.ask(1, [ask('rl', { need: 0, used: 3 })], 200);
  t.equal(l.view(10_000)[0]?.free, 5);
  // A dead worker's unspent tokens come back.
  l.ask(2, [ask('rl', { need: 5 })], 10_000);
  l.drop(2, 10_000);
  t.equal(l.view(10_000)[0]?.free, 5);
  t.equal(l.nextDue(10_000), undefined, 'no standing need: nothing due');
  l.ask(2, [ask('rl', { need: 6 })], 10_000);
  t.equal(l.nextDue(10_000), 10_100, 'a standing need waits for the next token');
});

t.test('tokens: a lowered burst empties the bucket down to it', async (t) => {
  const l = ledger(0, 1, new Map([['rl', { kind: 'tokens', burst: 10, perSecond: 1 }]]));
  l.configure(new Map([['rl', { kind: 'tokens', burst: 3, perSecond: 1 }]]), 0);
  t.equal(l.view(0)[0]?.free, 3);
  l.configure(new Map([['rl', slots(2)]]), 0);
  t.same([l.view(0)[0]?.kind, l.view(0)[0]?.free], ['slots', 2]);
  l.configure(new Map([['rl', { kind: 'tokens', burst: 4, perSecond: 1 }]]), 0);
  t.equal(l.view(0)[0]?.free, 4, 'a budget turned into tokens starts full');
});
