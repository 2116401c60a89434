// A worker's side of the node's circuit breakers (resilience/breaker-follower.ts, issue 39
// Deliver 3), with fake timers and a manual event-loop turn: what travels to the supervisor (only
// outcomes the node can use, one message per turn), the provisional refusal when the node's count
// and this worker's own failures reach the threshold, open kept open whatever the time (a frozen
// supervisor), probe permits (asked once, used once, the epoch carried, given back when idle),
// and the views.
import t from 'tap';
import type { FromWorker, NodeBreakerNotice } from '@edge-proxy/ipc';
import { BreakerFollower, PERMIT_IDLE_MS } from '../src/resilience/breaker-follower.ts';
import type { BreakerApplied } from '../src/resilience/breaker-follower.ts';
import type { BreakerPolicy } from '../src/resilience/circuit-breaker.ts';

type Report = Extract<FromWorker, { type: 'breaker-report' }>;
const P: BreakerPolicy = { enabled: true, failureThreshold: 3, openMs: 1_000, halfOpenMaxProbes: 1, failureStatuses: new Set([502, 503, 504]), maxEjectionPercent: 50 };
const OFF: BreakerPolicy = { ...P, enabled: false };
const NAMES = new Map([
  ['k-a', { upstream: 'api', backend: 'a' }],
  ['k-b', { upstream: 'api', backend: 'b' }],
]);

function harness() {
  const sent: Report[] = [];
  let turn: (() => void)[] = [];
  let timers: { fn: () => void; ms: number; id: number }[] = [];
  let id = 0;
  const applied: BreakerApplied[] = [];
  let sendThrows = false;
  const f = new BreakerFollower({
    send: (r) => {
      if (sendThrows) throw new Error('channel closed');
      sent.push(r);
    },
    where: (key) => NAMES.get(key),
    onApply: (a) => applied.push(a),
    defer: (fn) => turn.push(fn),
    stamp: () => 500,
    timers: {
      set: (fn, ms) => {
        timers.push({ fn, ms, id: ++id });
        return id;
      },
      clear: (h) => (timers = timers.filter((x) => x.id !== h)),
    },
  });
  f.pools([['k-a', 'k-b']]);
  f.retain(new Set(['k-a', 'k-b']));
  const endTurn = (): void => {
    const fns = turn;
    turn = [];
    for (const fn of fns) fn();
  };
  const fire = (): void => {
    const all = timers;
    timers = [];
    for (const x of all) x.fn();
  };
  const notice = (n: Partial<NodeBreakerNotice> & { key: string; status: NodeBreakerNotice['status'] }): NodeBreakerNotice => ({ failures: 0, held: false, epoch: 0, openUntilUnixMs: null, permits: 0, ...n });
  return { f, sent, applied, endTurn, fire, notice, timers: () => timers, turns: () => turn.length, throwOnSend: () => (sendThrows = true) };
}

t.test('what travels: failures, the first success after them, nothing for a success while the node counts nothing; one message per turn', async (t) => {
  const h = harness();
  h.f.record('k-a', 'success', false, P);
  h.f.record('k-a', 'neutral', false, P);
  t.equal(h.turns(), 0, 'a success or a neutral outcome on a backend nothing is held against: nothing scheduled');
  h.f.record('k-a', 'failure', false, P);
  h.f.record('k-b', 'failure', false, P);
  h.f.record('k-a', 'success', false, P);
  h.f.record('k-a', 'success', false, P);
  t.equal(h.turns(), 1, 'one flush scheduled for the turn');
  h.endTurn();
  t.same(h.sent, [{ type: 'breaker-report', outcomes: [
    { key: 'k-a', upstream: 'api', backend: 'a', pool: ['k-a', 'k-b'], outcome: 'failure', probeEpoch: 0 },
    { key: 'k-b', upstream: 'api', backend: 'b', pool: ['k-a', 'k-b'], outcome: 'failure', probeEpoch: 0 },
    { key: 'k-a', upstream: 'api', backend: 'a', pool: ['k-a', 'k-b'], outcome: 'success', probeEpoch: 0 },
  ], asks: [], returns: [] }], 'two failures and the first success after a\'s failure, in one message; the second success stays home');
  h.endTurn();
  t.equal(h.sent.length, 1, 'an empty turn sends nothing');
  h.f.record('k-z', 'failure', false, P);
  t.equal(h.turns(), 0, 'an identity outside the active generation: not reported');
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 2 })], 100);
  h.f.record('k-a', 'success', false, P);
  h.endTurn();
  t.same(h.sent.at(-1)?.outcomes.map((o) => [o.key, o.outcome]), [['k-a', 'success']], 'the node counts 2 failures (from other workers): this worker reports its next success');
  t.same(h.f.views((k) => NAMES.get(k)).map((v) => [v.backend, v.state, v.failures]), [['a', 'closed', 2], ['b', 'closed', 0]], 'views: the node count as told');
});

t.test("provisional refusal: the node's count plus this worker's own failures reach the threshold; the node's next notice replaces it", async (t) => {
  const h = harness();
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 1 })], 100);
  h.f.record('k-a', 'failure', false, P);
  t.ok(h.f.mayTry('k-a', P), '1 told + 1 own: still tried');
  h.f.record('k-a', 'failure', false, P);
  t.notOk(h.f.mayTry('k-a', P), '1 told + 2 own = 3: refused here at once');
  t.equal(h.f.status('k-a'), 'open');
  t.same(h.f.views((k) => NAMES.get(k))[0], { upstream: 'api', backend: 'a', state: 'open', failures: 0, openUntilUnixMs: null });
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 2 })], 100);
  t.ok(h.f.mayTry('k-a', P), 'the node counted 2 (a success elsewhere came between): tried again');
  h.f.record('k-a', 'failure', false, P);
  t.notOk(h.f.mayTry('k-a', P), '2 told + 1 own: refused');
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 3, held: true })], 100);
  t.ok(h.f.mayTry('k-a', P), 'held closed by max_ejection_percent: it keeps serving');
  h.f.record('k-a', 'failure', false, P);
  t.ok(h.f.mayTry('k-a', P), 'and a failure while held refuses nothing');
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 0 })], 100);
  t.same(h.f.views((k) => NAMES.get(k))[0]?.state, 'closed', 'cleared: forgotten');
  for (let i = 0; i < 3; i++) h.f.record('k-b', 'failure', false, P);
  h.f.record('k-b', 'success', false, P);
  t.notOk(h.f.mayTry('k-b', P), 'a success of an attempt begun before keeps the refusal: the node decides');
  h.f.apply([h.notice({ key: 'k-b', status: 'closed', failures: 0 })], 100);
  t.ok(h.f.mayTry('k-b', P));
  const solo = harness();
  for (let i = 0; i < 3; i++) solo.f.record('k-a', 'failure', false, P);
  t.notOk(solo.f.mayTry('k-a', P), 'one worker alone: its own 3 failures refuse the backend at once');
  t.ok(solo.f.mayTry('k-a', OFF), 'disabled: always tried');
});

t.test('open stays open whatever the time; half-open needs a permit, asked once; a probe carries its epoch', async (t) => {
  const h = harness();
  h.f.apply([h.notice({ key: 'k-a', status: 'open', epoch: 4, openUntilUnixMs: 1234 })], 100);
  t.same(h.applied, [{ key: 'k-a', from: 'closed', to: 'open', permits: 0, sentAt: 100, appliedAt: 500 }], 'applied, with the supervisor stamp and ours');
  t.notOk(h.f.mayTry('k-a', P), 'open');
  t.notOk(h.f.begin('k-a', P), 'no probe while open');
  t.same(h.f.views((k) => NAMES.get(k))[0]?.openUntilUnixMs, 1234);
  h.f.record('k-a', 'failure', false, P);
  t.equal(h.turns(), 0, 'a failure of an attempt begun before it opened: not reported');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 4 })], 100);
  t.notOk(h.f.mayTry('k-a', P), 'half-open without a permit: refused');
  t.notOk(h.f.mayTry('k-a', P));
  h.endTurn();
  t.same(h.sent.map((r) => r.asks), [['k-a']], 'and a permit asked for, once');
  t.notOk(h.f.begin('k-a', P), 'no permit: no probe');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 4, permits: 1 })], 100);
  t.ok(h.f.mayTry('k-a', P), 'granted: tried');
  t.equal(h.timers().length, 1, 'an idle timer for the permit');
  t.ok(h.f.begin('k-a', P), 'the attempt is a probe');
  t.equal(h.timers().length, 0, 'its permit used: no idle timer');
  t.notOk(h.f.mayTry('k-a', P), 'the permit is used up');
  h.f.record('k-a', 'failure', true, P);
  h.endTurn();
  t.same(h.sent.at(-1)?.outcomes.map((o) => [o.outcome, o.probeEpoch]), [['failure', 4]], 'the probe outcome carries epoch 4');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 5, permits: 1 })], 100);
  t.ok(h.f.begin('k-a', P), 'a new epoch with a permit: a probe');
  h.f.apply([h.notice({ key: 'k-a', status: 'closed' })], 100);
  h.f.record('k-a', 'neutral', true, P);
  h.endTurn();
  t.same(h.sent.at(-1)?.outcomes.map((o) => [o.outcome, o.probeEpoch]), [['neutral', 5]], 'a probe ending after the close still reports (its permit is the node\'s)');
  t.ok(h.f.mayTry('k-a', P), 'closed');
  t.same(h.applied.map((a) => `${a.from}>${a.to}:${a.permits}`), ['closed>open:0', 'open>half_open:0', 'half_open>half_open:1', 'half_open>half_open:1', 'half_open>closed:0']);
});

t.test('an unused permit goes back after PERMIT_IDLE_MS; retain forgets; disabled forgets; close sends nothing more', async (t) => {
  const h = harness();
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 2, permits: 2 })], 100);
  t.equal(h.timers()[0]?.ms, PERMIT_IDLE_MS);
  h.fire();
  h.endTurn();
  t.same(h.sent.at(-1)?.returns, [{ key: 'k-a', epoch: 2 }, { key: 'k-a', epoch: 2 }], 'both permits given back');
  t.notOk(h.f.mayTry('k-a', P), 'and none left');
  h.f.apply([h.notice({ key: 'k-a', status: 'open', epoch: 3 })], 100);
  h.f.retain(new Set(['k-b']));
  t.ok(h.f.mayTry('k-a', P), 'retain: a backend no live generation uses is forgotten');
  h.f.apply([h.notice({ key: 'k-b', status: 'open', epoch: 1 })], 100);
  h.f.record('k-b', 'failure', false, OFF);
  t.ok(h.f.mayTry('k-b', P), 'disabled: forgotten');
  h.f.apply([h.notice({ key: 'k-b', status: 'half_open', epoch: 1, permits: 1 })], 100);
  h.endTurn();
  h.f.close();
  t.equal(h.timers().length, 0, 'close stops the idle timers');
  t.ok(h.f.begin('k-b', P));
  h.f.record('k-b', 'failure', true, P);
  t.equal(h.turns(), 0, 'closed: nothing scheduled');
  const gone = harness();
  gone.throwOnSend();
  gone.f.record('k-a', 'failure', false, P);
  t.doesNotThrow(() => gone.endTurn(), 'the supervisor gone: the report is dropped');
});

// Cases the mutation run found unchecked.
t.test('follower: idle timers follow the state; a success reported once; views and status; what a flush resets', async (t) => {
  const h = harness();
  t.notOk(h.f.begin('k-a', OFF), 'disabled: no probe');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 1, permits: 1 })], 100);
  t.equal(h.timers().length, 1, 'a permit: its idle timer');
  h.f.apply([h.notice({ key: 'k-a', status: 'open', epoch: 2 })], 100);
  t.equal(h.timers().length, 0, 'open: the idle timer stopped');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 2, permits: 1 })], 100);
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 3, permits: 1 })], 100);
  t.equal(h.timers().length, 1, 'a new epoch: one idle timer, the old one stopped');
  h.f.apply([h.notice({ key: 'k-a', status: 'closed' })], 100);
  t.equal(h.timers().length, 0, 'closed: stopped');
  h.f.apply([h.notice({ key: 'k-b', status: 'half_open', epoch: 1 })], 100);
  t.notOk(h.f.mayTry('k-b', P), 'half-open, no permit: asks');
  h.f.apply([h.notice({ key: 'k-b', status: 'half_open', epoch: 1, permits: 0 })], 100);
  t.equal(h.timers().length, 0, 'a notice with no permit: no idle timer');
  t.notOk(h.f.mayTry('k-b', P));
  h.endTurn();
  t.same(h.sent.map((r) => r.asks), [['k-b']], 'asked once, not again after a notice with no permit');
  h.f.retain(new Set(['k-a']));
  t.equal(h.f.status('k-b'), 'closed', 'retain: b forgotten');
  h.f.apply([h.notice({ key: 'k-a', status: 'half_open', epoch: 4, permits: 1 })], 100);
  h.f.retain(new Set(['k-b']));
  t.equal(h.timers().length, 0, 'a half-open breaker forgotten by retain: its idle timer stopped');
  h.f.retain(new Set(['k-a', 'k-b']));
  h.f.apply([h.notice({ key: 'k-a', status: 'closed', failures: 2 })], 100);
  t.equal(h.f.status('k-a'), 'closed', 'the node counts 2: closed, not refused');
  h.f.retain(new Set(['k-a']));
  t.equal(h.f.status('k-a'), 'closed');
  t.same(h.f.views((k) => NAMES.get(k)).map((v) => [v.backend, v.failures]), [['a', 2]], 'retain keeps what is in use');
  h.f.record('k-a', 'success', false, P);
  h.f.record('k-a', 'success', false, P);
  h.endTurn();
  t.same(h.sent.at(-1)?.outcomes.map((o) => o.outcome), ['success'], 'one success reported, the next stays home');
  t.same(h.sent.at(-1)?.asks, [], 'asks are not sent twice');
  t.same(h.sent.at(-1)?.returns, []);
});

t.test('follower: views list states outside the last retain and skip what resolve does not know; no onApply needed', async (t) => {
  const f = new BreakerFollower({ send: () => undefined, where: (k) => NAMES.get(k), defer: () => undefined, timers: { set: () => 0, clear: () => undefined } });
  f.apply([{ key: 'k-b', status: 'open', failures: 0, held: false, epoch: 1, openUntilUnixMs: 9, permits: 0 }, { key: 'k-x', status: 'open', failures: 0, held: false, epoch: 1, openUntilUnixMs: 9, permits: 0 }], 1);
  t.same(f.views((k) => NAMES.get(k)), [{ upstream: 'api', backend: 'b', state: 'open', failures: 0, openUntilUnixMs: 9 }], 'b listed without a retain; k-x unknown to resolve: left out');
  f.close();
});
