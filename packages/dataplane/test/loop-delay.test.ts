// The worker's event-loop delay p99 (worker/loop-delay.ts): Node's histogram records whole timer
// intervals, so the resolution is taken off; an empty window is 0, never a negative delay.
import t from 'tap';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { loopDelayP99Seconds } from '../src/worker/loop-delay.ts';

/** A histogram whose p99 is `p99Ns` over `count` samples. */
const fake = (count: number, p99Ns: number) => ({ count, percentile: (p: number) => (p === 99 ? p99Ns : NaN) });

t.test('p99 interval minus the resolution, in seconds; 0 when empty or below the resolution', async (t) => {
  const cases: Array<[string, number, number, number]> = [
    ['idle loop: intervals ≈ the resolution', 50, 20.5e6, 0.0005],
    ['a 100 ms stall at the p99', 50, 120e6, 0.1],
    ['interval shorter than the resolution (timer coalescing)', 50, 19e6, 0],
    ['no sample in the window', 0, 511, 0],
  ];
  for (const [name, count, p99Ns, want] of cases) t.equal(Number(loopDelayP99Seconds(fake(count, p99Ns), 20).toFixed(6)), want, name);
});

t.test('a real histogram over a blocked loop: the p99 shows the block, not the 20 ms tick', async (t) => {
  const h = monitorEventLoopDelay({ resolution: 20 });
  h.enable();
  await new Promise((r) => setTimeout(r, 100));
  const until = Date.now() + 150;
  while (Date.now() < until); // block the loop: one interval of ≥ 150 ms
  await new Promise((r) => setTimeout(r, 50));
  h.disable();
  const p99 = loopDelayP99Seconds(h);
  t.ok(p99 >= 0.1 && p99 < 5, `p99 ${p99} s reflects the 150 ms block`);
});
