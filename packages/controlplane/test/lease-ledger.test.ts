// The node's lease ledger (limits/lease-ledger.ts), with a fake clock: grants never pass the
// limit, standing needs are served FIFO when units come back anywhere, contention makes holders
// give idle units back before a starved worker is told `exhausted`, a dead worker's units return,
// a lowered limit revokes; the views and the due times.
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
  return l.view().find((b) => b.key === key)?.granted ?? 0;
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
  t.equal(l.nextDue(), 150);
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
  t.equal(l.nextDue(), 205);
  t.equal(l.view()[0]?.contended, true);
  const out = l.tick(205);
  t.equal(grantOf(out, 0)?.contended, false, 'the holder hears contention ended');
  t.equal(l.view()[0]?.contended, false);
  t.equal(l.nextDue(), undefined);
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
  t.same(l.view()[0]?.holders.map((h) => h.worker), [1]);
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
  t.same(l.view().map((b) => [b.key, b.limit, b.granted]), [['global', 4, 0], ['upstream:a', 0, 1]]);
  l.ask(0, [ask('upstream:a', { give: 1 })], 2);
  t.same(l.view().map((b) => b.key), ['global']);
  t.same(grantOf(l.ask(0, [ask('upstream:zz', { need: 1 })], 3), 0, 'upstream:zz'), { key: 'upstream:zz', add: 0, revoke: 0, reply: true, exhausted: true, contended: false, block: 1, limit: 0, nodeHeld: 0 });
});

t.test('gives beyond what a worker holds are capped; used is capped at granted', async (t) => {
  const l = ledger(4);
  l.ask(0, [ask('global', { need: 2 })], 0);
  l.ask(0, [ask('global', { give: 9, used: 9 })], 1);
  t.equal(granted(l), 0);
  l.ask(0, [ask('global', { need: 1 })], 2);
  l.ask(0, [ask('global', { used: 9 })], 3);
  t.equal(l.view()[0]?.holders[0]?.used, 1);
});


t.test('defaults: a holder told of contention has 50 ms to answer; contention ends 200 ms after the last need', async (t) => {
  const l = new LeaseLedger({ workers: 4 });
  l.configure(new Map([['global', slots(1)]]), 0);
  l.ask(0, [ask('global', { need: 1 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 1000);
  t.equal(l.nextDue(), 1050, 'the ack deadline: 50 ms after the holder was told');
  t.same(grantOf(l.tick(1050), 1)?.exhausted, true);
  l.ask(1, [ask('global', { need: 0 })], 1100);
  t.equal(l.nextDue(), 1300, 'relaxed 200 ms after the need was withdrawn');
});

t.test('standing needs keep their place: a worker that re-sends its need is not sent to the back; FIFO is by the time a need began, not by holder order', async (t) => {
  const l = ledger(2);
  l.ask(1, [ask('global', { need: 1 })], 0); // holder 1 is known first
  l.ask(3, [ask('global', { need: 1 })], 0);
  l.ask(2, [ask('global', { need: 1 })], 1); // waits first
  l.ask(1, [ask('global', { need: 1, used: 1 })], 2); // waits second (holder 1 is older in the ledger)
  l.ask(3, [ask('global', { used: 1 })], 3); // the ack
  l.ask(2, [ask('global', { need: 1 })], 4); // re-sends its need: keeps its place
  const out = l.ask(3, [ask('global', { give: 1 })], 5);
  t.equal(grantOf(out, 2)?.add, 1, 'the freed slot goes to worker 2, whose need is the oldest');
  t.equal(grantOf(out, 1)?.add ?? 0, 0, 'not to worker 1');
});

t.test('an ask that asks nothing gets no answer; one for an unknown key that asks nothing gets nothing at all', async (t) => {
  const l = ledger(8);
  l.ask(0, [ask('global', { extra: 2 })], 0);
  t.same(l.ask(0, [ask('global', { give: 1, used: 0, asks: false })], 1), [], 'a give-back alone is not answered');
  t.same(l.ask(0, [ask('nope', { give: 1, asks: false })], 1), [], 'unknown key, nothing asked: nothing sent');
  t.same(l.ask(0, [ask('nope', { need: 1 })], 1), [{ worker: 0, grants: [{ key: 'nope', add: 0, revoke: 0, reply: true, exhausted: true, contended: false, block: 1, limit: 0, nodeHeld: 0 }] }], 'unknown key asked: answered exhausted');
});

t.test('a told holder that answers releases the starved worker at once, before ackMs', async (t) => {
  const l = ledger(2);
  l.ask(0, [ask('global', { need: 2 })], 0);
  t.equal(grantOf(l.ask(1, [ask('global', { need: 1 })], 10), 1), undefined, 'waits for the holder');
  const out = l.ask(0, [ask('global', { used: 2 })], 11);
  t.same(grantOf(out, 1), { key: 'global', add: 0, revoke: 0, reply: true, exhausted: true, contended: true, block: 1, limit: 2, nodeHeld: 2 }, 'answered exhausted in the same call');
  t.equal(l.nextDue(), undefined, 'nothing due while the need stands: no ack outstanding, no relax yet');
});

t.test('the ack deadline is set by the first holder told, not pushed back by later ones', async (t) => {
  const l = ledger(3);
  l.ask(0, [ask('global', { need: 2 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 0);
  l.ask(2, [ask('global', { need: 1 })], 10); // contention: 0 and 1 told at 10
  t.equal(l.nextDue(), 60);
  l.ask(3, [ask('global', { need: 1 })], 30);
  t.equal(l.nextDue(), 60, 'still 60');
});

t.test('contention lasts relaxMs after the starved worker is served; after it ends a new contention tells the holders again', async (t) => {
  const l = ledger(2);
  l.ask(0, [ask('global', { need: 1 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 0);
  l.ask(2, [ask('global', { need: 1 })], 10);
  l.ask(0, [ask('global', { used: 1 })], 11);
  l.ask(1, [ask('global', { used: 1 })], 11);
  const served = l.ask(0, [ask('global', { give: 1 })], 20);
  t.same([grantOf(served, 2)?.add, grantOf(served, 2)?.contended], [1, true], 'served, still contended');
  t.equal(l.view()[0]?.contended, true);
  t.equal(l.nextDue(), 220);
  const relaxed = l.tick(220);
  t.same(relaxed.map((o) => o.worker), [1, 2], 'the told holders hear it ended, in worker order');
  t.same(relaxed.flatMap((o) => o.grants.map((g) => g.contended)), [false, false]);
  t.equal(grantOf(relaxed, 0), undefined, 'worker 0 (holding nothing) is not told');
  // A new starved worker: the holders are told again.
  const again = l.ask(3, [ask('global', { need: 1 })], 300);
  t.same(again.map((o) => [o.worker, o.grants[0]?.contended]), [[1, true], [2, true]], 'both holders told again');
});

t.test('a lowered limit revokes once: the debt outstanding is counted, a later commit revokes no more', async (t) => {
  const l = ledger(4);
  l.ask(0, [ask('global', { need: 3 })], 0);
  l.ask(1, [ask('global', { need: 1 })], 0);
  const lowered = l.configure(new Map([['global', slots(2)]]), 1);
  t.same(lowered.map((o) => [o.worker, o.grants[0]?.revoke]), [[0, 2]], 'the largest holder owes the 2 (none idle as reported)');
  l.ask(0, [ask('global', { give: 1, used: 2 })], 2);
  t.same(l.configure(new Map([['global', slots(2)]]), 3), [], 'the same limit again: the one slot still owed is not revoked twice');
  t.equal(granted(l), 3);
  l.ask(0, [ask('global', { give: 1, used: 1 })], 4);
  t.equal(granted(l), 2);
  t.equal(l.ask(1, [ask('global', { need: 1, used: 1 })], 5)[0]?.grants[0]?.exhausted, false, 'nothing outstanding: contention starts, no exhausted yet');
});

t.test('revocation takes idle slots first, then from the largest lease', async (t) => {
  const l = ledger(10);
  l.ask(0, [ask('global', { need: 4 })], 0);
  l.ask(1, [ask('global', { need: 5 })], 0);
  l.ask(2, [ask('global', { need: 1 })], 0);
  l.ask(0, [ask('global', { used: 2 })], 1); // 2 idle
  l.ask(1, [ask('global', { used: 5 })], 1);
  l.ask(2, [ask('global', { used: 1 })], 1);
  const out = l.configure(new Map([['global', slots(5)]]), 2);
  t.same(out.map((o) => [o.worker, o.grants[0]?.revoke]), [[0, 2], [1, 3]], "worker 0's 2 idle, then 3 of worker 1's 5 (the largest lease)");
});

t.test('views: budgets by key, holders by worker; a holder keeps its entry while it holds slots', async (t) => {
  const l = new LeaseLedger({ workers: 4 });
  l.configure(new Map([['upstream:b', slots(8)], ['global', slots(8)], ['upstream:a', slots(8)]]), 0);
  l.ask(3, [ask('global', { need: 1 })], 0);
  l.ask(0, [ask('global', { need: 2 })], 0);
  const v = l.view();
  t.same(v.map((b) => b.key), ['global', 'upstream:a', 'upstream:b']);
  t.same(v[0]?.holders, [{ worker: 0, granted: 2, used: 0, need: 0 }, { worker: 3, granted: 1, used: 0, need: 0 }]);
  l.ask(3, [ask('global', { give: 1 })], 1);
  t.same(l.view()[0]?.holders.map((h) => h.worker), [0], 'worker 3, holding nothing, is forgotten');
});

t.test('a retired budget nobody holds is forgotten at the commit; one still held stays until given back', async (t) => {
  const l = ledger(0, 4, new Map([['global', slots(4)], ['upstream:a', slots(4)], ['upstream:b', slots(4)]]));
  l.ask(0, [ask('upstream:a', { need: 1 })], 0);
  l.configure(new Map([['global', slots(4)]]), 1);
  t.same(l.view().map((b) => [b.key, b.limit]), [['global', 4], ['upstream:a', 0]], 'b forgotten at once; a kept (limit 0) while held');
  l.ask(0, [ask('upstream:a', { give: 1 })], 2);
  t.same(l.view().map((b) => b.key), ['global']);
});

t.test('a dead worker: its slots serve the others, in worker order of the answers', async (t) => {
  const l = ledger(2);
  l.ask(0, [ask('global', { need: 2 })], 0);
  l.ask(2, [ask('global', { need: 1 })], 1);
  l.ask(1, [ask('global', { need: 1 })], 2);
  l.tick(100);
  const out = l.drop(0, 101);
  t.same(out.map((o) => [o.worker, o.grants[0]?.add]), [[1, 1], [2, 1]]);
});
