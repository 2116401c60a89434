// Adaptive admission: the pure window step and the per-worker holder, with a fake clock.
import t from 'tap';
import type { Test } from 'tap';
import { AdaptiveLimit, WINDOW_MS, isHighWindow, stepLimit } from '../src/resilience/adaptive-limit.ts';
import type { AdaptivePolicy } from '../src/resilience/adaptive-limit.ts';

const policy: AdaptivePolicy = {
  enabled: true, minLimit: 64, maxLimit: 256, decreaseStep: 16, increaseStep: 16, highLatencyMs: 500, globalInflightLimit: 512,
};

// Feeds one sample every `every` ms from `from` until `windows` windows have closed; returns the
// clock and the limit after each closed window, and checks the bounds after every sample.
function drive(t: Test, a: AdaptiveLimit, from: number, latencyMs: number, windows: number, p = policy, every = 10): { now: number; limits: number[] } {
  const limits: number[] = [];
  let now = from;
  const start = a.windows;
  while (a.windows - start < windows) {
    now += every;
    const before = a.windows;
    a.sample(latencyMs, now);
    if (a.limit < p.minLimit || a.limit > p.maxLimit) t.fail(`limit ${a.limit} outside [${p.minLimit}, ${p.maxLimit}] at ${now}`);
    if (a.windows !== before) limits.push(a.limit);
  }
  return { now, limits };
}

t.test('a window is high when more than 10 % of its samples are slow (exact boundary)', async (t) => {
  const cases: [samples: number, high: number, isHigh: boolean][] = [
    [10, 1, false], // exactly 10 %: p90 is not above the threshold
    [10, 2, true],
    [20, 2, false],
    [20, 3, true],
    [19, 2, true], // 10.5 %
    [1, 1, true],
    [1, 0, false],
    [9, 1, true], // 11.1 %
    [100, 10, false],
    [100, 11, true],
    [0, 0, false],
  ];
  for (const [samples, high, isHigh] of cases) t.equal(isHighWindow({ samples, high }), isHigh, `${high} slow of ${samples}`);
});

t.test('stepLimit: one step per window, clamped to [min, max]; no sample is no observation', async (t) => {
  const cases: [limit: number, samples: number, high: number, next: number][] = [
    [256, 10, 5, 240],
    [240, 10, 0, 256],
    [256, 10, 0, 256], // at max: stays
    [70, 10, 9, 64], // a step that would cross min stops at min
    [64, 10, 9, 64],
    [250, 10, 1, 256], // 10 %: healthy, up to max
    [200, 0, 0, 200], // empty window: nothing changes
    [1000, 0, 0, 256], // a limit outside the range is clamped even so
  ];
  for (const [limit, samples, high, next] of cases) t.equal(stepLimit(limit, { samples, high }, policy), next, `${limit} after ${high}/${samples}`);
});

t.test('the window closes at the first sample at least 100 ms after it opened, and includes it', async (t) => {
  const a = new AdaptiveLimit(() => 1000, policy);
  t.equal(a.limit, 256, 'starts at max_limit');
  a.sample(900, 1050);
  a.sample(900, 1099);
  t.equal(a.windows, 0, 'still open at 99 ms');
  t.equal(a.limit, 256);
  a.sample(900, 1000 + WINDOW_MS);
  t.equal(a.windows, 1, 'closed by the sample at 100 ms');
  t.equal(a.limit, 240, 'three slow samples of three: high');
  // The next window opened at 1100: 9 fast then 1 slow closing it = 10 % → healthy.
  for (let i = 1; i <= 9; i++) a.sample(10, 1100 + i);
  a.sample(501, 1200);
  t.equal(a.windows, 2);
  t.equal(a.limit, 256, 'one slow of ten (10 %) is healthy');
  // Exactly high_latency_ms is not slow.
  a.sample(500, 1300);
  t.equal(a.limit, 256);
});

t.test('converges to min_limit under steady high latency in (max - min) / decrease_step windows, recovers to max after', async (t) => {
  const a = new AdaptiveLimit(() => 0, policy);
  const down = drive(t, a, 0, 800, 14);
  // 256 → 64 by 16: 12 windows; then it stays at 64.
  t.same(down.limits, [240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 64, 64]);
  t.equal(down.now, 1400, 'one window per 100 ms at a sample every 10 ms');
  const up = drive(t, a, down.now, 20, 14);
  t.same(up.limits, [80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 256, 256]);
});

t.test('uneven steps and sparse traffic: bounds hold, one window per sample when samples are > 100 ms apart', async (t) => {
  const p: AdaptivePolicy = { ...policy, minLimit: 10, maxLimit: 100, decreaseStep: 37, increaseStep: 7 };
  const a = new AdaptiveLimit(() => 0, p);
  const down = drive(t, a, 0, 10_000, 4, p, 250);
  t.same(down.limits, [63, 26, 10, 10]);
  const up = drive(t, a, down.now, 1, 14, p, 250);
  t.same(up.limits, [17, 24, 31, 38, 45, 52, 59, 66, 73, 80, 87, 94, 100, 100]);
});

t.test('a window with no sample changes nothing, however long it lasts', async (t) => {
  let now = 0;
  const a = new AdaptiveLimit(() => now, policy);
  drive(t, a, 0, 800, 3);
  t.equal(a.limit, 208);
  const windows = a.windows;
  now = 60_000; // a minute without a completed response: no sample call, no observation
  t.equal(a.limit, 208);
  t.equal(a.windows, windows);
});

t.test('configure: min/max changes clamp, disabled pins global_inflight_limit, re-enabled starts at max', async (t) => {
  let now = 0;
  const a = new AdaptiveLimit(() => now);
  t.equal(a.limit, 0, 'no policy yet');
  a.sample(900, 500);
  t.equal(a.windows, 0, 'samples before a policy are ignored');
  a.configure(policy);
  t.equal(a.limit, 256);
  drive(t, a, 0, 800, 5); // 256 → 176
  t.equal(a.limit, 176);
  a.configure({ ...policy, maxLimit: 150 });
  t.equal(a.limit, 150, 'a lower max clamps the limit down');
  a.configure({ ...policy, minLimit: 200, maxLimit: 300 });
  t.equal(a.limit, 200, 'a higher min clamps it up');
  a.configure({ ...policy, minLimit: 100, maxLimit: 300 });
  t.equal(a.limit, 200, 'a wider range keeps it');
  a.configure({ ...policy, enabled: false });
  t.equal(a.limit, 512, 'disabled: global_inflight_limit');
  t.notOk(a.enabled);
  const w = a.windows;
  for (let i = 1; i <= 30; i++) a.sample(900, 10_000 + i * 10);
  t.equal(a.limit, 512, 'disabled: samples are ignored');
  t.equal(a.windows, w);
  a.configure({ ...policy, enabled: false, globalInflightLimit: 1024 });
  t.equal(a.limit, 1024, 'a new global limit while disabled');
  now = 20_000;
  a.configure(policy);
  t.equal(a.limit, 256, 're-enabled: starts at max_limit');
  t.ok(a.enabled);
});

t.test('configure restarts the window: samples judged against the old threshold are dropped', async (t) => {
  let now = 0;
  const a = new AdaptiveLimit(() => now, policy);
  for (let i = 1; i <= 5; i++) a.sample(900, i * 10); // 5 slow samples in the open window
  now = 50;
  a.configure({ ...policy, highLatencyMs: 1000 });
  for (let i = 1; i < 10; i++) a.sample(900, 50 + i * 10);
  t.equal(a.windows, 0, 'the window restarted at 50');
  a.sample(900, 150);
  t.equal(a.windows, 1);
  t.equal(a.limit, 256, 'none of the new window is slow under the new threshold');
});
