// A worker's token leases (resilience/token-lease.ts), with a fake clock, fake timers and a fake
// channel: spending synchronously from a lease, one ask per key per turn sized to the requests
// waiting, the answer served first come first served, the refusal and its local memory, a slow
// supervisor (UNAVAILABLE, a late grant credited), asking ahead at half a block, several leases
// all or none, idle leases settled, bounded memory.
import t from 'tap';
import { LEASE_WAIT_MS, PENDING, UNAVAILABLE } from '../src/resilience/token-lease.ts';
import { harness } from './support/token-leases.ts';

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
