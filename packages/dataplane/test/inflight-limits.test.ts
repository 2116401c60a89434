// Per-worker in-flight counters: limits, never below 0, counters that outlive generations. (Release
// exactly once is the request context's: handler.test.ts and test/overload-release.test.ts.)
import t from 'tap';
import { InflightLimits } from '../src/resilience/inflight-limits.ts';

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
  const a = l.counter('a');
  const b = l.counter('b');
  t.same([l.tryUpstreamCounter(a, 1), l.tryUpstreamCounter(a, 1), l.tryUpstreamCounter(b, 1)], [true, false, true]);
  t.equal(a.inflight, 1);
  t.equal(b.inflight, 1);
  t.equal(l.counter('never').inflight, 0);
  t.equal(l.counter('a'), a, 'the same object every time (survives generation swaps)');
  t.equal(l.tryUpstreamCounter(a, 2), true);
  t.equal(a.inflight, 2);
  l.releaseUpstreamCounter(a);
  l.releaseUpstreamCounter(a);
  l.releaseUpstreamCounter(a);
  t.equal(a.inflight, 0, 'never below 0');
  t.equal(b.inflight, 1, "another pool's count is untouched");
  t.equal(l.inflight, 0, 'upstream slots are not global slots');
});
