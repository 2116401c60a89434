// The retry budget as a pure policy with a fake clock: the floor, the ratio, the sliding window,
// and the bound it puts on retries against a dead pool.
import t from 'tap';
import { MIN_RETRIES_PER_WINDOW, RetryBudget, WINDOW_MS } from '../src/resilience/retry-budget.ts';

t.test('a quiet route can retry up to the floor, and no further', async (t) => {
  const b = new RetryBudget();
  let allowed = 0;
  for (let i = 0; i < 100; i++) if (b.withdraw(1000, 10)) allowed++;
  t.equal(allowed, MIN_RETRIES_PER_WINDOW);
});

t.test('above the floor, retries follow ratio_percent of primary requests in the window', async (t) => {
  for (const ratio of [0, 10, 25, 100]) {
    const b = new RetryBudget();
    for (let i = 0; i < 1000; i++) b.deposit(500);
    let allowed = 0;
    for (let i = 0; i < 2000; i++) if (b.withdraw(600, ratio)) allowed++;
    t.equal(allowed, MIN_RETRIES_PER_WINDOW + (1000 * ratio) / 100, `ratio ${ratio} %: floor + ${ratio} % of 1000`);
  }
});

t.test('the window slides: deposits and retries older than WINDOW_MS no longer count', async (t) => {
  const b = new RetryBudget();
  for (let i = 0; i < 1000; i++) b.deposit(0);
  let first = 0;
  while (b.withdraw(100, 10)) first++;
  t.equal(first, MIN_RETRIES_PER_WINDOW + 100);
  t.same(b.counts(WINDOW_MS - 1), { primaries: 1000, retries: first }, 'still inside the window');
  t.same(b.counts(WINDOW_MS + 1000), { primaries: 0, retries: 0 }, 'all of it expired');
  let again = 0;
  while (b.withdraw(WINDOW_MS + 1000, 10)) again++;
  t.equal(again, MIN_RETRIES_PER_WINDOW, 'only the floor once the deposits expired');
});

t.test('against a dead pool, retries stay within the budget whatever the clients do', async (t) => {
  // 200 primaries a second for a minute, each wanting one retry (every attempt fails).
  const b = new RetryBudget();
  let primaries = 0;
  let retries = 0;
  for (let ms = 0; ms < 60_000; ms += 5) {
    b.deposit(ms);
    primaries++;
    if (b.withdraw(ms, 10)) retries++;
  }
  const bound = (primaries * 10) / 100 + MIN_RETRIES_PER_WINDOW * (60_000 / WINDOW_MS);
  t.ok(retries <= bound, `${retries} retries for ${primaries} primaries (bound ${bound})`);
  t.ok(retries >= (primaries * 10) / 100, 'and the ratio is actually used');
});

t.test('a clock that goes backwards or jumps far ahead keeps the counts consistent', async (t) => {
  const b = new RetryBudget();
  b.deposit(5000);
  b.deposit(4000);
  t.same(b.counts(5000), { primaries: 2, retries: 0 }, 'an earlier time counts in the current bucket');
  t.same(b.counts(5000 + 100 * WINDOW_MS), { primaries: 0, retries: 0 }, 'a jump empties the window');
});
