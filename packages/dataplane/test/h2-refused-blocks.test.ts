// The refused-header-block bucket of an HTTP/2 session (ingress/h2-refused-blocks.ts), with a fake
// clock: which sequences of (running total, time) close the session.
import t from 'tap';
import { REFUSED_BLOCK_LIMIT, REFUSED_BLOCK_WINDOW_MS, RefusedBlockBucket } from '../src/ingress/h2-refused-blocks.ts';

t.test('the documented bound: 100 refused header blocks per 10 s', async (t) => {
  t.equal(REFUSED_BLOCK_LIMIT, 100);
  t.equal(REFUSED_BLOCK_WINDOW_MS, 10_000);
});

/** name, limit, window (ms), observations [total, at ms], expected verdict of each */
const cases: [string, number, number, [number, number][], boolean[]][] = [
  ['none refused', 100, 10_000, [[0, 200], [0, 400], [0, 60_000]], [false, false, false]],
  ['exactly the limit at once is tolerated', 100, 10_000, [[100, 200]], [false]],
  ['one over the limit at once closes', 100, 10_000, [[101, 200]], [true]],
  ['a burst over the limit within one check', 100, 10_000, [[40, 200], [180, 400]], [false, true]],
  ['a steady trickle under the drain rate never closes', 100, 10_000, [[5, 1000], [10, 2000], [15, 3000], [20, 4000], [25, 5000], [30, 6000]], [false, false, false, false, false, false]],
  ['a steady rate above the drain rate closes eventually', 10, 1000, [[8, 500], [16, 1000], [24, 1500]], [false, true, true]],
  ['the bucket drains: 100, then 100 more after a full window', 100, 10_000, [[100, 0], [200, 10_000]], [false, false]],
  ['but not after half a window', 100, 10_000, [[100, 0], [200, 5000]], [false, true]],
  ['a total that does not move adds nothing', 100, 10_000, [[90, 0], [90, 100], [90, 200]], [false, false, false]],
  ['a total read lower (never: ids only grow) adds nothing', 100, 10_000, [[90, 0], [80, 100], [95, 200]], [false, false, false]],
];

t.test('RefusedBlockBucket', async (t) => {
  for (const [name, limit, windowMs, obs, expected] of cases) {
    const b = new RefusedBlockBucket(0, limit, windowMs);
    t.same(
      obs.map(([total, at]) => b.observe(total, at)),
      expected,
      name,
    );
  }
});
