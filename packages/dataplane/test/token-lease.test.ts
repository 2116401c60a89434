// A worker's token leases (resilience/token-lease.ts), with a fake clock, fake timers and a fake
// channel: spending synchronously from a lease, one ask per key per turn sized to the requests
// waiting, the answer served first come first served, the refusal and its local memory, a slow
// supervisor (UNAVAILABLE, a late grant credited), asking ahead at half a block, several leases
// all or none, idle leases settled, bounded memory.
import t from 'tap';
import { LEASE_WAIT_MS, PENDING, TokenLeases, UNAVAILABLE } from '../src/resilience/token-lease.ts';
import type { Lease, TokenDeposit, TokenSettle } from '../src/resilience/token-lease.ts';
import { harness } from './support/token-leases.ts';
import type { Harness } from './support/token-leases.ts';

t.test('an empty lease: the requests of one turn wait on one ask sized to them; the answer serves them in order, the rest refused with the wait', async (t) => {
  const h = harness();
  const verdicts: number[] = [];
  for (let i = 0; i < 7; i++) {
    const l = h.leases.lease('rl', 'a:1.1.1.1', h.now());
    const v = h.leases.takeAll([l], h.now());
    t.equal(v, PENDING, `request ${i}: pending`);
    h.leases.wait([l], (x) => verdicts.push(x));
  }
  h.turn();
  t.same(h.sent, [{ asks: [{ budget: 'rl', key: 'a:1.1.1.1', want: 7, waiting: 7, holding: 0 }], settles: [] }], 'one message, one ask for the 7 waiting');
  h.leases.granted([{ budget: 'rl', key: 'a:1.1.1.1', granted: 5, waitMs: 1500, block: 1 }]);
  t.same(verdicts, [0, 0, 0, 0, 0, 2, 2], '5 served, 2 refused: Retry-After 2 s (1.5 s rounded up)');
  const l = h.leases.lease('rl', 'a:1.1.1.1', h.now());
  t.equal(h.leases.takeOne(l, h.now()), 2, 'the next request is refused locally');
  h.advance(1499);
  t.equal(h.leases.takeOne(l, h.now()), 1, '1 ms before the token');
  h.turn();
  t.equal(h.sent.length, 1, 'no message for the refused requests');
  h.advance(1);
  t.equal(h.leases.takeOne(l, h.now()), PENDING, 'the node may have a token again: ask');
});

t.test("a wait of exactly 1 s is Retry-After 1 whatever the clock reads (performance.now() is fractional: (now + 1000) - now can exceed 1000)", async (t) => {
  // At this clock value (1048.000999998865 + 1000) - 1048.000999998865 is 1000.0000000000001.
  const start = 1048.000999998865;
  t.ok(start + 1000 - start > 1000, 'the float sum is over 1000 at this clock value');
  const h = harness({}, start);
  const verdicts: number[] = [];
  for (let i = 0; i < 3; i++) {
    const l = h.leases.lease('rl', 'a:1.1.1.1', h.now());
    t.equal(h.leases.takeAll([l], h.now()), PENDING, `request ${i}: pending`);
    h.leases.wait([l], (x) => verdicts.push(x));
  }
  h.turn();
  h.leases.granted([{ budget: 'rl', key: 'a:1.1.1.1', granted: 1, waitMs: 1000, block: 1 }]);
  t.same(verdicts, [0, 1, 1], '1 served, 2 refused with Retry-After 1 (not 2)');
  t.equal(h.leases.takeOne(h.leases.lease('rl', 'a:1.1.1.1', h.now()), h.now()), 1, 'refused locally: 1');
});

t.test('a slow supervisor: waiters are refused UNAVAILABLE after the wait, so is the key while unanswered; a late grant is credited; one ask out per key', async (t) => {
  const h = harness();
  const verdicts: number[] = [];
  const l = h.leases.lease('rl', 'k', h.now());
  h.leases.wait([l], (v) => verdicts.push(v));
  h.turn();
  h.advance(LEASE_WAIT_MS - 1);
  t.same(verdicts, [], 'still waiting 1 ms before the bound');
  t.equal(h.leases.takeAll([l], h.now()), PENDING);
  h.leases.wait([l], (v) => verdicts.push(v));
  h.advance(1);
  t.same(verdicts, [], 'the bound passed: checked after the turn, so an answer already received would still count');
  h.turn();
  t.same(verdicts, [UNAVAILABLE, UNAVAILABLE], 'both refused at the bound');
  t.equal(h.leases.takeAll([l], h.now()), UNAVAILABLE, 'a new request: at once');
  h.turn();
  t.equal(h.sent.length, 1, 'no second ask while one is out');
  h.leases.granted([{ budget: 'rl', key: 'k', granted: 1, waitMs: 0, block: 1 }]);
  t.equal(h.leases.takeOne(l, h.now()), 0, 'the late token is spent');
  t.equal(h.leases.unavailable, 3);
});

t.test('a block above 1: the lease asks ahead at half a block, without waiting', async (t) => {
  const h = harness();
  const l = h.leases.lease('rl', 'k', h.now());
  h.leases.wait([l], () => {});
  h.turn();
  h.leases.granted([{ budget: 'rl', key: 'k', granted: 9, waitMs: 0, block: 8 }]);
  t.equal(l.tokens, 8, '1 spent by the waiter, 8 held');
  for (let i = 0; i < 5; i++) t.equal(h.leases.takeOne(l, h.now()), 0);
  h.turn();
  t.same(h.sent[1]?.asks, [{ budget: 'rl', key: 'k', want: 8, waiting: 0, holding: 3 }], 'asked ahead for a block at 3 (< 4) held');
  t.equal(h.leases.takeOne(l, h.now()), 0, 'still spending while the ask is out');
});

t.test('several leases: all or none; a refusing lease decides before a pending one', async (t) => {
  const h = harness();
  const a = h.leases.lease('a', 'k', h.now());
  const b = h.leases.lease('b', 'k', h.now());
  a.tokens = 1;
  t.equal(h.leases.takeAll([a, b], h.now()), PENDING);
  t.equal(a.tokens, 1, 'nothing spent');
  let verdict: number | undefined;
  h.leases.wait([a, b], (v) => (verdict = v));
  h.turn();
  t.same(h.sent[0]?.asks.map((x) => x.budget), ['b'], 'only the empty one is asked for');
  h.leases.granted([{ budget: 'b', key: 'k', granted: 1, waitMs: 0, block: 1 }]);
  t.equal(verdict, 0);
  t.same([a.tokens, b.tokens], [0, 0], 'one of each spent');
  b.emptyUntil = h.now() + 3000;
  const c = h.leases.lease('c', 'k', h.now());
  t.equal(h.leases.takeAll([c, b], h.now()), 3, 'b refuses for 3 s even though c could be asked');
});

t.test('idle leases are settled with their unspent tokens and forgotten; a grant for a forgotten lease goes straight back', async (t) => {
  const h = harness();
  const l = h.leases.lease('rl', 'k', h.now());
  l.tokens = 3;
  h.leases.lease('rl', 'other', h.now());
  h.advance(999);
  t.equal(h.leases.size, 2);
  h.advance(1);
  h.turn();
  t.equal(h.leases.size, 0);
  t.same(h.sent, [{ asks: [], settles: [{ budget: 'rl', key: 'k', unused: 3, forget: true }, { budget: 'rl', key: 'other', unused: 0, forget: true }] }]);
  h.leases.granted([{ budget: 'rl', key: 'gone', granted: 2, waitMs: 0, block: 1 }]);
  h.turn();
  t.same(h.sent[1], { asks: [], settles: [{ budget: 'rl', key: 'gone', unused: 2, forget: true }] });
});

t.test('slots: taken from a grant, given back one by one as they free; a lease with slots in use is never forgotten', async (t) => {
  const h = harness();
  const l = h.leases.lease('conn-src', '127.0.0.1', h.now(), true);
  const verdicts: number[] = [];
  for (let i = 0; i < 3; i++) h.leases.wait([l], (v) => verdicts.push(v));
  h.turn();
  t.same(h.sent[0]?.asks, [{ budget: 'conn-src', key: '127.0.0.1', want: 3, waiting: 3, holding: 0 }]);
  h.leases.granted([{ budget: 'conn-src', key: '127.0.0.1', granted: 2, waitMs: 1, block: 1 }]);
  t.same(verdicts, [0, 0, 1], 'two admitted, the third refused (the node is at its cap)');
  t.same([l.inUse, l.tokens], [2, 0]);
  h.leases.release(l, h.now());
  h.turn();
  t.same(h.sent[1]?.settles, [{ budget: 'conn-src', key: '127.0.0.1', unused: 1, forget: false }], 'one back, one still open');
  h.advance(5000);
  t.equal(h.leases.size, 1, 'kept while a slot is in use');
  h.leases.release(l, h.now());
  h.leases.release(l, h.now());
  h.turn();
  t.same(h.sent[2]?.settles, [{ budget: 'conn-src', key: '127.0.0.1', unused: 1, forget: false }], 'a second release of the same slot gives nothing');
  h.advance(1000);
  h.turn();
  t.same(h.sent[3]?.settles, [{ budget: 'conn-src', key: '127.0.0.1', unused: 0, forget: true }], 'forgotten once idle');
  t.equal(h.leases.size, 0);
});

t.test('memory: past the cap the least recently used tenth is settled, never a lease with an ask out', async (t) => {
  const h = harness({ maxEntries: 20 });
  const first = h.leases.lease('rl', 'k0', h.now());
  h.leases.wait([first], () => {});
  for (let i = 1; i < 20; i++) h.leases.lease('rl', `k${i}`, h.now());
  h.leases.lease('rl', 'new', h.now());
  h.turn();
  t.equal(h.leases.size, 19);
  t.same(h.sent[0]?.settles.map((s) => s.key), ['k1', 'k2']);
});

/** A lease of the window budget `r` holding `n` units of the bucket [1000, 1500) (the harness starts at 1000); nothing else sent after its ask. */
const windowLease = (n = 2): { h: Harness; l: Lease } => {
  const h = harness();
  const l = h.leases.lease('r', '', h.now());
  h.leases.prefetch(l, h.now());
  h.turn();
  h.leases.granted([{ budget: 'r', key: '', granted: n, waitMs: 0, block: 1, from: 1000, until: 1500 }]);
  return { h, l };
};

t.test('window units lapse at the end of their bucket whichever call meets the lease first: given back to their bucket, none spent', async (t) => {
  const cases: [string, (h: Harness, l: Lease) => unknown, unknown][] = [
    ['takeOne', (h, l) => h.leases.takeOne(l, h.now()), PENDING],
    ['takeAll', (h, l) => h.leases.takeAll([l], h.now()), PENDING],
    ['holds', (h, l) => h.leases.holds(l), false],
    ['prefetch', (h, l) => h.leases.prefetch(l, h.now()), undefined],
    ['sweep', (h) => h.leases.sweep(h.now()), undefined],
  ];
  for (const [name, call, verdict] of cases) {
    const { h, l } = windowLease();
    t.equal(h.leases.held, 2, `${name}: 2 held`);
    h.advance(600);
    h.turn();
    t.equal(h.sent.length, 1, `${name}: nothing sent meanwhile (a lease unused since its grant does not renew)`);
    t.equal(call(h, l), verdict, `${name}: what it answers at 1600`);
    t.equal(h.leases.held, 0);
    h.turn();
    t.same(h.sent[1]?.settles, [{ budget: 'r', key: '', unused: 2, forget: false, until: 1500 }], `${name}: the 2 back to the bucket of [1000, 1500)`);
  }
});

t.test('window units: none lapse when all were spent; units asked ahead whose bucket is over when the lease is met go back to that bucket', async (t) => {
  const a = windowLease();
  t.same([a.h.leases.takeOne(a.l, a.h.now()), a.h.leases.takeOne(a.l, a.h.now())], [0, 0]);
  a.h.advance(600);
  a.h.turn();
  t.same(a.h.sent.at(-1)?.asks, [{ budget: 'r', key: '', want: 1, waiting: 0, holding: 0, ahead: true }], 'used: renewed at 1400');
  const n = a.h.sent.length;
  a.h.leases.sweep(a.h.now());
  a.h.turn();
  t.equal(a.h.sent.length, n, 'nothing to give back');

  const b = windowLease();
  t.equal(b.h.leases.takeOne(b.l, b.h.now()), 0);
  b.h.advance(400);
  b.h.turn();
  b.h.leases.granted([{ budget: 'r', key: '', granted: 3, waitMs: 0, block: 1, from: 1500, until: 2000 }]);
  t.equal(b.h.leases.held, 1, 'the 3 of the next bucket are not spendable yet');
  b.h.advance(600);
  b.h.turn();
  t.same(b.h.sent.at(-1)?.settles, [{ budget: 'r', key: '', unused: 1, forget: false, until: 1500 }, { budget: 'r', key: '', unused: 3, forget: false, until: 2000 }], 'met first at 2000 (the sweep): 1 back to its bucket, the 3 to theirs');
});

t.test('window units asked ahead: held apart until their bucket, then spent; a lease in use there renews again before it ends', async (t) => {
  const { h, l } = windowLease();
  t.equal(h.leases.takeOne(l, h.now()), 0);
  h.advance(400);
  h.turn();
  h.leases.granted([{ budget: 'r', key: '', granted: 3, waitMs: 0, block: 1, from: 1500, until: 2000 }]);
  t.equal(h.leases.takeOne(l, h.now()), 0, 'the last unit of [1000, 1500)');
  t.equal(h.leases.takeOne(l, h.now()), PENDING, 'the 3 ahead wait for 1500');
  h.leases.wait([l], () => {});
  h.turn();
  t.same(h.sent.at(-1)?.asks, [{ budget: 'r', key: '', want: 1, waiting: 1, holding: 3 }], 'an ask says it holds the 3 ahead');
  h.leases.granted([{ budget: 'r', key: '', granted: 0, waitMs: 100, block: 1, from: 1000, until: 1500 }]);
  h.advance(100);
  t.equal(h.leases.takeOne(l, h.now()), 0, 'at 1500 they are spendable');
  t.equal(h.leases.held, 2);
  h.advance(400);
  h.turn();
  t.same(h.sent.at(-1)?.asks, [{ budget: 'r', key: '', want: 1, waiting: 0, holding: 2, ahead: true }], 'used in [1500, 2000): renewed at 1900 too');
});

t.test('window grants: one for a bucket already over is given back to it; one ahead arriving when its bucket began is spendable at once, the lapsed units given back first; one of none arms nothing', async (t) => {
  const h = harness();
  const l = h.leases.lease('r', '', h.now());
  h.leases.prefetch(l, h.now());
  h.turn();
  h.advance(500);
  h.leases.granted([{ budget: 'r', key: '', granted: 2, waitMs: 0, block: 1, from: 1000, until: 1500 }]);
  t.equal(h.leases.held, 0, 'answered at 1500: its bucket is over');
  h.turn();
  t.same(h.sent[1], { asks: [], settles: [{ budget: 'r', key: '', unused: 2, forget: false, until: 1500 }] });

  const b = windowLease();
  t.equal(b.h.leases.takeOne(b.l, b.h.now()), 0);
  b.h.advance(400);
  b.h.turn();
  b.h.advance(100);
  b.h.leases.granted([{ budget: 'r', key: '', granted: 3, waitMs: 0, block: 1, from: 1500, until: 2000 }]);
  t.equal(b.h.leases.held, 3, 'the ahead answer arrived at 1500: its 3 at once, the lapsed one not among them');
  b.h.turn();
  t.same(b.h.sent.at(-1)?.settles, [{ budget: 'r', key: '', unused: 1, forget: false, until: 1500 }]);

  const c = harness();
  const m = c.leases.lease('r', '', c.now());
  c.leases.deposit(m, c.now());
  c.leases.prefetch(m, c.now());
  c.turn();
  c.leases.granted([{ budget: 'r', key: '', granted: 0, waitMs: 500, block: 1, from: 1000, until: 1500 }]);
  c.advance(450);
  c.turn();
  t.equal(c.sent.length, 1, 'granted none: no renewal armed, though a primary was deposited');
});

t.test('a slot held for a request another budget refuses goes back to the node at once; a request waiting on a second budget waits on', async (t) => {
  const h = harness();
  const s = h.leases.lease('conn', 'ip', h.now(), true);
  const r = h.leases.lease('rl', 'ip', h.now());
  const verdicts: number[] = [];
  t.equal(h.leases.takeAll([s, r], h.now()), PENDING);
  h.leases.wait([s, r], (v) => verdicts.push(v));
  h.turn();
  t.same(h.sent[0]?.asks, [{ budget: 'conn', key: 'ip', want: 1, waiting: 1, holding: 0 }]);
  h.leases.granted([{ budget: 'conn', key: 'ip', granted: 1, waitMs: 0, block: 1 }]);
  t.same(verdicts, [], 'the slot held for it; the rate budget is asked next');
  h.turn();
  t.same(h.sent[1], { asks: [{ budget: 'rl', key: 'ip', want: 1, waiting: 1, holding: 0 }], settles: [] });
  h.leases.granted([{ budget: 'rl', key: 'ip', granted: 0, waitMs: 2000, block: 1 }]);
  t.same(verdicts, [2], 'refused by the rate budget: Retry-After 2');
  t.same([s.tokens, s.inUse], [0, 0], 'the slot is not kept idle');
  h.turn();
  t.same(h.sent[2], { asks: [], settles: [{ budget: 'conn', key: 'ip', unused: 1, forget: false }] }, 'it goes back to the node');
  t.equal(h.leases.messages, 3);
  const v: number[] = [];
  for (let i = 0; i < 2; i++) h.leases.wait([s], (x) => v.push(x));
  h.turn();
  h.leases.granted([{ budget: 'conn', key: 'ip', granted: 2, waitMs: 0, block: 1 }]);
  h.leases.wait([s], (x) => v.push(x));
  h.turn();
  t.same(h.sent.at(-1)?.asks, [{ budget: 'conn', key: 'ip', want: 1, waiting: 1, holding: 2 }], 'an ask of slots counts those in use as held');
  t.same(v, [0, 0]);
});

t.test('sweep keeps a lease with an ask out or deposits unsent, and forgets one refusing locally once its wait is over', async (t) => {
  const a = harness();
  a.leases.prefetch(a.leases.lease('rl', 'k', a.now()), a.now());
  a.turn();
  a.advance(1000);
  t.equal(a.leases.size, 1, 'an ask out for 1000 ms: kept');
  const b = harness();
  const l = b.leases.lease('r', 'k', b.now());
  b.advance(999);
  b.leases.deposit(l, b.now());
  b.advance(1);
  t.equal(b.leases.size, 1, 'a deposit not sent yet: kept');
  const c = harness();
  const m = c.leases.lease('rl', 'k', c.now());
  const verdicts: number[] = [];
  c.leases.wait([m], (v) => verdicts.push(v));
  c.turn();
  c.leases.granted([{ budget: 'rl', key: 'k', granted: 0, waitMs: 1000, block: 1 }]);
  t.same(verdicts, [1]);
  c.advance(1000);
  t.equal(c.leases.size, 0, 'empty until 2000: forgotten at 2000');
});

t.test('settleAll: every lease of the budgets not kept, except those with an ask out, slots in use or deposits unsent', async (t) => {
  const h = harness();
  h.leases.lease('a', 'k', h.now()).tokens = 2;
  h.leases.lease('b', 'k', h.now()).tokens = 1;
  h.leases.prefetch(h.leases.lease('a', 'asking', h.now()), h.now());
  h.leases.lease('a', 'slot', h.now(), true).inUse = 1;
  h.turn();
  h.leases.deposit(h.leases.lease('a', 'dep', h.now()), h.now());
  h.leases.settleAll(new Set(['b']));
  t.equal(h.leases.size, 4);
  h.turn();
  t.same(h.sent[1]?.settles, [{ budget: 'a', key: 'k', unused: 2, forget: true }], 'b kept');
  h.leases.settleAll();
  t.equal(h.leases.size, 2, 'all budgets: b too, and the lease whose deposits went with the last message');
  h.turn();
  t.same(h.sent[2]?.settles, [{ budget: 'b', key: 'k', unused: 1, forget: true }, { budget: 'a', key: 'dep', unused: 0, forget: true }]);
});

t.test('close: no sweep and no deposit flush after it', async (t) => {
  const h = harness();
  h.leases.deposit(h.leases.lease('r', 'a', h.now()), h.now());
  h.leases.deposit(h.leases.lease('r', 'b', h.now()), h.now());
  h.leases.lease('rl', 'idle', h.now());
  h.leases.close();
  h.advance(5000);
  h.turn();
  t.same(h.sent, []);
  t.equal(h.leases.size, 3);
});

t.test('memory: leases with slots in use or deposits unsent are not evicted; each pass reports how many it settled', async (t) => {
  const evicted: number[] = [];
  const h = harness({ maxEntries: 20, onEvict: (n) => evicted.push(n) });
  h.leases.lease('conn', 's', h.now(), true).inUse = 1;
  h.leases.deposit(h.leases.lease('r', 'd', h.now()), h.now());
  for (let i = 2; i < 20; i++) h.leases.lease('rl', `k${i}`, h.now());
  h.leases.lease('rl', 'new', h.now());
  h.turn();
  t.same(h.sent[0]?.settles, [{ budget: 'rl', key: 'k2', unused: 0, forget: true }, { budget: 'rl', key: 'k3', unused: 0, forget: true }]);
  t.same(evicted, [2]);
  const busy: number[] = [];
  const b = harness({ maxEntries: 10, onEvict: (n) => busy.push(n) });
  for (let i = 0; i < 10; i++) b.leases.lease('conn', `s${i}`, b.now(), true).inUse = 1;
  b.leases.lease('conn', 'new', b.now(), true);
  t.same(busy, [0], 'all in use: none');
  t.equal(b.leases.size, 11);
});

t.test('memory: a lease used again moves to the back of the eviction order from half an idle period on', async (t) => {
  const h = harness({ maxEntries: 20 });
  for (let i = 0; i < 20; i++) h.leases.lease('rl', `k${i}`, h.now());
  h.advance(499);
  h.leases.lease('rl', 'k0', h.now());
  h.advance(1);
  h.leases.lease('rl', 'k1', h.now());
  h.leases.lease('rl', 'new', h.now());
  h.turn();
  t.same(h.sent[0]?.settles.map((s) => s.key), ['k0', 'k2'], 'k0 (499 ms) kept its place, k1 (500 ms) moved');
});

t.test('an ask unanswered with nobody waiting expires quietly; an older ask answered leaves the newer one its whole wait', async (t) => {
  const h = harness();
  const l = h.leases.lease('rl', 'k', h.now());
  h.leases.prefetch(l, h.now());
  h.turn();
  h.advance(LEASE_WAIT_MS);
  h.turn();
  t.equal(h.leases.unavailable, 0);
  const g = harness();
  const m = g.leases.lease('rl', 'k', g.now());
  g.leases.prefetch(m, g.now());
  g.turn();
  g.advance(100);
  g.leases.granted([{ budget: 'rl', key: 'k', granted: 0, waitMs: 0, block: 1 }]);
  g.advance(100);
  const verdicts: number[] = [];
  g.leases.wait([m], (v) => verdicts.push(v));
  g.turn();
  g.advance(LEASE_WAIT_MS - 200);
  g.turn();
  t.same(verdicts, [], "at 2000 the first ask's timer: the second, sent at 1200, still waits");
  g.advance(200);
  g.turn();
  t.same(verdicts, [UNAVAILABLE], 'refused at 2200');
});

t.test('asking ahead and locally: at exactly half a block no ask; an ask out keeps an empty lease pending; prefetch up to a block, once its wait is over; reopen of an unknown key', async (t) => {
  const h = harness();
  const l = h.leases.lease('rl', 'k', h.now());
  h.leases.wait([l], () => {});
  h.turn();
  h.leases.granted([{ budget: 'rl', key: 'k', granted: 9, waitMs: 0, block: 8 }]);
  for (let i = 0; i < 4; i++) t.equal(h.leases.takeOne(l, h.now()), 0);
  h.turn();
  t.equal(h.sent.length, 1, '4 held of a block of 8: no ask yet');
  const s = harness();
  const m = s.leases.lease('rl', 'k', s.now());
  s.leases.wait([m], () => {});
  s.turn();
  s.leases.granted([{ budget: 'rl', key: 'k', granted: 3, waitMs: 2000, block: 4 }]);
  t.same([s.leases.takeOne(m, s.now()), s.leases.takeOne(m, s.now())], [0, 0], 'the second asks ahead (1 < 2)');
  t.equal(s.leases.takeOne(m, s.now()), PENDING, 'empty, but that ask may answer: pending, not the old wait');
  const p = harness();
  const q = p.leases.lease('rl', 'k', p.now());
  p.leases.wait([q], () => {});
  p.turn();
  p.leases.granted([{ budget: 'rl', key: 'k', granted: 4, waitMs: 500, block: 4 }]);
  p.leases.prefetch(q, p.now());
  p.turn();
  t.equal(p.sent.length, 1, 'empty until 1500: no prefetch');
  p.advance(500);
  p.leases.prefetch(q, p.now());
  p.turn();
  t.same(p.sent.at(-1)?.asks, [{ budget: 'rl', key: 'k', want: 4, waiting: 0, holding: 3 }], 'at 1500, 3 held of a block of 4: a block asked');
  p.leases.reopen('rl', 'unknown');
  t.equal(p.leases.size, 1);
});

t.test('a late grant of slots while one is in use goes back at the next sweep; a grant of none for a forgotten lease sends nothing', async (t) => {
  const h = harness();
  const s = h.leases.lease('conn', 'ip', h.now(), true);
  const v: number[] = [];
  h.leases.wait([s], (x) => v.push(x));
  h.turn();
  h.leases.granted([{ budget: 'conn', key: 'ip', granted: 1, waitMs: 0, block: 1 }]);
  h.leases.wait([s], (x) => v.push(x));
  h.turn();
  h.advance(LEASE_WAIT_MS);
  h.turn();
  t.same(v, [0, UNAVAILABLE]);
  h.leases.granted([{ budget: 'conn', key: 'ip', granted: 1, waitMs: 0, block: 1 }]);
  t.same([s.tokens, s.inUse], [1, 1], 'late: nobody waits for it');
  const n = h.sent.length;
  h.advance(1000);
  h.turn();
  t.same(h.sent.slice(n), [{ asks: [], settles: [{ budget: 'conn', key: 'ip', unused: 1, forget: false }] }], 'given back by the sweep at 3000');
  h.leases.granted([{ budget: 'rl', key: 'gone', granted: 0, waitMs: 1000, block: 1 }]);
  h.turn();
  t.equal(h.sent.length, n + 1);
});

t.test('memory: a lease with an ask out and nobody waiting is not evicted; the sweeper stops when no lease is left and starts again with the next', async (t) => {
  const h = harness({ maxEntries: 10 });
  h.leases.prefetch(h.leases.lease('rl', 'asking', h.now()), h.now());
  for (let i = 1; i < 10; i++) h.leases.lease('rl', `k${i}`, h.now());
  h.leases.lease('rl', 'new', h.now());
  h.turn();
  t.same(h.sent[0]?.settles.map((s) => s.key), ['k1']);
  const g = harness();
  g.leases.lease('rl', 'a', g.now());
  g.advance(1000);
  t.equal(g.leases.size, 0, 'swept at 2000');
  g.advance(500);
  g.leases.lease('rl', 'b', g.now());
  g.advance(999);
  t.equal(g.leases.size, 1, 'made at 2500: kept at 3499');
  g.advance(1);
  t.equal(g.leases.size, 0, 'swept at 3500, an idle period after it was made');
});

t.test('renewals: an ahead answer short of units says nothing of now; none for a forgotten lease, one with an ask out, or one holding the next units already', async (t) => {
  const a = windowLease();
  t.equal(a.h.leases.takeOne(a.l, a.h.now()), 0);
  a.h.advance(400);
  a.h.turn();
  a.h.leases.granted([{ budget: 'r', key: '', granted: 0, waitMs: 600, block: 1, from: 1500, until: 2000 }]);
  t.equal(a.h.leases.takeOne(a.l, a.h.now()), 0);
  t.equal(a.h.leases.takeOne(a.l, a.h.now()), PENDING, 'empty now: ask, not refused for the next bucket');

  const b = windowLease();
  t.equal(b.h.leases.takeOne(b.l, b.h.now()), 0);
  b.h.leases.settleAll();
  b.h.advance(400);
  b.h.turn();
  t.same(b.h.sent.map((m) => m.asks.length), [1, 0], 'settled and forgotten: no renewal at 1400');

  const c = harness();
  const l = c.leases.lease('r', '', c.now());
  c.leases.prefetch(l, c.now());
  c.turn();
  c.leases.granted([{ budget: 'r', key: '', granted: 2, waitMs: 0, block: 4, from: 1000, until: 1500 }]);
  t.equal(c.leases.takeOne(l, c.now()), 0, 'and asks ahead at half the block');
  c.advance(400);
  c.turn();
  t.same(c.sent.map((m) => m.asks.length), [1, 1], 'that ask still out at 1400: no renewal');

  const d = windowLease();
  t.equal(d.h.leases.takeOne(d.l, d.h.now()), 0);
  d.h.advance(400);
  d.h.turn();
  d.h.leases.granted([{ budget: 'r', key: '', granted: 3, waitMs: 0, block: 1, from: 1500, until: 2000 }]);
  d.h.advance(50);
  t.equal(d.h.leases.takeOne(d.l, d.h.now()), 0);
  d.h.advance(450);
  d.h.turn();
  t.equal(d.h.sent.length, 2, 'at 1900 it still holds the 3 of [1500, 2000) unmet: no renewal');
});

t.test('the defaults: the clock is performance.now(), a turn ends with setImmediate, deposits flush on a real timer, close clears it; verdicts of seconds are never PENDING or UNAVAILABLE', async (t) => {
  t.ok(UNAVAILABLE < 1 && PENDING < 1, 'below any Retry-After (seconds, at least 1)');
  t.not(UNAVAILABLE, PENDING);
  let onSend = (_d: readonly TokenDeposit[]): void => {};
  const sent: (readonly TokenSettle[])[] = [];
  const leases = new TokenLeases({
    send: (_a, s, d) => {
      sent.push(s);
      onSend(d);
    },
  });
  const before = performance.now();
  const now = leases.now();
  t.ok(now >= before && now <= performance.now(), 'performance.now()');
  const s = leases.lease('conn', 'ip', now, true);
  s.inUse = 1;
  leases.release(s, now);
  await new Promise((resolve) => setImmediate(resolve));
  t.same(sent, [[{ budget: 'conn', key: 'ip', unused: 1, forget: false }]], 'sent at the end of the turn');
  const got = new Promise<readonly TokenDeposit[]>((resolve) => (onSend = resolve));
  leases.deposit(leases.lease('r', '', leases.now()), leases.now());
  const alive = setInterval(() => {}, 1000); // the leases' timers are unref'd: keep the process up meanwhile
  t.equal((await got).length, 1, 'the deposit flushed by its timer');
  clearInterval(alive);
  leases.close();
});
