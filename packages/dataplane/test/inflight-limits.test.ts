// Per-worker in-flight counters: limits, release exactly once, counters that outlive generations.
import t from 'tap';
import { HOLDS_GLOBAL, HOLDS_UPSTREAM, InflightLimits, NONE } from '../src/resilience/inflight-limits.ts';

t.test('global: admits up to the limit, release never goes below 0, a lowered limit applies at once', async (t) => {
  const l = new InflightLimits();
  t.same([l.tryGlobal(2), l.tryGlobal(2), l.tryGlobal(2)], [true, true, false]);
  t.equal(l.inflight, 2);
  t.equal(l.tryGlobal(1), false, 'limit lowered below the count: refused until it drains');
  l.releaseGlobal();
  t.equal(l.tryGlobal(1), false);
  l.releaseGlobal();
  t.equal(l.tryGlobal(1), true);
  l.releaseGlobal();
  l.releaseGlobal();
  t.equal(l.inflight, 0, 'an extra release does not go negative');
  t.equal(l.tryGlobal(0), false, 'limit 0 admits nothing');
});

t.test('per upstream: keyed by pool name, one stable counter per name', async (t) => {
  const l = new InflightLimits();
  t.same([l.tryUpstream('a', 1), l.tryUpstream('a', 1), l.tryUpstream('b', 1)], [true, false, true]);
  t.equal(l.upstreamInflight('a'), 1);
  t.equal(l.upstreamInflight('b'), 1);
  t.equal(l.upstreamInflight('never'), 0);
  const c = l.counter('a');
  t.equal(l.counter('a'), c, 'the same object every time (survives generation swaps)');
  t.equal(c.inflight, 1);
  t.equal(l.tryUpstreamCounter(c, 2), true);
  t.equal(l.upstreamInflight('a'), 2);
  l.releaseUpstream('a');
  l.releaseUpstreamCounter(c);
  l.releaseUpstream('a');
  l.releaseUpstream('never');
  t.equal(l.upstreamInflight('a'), 0, 'never below 0');
  t.equal(l.upstreamInflight('never'), 0);
  t.same(l.upstreamCounts(), { b: 1 });
  t.equal(l.inflight, 0, 'upstream slots are not global slots');
});

t.test('held flags: release exactly once whatever the exit path', async (t) => {
  const l = new InflightLimits();
  const up = l.counter('a');
  // Path 1: both slots taken, released twice (e.g. finish after an error handler already released).
  let held = NONE;
  if (l.tryGlobal(10)) held |= HOLDS_GLOBAL;
  if (l.tryUpstreamCounter(up, 10)) held |= HOLDS_UPSTREAM;
  t.equal(l.inflight, 1);
  t.equal(up.inflight, 1);
  held = l.release(held, up);
  held = l.release(held, up);
  t.equal(held, NONE);
  t.same([l.inflight, up.inflight], [0, 0]);
  // Path 2: global taken, upstream full (the request queues or is shed): only the global slot goes back.
  l.tryUpstreamCounter(up, 1); // another request holds the upstream's one slot
  held = NONE;
  if (l.tryGlobal(10)) held |= HOLDS_GLOBAL;
  if (l.tryUpstreamCounter(up, 1)) held |= HOLDS_UPSTREAM;
  t.equal(held, HOLDS_GLOBAL);
  held = l.release(held, up);
  t.same([l.inflight, up.inflight], [0, 1], "the other request's upstream slot is untouched");
  // Path 3: nothing taken (brownout shed before admission).
  t.equal(l.release(NONE, undefined), NONE);
  t.same([l.inflight, up.inflight], [0, 1]);
});
