// A worker's share of the node's retry budgets (resilience/retry-control.ts over token-lease.ts's
// window leases), on a fake clock: primaries deposited in batches dated at the oldest, a retry
// taken from the lease synchronously or refused while it is empty (one ask), units spendable only
// within their bucket and given back when it ends, the renewal asked ahead for the next bucket by
// a lease in use, an activation reopening a lease the node had said was empty.
import t from 'tap';
import { Metrics } from '@edge-proxy/telemetry';
import { RetryControl, retryBudget } from '../src/resilience/retry-control.ts';
import { DEPOSIT_FLUSH_MS, RENEW_AHEAD_MS, RENEW_WHILE_MS } from '../src/resilience/token-lease.ts';
import { harness } from './support/token-leases.ts';

const setup = () => {
  const h = harness({}, 5000);
  const r = new RetryControl(new Metrics('worker'));
  r.lease(h.leases);
  return { h, r };
};
const B = retryBudget('app');

t.test('a primary deposits and, the lease being empty, asks; a retry before the answer is refused without another ask; the grant is spent synchronously', async (t) => {
  const { h, r } = setup();
  r.primary('app', h.now());
  r.primary('app', h.now());
  t.equal(r.allows('app', h.now(), 10), false, 'nothing granted yet: refused (budget_exhausted)');
  h.turn();
  t.same(h.sent, [{ asks: [{ budget: B, key: '', want: 1, waiting: 0, holding: 0 }], settles: [], deposits: [{ budget: B, key: '', n: 2, at: 5000 }] }], 'one message: the ask and both deposits, dated at the first');
  h.leases.granted([{ budget: B, key: '', granted: 3, waitMs: 0, block: 3, from: 5000, until: 6000 }]);
  t.equal(r.allows('app', h.now(), 10), true, 'granted: allowed');
  r.withdraw('app', h.now(), 10);
  r.withdraw('app', h.now(), 10);
  t.equal(r.allows('app', h.now(), 10), true, 'one left');
  r.withdraw('app', h.now(), 10);
  h.turn();
  t.same(h.sent.at(-1)?.asks, [{ budget: B, key: '', want: 3, waiting: 0, holding: 0 }], 'below half a block after a spend: asked ahead once (sized at the end of the turn)');
  t.equal(r.allows('app', h.now(), 10), false, 'empty again while the ask is out');
  h.turn();
  t.equal(h.sent.length, 2, 'no second ask while one is out');
});

t.test('deposits without an ask leave within DEPOSIT_FLUSH_MS; a short answer refuses locally until the next bucket, and an activation reopens the lease', async (t) => {
  const { h, r } = setup();
  r.primary('app', h.now());
  h.turn();
  h.leases.granted([{ budget: B, key: '', granted: 2, waitMs: 0, block: 1, from: 5000, until: 7000 }]);
  h.sent.length = 0;
  r.primary('app', h.now());
  h.turn();
  t.same(h.sent, [], 'a lease holding units does not ask; the deposit waits');
  h.advance(DEPOSIT_FLUSH_MS);
  h.turn();
  t.same(h.sent, [{ asks: [], settles: [], deposits: [{ budget: B, key: '', n: 1, at: 5000 }] }], `sent ${DEPOSIT_FLUSH_MS} ms later, alone`);

  const s = setup();
  s.r.primary('app', s.h.now());
  s.h.turn();
  s.h.leases.granted([{ budget: B, key: '', granted: 0, waitMs: 600, block: 1, from: 5000, until: 5600 }]);
  s.h.sent.length = 0;
  s.r.primary('app', s.h.now());
  t.equal(s.r.allows('app', s.h.now(), 10), false, 'the node has none');
  s.h.advance(DEPOSIT_FLUSH_MS);
  s.h.turn();
  t.same(s.h.sent.map((m) => m.asks.length), [0], 'and no ask until its bucket ends: only the deposit');
  s.r.retain(['app']);
  s.r.primary('app', s.h.now());
  s.h.turn();
  t.same(s.h.sent.at(-1)?.asks.length, 1, 'an activation reopens it: asked at once');
});

t.test('a lease in use asks RENEW_AHEAD_MS before its bucket ends for the next one; those units wait for their bucket, then replace the lapsed ones', async (t) => {
  const { h, r } = setup();
  r.primary('app', h.now());
  h.turn();
  h.leases.granted([{ budget: B, key: '', granted: 4, waitMs: 0, block: 2, from: 5000, until: 6000 }]);
  h.sent.length = 0;
  r.withdraw('app', h.now(), 10);
  h.advance(1000 - RENEW_AHEAD_MS - 1);
  h.turn();
  t.same(h.sent, [], 'nothing before');
  h.advance(1);
  h.turn();
  t.same(h.sent, [{ asks: [{ budget: B, key: '', want: 2, waiting: 0, holding: 3, ahead: true }], settles: [] }], `${RENEW_AHEAD_MS} ms before 6000: an ask for the next bucket`);
  h.leases.granted([{ budget: B, key: '', granted: 4, waitMs: 0, block: 2, from: 6000, until: 7000 }]);
  t.equal(r.allows('app', h.now(), 10), true, 'the current units still serve');
  r.withdraw('app', h.now(), 10);
  h.advance(RENEW_AHEAD_MS);
  h.sent.length = 0;
  for (let i = 0; i < 4; i++) {
    t.equal(r.allows('app', h.now(), 10), true, `at 6000: the next bucket's unit ${i + 1}`);
    r.withdraw('app', h.now(), 10);
  }
  t.equal(r.allows('app', h.now(), 10), false, 'its 4 spent; the 2 of the old bucket lapsed');
  h.turn();
  t.same(h.sent[0]?.settles, [{ budget: B, key: '', unused: 2, forget: false, until: 6000 }], 'the 2 of the old bucket given back to that bucket (until 6000)');
});

t.test('a lease keeps renewing RENEW_WHILE_MS after its last primary (a slow one may still fail), then lets its units lapse and is forgotten', async (t) => {
  const { h, r } = setup();
  r.primary('app', h.now());
  h.turn();
  h.leases.granted([{ budget: B, key: '', granted: 4, waitMs: 0, block: 4, from: 5000, until: 6000 }]);
  h.sent.length = 0;
  h.advance(1000 - RENEW_AHEAD_MS);
  h.turn();
  t.same(h.sent.flatMap((m) => m.asks), [{ budget: B, key: '', want: 4, waiting: 0, holding: 4, ahead: true }], 'unused, but a primary 0.9 s ago: renewed');
  h.leases.granted([{ budget: B, key: '', granted: 4, waitMs: 0, block: 4, from: 6000, until: 7000 }]);
  h.advance(RENEW_AHEAD_MS);
  t.equal(r.allows('app', h.now(), 10), true, 'at 6000 the renewed units serve');
  h.turn();
  t.same(h.sent.at(-1)?.settles, [{ budget: B, key: '', unused: 4, forget: false, until: 6000 }], 'the unused ones of 5 s back to their bucket');
  // Answer every renewal with nothing until the primary is RENEW_WHILE_MS old.
  for (let i = 0; i < 12; i++) {
    h.advance(1000);
    h.turn();
    const ahead = h.sent.at(-1)?.asks.find((a) => a.ahead === true);
    if (ahead !== undefined) h.leases.granted([{ budget: B, key: '', granted: 0, waitMs: 0, block: 4, from: 0, until: 0 }]);
  }
  h.sent.length = 0;
  h.advance(3000);
  h.turn();
  t.same(h.sent.flatMap((m) => m.asks), [], `${RENEW_WHILE_MS} ms after the last primary: no renewal`);
  t.equal(h.leases.size, 0, 'and the idle lease is forgotten');
});

t.test('alone (no supervisor): the worker keeps its own budget per route', async (t) => {
  const r = new RetryControl(new Metrics('worker'));
  for (let i = 0; i < 30; i++) r.withdraw('solo', 1000, 0);
  t.equal(r.allows('solo', 1000, 0), false, 'the floor of 30 spent');
  t.same(r.counts('solo', 1000), { primaries: 0, retries: 30 });
});
