// The fail-open budget of fail-open-budget.ts, pure: a token bucket of `perSecond`, burst the same, on a fake clock.
import t from 'tap';
import { FailOpenBudget } from '../src/fail-open-budget.ts';

t.test('takes: a burst of perSecond, then refills at perSecond per second, capped at the burst; a clock going back refills nothing', async (t) => {
  let now = 1000;
  const b = new FailOpenBudget(4, () => now);
  // [time ms, takes tried, granted]
  const rows: [number, number, number][] = [
    [1000, 6, 4], // the burst
    [1100, 1, 0], // 0.4 token
    [1250, 1, 1], // 1.0 token
    [1250, 1, 0],
    [3000, 10, 4], // 7 tokens earned, capped at 4
    [2000, 1, 0], // back in time: nothing
    [2250, 1, 1], // 250 ms after the latest reading (2000): one token
  ];
  for (const [at, tries, granted] of rows) {
    now = at;
    let got = 0;
    for (let i = 0; i < tries; i++) if (b.take()) got++;
    t.equal(got, granted, `t=${at}: ${granted} of ${tries}`);
  }
});

t.test('over a minute at 1,000 tries a second, perSecond 5: 5 + 5 per second granted, no more', async (t) => {
  let now = 0;
  const b = new FailOpenBudget(5, () => now);
  let granted = 0;
  for (let ms = 0; ms < 60_000; ms++) {
    now = ms;
    if (b.take()) granted++;
  }
  t.ok(granted >= 5 + 5 * 59 && granted <= 5 + 5 * 60, `${granted} granted in 60 s (burst 5 + 5/s)`);
});
