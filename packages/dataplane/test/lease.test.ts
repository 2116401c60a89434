// A worker's leases (resilience/lease.ts) with a fake clock and a manual flush: takes and
// releases are local and synchronous, the asks of one turn go out as one message, at most one
// ask awaiting its answer per key, idle units go back by the hysteresis rule, at once while
// contended, revoked units first; an ask unanswered past waitMs makes the lease unavailable.
import t from 'tap';
import { LeaseTable } from '../src/resilience/lease.ts';
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';

function setup(waitMs = 1000) {
  let now = 0;
  const sent: LeaseAsk[][] = [];
  const pending: (() => void)[] = [];
  const heard: LeaseGrant[] = [];
  const delayed: number[] = [];
  const table = new LeaseTable({ send: (a) => sent.push(a), waitMs, now: () => now, schedule: (fn) => pending.push(fn), delay: (fn, ms) => (delayed.push(ms), pending.push(fn)), onGrant: (_l, g) => heard.push(g) });
  return {
    table,
    sent,
    delayed,
    heard,
    pending,
    advance(ms: number) {
      now += ms;
    },
    /** Runs the scheduled flush (the end of the turn); returns what was sent. */
    turn(): LeaseAsk[] | undefined {
      const before = sent.length;
      for (const fn of pending.splice(0)) fn();
      return sent.length > before ? sent[sent.length - 1] : undefined;
    },
  };
}

function grant(key: string, g: Partial<LeaseGrant> = {}): LeaseGrant {
  return { key, add: 0, revoke: 0, contended: false, reply: false, exhausted: false, block: 1, limit: 8, nodeHeld: 0, ...g };
}

t.test('an empty lease refuses and asks once per turn, with the standing need', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  t.equal(l.tryTake(), false);
  t.equal(l.tryTake(), false);
  l.waiting = 2;
  t.equal(s.pending.length, 1, 'one flush scheduled for the turn');
  t.same(s.turn(), [{ key: 'global', need: 2, extra: 0, give: 0, used: 0, asks: true }]);
  t.equal(l.askedAt, 0);
  // While the ask is out, a changed need is sent without asking again.
  l.waiting = 3;
  t.equal(l.tryTake(), false);
  t.same(s.turn(), [{ key: 'global', need: 3, extra: 0, give: 0, used: 0, asks: false }]);
  t.equal(l.tryTake(), false);
  t.equal(s.turn(), undefined, 'nothing new to say');
  t.equal(s.table.messages, 2);
});

t.test('a grant is taken synchronously; the answer clears the outstanding ask; exhausted is remembered by ask number', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  l.waiting = 1;
  l.tryTake();
  s.turn();
  s.table.receive([grant('global', { add: 1, reply: true })]);
  t.equal(s.heard.length, 1);
  t.equal(l.askedAt, -1);
  t.equal(l.answered, 1);
  t.equal(l.tryTake(), true);
  t.equal(l.inUse, 1);
  l.waiting = 1;
  l.tryTake();
  s.turn();
  s.table.receive([grant('global', { reply: true, exhausted: true })]);
  t.equal(l.exhaustedAt, 2);
  s.table.receive([grant('global', { add: 1 })]);
  t.equal(l.exhaustedAt, 0, 'a unit came: no longer exhausted');
  t.equal(l.answered, 2, 'an unsolicited grant answers nothing');
  // The node's in-use count less what this worker last reported: the others'.
  l.tryTake();
  s.turn();
  t.equal(l.sentUsed, 2);
  s.table.receive([grant('global', { nodeHeld: 5 })]);
  t.equal(l.othersInUse, 3);
  s.table.receive([grant('global', { nodeHeld: 1 })]);
  t.equal(l.othersInUse, 0, 'never below 0 (a report in transit)');
});

t.test('low on units: headroom of one block is asked ahead of need, once', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.table.receive([grant('global', { add: 4, block: 4 })]);
  t.equal(s.turn(), undefined, 'a block idle: nothing to say');
  t.equal(l.tryTake(), true);
  t.equal(s.turn(), undefined, '3 idle of a block of 4: not low yet');
  t.equal(l.tryTake(), true);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 4, give: 0, used: 2, asks: true }], 'half a block idle: low');
  t.equal(l.tryTake(), true);
  t.equal(l.tryTake(), true);
  t.equal(s.turn(), undefined, 'one ask outstanding at most');
  t.equal(l.tryTake(), false);
});

t.test('release: back to the lease; idle beyond 2 blocks goes back down to one block', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.table.receive([grant('global', { add: 4, block: 2 })]);
  t.equal(s.turn(), undefined, '2 blocks idle: kept');
  for (let i = 0; i < 4; i++) t.equal(l.tryTake(), true);
  s.turn();
  s.table.receive([grant('global', { add: 2, reply: true, block: 2 })]);
  t.equal(s.turn(), undefined);
  l.release();
  l.release();
  t.equal(s.pending.length, 0, '4 idle of 2 blocks of 2: kept, nothing scheduled');
  l.release();
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 3, used: 1, asks: false }], '5 idle: 3 back, one block kept');
  t.equal(l.granted, 3);
  t.equal(l.idle, 2);
  l.release();
  l.release();
  t.equal(l.inUse, 0, 'never below 0');
});

t.test('an unsolicited grant beyond 2 blocks idle goes back at once', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.table.receive([grant('global', { add: 7, block: 2 })]);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 5, used: 0, asks: false }]);
  t.equal(l.granted, 2);
});

t.test('contended: a contention notice is acked with every idle unit; each freed unit then goes back', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.table.receive([grant('global', { add: 3, block: 2 })]);
  s.turn();
  t.equal(l.tryTake(), true);
  t.equal(l.tryTake(), true);
  s.turn();
  s.table.receive([grant('global', { contended: true, block: 2 })]);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 1, used: 2, asks: false }], 'ack with the idle unit');
  l.release();
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 1, used: 1, asks: false }]);
  s.table.receive([grant('global', { contended: true })]);
  t.same(s.turn(), undefined, 'already contended: nothing to ack');
  s.table.receive([grant('global', { contended: false, reply: true })]);
  t.equal(l.contended, false);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 1, give: 0, used: 1, asks: true }], 'relaxed: headroom again');
});

t.test('a revoked unit is paid from idle units at once, the rest as they free; nothing is taken meanwhile', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.table.receive([grant('global', { add: 4, block: 4 })]);
  for (let i = 0; i < 3; i++) l.tryTake();
  s.turn();
  s.table.receive([grant('global', { revoke: 3, reply: true, block: 1, limit: 1 })]);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 1, used: 3, asks: false }]);
  t.equal(l.debt, 2);
  t.equal(l.tryTake(), false, 'no idle unit while in debt');
  s.turn();
  l.release();
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 1, used: 2, asks: false }]);
  l.release();
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 1, give: 1, used: 1, asks: true }], 'paid: headroom asked again');
  t.equal(l.debt, 0);
  t.equal(l.granted, 1);
});

t.test('unavailable: an ask unanswered for waitMs', async (t) => {
  const s = setup(250);
  const l = s.table.lease('global');
  t.equal(l.unavailable(0), false, 'no ask out');
  l.waiting = 1;
  l.tryTake();
  s.turn();
  s.advance(249);
  t.equal(l.unavailable(249), false);
  t.equal(l.unavailable(250), true);
  s.table.receive([grant('global', { reply: true, add: 1 })]);
  t.equal(l.unavailable(10_000), false);
});


t.test('solo (no supervisor): each lease holds its whole limit; nothing is ever sent', async (t) => {
  const table = new LeaseTable({ waitMs: 100 });
  const g = table.lease('global');
  t.equal(g.granted, 0);
  table.setSolo((k) => (k === 'global' ? 2 : 5));
  t.equal(g.granted, 2);
  t.equal(table.lease('upstream:a').granted, 5, 'created after: holds its limit');
  t.equal(g.tryTake(), true);
  t.equal(g.tryTake(), true);
  t.equal(g.tryTake(), false);
  g.release();
  t.equal(g.tryTake(), true);
  table.flush();
  t.equal(table.messages, 0);
  t.same([...table.all()].map((l) => l.key), ['global', 'upstream:a']);
});

t.test('several keys of one turn go out in one message', async (t) => {
  const s = setup();
  const a = s.table.lease('global');
  const b = s.table.lease('upstream:x');
  a.waiting = 1;
  b.waiting = 1;
  a.tryTake();
  b.tryTake();
  t.same(s.turn()?.map((x) => x.key), ['global', 'upstream:x']);
  t.equal(s.table.messages, 1);
});

t.test('a new lease asks for a block of headroom at once, uncontended; nothing is granted before the answer', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  t.equal(l.granted, 0);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 1, give: 0, used: 0, asks: true }]);
});

t.test('running low: the top-up is asked at half a block idle, once, not while an ask is out', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.turn();
  s.table.receive([grant('global', { add: 8, reply: true, block: 4, limit: 64 })]);
  s.turn();
  const asks: (LeaseAsk[] | undefined)[] = [];
  for (let i = 0; i < 6; i++) {
    t.equal(l.tryTake(), true);
    asks.push(s.turn());
  }
  // idle after each take: 7 6 5 4 3 2 — the ask goes out at 2 (half the block), and no second one while it is out.
  t.same(asks.map((a) => a?.[0]?.asks ?? null), [null, null, null, null, null, true]);
  t.same(asks[5], [{ key: 'global', need: 0, extra: 4, give: 0, used: 6, asks: true }]);
  t.equal(l.tryTake(), true);
  t.equal(s.turn(), undefined, 'ask outstanding: no second top-up');
});

t.test('a lease marked twice in a turn goes out once; two leases in a turn share one flush and one message', async (t) => {
  const s = setup();
  const a = s.table.lease('global');
  const b = s.table.lease('upstream:x');
  t.equal(s.pending.length, 1, 'one flush scheduled for both');
  a.tryTake();
  a.tryTake();
  b.tryTake();
  const sent = s.turn();
  t.same(sent?.map((x) => x.key), ['global', 'upstream:x']);
  t.equal(s.table.messages, 1);
});

t.test('debt: every idle slot pays it back at once, whatever the hysteresis would keep', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.turn();
  s.table.receive([grant('global', { add: 4, reply: true, block: 4, limit: 64 })]);
  s.turn();
  l.tryTake();
  s.table.receive([grant('global', { revoke: 4, block: 4, limit: 64 })]);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 3, used: 1, asks: false }], '3 idle paid at once, 1 still owed');
  l.release();
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 4, give: 1, used: 0, asks: true }], 'the last one as it frees; debt paid, headroom is asked again');
  t.equal(l.debt, 0);
});

t.test('a contention notice is acknowledged even with nothing to give', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  s.turn();
  s.table.receive([grant('global', { add: 1, reply: true })]);
  s.turn();
  t.equal(l.tryTake(), true);
  s.turn();
  s.table.receive([grant('global', { contended: true })]);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 0, give: 0, used: 1, asks: false }], 'the ack: nothing idle, in use 1');
  s.table.receive([grant('global', { contended: true })]);
  t.equal(s.turn(), undefined, 'already contended: no second ack');
});

t.test('answers: only a reply clears the outstanding ask; only an exhausted reply is remembered; a grant adding nothing keeps it', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  l.waiting = 1;
  l.tryTake();
  s.turn();
  s.advance(1500);
  s.table.receive([grant('global', { add: 1 })]); // unsolicited (a slot freed elsewhere), not the answer
  t.equal(l.askedAt, 0, 'the ask is still out');
  t.equal(l.unavailable(1500), true, 'and still unanswered past the wait');
  s.table.receive([grant('global', { reply: true, exhausted: false })]);
  t.same([l.askedAt, l.answered, l.exhaustedAt], [-1, 1, 0], 'answered, not exhausted');
  l.tryTake();
  l.waiting = 1;
  l.tryTake();
  s.turn();
  s.table.receive([grant('global', { reply: true, exhausted: true })]);
  t.equal(l.exhaustedAt, 2, 'the second ask was answered exhausted');
  s.table.receive([grant('global', { contended: true })]);
  t.equal(l.exhaustedAt, 2, 'a notice that adds nothing does not forget it');
  s.table.receive([grant('global', { add: 1 })]);
  t.equal(l.exhaustedAt, 0, 'a slot came: forgotten');
});

t.test('unavailable counts from when the ask was sent, on any clock origin', async (t) => {
  const s = setup(1000);
  s.advance(5000);
  const l = s.table.lease('global');
  s.turn();
  t.equal(l.askedAt, 5000);
  t.equal(l.unavailable(5999), false);
  t.equal(l.unavailable(6000), true);
});

t.test('defaults: the flush runs after the turn (setImmediate); a grant without onGrant is applied', async (t) => {
  const sent: LeaseAsk[][] = [];
  const table = new LeaseTable({ send: (a) => sent.push(a), waitMs: 1000 });
  const l = table.lease('global');
  t.equal(sent.length, 0, 'not within the turn');
  await new Promise((r) => setImmediate(r));
  t.equal(sent.length, 1);
  t.ok(l.askedAt > 0, 'sent at the performance clock');
  table.receive([grant('global', { add: 2, reply: true })]);
  t.equal(l.granted, 2);
});

t.test('a headroom ask answered with nothing is not repeated until the budget changes (no ask and empty answer every turn while it is fully leased)', async (t) => {
  const s = setup();
  const l = s.table.lease('global');
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 1, give: 0, used: 0, asks: true }], 'a new lease asks for headroom');
  s.table.receive([grant('global', { reply: true, limit: 8 })]);
  t.equal(l.headroomRefused, true, 'answered with nothing: nothing free on the node');
  t.equal(s.turn(), undefined, 'not asked again');
  t.equal(l.tryTake(), false, 'a request finds the lease empty');
  l.waiting = 1;
  t.same(s.turn(), [{ key: 'global', need: 1, extra: 0, give: 0, used: 0, asks: true }], 'its need is asked for all the same');
  s.table.receive([grant('global', { reply: true, exhausted: true, limit: 8 })]);
  t.equal(l.headroomRefused, true, 'an unmet need keeps it');
  l.waiting = 0;
  s.turn();
  s.table.receive([grant('global', { add: 1, limit: 8 })]);
  t.equal(l.headroomRefused, false, 'a unit came: headroom may be asked again');
  t.equal(l.tryTake(), true);
  t.same(s.turn(), [{ key: 'global', need: 0, extra: 1, give: 0, used: 1, asks: true }], 'running low: headroom asked');
  s.table.receive([grant('global', { reply: true, limit: 8 })]);
  t.equal(l.headroomRefused, true);
  s.table.receive([grant('global', { limit: 16 })]);
  t.equal(l.headroomRefused, false, 'a new limit: asked again');
  s.table.receive([grant('global', { reply: true, contended: true, limit: 16 })]);
  s.table.receive([grant('global', { contended: false, limit: 16 })]);
  t.equal(l.headroomRefused, false, 'contention over: asked again');
});

t.test('at most one message per LEASE_FLUSH_GAP_MS: a flush due sooner waits for the rest of the gap and carries every change made meanwhile', async (t) => {
  const s = setup();
  s.advance(10);
  const a = s.table.lease('global');
  const b = s.table.lease('upstream:x');
  t.equal(s.turn()?.length, 2, 'the first message goes after the turn');
  t.same(s.delayed, [], 'not delayed');
  s.advance(0.25);
  a.waiting = 1;
  a.tryTake();
  t.same(s.delayed, [0.75], 'due 0.25 ms after the last message: delayed by the rest of the 1 ms gap');
  b.waiting = 1;
  b.tryTake();
  t.same(s.delayed, [0.75], 'one flush for both');
  s.advance(0.75);
  t.same(s.turn()?.map((x) => x.key), ['global', 'upstream:x'], 'both changes in one message');
  s.advance(5);
  a.waiting = 2;
  s.table.mark(a);
  t.same(s.delayed, [0.75], 'a gap passed: after the turn again');
  t.equal(s.turn()?.[0]?.need, 2);
  t.equal(s.table.messages, 3);
});
