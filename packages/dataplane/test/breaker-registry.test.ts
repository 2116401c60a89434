// The breaker registry (resilience/breaker-registry.ts): state per backend identity, a fake clock,
// the policy passed with each call; scripted steps with the exact answer of each, the transitions
// it reports, and the classification of forwarding outcomes.
import t from 'tap';
import { BreakerRegistry, breakerOutcome } from '../src/resilience/breaker-registry.ts';
import { classifyError, codedError } from '../src/proxy/forward.ts';

/** An error code that forward.ts classifies under each reason. */
const CLASSIFYING: Record<string, string> = {
  connect_timeout: 'UND_ERR_CONNECT_TIMEOUT',
  headers_timeout: 'UND_ERR_HEADERS_TIMEOUT',
  body_timeout: 'UND_ERR_BODY_TIMEOUT',
  transport: 'ECONNRESET',
  tls: 'ERR_TLS_CERT_ALTNAME_INVALID',
  client_closed: 'EDGE_CLIENT_CLOSED',
  client_send_timeout: 'EDGE_CLIENT_SEND_TIMEOUT',
  client_body_timeout: 'EDGE_CLIENT_BODY_TIMEOUT',
  request_too_large: 'EDGE_REQUEST_BODY_TOO_LARGE',
  invalid_request: 'UND_ERR_INVALID_ARG',
  internal: 'UND_ERR_DESTROYED',
};
import type { BreakerPolicy, BreakerTransition } from '../src/resilience/breaker-registry.ts';

const P: BreakerPolicy = { enabled: true, failureThreshold: 3, openMs: 1_000, halfOpenMaxProbes: 1, failureStatuses: new Set([502, 503, 504]), maxEjectionPercent: 50 };

/** One scripted call and what it must answer (`record` answers nothing). */
type Step =
  | { at: number; may: boolean; key?: string; policy?: BreakerPolicy }
  | { at: number; begin: boolean; key?: string; policy?: BreakerPolicy }
  | { at: number; record: 'success' | 'failure' | 'neutral'; probe?: boolean; key?: string; policy?: BreakerPolicy }
  | { at: number; status: 'closed' | 'open' | 'half_open'; key?: string };

interface Case {
  name: string;
  steps: Step[];
  /** Transitions reported, as `key from→to@at`. */
  transitions: string[];
}

const fail = (at: number, key?: string): Step => ({ at, record: 'failure', ...(key === undefined ? {} : { key }) });
const openAt = (at: number, key?: string): Step[] => [fail(at, key), fail(at, key), fail(at, key)];

const cases: Case[] = [
  {
    name: 'open → half-open → closed',
    steps: [
      { at: 0, may: true }, { at: 0, begin: false }, fail(0), fail(0),
      { at: 0, status: 'closed' }, fail(10), { at: 10, status: 'open' },
      { at: 1009, may: false }, { at: 1010, may: true }, { at: 1010, status: 'open' },
      { at: 1010, begin: true }, { at: 1010, status: 'half_open' }, { at: 1011, may: false },
      { at: 1050, record: 'success', probe: true }, { at: 1050, status: 'closed' }, { at: 1051, may: true }, { at: 1051, begin: false },
    ],
    transitions: ['b closed→open@10', 'b open→half_open@1010', 'b half_open→closed@1050'],
  },
  {
    name: 'open → half-open → open, then again after another open_ms',
    steps: [
      ...openAt(0), { at: 1000, begin: true }, { at: 1100, record: 'failure', probe: true }, { at: 1100, status: 'open' },
      { at: 2099, may: false }, { at: 2100, may: true }, { at: 2100, begin: true }, { at: 2100, record: 'success', probe: true }, { at: 2100, status: 'closed' },
    ],
    transitions: ['b closed→open@0', 'b open→half_open@1000', 'b half_open→open@1100', 'b open→half_open@2100', 'b half_open→closed@2100'],
  },
  {
    name: 'a success between failures resets the streak',
    steps: [fail(0), fail(0), { at: 0, record: 'success' }, fail(0), fail(0), { at: 0, status: 'closed' }, fail(0), { at: 0, status: 'open' }],
    transitions: ['b closed→open@0'],
  },
  {
    name: 'probe limit: half_open_max_probes 2 admits two concurrent probes, not a third',
    steps: [
      ...openAt(0, 'b').map((s) => ({ ...s, policy: { ...P, halfOpenMaxProbes: 2 } })),
      { at: 1000, begin: true, policy: { ...P, halfOpenMaxProbes: 2 } }, { at: 1000, may: true, policy: { ...P, halfOpenMaxProbes: 2 } },
      { at: 1000, begin: true, policy: { ...P, halfOpenMaxProbes: 2 } }, { at: 1000, may: false, policy: { ...P, halfOpenMaxProbes: 2 } },
      { at: 1000, begin: false, policy: { ...P, halfOpenMaxProbes: 2 } },
      { at: 1001, record: 'success', probe: true, policy: { ...P, halfOpenMaxProbes: 2 } },
      { at: 1002, record: 'failure', probe: true, policy: { ...P, halfOpenMaxProbes: 2 } }, { at: 1002, status: 'closed' },
    ],
    transitions: ['b closed→open@0', 'b open→half_open@1000', 'b half_open→closed@1001'],
  },
  {
    name: 'a neutral probe gives its slot back and decides nothing',
    steps: [
      ...openAt(0), { at: 1000, begin: true }, { at: 1000, may: false },
      { at: 1001, record: 'neutral', probe: true }, { at: 1001, status: 'half_open' }, { at: 1001, may: true },
      { at: 1002, begin: true }, { at: 1003, record: 'failure', probe: true }, { at: 1003, status: 'open' },
    ],
    transitions: ['b closed→open@0', 'b open→half_open@1000', 'b half_open→open@1003'],
  },
  {
    name: 'outcomes of attempts that began before the breaker opened are dropped',
    steps: [...openAt(0), { at: 5, record: 'success' }, { at: 5, status: 'open' }, { at: 1000, begin: true }, { at: 1001, record: 'success', probe: false }, { at: 1001, status: 'half_open' }, { at: 1001, may: false }],
    transitions: ['b closed→open@0', 'b open→half_open@1000'],
  },
  {
    name: 'disabled: always may try, never a probe, outcomes count nothing, and the old state is forgotten',
    steps: [
      ...openAt(0), { at: 1, may: false },
      { at: 1, may: true, policy: { ...P, enabled: false } }, { at: 1, begin: false, policy: { ...P, enabled: false } },
      { at: 2, record: 'failure', policy: { ...P, enabled: false } }, { at: 2, status: 'closed' },
      ...[3, 4, 5].map((at): Step => ({ at, record: 'failure', policy: { ...P, enabled: false } })), { at: 5, status: 'closed' },
      { at: 6, may: true }, fail(6), { at: 6, status: 'closed' },
    ],
    transitions: ['b closed→open@0'],
  },
  {
    name: 'the policy of each call is used: a lower threshold, a shorter open_ms, more probes',
    steps: [
      fail(0), { at: 0, record: 'failure', policy: { ...P, failureThreshold: 2 } }, { at: 0, status: 'open' },
      { at: 100, may: false }, { at: 100, may: true, policy: { ...P, openMs: 100 } },
      { at: 100, begin: true, policy: { ...P, openMs: 100 } }, { at: 100, may: false }, { at: 100, may: true, policy: { ...P, halfOpenMaxProbes: 2 } },
    ],
    transitions: ['b closed→open@0', 'b open→half_open@100'],
  },
  {
    name: 'backends are independent',
    steps: [...openAt(0, 'x'), { at: 1, status: 'open', key: 'x' }, { at: 1, status: 'closed', key: 'y' }, { at: 1, may: true, key: 'y' }, { at: 1, begin: false, key: 'y' }],
    transitions: ['x closed→open@0'],
  },
];

for (const c of cases) {
  t.test(c.name, async (t) => {
    let now = 0;
    const seen: BreakerTransition[] = [];
    const reg = new BreakerRegistry((tr) => seen.push(tr), () => now);
    c.steps.forEach((s, i) => {
      now = s.at;
      const key = s.key ?? 'b';
      const label = `step ${i} at ${s.at}`;
      if ('may' in s) t.equal(reg.mayTry(key, s.policy ?? P), s.may, `${label}: mayTry ${s.may}`);
      else if ('begin' in s) t.equal(reg.begin(key, s.policy ?? P), s.begin, `${label}: begin → probe ${s.begin}`);
      else if ('record' in s) reg.record(key, s.record, s.probe ?? false, s.policy ?? P);
      else t.equal(reg.status(key), s.status, `${label}: ${s.status}`);
    });
    t.same(seen.map((x) => `${x.key} ${x.from}→${x.to}@${x.at}`), c.transitions, 'transitions reported');
  });
}

t.test('transition events carry the failures that opened the breaker', async (t) => {
  const seen: BreakerTransition[] = [];
  const reg = new BreakerRegistry((tr) => seen.push(tr), () => 42);
  for (let i = 0; i < 5; i++) reg.record('k', 'failure', false, { ...P, failureThreshold: 5 });
  t.same(seen, [{ key: 'k', from: 'closed', to: 'open', failures: 5, at: 42 }]);
});

t.test('views: every retained backend of the resolved generation, closed when it has no state; retain drops the rest', async (t) => {
  let now = 0;
  const reg = new BreakerRegistry(undefined, () => now, () => now);
  const where: Record<string, { upstream: string; backend: string }> = { 'api/a': { upstream: 'api', backend: 'a' }, 'api/b': { upstream: 'api', backend: 'b' }, 'web/c': { upstream: 'web', backend: 'c' } };
  const resolve = (key: string) => where[key];
  reg.retain(new Set(['api/a', 'api/b', 'web/c', 'old/z']));
  for (let i = 0; i < 3; i++) reg.record('api/b', 'failure', false, P);
  reg.record('web/c', 'failure', false, P);
  reg.record('old/z', 'failure', false, P);
  now = 500;
  t.same(reg.views(resolve), [
    { upstream: 'api', backend: 'a', state: 'closed', failures: 0, openUntilUnixMs: null },
    { upstream: 'api', backend: 'b', state: 'open', failures: 0, openUntilUnixMs: 1000 },
    { upstream: 'web', backend: 'c', state: 'closed', failures: 1, openUntilUnixMs: null },
  ], 'old/z is not in the resolved generation: left out');
  reg.mayTry('api/b', { ...P, openMs: 800 });
  t.equal(reg.views(resolve)[1]?.openUntilUnixMs, 800, 'a changed open_ms shows in the view once read');
  reg.retain(new Set(['api/a', 'api/b']));
  where['old/z'] = { upstream: 'old', backend: 'z' };
  where['web/c'] = { upstream: 'web', backend: 'c' };
  t.same(reg.views(resolve).map((v) => `${v.backend}:${v.state}`), ['a:closed', 'b:open'], 'retain dropped web/c and old/z with their state');
  t.equal(reg.status('web/c'), 'closed');
  reg.retain(new Set(['api/a', 'api/b', 'web/c']));
  t.same(reg.views(resolve).map((v) => `${v.backend}:${v.state}:${v.failures}`), ['a:closed:0', 'b:open:0', 'c:closed:0'], 'a returning backend starts closed');
  const fresh = new BreakerRegistry();
  for (let i = 0; i < 3; i++) fresh.record('api/a', 'failure', false, P);
  t.same(fresh.views(resolve).map((v) => `${v.backend}:${v.state}`), ['a:open'], 'never retained: backends with a state are listed');
});

t.test('the state machine runs on the monotonic clock: a wall-clock step neither keeps it open nor closes it early; views read unix time', async (t) => {
  let mono = 1_000;
  let wall = 1_700_000_000_000;
  const reg = new BreakerRegistry(undefined, () => mono, () => wall);
  const policy = { ...P, openMs: 1000 };
  for (let i = 0; i < 3; i++) reg.record('k', 'failure', false, policy);
  const resolve = () => ({ upstream: 'u', backend: 'b' });
  t.equal(reg.views(resolve)[0]?.openUntilUnixMs, 1_700_000_001_000, 'view: opened now, may probe in open_ms, in unix ms');
  wall -= 3_600_000; // NTP steps the wall clock back an hour
  mono += 1000;
  t.equal(reg.mayTry('k', policy), true, 'back-stepped wall clock: due after open_ms of monotonic time');
  t.equal(reg.begin('k', policy), true, 'the first probe');
  reg.record('k', 'failure', true, policy);
  t.equal(reg.status('k'), 'open', 'the failed probe re-opened it');
  wall += 7_200_000; // and forward two hours
  mono += 10;
  t.equal(reg.mayTry('k', policy), false, 'forward-stepped wall clock: re-opened for open_ms of monotonic time, not due 10 ms later');
  t.equal(reg.views(resolve)[0]?.openUntilUnixMs, wall + 990, 'view: may probe in 990 ms, in the stepped wall clock\'s unix ms');

  // The defaults: performance.now() for the machine, Date.now() for the views only.
  const real = new BreakerRegistry();
  for (let i = 0; i < 3; i++) real.record('k', 'failure', false, policy);
  const dateNow = Date.now;
  try {
    Date.now = () => dateNow() + 3_600_000;
    t.equal(real.mayTry('k', policy), false, 'default clocks: a wall clock an hour ahead does not make it due');
    const until = real.views(resolve)[0]?.openUntilUnixMs ?? 0;
    t.ok(until > Date.now() && until <= Date.now() + 1000, `default clocks: the view reads the (stepped) wall clock, ${until - Date.now()} ms ahead`);
  } finally {
    Date.now = dateNow;
  }
});

t.test('breakerOutcome: the contract\'s failure definition over statuses and the classes of forward.ts errors', async (t) => {
  const cases: [number | undefined, string | undefined, 'success' | 'failure' | 'neutral'][] = [
    [200, undefined, 'success'], [204, undefined, 'success'], [404, undefined, 'success'], [499, undefined, 'success'],
    // Gateway failures by default (failure_statuses [502, 503, 504]); a 500 or another 5xx is an answer.
    [500, undefined, 'success'], [501, undefined, 'success'], [502, undefined, 'failure'], [503, undefined, 'failure'], [504, undefined, 'failure'], [599, undefined, 'success'],
    [504, 'connect_timeout', 'failure'], [504, 'headers_timeout', 'failure'], [504, 'body_timeout', 'failure'],
    [502, 'transport', 'failure'], [502, 'tls', 'failure'], [200, 'body_timeout', 'failure'], [200, 'transport', 'failure'],
    [499, 'client_closed', 'neutral'], [408, 'client_send_timeout', 'neutral'], [408, 'client_body_timeout', 'neutral'],
    [413, 'request_too_large', 'neutral'], [400, 'invalid_request', 'neutral'], [502, 'internal', 'neutral'],
    [500, 'client_closed', 'neutral'], [undefined, 'client_closed', 'neutral'], [undefined, undefined, 'neutral'],
  ];
  // Each reason is the one forward.ts gives with its coded error; the breaker reads the error's class.
  const errorOf = new Map([...Object.entries(CLASSIFYING)].map(([reason, code]) => [reason, classifyError(codedError(code, reason)).error]));
  for (const [status, reason, expected] of cases) {
    const err = reason === undefined ? undefined : errorOf.get(reason);
    t.equal(breakerOutcome(status, err, P.failureStatuses), expected, `${String(status)} ${String(reason)} (${err?.code ?? '-'}) → ${expected}`);
  }
});
