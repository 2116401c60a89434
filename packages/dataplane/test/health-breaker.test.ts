// Health and circuit-breaker policies, table-driven with a fake clock (no sockets, no timers).
// Active health ejects; passive outcomes are counted and eject nothing (the breaker owns
// consecutive-failure ejection; its registry is tested in breaker-registry.test.ts).
import t from 'tap';
import { INITIAL_HEALTH, isEligible, observeProbe } from '../src/health/health-state.ts';
import type { HealthState } from '../src/health/health-state.ts';
import { CLOSED, begin, mayTry, record } from '../src/resilience/circuit-breaker.ts';
import type { BreakerState } from '../src/resilience/circuit-breaker.ts';
import { HealthRegistry, statusMatches } from '../src/health/health-registry.ts';
import type { HealthEvents, ProbeSpec } from '../src/health/health-registry.ts';
import type { Dispatcher } from 'undici';
import type { UpstreamDispatcher } from '../src/upstream/pools.ts';

const th = { healthyThreshold: 2, unhealthyThreshold: 3 };

t.test('active probes: ejection after 3 failures, return after 2 successes, streaks reset', async (t) => {
  let s: HealthState = INITIAL_HEALTH;
  const steps: [boolean, boolean][] = [
    // probe ok?, eligible after
    [false, true], [false, true], [true, true], // a success resets the failure streak
    [false, true], [false, true], [false, false], // third in a row: unhealthy
    [true, false], [false, false], [true, false], [true, true], // 2 successes in a row bring it back
  ];
  steps.forEach(([ok, eligible], i) => {
    s = observeProbe(s, ok, th);
    t.equal(isEligible(s), eligible, `step ${i}: probe ${ok ? 'ok' : 'failed'} → eligible ${eligible}`);
  });
});

// The registry the data plane reads at pick time: passive outcomes and active probes through it,
// with a fake dispatcher (no sockets). Without these, a registry that never ejects on failed
// probes (or never tells metrics) passed every unit test.

interface Recorded {
  probes: boolean[];
  failures: string[];
  transitions: [string, boolean][];
}

function recorder(): Recorded & HealthEvents {
  const r: Recorded = { probes: [], failures: [], transitions: [] };
  return Object.assign(r, {
    probe: (ok: boolean) => void r.probes.push(ok),
    passiveFailure: (reason: string) => void r.failures.push(reason),
    transition: (key: string, eligible: boolean) => void r.transitions.push([key, eligible]),
  });
}

t.test('registry, passive: every failure is counted by reason, none ejects, no transition', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.ok(reg.eligible('b1'), 'an unknown backend is eligible');
  const outcomes = ['5xx', 'timeout', 'ok', 'transport', 'tls', '5xx', '5xx', '5xx', '5xx', 'timeout', 'timeout'] as const;
  for (const o of outcomes) {
    reg.passive('b1', o);
    t.ok(reg.eligible('b1'), `after ${o}: still eligible`);
  }
  t.same(ev.failures, outcomes.filter((o) => o !== 'ok'), 'svc_health_failures_total{reason} hears each failure, in order');
  t.same(ev.transitions, [], 'no transition: passive health never makes a backend ineligible');
  t.same(ev.probes, [], 'and no probe was counted');
});

t.test('registry, passive and active together: only failed probes eject, and passing probes alone bring the backend back', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.teardown(() => reg.close());
  const { dispatcher } = fakeDispatcher([500, 500, 500, 200, 200]);
  reg.reconcile([{ ...probeSpec('b', dispatcher), intervalMs: 1 }]);
  await probesSeen(ev, 3);
  t.notOk(reg.eligible('b'), 'three failed probes eject');
  for (let i = 0; i < 5; i++) reg.passive('b', 'ok');
  t.notOk(reg.eligible('b'), 'passive successes do not lift an active ejection');
  await probesSeen(ev, 5);
  t.ok(reg.eligible('b'), 'two passing probes do');
  reg.retain(new Set(['other']));
  t.ok(reg.eligible('b'), 'retain forgets backends no generation references');
});

/** A pool's `dispatch` answering each probe with the next status of `statuses` (or failing it). */
function fakeDispatcher(statuses: (number | 'throw')[]): { dispatcher: UpstreamDispatcher; requests: { path: string; method: string; host: string }[]; agents: string[] } {
  const requests: { path: string; method: string; host: string }[] = [];
  const agents: string[] = [];
  let i = 0;
  const controller = { abort() {}, pause() {}, resume() {}, aborted: false, paused: false, reason: null } as unknown as Dispatcher.DispatchController;
  const dispatcher: UpstreamDispatcher = {
    dispatch(opts, handler) {
      const headers = opts.headers as Record<string, string>;
      requests.push({ path: opts.path, method: opts.method, host: headers['host'] as string });
      agents.push(headers['user-agent'] as string);
      const s = statuses[Math.min(i++, statuses.length - 1)] as number | 'throw';
      handler.onRequestStart?.(controller, {});
      queueMicrotask(() => {
        if (s === 'throw') {
          handler.onResponseError?.(controller, Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }));
          return;
        }
        handler.onResponseStart?.(controller, s, {}, '');
        handler.onResponseData?.(controller, Buffer.from('ok'));
        handler.onResponseEnd?.(controller, {});
      });
      return true;
    },
    close: () => Promise.resolve(),
    destroy: () => Promise.resolve(),
  };
  return { dispatcher, requests, agents };
}

/** A pool's `dispatch` that never answers: a probe ends only when it is aborted (`aborted` resolves then). */
function hangingDispatcher(): { dispatcher: UpstreamDispatcher; started: number; aborted: Promise<void> } {
  let onAbort: () => void = () => undefined;
  const out = {
    started: 0,
    aborted: new Promise<void>((resolve) => (onAbort = resolve)),
    dispatcher: {
      dispatch(_opts, handler) {
        out.started++;
        const c = {
          abort(reason: Error) {
            handler.onResponseError?.(c, reason);
            onAbort();
          },
          pause() {},
          resume() {},
        } as unknown as Dispatcher.DispatchController;
        handler.onRequestStart?.(c, {});
        return true;
      },
      close: () => Promise.resolve(),
      destroy: () => Promise.resolve(),
    } as UpstreamDispatcher,
  };
  return out;
}

function probeSpec(key: string, dispatcher: UpstreamDispatcher, expectedStatus = '2xx'): ProbeSpec {
  return { key, dispatcher, path: '/healthz', host: 'svc.internal', intervalMs: 1, timeoutMs: 5_000, expectedStatus, thresholds: { healthyThreshold: 2, unhealthyThreshold: 3 } };
}

/** Waits (bounded) until `n` probes were reported. */
async function probesSeen(ev: Recorded, n: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (ev.probes.length < n) {
    if (Date.now() > deadline) throw new Error(`only ${ev.probes.length} probes in 10 s`);
    await new Promise((r) => setImmediate(r));
  }
}

t.test('registry, active: failing probes eject, passing ones bring the backend back; GET of the configured path and host', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.teardown(() => reg.close());
  const { dispatcher, requests } = fakeDispatcher([503, 'throw', 500, 200, 200, 204]);
  reg.reconcile([probeSpec('b', dispatcher)]);
  t.equal(reg.activeChecks, 1);
  await probesSeen(ev, 3);
  t.same(ev.probes.slice(0, 3), [false, false, false]);
  t.notOk(reg.eligible('b'), 'three failed probes: unhealthy');
  await probesSeen(ev, 5);
  t.same(ev.probes.slice(3, 5), [true, true]);
  t.ok(reg.eligible('b'), 'two passing probes: healthy again');
  t.same(ev.transitions.slice(0, 2), [['b', false], ['b', true]]);
  t.same(requests[0], { path: '/healthz', method: 'GET', host: 'svc.internal' });
  reg.close();
  t.equal(reg.activeChecks, 0, 'close stops every check');
});

t.test('registry, reconcile: unchanged checks keep running, changed ones restart, removed ones stop; none after close', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.teardown(() => reg.close());
  const a = fakeDispatcher([200]);
  const spec = probeSpec('a', a.dispatcher);
  reg.reconcile([spec, probeSpec('b', a.dispatcher)]);
  t.equal(reg.activeChecks, 2);
  reg.reconcile([{ ...spec }]);
  t.equal(reg.activeChecks, 1, 'b removed');
  reg.reconcile([{ ...spec, path: '/other' }]);
  t.equal(reg.activeChecks, 1, 'a changed: replaced, still one');
  await probesSeen(ev, 2);
  t.ok(a.requests.some((r) => r.path === '/other'), 'the new spec is probed');
  reg.close();
  reg.reconcile([spec]);
  t.equal(reg.activeChecks, 0, 'a closed registry starts no check');
});

// The breaker policy (resilience/circuit-breaker.ts), pure: exact states for each step. The
// registry that holds these states per backend is tested in breaker-registry.test.ts.
const p = { enabled: true, failureThreshold: 3, openMs: 30_000, halfOpenMaxProbes: 1, failureStatuses: new Set([502, 503, 504]), maxEjectionPercent: 50 };

t.test('breaker policy: exact decisions in every state', async (t) => {
  const closed: BreakerState = { status: 'closed', failures: 2 };
  const open: BreakerState = { status: 'open', openedAt: 1000 };
  const half: BreakerState = { status: 'half_open', probesInFlight: 1 };
  const cases: [string, BreakerState, typeof p, number, boolean, BreakerState][] = [
    // name, state, policy, now, mayTry, state after begin
    ['closed', closed, p, 0, true, closed],
    ['open, not due', open, p, 30_999, false, open],
    ['open, due', open, p, 31_000, true, { status: 'half_open', probesInFlight: 1 }],
    ['half-open, slot taken', half, p, 31_001, false, half],
    ['half-open, 2 probes allowed', half, { ...p, halfOpenMaxProbes: 2 }, 31_001, true, { status: 'half_open', probesInFlight: 2 }],
    ['half-open, no probe in flight', { status: 'half_open', probesInFlight: 0 }, p, 31_001, true, half],
    ['open, disabled', open, { ...p, enabled: false }, 0, true, open],
  ];
  for (const [name, s, pol, now, may, after] of cases) {
    t.equal(mayTry(s, pol, now), may, `${name}: mayTry`);
    t.same(begin(s, pol, now), after, `${name}: begin`);
  }
  t.equal(begin(closed, p, 0), closed, 'a closed begin returns the same object (no allocation)');
  t.equal(begin(open, p, 0), open, 'a refused begin changes nothing');
});

t.test('breaker policy: record, exact next state for each (state, outcome, probe)', async (t) => {
  const closed2: BreakerState = { status: 'closed', failures: 2 };
  const open: BreakerState = { status: 'open', openedAt: 1000 };
  const half2: BreakerState = { status: 'half_open', probesInFlight: 2 };
  const cases: [string, BreakerState, 'success' | 'failure' | 'neutral', boolean, BreakerState][] = [
    ['closed: success resets', closed2, 'success', false, CLOSED],
    ['closed: failure counts', CLOSED, 'failure', false, { status: 'closed', failures: 1 }],
    ['closed: the third failure opens', closed2, 'failure', false, { status: 'open', openedAt: 7 }],
    ['closed: neutral changes nothing', closed2, 'neutral', false, closed2],
    ['closed: a late probe counts as an ordinary outcome', closed2, 'failure', true, { status: 'open', openedAt: 7 }],
    ['half-open: probe success closes', half2, 'success', true, CLOSED],
    ['half-open: probe failure re-opens for open_ms', half2, 'failure', true, { status: 'open', openedAt: 7 }],
    ['half-open: neutral probe gives its slot back', half2, 'neutral', true, { status: 'half_open', probesInFlight: 1 }],
    ['half-open: a non-probe outcome decides nothing', half2, 'failure', false, half2],
    ['half-open: a non-probe success decides nothing', half2, 'success', false, half2],
    ['open: a late success does not close', open, 'success', false, open],
    ['open: a late failure does not extend', open, 'failure', true, open],
  ];
  for (const [name, s, outcome, probe, after] of cases) t.same(record(s, outcome, probe, p, 7), after, name);
  t.equal(record(CLOSED, 'success', false, p, 0), CLOSED, 'the success path returns the same object');
  t.equal(record(closed2, 'failure', false, { ...p, enabled: false }, 0), closed2, 'disabled: nothing counts');
});

t.test('breaker policy: open → half-open → closed and open → half-open → open, step by step', async (t) => {
  let s: BreakerState = CLOSED;
  for (let i = 0; i < 3; i++) s = record(s, 'failure', false, p, 100);
  t.same(s, { status: 'open', openedAt: 100 });
  t.notOk(mayTry(s, p, 30_099), 'refused until open_ms elapsed');
  s = begin(s, p, 30_100);
  t.same(s, { status: 'half_open', probesInFlight: 1 }, 'the first attempt after open_ms probes');
  t.notOk(mayTry(s, p, 30_101), 'one probe at a time');
  const failed = record(s, 'failure', true, p, 30_200);
  t.same(failed, { status: 'open', openedAt: 30_200 }, 'a failed probe re-opens');
  t.notOk(mayTry(failed, p, 60_199));
  t.ok(mayTry(failed, p, 60_200), 'for another open_ms');
  t.same(record(begin(failed, p, 60_200), 'success', true, p, 60_300), CLOSED, 'a successful probe closes');
});

t.test('expected_status: a class, a range or one code', async (t) => {
  const cases: [string, number, boolean][] = [
    ['2xx', 200, true], ['2xx', 299, true], ['2xx', 300, false], ['2xx', 199, false], ['5xx', 503, true],
    ['200-399', 200, true], ['200-399', 399, true], ['200-399', 400, false], ['200-399', 199, false],
    ['204', 204, true], ['204', 200, false],
  ];
  for (const [spec, status, ok] of cases) t.equal(statusMatches(spec, status), ok, `${spec} ${status}`);
});

// Below: more cases the mutation run found unchecked.

t.test('registry without an events sink: failures, probes and transitions still work', async (t) => {
  const reg = new HealthRegistry(undefined);
  t.teardown(() => reg.close());
  for (let i = 0; i < 3; i++) reg.passive('a', 'transport');
  t.ok(reg.eligible('a'), 'passive failures eject nothing');
  const { dispatcher, requests } = fakeDispatcher([500]);
  reg.reconcile([probeSpec('b', dispatcher)]);
  const deadline = Date.now() + 10_000;
  while (requests.length < 4 && Date.now() < deadline) await new Promise((r) => setImmediate(r));
  t.ok(requests.length >= 4, 'probes keep running');
  t.notOk(reg.eligible('b'), 'and eject');
});

t.test('expected_status specs match whole: no partial class or range', async (t) => {
  for (const [spec, status] of [['22xx', 200], ['2xxx', 200], ['1200-399', 250], ['200-3999', 250]] as const) t.equal(statusMatches(spec, status), false, spec);
});

t.test('registry, probes: user agent; a new dispatcher restarts the check, an identical spec does not', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.teardown(() => reg.close());
  const a = fakeDispatcher([200]);
  const slow = { ...probeSpec('a', a.dispatcher), intervalMs: 3_600_000 };
  reg.reconcile([slow]);
  await probesSeen(ev, 1);
  t.equal(a.agents[0], 'edge-proxy-health/1');
  const b = fakeDispatcher([200]);
  reg.reconcile([{ ...slow }, { ...slow, key: 'z', dispatcher: b.dispatcher }]);
  await probesSeen(ev, 2);
  t.equal(a.requests.length, 1, 'the unchanged check was not restarted');
  const c = fakeDispatcher([200]);
  reg.reconcile([{ ...slow, dispatcher: c.dispatcher }]);
  await probesSeen(ev, 3);
  t.equal(c.requests.length, 1, 'same settings, new pool: probed through the new dispatcher');
});

t.test('registry, probes: no answer within timeout_ms, or a body that fails, is a failed probe; none is reported after close', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev);
  t.teardown(() => reg.close());
  const hang = hangingDispatcher();
  reg.reconcile([{ ...probeSpec('h', hang.dispatcher), timeoutMs: 20, intervalMs: 3_600_000 }]);
  await probesSeen(ev, 1);
  t.same(ev.probes, [false], 'aborted at timeout_ms');
  const broken: UpstreamDispatcher = {
    dispatch(_opts, handler) {
      const c = { abort() {}, pause() {}, resume() {} } as unknown as Dispatcher.DispatchController;
      handler.onRequestStart?.(c, {});
      queueMicrotask(() => {
        handler.onResponseStart?.(c, 200, {}, '');
        handler.onResponseError?.(c, Object.assign(new Error('reset'), { code: 'ECONNRESET' }));
      });
      return true;
    },
    close: () => Promise.resolve(),
    destroy: () => Promise.resolve(),
  };
  reg.reconcile([{ ...probeSpec('h', hang.dispatcher), timeoutMs: 20, intervalMs: 3_600_000 }, { ...probeSpec('x', broken), intervalMs: 3_600_000 }]);
  await probesSeen(ev, 2);
  t.same(ev.probes, [false, false], 'a 200 whose body fails');
  const pending = hangingDispatcher();
  const reg2 = new HealthRegistry(ev);
  reg2.reconcile([{ ...probeSpec('p', pending.dispatcher), intervalMs: 1 }]);
  while (pending.started === 0) await new Promise((r) => setImmediate(r));
  reg2.close();
  await pending.aborted;
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
  t.same(ev.probes, [false, false], 'a probe cut short by close is not reported');
  t.equal(reg2.activeChecks, 0);
});
