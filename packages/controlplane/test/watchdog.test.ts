// Watchdog policy, table-driven with a fake clock.
import t from 'tap';
import { validateConfig } from '@edge-proxy/config';
import { WATCHDOG_INITIAL, judgeWindow, stepWatchdog } from '../src/watchdog/policy.ts';
import type { WatchdogConfig } from '../src/watchdog/policy.ts';

function cfg(over: Record<string, unknown> = {}): WatchdogConfig {
  const r = validateConfig({ listen: { tls: { cert: 'c', key: 'k' } }, upstream: { a: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: 'h' }] } }, resilience: { watchdog: { enabled: true, ...over } } }, '/tmp');
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value.config.resilience.watchdog;
}
const admission = { adaptiveEnabled: false, adaptiveLimit: 4096, minLimit: 4096, maxLimit: 4096, inflight: 10, queued: 0, queuedByRoute: {}, brownoutActive: false };
const w = (o: Partial<{ maxLoopDelayMs: number; requests: number; timeoutsOrErrors: number; inflight: number; inflightLimit: number }> = {}) => ({ maxLoopDelayMs: 5, requests: 100, timeoutsOrErrors: 0, inflight: 10, inflightLimit: 4096, generation: 1, backendsHealthy: 1, backendsUnhealthy: 0, admission, breakers: [], quota: { backend_mode: 'local' as const, availability: 'disabled' as const }, ...o });

t.test('judging a window', async (t) => {
  const c = cfg();
  t.same(judgeWindow(c, [w(), w()]), []);
  t.same(judgeWindow(c, [w(), w({ maxLoopDelayMs: 5000 })]), ['poll_stall']);
  t.same(judgeWindow(c, [w(), undefined]), ['worker_silent']);
  t.same(judgeWindow(c, [w({ requests: 50, timeoutsOrErrors: 30 }), w({ requests: 50, timeoutsOrErrors: 30 })]), ['timeout_error_rate'], '60 % of 100');
  t.same(judgeWindow(c, [w({ requests: 10, timeoutsOrErrors: 10 })]), [], 'below min_requests_per_window');
  t.same(judgeWindow(c, [w({ inflight: 3900, inflightLimit: 4096 })]), ['overload'], '95 %');
});

t.test('three bad windows in a row restart; cooldown holds the next', async (t) => {
  const c = cfg({ unhealthy_consecutive_windows: 3, restart_cooldown_ms: 120_000 });
  let s = WATCHDOG_INITIAL;
  const decisions: boolean[] = [];
  const run = (bad: boolean, now: number): void => {
    const r = stepWatchdog(c, s, bad ? ['poll_stall'] : [], now);
    s = r.state;
    decisions.push(r.restart);
  };
  run(true, 0);
  run(false, 1000); // resets the streak
  run(true, 2000);
  run(true, 3000);
  run(true, 4000); // third in a row: restart
  run(true, 5000);
  run(true, 6000);
  run(true, 7000); // three more, but within the cooldown
  run(true, 124_001); // cooled down, streak continued
  t.same(decisions, [false, false, false, false, true, false, false, false, true]);
  t.equal(s.degradedWindows, 8);
});

t.test('disabled: windows are counted, nothing restarts', async (t) => {
  const c = { ...cfg(), enabled: false };
  let s = WATCHDOG_INITIAL;
  for (let i = 0; i < 5; i++) {
    const r = stepWatchdog(c, s, ['overload'], i);
    s = r.state;
    t.notOk(r.restart);
  }
  t.equal(s.degradedWindows, 5);
});
