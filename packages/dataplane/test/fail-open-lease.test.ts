// A pool's fail-open gate on the node's budget (auth/fail-open-lease.ts), over a worker's token
// leases on a fake clock and channel: a token held is spent at once; an empty lease waits for the
// supervisor's answer and allows only what it granted; a refusal is remembered without a message;
// no answer within LEASE_WAIT_MS denies.
import t from 'tap';
import { LeasedFailOpen, failOpenBudget } from '../src/auth/fail-open-lease.ts';
import { LEASE_WAIT_MS } from '../src/resilience/token-lease.ts';
import { harness } from './support/token-leases.ts';

t.test('the node decides: an empty lease asks once for the failures of the turn; the answer allows what it granted, the rest deny, and so does the next failure until the bucket refills', async (t) => {
  const h = harness();
  const gate = new LeasedFailOpen(h.leases, 'api', h.now);
  t.equal(gate.budget, 'auth-fo:api');
  t.equal(failOpenBudget('api'), 'auth-fo:api');
  const waiting = [gate.take(), gate.take(), gate.take()];
  t.ok(waiting.every((w) => w instanceof Promise), 'an empty lease: the three failures wait for the supervisor');
  h.turn();
  t.same(h.sent, [{ asks: [{ budget: 'auth-fo:api', key: '', want: 3, waiting: 3, holding: 0 }], settles: [] }], 'one message, one ask for the 3 waiting');
  h.leases.granted([{ budget: 'auth-fo:api', key: '', granted: 2, waitMs: 200, block: 1 }]);
  t.same(await Promise.all(waiting), [true, true, false], '2 granted: 2 allowed, the third denied');
  t.equal(gate.take(), false, 'the next failure is denied at once: the node said its bucket is empty for 200 ms');
  h.turn();
  t.equal(h.sent.length, 1, 'no message for it');
  h.advance(200);
  const later = gate.take();
  h.turn();
  t.equal(h.sent.length, 2, 'after the wait it asks again');
  h.leases.granted([{ budget: 'auth-fo:api', key: '', granted: 1, waitMs: 0, block: 1 }]);
  t.equal(await later, true, 'and a token granted allows it');
});

t.test('a token held is spent synchronously; a supervisor that does not answer within LEASE_WAIT_MS denies', async (t) => {
  const h = harness();
  const gate = new LeasedFailOpen(h.leases, 'api', h.now);
  const first = gate.take();
  h.turn();
  // A block of 4 (a large budget): the grant covers the waiting failure and holds the rest ahead.
  h.leases.granted([{ budget: 'auth-fo:api', key: '', granted: 4, waitMs: 0, block: 4 }]);
  t.equal(await first, true);
  t.same([gate.take(), gate.take(), gate.take()], [true, true, true], 'the 3 held are spent at once, no promise');
  const stalled = gate.take();
  t.ok(stalled instanceof Promise, 'the lease is empty again: it waits');
  h.turn();
  let verdict: boolean | undefined;
  void (stalled as Promise<boolean>).then((v) => (verdict = v));
  h.advance(LEASE_WAIT_MS - 1);
  h.turn();
  await Promise.resolve();
  t.equal(verdict, undefined, 'still waiting 1 ms before the bound');
  h.advance(1);
  h.turn();
  t.equal(await stalled, false, 'no answer within the bound: denied, as a spent budget');
  t.equal(gate.take(), false, 'and so is the next failure while the ask is unanswered');
});
