// Health and circuit-breaker policies, table-driven with a fake clock (no sockets, no timers).
// Health is live; the breaker policy is not wired yet (see the note above its cases).
import t from 'tap';
import { INITIAL_HEALTH, MAX_EJECTION_MS, ejectionMs, isEligible, observePassive, observeProbe } from '../src/health/health-state.ts';
import type { HealthState } from '../src/health/health-state.ts';
import { CLOSED, admit, record } from '../src/resilience/circuit-breaker.ts';
import type { BreakerState } from '../src/resilience/circuit-breaker.ts';
import { HealthRegistry, statusMatches } from '../src/health/health-registry.ts';
import type { HealthEvents, ProbeSpec } from '../src/health/health-registry.ts';
import type { Dispatcher } from 'undici';

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
    t.equal(isEligible(s, 0), eligible, `step ${i}: probe ${ok ? 'ok' : 'failed'} → eligible ${eligible}`);
  });
});

t.test('passive: ejection for 30 s × ejections (max 300 s); successes in between reset the count', async (t) => {
  let s: HealthState = INITIAL_HEALTH;
  let now = 1_000_000;
  for (const r of ['5xx', 'timeout'] as const) s = observePassive(s, r, th, now);
  t.ok(isEligible(s, now), 'two failures: still eligible');
  s = observePassive(s, 'ok', th, now);
  s = observePassive(s, 'transport', th, now);
  s = observePassive(s, 'transport', th, now);
  t.ok(isEligible(s, now), 'the success reset the streak');
  s = observePassive(s, 'tls', th, now);
  t.notOk(isEligible(s, now), 'third consecutive failure ejects');
  t.ok(isEligible(s, now + 30_000), 'back after 30 s');
  now += 30_000;
  for (let i = 0; i < 3; i++) s = observePassive(s, '5xx', th, now);
  t.notOk(isEligible(s, now + 59_999), 'second ejection lasts 60 s');
  t.ok(isEligible(s, now + 60_000));
  t.equal(ejectionMs(50), MAX_EJECTION_MS);
  now += 60_000 + 2 * 60_000 + 1;
  s = observePassive(s, 'ok', th, now);
  t.equal(s.ejections, 0, 'a calm period forgets earlier ejections');
});

t.test('a passing active probe lifts a passive ejection once the backend is healthy again', async (t) => {
  let s: HealthState = INITIAL_HEALTH;
  for (let i = 0; i < 3; i++) s = observePassive(s, '5xx', th, 0);
  for (let i = 0; i < 3; i++) s = observeProbe(s, false, th);
  t.notOk(isEligible(s, 0));
  s = observeProbe(s, true, th);
  t.notOk(isEligible(s, 0), 'one success is not enough');
  s = observeProbe(s, true, th);
  t.ok(isEligible(s, 0), 'recovered by active checks; ejection lifted');
});

// The breaker below is a pure policy that nothing wires into request handling yet (issue 13):
// `resilience.circuit_breaker` is reported "not active yet" (config features.ts). These cases pin
// the policy for when it is wired; they are no evidence that a breaker protects traffic.
const p = { failureThreshold: 3, openMs: 30_000, halfOpenMaxProbes: 1 };

t.test('breaker: opens after 3 consecutive failures, rejects while open, probes once, closes on success', async (t) => {
  let s: BreakerState = CLOSED;
  for (let i = 0; i < 2; i++) s = record(s, false, p, 0);
  s = record(s, true, p, 0);
  t.same(s, CLOSED, 'success resets the count');
  for (let i = 0; i < 3; i++) s = record(s, false, p, 100);
  t.equal(s.status, 'open');
  t.equal(admit(s, p, 100 + 29_999).allowed, false, 'rejected while open');
  const probe = admit(s, p, 100 + 30_000);
  t.same([probe.allowed, probe.probe, probe.state.status], [true, true, 'half_open']);
  t.equal(admit(probe.state, p, 100 + 30_001).allowed, false, 'only one probe in flight');
  t.same(record(probe.state, true, p, 100 + 30_050), CLOSED, 'successful probe closes');
  const failed = record(probe.state, false, p, 200_000);
  t.same(failed, { status: 'open', until: 230_000 }, 'failed probe re-opens for open_ms');
});

t.test('breaker: half_open_max_probes allows that many concurrent probes', async (t) => {
  const p3 = { ...p, halfOpenMaxProbes: 3 };
  let s: BreakerState = { status: 'open', until: 0 };
  const allowed: boolean[] = [];
  for (let i = 0; i < 4; i++) {
    const a = admit(s, p3, 1);
    allowed.push(a.allowed);
    s = a.state;
  }
  t.same(allowed, [true, true, true, false]);
});

// The registry the data plane reads at pick time: passive outcomes and active probes through it,
// with a fake clock and a fake dispatcher (no sockets). Without these, a registry that never
// ejects (or never tells metrics) passed every unit test.

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

t.test('registry, passive: three failures eject for 30 s, events for each failure and each transition', async (t) => {
  let now = 1_000_000;
  const ev = recorder();
  const reg = new HealthRegistry(ev, () => now);
  t.ok(reg.eligible('b1'), 'an unknown backend is eligible');
  reg.passive('b1', '5xx');
  reg.passive('b1', 'timeout');
  t.ok(reg.eligible('b1'));
  reg.passive('b1', 'ok');
  reg.passive('b1', 'transport');
  reg.passive('b1', 'tls');
  t.ok(reg.eligible('b1'), 'the success reset the streak');
  reg.passive('b1', '5xx');
  t.notOk(reg.eligible('b1'), 'third failure in a row ejects');
  t.ok(reg.eligible('b2'), 'other backends are not affected');
  t.same(ev.failures, ['5xx', 'timeout', 'transport', 'tls', '5xx']);
  t.same(ev.transitions, [['b1', false]]);
  now += 29_999;
  t.notOk(reg.eligible('b1'));
  now += 1;
  t.ok(reg.eligible('b1'), 'back when the ejection ends');
  reg.passive('b1', 'ok', { healthyThreshold: 2, unhealthyThreshold: 3 });
  t.same(ev.transitions, [['b1', false]], 'the end of an ejection is read at pick time, not an event');
});

t.test('registry, passive: the thresholds passed are used; successes on a clean backend change nothing', async (t) => {
  const now = 5_000;
  const ev = recorder();
  const reg = new HealthRegistry(ev, () => now);
  reg.passive('a', 'ok');
  t.same(ev.transitions, []);
  reg.passive('a', '5xx', { healthyThreshold: 1, unhealthyThreshold: 1 });
  t.notOk(reg.eligible('a'), 'unhealthy_threshold 1: one failure ejects');
  t.same(ev.transitions, [['a', false]]);
  reg.retain(new Set(['other']));
  t.ok(reg.eligible('a'), 'retain forgets backends no generation references');
});

function fakeDispatcher(statuses: (number | 'throw')[]): { dispatcher: Dispatcher; requests: { path: string; method: string; host: string }[]; agents: string[] } {
  const requests: { path: string; method: string; host: string }[] = [];
  const agents: string[] = [];
  let i = 0;
  const dispatcher = {
    request(opts: { path: string; method: string; headers: Record<string, string> }) {
      requests.push({ path: opts.path, method: opts.method, host: opts.headers['host'] as string });
      agents.push(opts.headers['user-agent'] as string);
      const s = statuses[Math.min(i++, statuses.length - 1)];
      if (s === 'throw') return Promise.reject(new Error('connect ECONNREFUSED'));
      return Promise.resolve({ statusCode: s, body: { dump: () => Promise.resolve() } });
    },
  } as unknown as Dispatcher;
  return { dispatcher, requests, agents };
}

function probeSpec(key: string, dispatcher: Dispatcher, expectedStatus = '2xx'): ProbeSpec {
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
  const reg = new HealthRegistry(ev, () => 0);
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
  const reg = new HealthRegistry(ev, () => 0);
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

t.test('expected_status: a class, a range or one code', async (t) => {
  const cases: [string, number, boolean][] = [
    ['2xx', 200, true], ['2xx', 299, true], ['2xx', 300, false], ['2xx', 199, false], ['5xx', 503, true],
    ['200-399', 200, true], ['200-399', 399, true], ['200-399', 400, false], ['200-399', 199, false],
    ['204', 204, true], ['204', 200, false],
  ];
  for (const [spec, status, ok] of cases) t.equal(statusMatches(spec, status), ok, `${spec} ${status}`);
});

// Below: more cases the mutation run found unchecked.

t.test('passive: an ejection in force is not extended by more failures; the count survives an early success', async (t) => {
  let s: HealthState = INITIAL_HEALTH;
  for (let i = 0; i < 3; i++) s = observePassive(s, '5xx', th, 0);
  for (let i = 0; i < 3; i++) s = observePassive(s, '5xx', th, 10_000);
  t.ok(isEligible(s, 30_000), 'failures while ejected do not extend the ejection');
  t.equal(s.ejections, 1);
  s = observePassive(s, 'ok', th, 60_000);
  t.equal(s.ejections, 1, 'a success 60 s after a 30 s ejection: not yet calm (needs more than twice the ejection)');
  s = observePassive(s, 'ok', th, 60_001);
  t.equal(s.ejections, 0, 'calm after more than twice the last ejection');
});

t.test('breaker: exact decisions in every state; outcomes arriving while open change nothing', async (t) => {
  const closed: BreakerState = { status: 'closed', failures: 2 };
  t.same(admit(closed, p, 0), { allowed: true, probe: false, state: closed });
  const open: BreakerState = { status: 'open', until: 1000 };
  t.same(admit(open, p, 999), { allowed: false, probe: false, state: open });
  t.same(admit(open, p, 1000), { allowed: true, probe: true, state: { status: 'half_open', probesInFlight: 1 } });
  const half: BreakerState = { status: 'half_open', probesInFlight: 1 };
  t.same(admit(half, p, 1001), { allowed: false, probe: false, state: half });
  t.same(admit(half, { ...p, halfOpenMaxProbes: 2 }, 1001), { allowed: true, probe: true, state: { status: 'half_open', probesInFlight: 2 } });
  t.equal(record(open, true, p, 500), open, 'a late success does not close an open breaker');
  t.equal(record(open, false, p, 500), open, 'a late failure does not extend it');
  t.same(record(closed, true, p, 0), CLOSED);
  t.same(record(closed, false, p, 7), { status: 'open', until: 30_007 }, 'the third failure opens');
});

t.test('registry without an events sink: failures, probes and transitions still work', async (t) => {
  let now = 0;
  const reg = new HealthRegistry(undefined, () => now);
  t.teardown(() => reg.close());
  for (let i = 0; i < 3; i++) reg.passive('a', 'transport');
  t.notOk(reg.eligible('a'));
  now = 30_000;
  t.ok(reg.eligible('a'));
  const { dispatcher, requests } = fakeDispatcher([500]);
  reg.reconcile([probeSpec('b', dispatcher)]);
  const deadline = Date.now() + 10_000;
  while (requests.length < 4 && Date.now() < deadline) await new Promise((r) => setImmediate(r));
  t.ok(requests.length >= 4, 'probes keep running');
  t.notOk(reg.eligible('b'), 'and eject');
});

t.test('registry: a calm period resets the ejection count (the next ejection is 30 s again); retain keeps listed state', async (t) => {
  let now = 0;
  const reg = new HealthRegistry(recorder(), () => now);
  for (let i = 0; i < 3; i++) reg.passive('a', '5xx');
  now = 30_000 + 60_001;
  reg.passive('a', 'ok');
  for (let i = 0; i < 3; i++) reg.passive('a', '5xx');
  t.notOk(reg.eligible('a'));
  now += 30_000;
  t.ok(reg.eligible('a'), 'ejected for 30 s, not 60 s');
  for (let i = 0; i < 3; i++) reg.passive('a', '5xx');
  reg.retain(new Set(['a']));
  t.notOk(reg.eligible('a'), 'retain keeps the state of a listed backend');
});

t.test('expected_status specs match whole: no partial class or range', async (t) => {
  for (const [spec, status] of [['22xx', 200], ['2xxx', 200], ['1200-399', 250], ['200-3999', 250]] as const) t.equal(statusMatches(spec, status), false, spec);
});

t.test('registry, probes: user agent; a new dispatcher restarts the check, an identical spec does not', async (t) => {
  const ev = recorder();
  const reg = new HealthRegistry(ev, () => 0);
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
  const reg = new HealthRegistry(ev, () => 0);
  t.teardown(() => reg.close());
  const hang = {
    request: (opts: { signal: AbortSignal }) => new Promise((_, reject) => opts.signal.addEventListener('abort', () => reject(new Error('aborted')))),
  } as unknown as Dispatcher;
  reg.reconcile([{ ...probeSpec('h', hang), timeoutMs: 20, intervalMs: 3_600_000 }]);
  await probesSeen(ev, 1);
  t.same(ev.probes, [false], 'aborted at timeout_ms');
  const broken = { request: () => Promise.resolve({ statusCode: 200, body: { dump: () => Promise.reject(new Error('reset')) } }) } as unknown as Dispatcher;
  reg.reconcile([{ ...probeSpec('h', hang), timeoutMs: 20, intervalMs: 3_600_000 }, { ...probeSpec('x', broken), intervalMs: 3_600_000 }]);
  await probesSeen(ev, 2);
  t.same(ev.probes, [false, false], 'a 200 whose body fails');
  let settled: Promise<unknown> | undefined;
  const pending = { request: (opts: { signal: AbortSignal }) => (settled = new Promise((_, reject) => opts.signal.addEventListener('abort', () => reject(new Error('aborted'))))) } as unknown as Dispatcher;
  const reg2 = new HealthRegistry(ev, () => 0);
  reg2.reconcile([{ ...probeSpec('p', pending), intervalMs: 1 }]);
  while (settled === undefined) await new Promise((r) => setImmediate(r));
  reg2.close();
  await (settled as Promise<unknown>).catch(() => undefined);
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
  t.same(ev.probes, [false, false], 'a probe cut short by close is not reported');
  t.equal(reg2.activeChecks, 0);
});

t.test('passive: the calm period counts from the ejection, not from the epoch', async (t) => {
  let s: HealthState = INITIAL_HEALTH;
  for (let i = 0; i < 3; i++) s = observePassive(s, '5xx', th, 1_000_000);
  s = observePassive(s, 'ok', th, 1_060_000);
  t.equal(s.ejections, 1, '60 s after an ejection at t=1000 s: not calm yet');
  s = observePassive(s, 'ok', th, 1_060_001);
  t.equal(s.ejections, 0);
});
