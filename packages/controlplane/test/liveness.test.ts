// Worker liveness policy, table-driven with a fixed clock: who is silent too long, and the re-fork backoff.
import t from 'tap';
import { reforkDelayMs, silenceLimitMs, unresponsive } from '../src/supervisor/liveness.ts';

const cfg = { heartbeatMs: 1000, unresponsiveHeartbeats: 5 };

t.test('silence limit is heartbeat × missed heartbeats', async (t) => {
  t.equal(silenceLimitMs(cfg), 5000);
  t.equal(silenceLimitMs({ heartbeatMs: 250, unresponsiveHeartbeats: 8 }), 2000);
});

t.test('a worker is unresponsive only past the limit', async (t) => {
  const now = 100_000;
  const cases: [lastSeen: number, expected: boolean][] = [
    [now, false],
    [now - 4999, false],
    [now - 5000, false], // exactly at the limit: still within
    [now - 5001, true],
    [now - 60_000, true],
  ];
  for (const [lastSeen, expected] of cases) {
    t.equal(unresponsive(cfg, [{ index: 3, lastSeen }], now).length === 1, expected, `silent ${now - lastSeen} ms`);
  }
  t.same(
    unresponsive(cfg, [{ index: 0, lastSeen: now - 100 }, { index: 1, lastSeen: now - 7000 }, { index: 2, lastSeen: now - 5001 }], now),
    [{ index: 1, silentMs: 7000 }, { index: 2, silentMs: 5001 }],
  );
});

t.test('re-fork backoff: at once after a crash, then 250 ms doubling to 10 s', async (t) => {
  const table: [failures: number, ms: number][] = [
    [0, 0],
    [1, 250],
    [2, 500],
    [3, 1000],
    [6, 8000],
    [7, 10_000],
    [50, 10_000],
  ];
  for (const [failures, ms] of table) t.equal(reforkDelayMs(failures), ms, `${failures} failures`);
});
