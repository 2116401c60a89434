// The bounds that keep one client from ejecting a pool (issue 38, finding 2), and time-driven
// breaker state (finding 6): which outcomes count under `failure_statuses`, the ejection bound of
// `max_ejection_percent` (pure, then per pool in the registry), and open → half-open by the
// registry's timer and by its views, all with a fake clock and fake timers (no sockets).
import t from 'tap';
import { CLOSED, due, ejectionAllowed, held, record } from '../src/resilience/circuit-breaker.ts';
import type { BreakerPolicy, BreakerState } from '../src/resilience/circuit-breaker.ts';
import { BreakerRegistry, breakerOutcome } from '../src/resilience/breaker-registry.ts';
import type { BreakerHold, BreakerTimers, BreakerTransition } from '../src/resilience/breaker-registry.ts';
import { ERR } from '../src/errors.ts';
import type { RequestError } from '../src/errors.ts';

const GATEWAY = new Set([502, 503, 504]);
const P: BreakerPolicy = { enabled: true, failureThreshold: 3, openMs: 1_000, halfOpenMaxProbes: 1, failureStatuses: GATEWAY, maxEjectionPercent: 50 };

t.test('breakerOutcome: only the statuses of failure_statuses count; errors by their class; a discarded 502/503 by its status', async (t) => {
  const optIn = new Set([500, 502, 503, 504]);
  const none = new Set<number>();
  const cases: [number | undefined, RequestError | undefined, ReadonlySet<number>, string, 'success' | 'failure' | 'neutral'][] = [
    [500, undefined, GATEWAY, 'default', 'success'],
    [501, undefined, GATEWAY, 'default', 'success'],
    [502, undefined, GATEWAY, 'default', 'failure'],
    [503, undefined, GATEWAY, 'default', 'failure'],
    [504, undefined, GATEWAY, 'default', 'failure'],
    [599, undefined, GATEWAY, 'default', 'success'],
    [200, undefined, GATEWAY, 'default', 'success'],
    [500, undefined, optIn, 'opt-in 500', 'failure'],
    [501, undefined, optIn, 'opt-in 500', 'success'],
    [502, undefined, none, 'empty', 'success'],
    [503, ERR.EDGE_UPSTREAM_ERROR_STATUS, GATEWAY, 'default', 'failure'],
    [503, ERR.EDGE_UPSTREAM_ERROR_STATUS, new Set([504]), 'only 504', 'success'],
    [502, ERR.EDGE_UPSTREAM_TRANSPORT, none, 'empty', 'failure'],
    [504, ERR.EDGE_UPSTREAM_HEADERS_TIMEOUT, none, 'empty', 'failure'],
    [502, ERR.EDGE_UPSTREAM_TLS, none, 'empty', 'failure'],
    [500, ERR.EDGE_CLIENT_CLOSED, optIn, 'opt-in 500', 'neutral'],
    [502, ERR.EDGE_INTERNAL, GATEWAY, 'default', 'neutral'],
    [undefined, undefined, GATEWAY, 'default', 'neutral'],
  ];
  for (const [status, err, set, name, expected] of cases) t.equal(breakerOutcome(status, err, set), expected, `${String(status)} ${err?.code ?? '-'} with ${name} → ${expected}`);
});

t.test('record with mayOpen false: held closed at failure_threshold; held(); the next failure may open', async (t) => {
  const c2: BreakerState = { status: 'closed', failures: 2 };
  const c3: BreakerState = { status: 'closed', failures: 3 };
  const cases: [string, BreakerState, 'success' | 'failure' | 'neutral', boolean, BreakerState][] = [
    ['the third failure, bound reached: held at 3', c2, 'failure', false, c3],
    ['the third failure, bound free: opens', c2, 'failure', true, { status: 'open', openedAt: 9 }],
    ['held, another failure, bound still reached: unchanged', c3, 'failure', false, c3],
    ['held, another failure, bound free again: opens', c3, 'failure', true, { status: 'open', openedAt: 9 }],
    ['held, a success: closed and clean', c3, 'success', false, CLOSED],
    ['held, neutral: unchanged', c3, 'neutral', false, c3],
    ['a failure below the threshold ignores the bound', { status: 'closed', failures: 1 }, 'failure', false, c2],
    ['threshold lowered under a held breaker: held at the new threshold', { status: 'closed', failures: 5 }, 'failure', false, c3],
  ];
  for (const [name, s, outcome, mayOpen, after] of cases) t.same(record(s, outcome, false, P, 9, mayOpen), after, name);
  t.equal(record(c3, 'failure', false, P, 9, false), c3, 'held and still bounded: the same object (no allocation)');
  t.same([held(c3, P), held(c2, P), held(CLOSED, P), held({ status: 'open', openedAt: 0 }, P)], [true, false, false, false], 'held: closed at the threshold only');
  t.same(record({ status: 'half_open', probesInFlight: 1 }, 'failure', true, P, 9, false), { status: 'open', openedAt: 9 }, 'a failed probe re-opens whatever the bound (half-open already counts as ejected)');
});

t.test('due: open → half-open (no probe in flight) once open_ms elapsed, by time alone', async (t) => {
  const open: BreakerState = { status: 'open', openedAt: 1_000 };
  const cases: [string, BreakerState, BreakerPolicy, number, BreakerState][] = [
    ['open, 1 ms early', open, P, 1_999, open],
    ['open, due', open, P, 2_000, { status: 'half_open', probesInFlight: 0 }],
    ['open, long past', open, P, 90_000, { status: 'half_open', probesInFlight: 0 }],
    ['open, a longer open_ms now in force', open, { ...P, openMs: 5_000 }, 2_000, open],
    ['open, disabled', open, { ...P, enabled: false }, 9_000, open],
    ['closed', CLOSED, P, 9_000, CLOSED],
    ['half-open with a probe', { status: 'half_open', probesInFlight: 1 }, P, 9_000, { status: 'half_open', probesInFlight: 1 }],
  ];
  for (const [name, s, p, now, after] of cases) t.same(due(s, p, now), after, name);
  t.equal(due(open, P, 1_999), open, 'not due: the same object');
});

t.test('ejectionAllowed: at most max_ejection_percent of the pool, rounded down, at least one unless 0', async (t) => {
  const cases: [number, number, number, boolean][] = [
    // ejected, pool size, percent, one more allowed
    [0, 3, 50, true], [1, 3, 50, false], [0, 2, 50, true], [1, 2, 50, false], [1, 4, 50, true], [2, 4, 50, false],
    [0, 1, 50, true], [1, 1, 50, false], [0, 1, 1, true], [0, 10, 10, true], [1, 10, 10, false], [4, 10, 49, false], [3, 10, 49, true],
    [2, 3, 100, true], [3, 3, 100, false], [0, 3, 0, false], [0, 1, 0, false],
  ];
  for (const [ejected, size, pct, allowed] of cases) t.equal(ejectionAllowed(ejected, size, { ...P, maxEjectionPercent: pct }), allowed, `${ejected} of ${size} ejected, ${pct} %: ${allowed ? 'one more' : 'no more'}`);
});

/** Fake timers: what is armed, with its delay, fired by hand. */
function fakeTimers(): BreakerTimers & { armed: Map<number, { fn: () => void; ms: number }>; fire(): number } {
  const armed = new Map<number, { fn: () => void; ms: number }>();
  let next = 1;
  return {
    armed,
    set: (fn, ms) => {
      armed.set(next, { fn, ms });
      return next++;
    },
    clear: (h) => void armed.delete(h as number),
    /** Fires every armed timer once (those armed while firing wait for the next call); how many fired. */
    fire() {
      const now = [...armed.entries()];
      for (const [h] of now) armed.delete(h);
      for (const [, { fn }] of now) fn();
      return now.length;
    },
  };
}

t.test('registry: within one pool at most max_ejection_percent open; the others held closed and reported; a closed slot lets the next failure open', async (t) => {
  let now = 0;
  const holds: BreakerHold[] = [];
  const seen: string[] = [];
  const reg = new BreakerRegistry((tr) => seen.push(`${tr.key} ${tr.from}→${tr.to}`), () => now, () => now, { onHold: (h) => holds.push(h), timers: fakeTimers() });
  reg.pools([['a', 'b', 'c'], ['solo']]);
  const failN = (key: string, n: number): void => {
    for (let i = 0; i < n; i++) reg.record(key, 'failure', false, P);
  };
  failN('a', 3);
  failN('b', 3);
  failN('c', 5);
  t.same(['a', 'b', 'c'].map((k) => reg.status(k)), ['open', 'closed', 'closed'], '3 backends, 50 %: one ejected (floor 1.5), two held closed');
  t.same(holds.map((h) => `${h.key} ${h.ejected}/${h.poolSize} ${h.first}`), ['b 1/3 true', 'c 1/3 true', 'c 1/3 false', 'c 1/3 false'], 'every refused opening reported, the first of each backend marked');
  t.ok(reg.mayTry('b', P) && reg.mayTry('c', P), 'held backends are still picked');
  const views = reg.views((k) => ({ upstream: 'u', backend: k }));
  t.same(views.map((v) => `${v.backend}:${v.state}:${v.failures}`), ['a:open:0', 'b:closed:3', 'c:closed:3'], 'views: held at failure_threshold failures');

  // a turns half-open: it still counts as ejected.
  now = 1_000;
  t.ok(reg.begin('a', P), 'a probes');
  failN('b', 1);
  t.equal(reg.status('b'), 'closed', 'half-open a still holds the pool at its bound');
  reg.record('a', 'success', true, P);
  t.equal(reg.status('a'), 'closed', 'a closed by its probe');
  failN('b', 1);
  t.equal(reg.status('b'), 'open', 'a slot is free: b\'s next failure opens it');
  failN('a', 3);
  t.equal(reg.status('a'), 'closed', 'and now a is the one held');

  // A pool of one may eject its only backend; an identity in no pool is unbounded.
  failN('solo', 3);
  failN('stray', 3);
  t.same([reg.status('solo'), reg.status('stray')], ['open', 'open'], 'a pool of one fails fast (at least one); an unknown identity is not bounded');
  t.same(seen, ['a closed→open', 'a open→half_open', 'a half_open→closed', 'b closed→open', 'solo closed→open', 'stray closed→open'], 'holds are no transitions');

  // 100 %: every backend of the pool may open; 0 %: none.
  const all = new BreakerRegistry(undefined, () => 0, () => 0, { timers: fakeTimers() });
  all.pools([['x', 'y']]);
  for (const k of ['x', 'y']) for (let i = 0; i < 3; i++) all.record(k, 'failure', false, { ...P, maxEjectionPercent: 100 });
  t.same([all.status('x'), all.status('y')], ['open', 'open'], 'max_ejection_percent 100: both open');
  const noneHolds: BreakerHold[] = [];
  const none = new BreakerRegistry(undefined, () => 0, () => 0, { onHold: (h) => noneHolds.push(h), timers: fakeTimers() });
  none.pools([['x']]);
  for (let i = 0; i < 4; i++) none.record('x', 'failure', false, { ...P, maxEjectionPercent: 0 });
  t.same([none.status('x'), noneHolds.length], ['closed', 2], 'max_ejection_percent 0: never opens, each failure at the threshold reported');
  // A new generation's pools replace the old ones.
  all.pools([['x', 'y', 'z', 'w', 'v']]);
  for (let i = 0; i < 3; i++) all.record('z', 'failure', false, P);
  t.equal(all.status('z'), 'closed', 'new pools: x and y open out of 5, 50 % = 2, so z is held');
});

t.test('registry: an idle open breaker turns half-open at open_ms by its timer; the views apply time too; timers end with the breaker and the registry', async (t) => {
  let now = 0;
  const timers = fakeTimers();
  const seen: BreakerTransition[] = [];
  const reg = new BreakerRegistry((tr) => seen.push(tr), () => now, () => 1_700_000_000_000 + now, { timers });
  const resolve = (k: string) => ({ upstream: 'u', backend: k });
  for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, P);
  t.same([...timers.armed.values()].map((x) => x.ms), [1_000], 'opened at 0: one timer, open_ms ahead');
  now = 1_000;
  t.equal(timers.fire(), 1);
  t.equal(reg.status('k'), 'half_open', 'no request at all: half-open at open_ms');
  t.same(seen.map((x) => `${x.from}→${x.to}@${x.at}`), ['closed→open@0', 'open→half_open@1000'], 'the transition is reported when time made it');
  t.same(reg.views(resolve), [{ upstream: 'u', backend: 'k', state: 'half_open', failures: 0, openUntilUnixMs: null }], 'the view shows half-open');
  t.equal(timers.armed.size, 0, 'no timer while half-open');
  t.ok(reg.mayTry('k', P), 'the next request may probe');
  t.ok(reg.begin('k', P), 'and is the probe');
  t.equal(seen.length, 2, 'the probe itself is no transition (already half-open)');
  now = 1_100;
  reg.record('k', 'failure', true, P);
  t.same([reg.status('k'), [...timers.armed.values()].map((x) => x.ms)], ['open', [1_000]], 'the failed probe re-opens it with a new timer');

  // open_ms lengthened after the timer was armed: the timer fires early, re-arms for the rest.
  reg.mayTry('k', { ...P, openMs: 3_000 });
  now = 2_100;
  timers.fire();
  t.same([reg.status('k'), [...timers.armed.values()].map((x) => x.ms)], ['open', [2_000]], 'a longer open_ms: still open at the old due time, armed for 2000 ms more');
  // Shortened: the view applies it at once, without the timer.
  reg.mayTry('k', { ...P, openMs: 500 });
  t.equal(reg.views(resolve)[0]?.state, 'half_open', 'a shorter open_ms: the next view shows half-open');
  t.equal(timers.armed.size, 0, 'and the timer is gone');

  // A probe success closes it: no timer left. Forgetting an open breaker clears its timer.
  reg.begin('k', P);
  reg.record('k', 'success', true, P);
  t.same([reg.status('k'), timers.armed.size], ['closed', 0], 'closed, no timer');
  for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, P);
  t.equal(timers.armed.size, 1, 'open again: armed');
  reg.retain(new Set());
  t.same([reg.status('k'), timers.armed.size], ['closed', 0], 'retain dropped it and its timer');
  for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, P);
  reg.record('disabled', 'failure', false, P);
  reg.record('k', 'failure', false, { ...P, enabled: false });
  t.same([reg.status('k'), timers.armed.size], ['closed', 0], 'disabling forgets it and its timer');
  for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, P);
  reg.close();
  t.equal(timers.armed.size, 0, 'close clears every timer');
  now = 99_000;
  reg.views(resolve);
  for (let i = 0; i < 3; i++) reg.record('j', 'failure', false, P);
  t.equal(timers.armed.size, 0, 'a closed registry arms nothing (a view still applies time)');
  t.equal(reg.status('k'), 'half_open', 'the view moved k by time');
});

t.test('registry, real timers: an open breaker turns half-open at open_ms with nothing else happening', async (t) => {
  const policy = { ...P, openMs: 30 };
  let opened = 0;
  const half = new Promise<number>((resolve) => {
    const reg = new BreakerRegistry((tr) => tr.to === 'half_open' && resolve(performance.now()));
    t.teardown(() => reg.close());
    opened = performance.now();
    for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, policy);
  });
  // The registry's timer is unref'd (it never keeps a worker alive): this ref'd one keeps the test's process up meanwhile.
  const keepAlive = setTimeout(() => undefined, 5_000);
  const at = await half;
  clearTimeout(keepAlive);
  t.ok(at - opened >= 29, `half-open ${(at - opened).toFixed(1)} ms after it opened (open_ms 30)`);
});
