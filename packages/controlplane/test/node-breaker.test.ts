// The node's circuit breakers (issue 39 Deliver 3): the pure policy (breakers/node-breaker.ts),
// table-driven, and the supervisor's owner (breakers/node-breakers.ts) with a fake clock, fake
// timers and a recording sink: failures counted in arrival order across workers, one broadcast per
// change a worker acts on, probe permits bounded node-wide and returned by a worker gone or idle,
// the ejection bound over the node's states, and the gauge/views of one state per backend.
import t from 'tap';
import { Metrics } from '@edge-proxy/telemetry';
import type { ToWorker } from '@edge-proxy/ipc';
import { NODE_CLOSED, ask, due, ejectionAllowed, fill, giveBack, grants, held, outcome, workerGone } from '../src/breakers/node-breaker.ts';
import type { NodeBreakerPolicy, NodeBreakerState } from '../src/breakers/node-breaker.ts';
import { NodeBreakers, nodeBreakerPolicy } from '../src/breakers/node-breakers.ts';
import type { NodeBreakerClock } from '../src/breakers/node-breakers.ts';

const P: NodeBreakerPolicy = { enabled: true, failureThreshold: 3, openMs: 1_000, halfOpenMaxProbes: 2, maxEjectionPercent: 50 };
const OFF: NodeBreakerPolicy = { ...P, enabled: false };
const closed = (failures: number, epoch = 0): NodeBreakerState => ({ status: 'closed', failures, epoch });
const open = (openedAt: number, epoch: number, lastWorker: number): NodeBreakerState => ({ status: 'open', openedAt, epoch, lastWorker });
const half = (epoch: number, granted: number[], waiting: number[] = []): NodeBreakerState => ({ status: 'half_open', epoch, granted, waiting });

t.test('outcome: consecutive failures of any worker open it; success clears; half-open decided by probes of its epoch with a permit', async (t) => {
  const cases: [string, NodeBreakerState, number, 'success' | 'failure' | 'neutral', number, NodeBreakerPolicy, boolean, NodeBreakerState | 'same'][] = [
    ['closed, neutral', closed(1), 0, 'neutral', 0, P, true, 'same'],
    ['closed 0, success', NODE_CLOSED, 0, 'success', 0, P, true, 'same'],
    ['closed 2, success clears', closed(2, 4), 1, 'success', 0, P, true, closed(0, 4)],
    ['closed 0, failure', closed(0, 4), 1, 'failure', 0, P, true, closed(1, 4)],
    ['closed 1, failure', closed(1), 2, 'failure', 0, P, true, closed(2)],
    ['closed 2, failure of worker 3 opens (epoch + 1)', closed(2, 4), 3, 'failure', 0, P, true, open(50, 5, 3)],
    ['closed 2, failure, ejection refused: held at 3', closed(2), 3, 'failure', 0, P, false, closed(3)],
    ['closed 3 held, failure again: same', closed(3), 3, 'failure', 0, P, false, 'same'],
    ['closed 5 (threshold lowered), held: back to 3', closed(5), 3, 'failure', 0, P, false, closed(3)],
    ['open, failure', open(0, 1, 0), 0, 'failure', 1, P, true, 'same'],
    ['open, success', open(0, 1, 0), 0, 'success', 0, P, true, 'same'],
    ['half-open, probe success closes', half(2, [1]), 1, 'success', 2, P, true, closed(0, 2)],
    ['half-open, probe failure reopens (epoch + 1)', half(2, [1, 0]), 1, 'failure', 2, P, true, open(50, 3, 1)],
    ['half-open, probe neutral gives the permit to the next waiting', half(2, [1, 0], [3]), 1, 'neutral', 2, P, true, half(2, [0, 3], [])],
    ['half-open, probe of an older epoch: nothing', half(2, [1]), 1, 'success', 1, P, true, 'same'],
    ['half-open, not a probe: nothing', half(2, [1]), 1, 'failure', 0, P, true, 'same'],
    ['half-open, a worker without a permit: nothing', half(2, [1]), 0, 'success', 2, P, true, 'same'],
    ['disabled: nothing', closed(2), 0, 'failure', 0, OFF, true, 'same'],
  ];
  for (const [name, s, w, o, epoch, p, mayOpen, want] of cases) {
    const got = outcome(s, w, o, epoch, p, 50, mayOpen);
    if (want === 'same') t.equal(got, s, `${name}: the same object`);
    else t.same(got, want, name);
  }
});

t.test('permits: at most half_open_max_probes out node-wide, waiting workers in order, given back, returned by a worker gone', async (t) => {
  let s = due(open(0, 1, 2), P, 1_000);
  t.same(s, half(1, [2]), 'open_ms elapsed: half-open, the worker whose failure opened it holds the first permit');
  const early = open(0, 1, 2);
  t.equal(due(early, P, 999), early, 'not before open_ms: the same object');
  t.same(due(open(0, 1, -1), P, 1_000), half(1, []), 'a worker gone before: nobody offered');
  const h1 = half(1, []);
  t.equal(due(h1, P, 5_000), h1, 'half-open: time does nothing more');
  t.equal(due(early, OFF, 5_000), early, 'disabled: time does nothing');
  s = ask(s, 0, P);
  t.same(s, half(1, [2, 0]), 'worker 0 asks: granted (2 of 2 out)');
  t.same(grants(half(1, [2]), s), new Map([[0, 1]]), 'grants: worker 0 gained one');
  const full = s;
  s = ask(s, 3, P);
  t.same(s, half(1, [2, 0], [3]), 'worker 3 asks with 2 out: it waits');
  t.equal(ask(s, 3, P), s, 'asking again while waiting changes nothing');
  t.same(grants(full, s), new Map(), 'no grant');
  const back = giveBack(s, 2, 1, P);
  t.same(back, half(1, [0, 3], []), 'worker 2 gives its permit back unused: worker 3 gets it');
  t.same(grants(s, back), new Map([[3, 1]]));
  t.equal(giveBack(s, 2, 0, P), s, 'a permit of another epoch: nothing');
  t.equal(giveBack(s, 1, 1, P), s, 'a worker holding none: nothing');
  const gone = workerGone(s, 0, P);
  t.same(gone, half(1, [2, 3], []), 'worker 0 gone: its permit returns to the node and goes to worker 3');
  t.same(workerGone(s, 3, P), half(1, [2, 0], []), 'a waiting worker gone waits no more');
  t.equal(workerGone(s, 1, P), s, 'a worker with nothing: the same state');
  t.same(workerGone(open(0, 1, 2), 2, P), open(0, 1, -1), 'the worker that opened it gone: nobody is offered the first permit');
  const c2 = closed(2);
  t.equal(workerGone(c2, 2, P), c2, 'closed: nothing');
  t.equal(ask(closed(0), 1, P).status, 'closed', 'asking on a closed breaker: nothing');
  t.equal(fill(half(1, [1], []), P).status, 'half_open');
  t.same(grants(half(1, [1]), half(2, [1])), new Map([[1, 1]]), 'a new epoch: every permit is new');
  t.same(grants(half(1, [1]), closed(0)), new Map(), 'closed: no grant');
  t.same(fill(half(1, [], [4, 5, 6]), { ...P, halfOpenMaxProbes: 2 }), half(1, [4, 5], [6]), 'fill moves as many as there is room for');
});

t.test('held and ejectionAllowed', async (t) => {
  t.ok(held(closed(3), P));
  t.notOk(held(closed(2), P));
  t.notOk(held(open(0, 1, 0), P));
  const cases: [number, number, number, boolean][] = [
    [0, 1, 50, true],
    [1, 1, 50, false],
    [0, 3, 50, true],
    [1, 3, 50, false],
    [1, 4, 50, true],
    [2, 4, 50, false],
    [0, 4, 0, false],
    [3, 4, 100, true],
    [4, 4, 100, false],
  ];
  for (const [ejected, size, pct, want] of cases) t.equal(ejectionAllowed(ejected, size, { ...P, maxEjectionPercent: pct }), want, `${ejected} of ${size} ejected, ${pct}%: ${want}`);
});

/** A fake clock with fake timers and a sink recording what each worker is sent. */
function harness(policy: Partial<NodeBreakerPolicy> = {}) {
  let now = 0;
  let timers: { at: number; fn: () => void; id: number }[] = [];
  let id = 0;
  const clock: NodeBreakerClock = {
    now: () => now,
    wallNow: () => 1_700_000_000_000 + now,
    stamp: () => 9_000 + now,
    set: (fn, ms) => {
      timers.push({ at: now + ms, fn, id: ++id });
      return id;
    },
    clear: (h) => (timers = timers.filter((x) => x.id !== h)),
  };
  const sent: { to: number | 'all'; notice: Extract<ToWorker, { type: 'breakers' }> }[] = [];
  const metrics = new Metrics('supervisor');
  const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
  const log = { info: (fields: object, msg: string) => lines.push({ level: 'info', msg, fields: fields as Record<string, unknown> }), warn: (fields: object, msg: string) => lines.push({ level: 'warn', msg, fields: fields as Record<string, unknown> }) };
  const nb = new NodeBreakers({ broadcast: (n) => sent.push({ to: 'all', notice: n }), send: (w, n) => sent.push({ to: w, notice: n }) }, metrics, log as never, clock);
  const cb = { enabled: true, failure_threshold: 3, open_ms: 1_000, half_open_max_probes: 1, failure_statuses: [502, 503, 504], max_ejection_percent: 50, ...snake(policy) };
  const config = (c: object = cb) => ({ config: { resilience: { circuit_breaker: c }, upstream: { api: { name: 'api', backends: [{ id: 'a' }, { id: 'b' }, { id: 'c' }] } } } }) as never;
  nb.configure(config());
  const advance = (ms: number): void => {
    now += ms;
    for (;;) {
      const due = timers.filter((x) => x.at <= now).sort((x, y) => x.at - y.at)[0];
      if (due === undefined) break;
      timers = timers.filter((x) => x !== due);
      due.fn();
    }
  };
  const POOL = ['k-a', 'k-b', 'k-c'];
  const entry = (key: string, o: 'success' | 'failure' | 'neutral', probeEpoch = 0) => ({ key, upstream: 'api', backend: key.slice(2), pool: POOL, outcome: o, probeEpoch });
  const report = (w: number, outcomes: ReturnType<typeof entry>[], asks: string[] = [], returns: { key: string; epoch: number }[] = []): void => nb.report(w, { type: 'breaker-report', outcomes, asks, returns });
  return { nb, sent, lines, metrics, advance, report, entry, config, cb, timers: () => timers };
}

function snake(p: Partial<NodeBreakerPolicy>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (p.failureThreshold !== undefined) out['failure_threshold'] = p.failureThreshold;
  if (p.halfOpenMaxProbes !== undefined) out['half_open_max_probes'] = p.halfOpenMaxProbes;
  if (p.maxEjectionPercent !== undefined) out['max_ejection_percent'] = p.maxEjectionPercent;
  return out;
}

t.test('node breakers: 3 failures from 3 workers open it for all; one broadcast per change; half-open grants one permit; a probe closes it everywhere', async (t) => {
  const h = harness();
  h.report(0, [h.entry('k-a', 'failure')]);
  t.same(h.sent.map((s) => [s.to, s.notice.states.map((n) => [n.key, n.status, n.failures])]), [['all', [['k-a', 'closed', 1]]]], 'the first failure: every worker learns the node counts 1 failure for a (so it reports its next success)');
  h.report(1, [h.entry('k-a', 'failure')]);
  t.same(h.sent.map((s) => s.notice.states[0]?.failures), [1, 2], 'the second: every worker learns the count (one more failure anywhere and a worker refuses at once)');
  h.report(2, [h.entry('k-a', 'failure')]);
  t.same(h.sent.at(-1), { to: 'all', notice: { type: 'breakers', sentAt: 9_000, states: [{ key: 'k-a', status: 'open', failures: 0, held: false, epoch: 1, openUntilUnixMs: 1_700_000_001_000, permits: 0 }] } }, 'the third, from a third worker: open, broadcast to every worker');
  t.same(h.nb.view('api', 'a'), { state: 'open', failures: 0, openUntilUnixMs: 1_700_000_001_000 });
  t.same(h.lines.map((l) => [l.level, l.msg, l.fields['consecutive_failures']]), [['warn', 'circuit breaker opened: backend failing, not picked until open_ms elapsed', 3]], 'one line for the node');
  h.report(3, [h.entry('k-a', 'failure')]);
  t.equal(h.sent.length, 3, 'a failure while open: nothing');
  h.advance(999);
  t.equal(h.sent.length, 3, 'not half-open before open_ms');
  h.advance(1);
  t.same(h.sent.slice(3).map((s) => [s.to, s.notice.states.map((n) => [n.status, n.epoch, n.permits])]), [['all', [['half_open', 1, 0]]], [2, [['half_open', 1, 1]]]], 'at open_ms: half-open to all, then the one permit to worker 2 (whose failure opened it)');
  h.report(0, [], ['k-a']);
  h.report(1, [], ['k-a']);
  t.equal(h.sent.length, 5, 'workers 0 and 1 ask: none granted (1 of 1 out)');
  h.report(2, [], [], [{ key: 'k-a', epoch: 1 }]);
  t.same(h.sent.slice(5).map((s) => [s.to, s.notice.states[0]?.permits]), [[0, 1]], 'worker 2 gives it back unused: worker 0, first to ask, gets it');
  h.nb.workerGone(0);
  t.same(h.sent.slice(6).map((s) => [s.to, s.notice.states[0]?.permits]), [[1, 1]], 'worker 0 dies holding it: it returns to the node, worker 1 gets it');
  h.report(1, [h.entry('k-a', 'success', 1)]);
  t.same(h.sent.at(-1), { to: 'all', notice: { type: 'breakers', sentAt: 10_000, states: [{ key: 'k-a', status: 'closed', failures: 0, held: false, epoch: 1, openUntilUnixMs: null, permits: 0 }] } }, 'its probe succeeds: closed for every worker');
  t.same(h.nb.view('api', 'a'), { state: 'closed', failures: 0, openUntilUnixMs: null });
  t.same(h.nb.view('api', 'z'), { state: 'closed', failures: 0, openUntilUnixMs: null }, 'an unknown backend: closed');
  t.same(h.lines.map((l) => l.fields['to']), ['open', 'half_open', 'closed']);
});

t.test('node breakers: a success on any worker between failures clears the count (consecutive node-wide, in arrival order)', async (t) => {
  const h = harness();
  h.report(0, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure')]);
  h.report(1, [h.entry('k-a', 'success')]);
  t.same(h.sent.map((s) => s.notice.states[0]?.failures), [2, 0], 'one message with the count at 2 (the turn coalesced), then cleared');
  t.same(h.sent.map((s) => s.to), ['all', 'all']);
  h.report(2, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure')]);
  t.equal(h.nb.view('api', 'a').state, 'closed', '2 + 2 failures split by a success: still closed');
  h.report(3, [h.entry('k-a', 'failure')]);
  t.equal(h.nb.view('api', 'a').state, 'open', 'the third consecutive one opens it');
});

t.test('node breakers: a failed probe reopens it with a new epoch; a late probe of the old epoch decides nothing', async (t) => {
  const h = harness({ halfOpenMaxProbes: 2 });
  h.report(0, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-a', 'failure')]);
  h.advance(1_000);
  h.report(1, [], ['k-a']);
  h.report(0, [h.entry('k-a', 'failure', 1)]);
  t.same([h.nb.view('api', 'a').state, h.sent.at(-1)?.notice.states[0]?.epoch], ['open', 2], 'reopened, epoch 2');
  h.advance(1_000);
  h.report(1, [h.entry('k-a', 'success', 1)]);
  t.equal(h.nb.view('api', 'a').state, 'half_open', "worker 1's probe from epoch 1 ends in epoch 2: nothing");
  t.same(h.lines.map((l) => l.msg.split(':')[0]), ['circuit breaker opened', 'circuit breaker half-open', 'circuit breaker re-opened', 'circuit breaker half-open']);
});

t.test('node breakers: max_ejection_percent counts the node: a second backend of 3 is held closed, counted and logged once', async (t) => {
  const h = harness();
  const f = (key: string) => [h.entry(key, 'failure'), h.entry(key, 'failure'), h.entry(key, 'failure')];
  h.report(0, f('k-a'));
  h.report(1, f('k-b'));
  h.report(2, [h.entry('k-b', 'failure')]);
  t.same([h.nb.view('api', 'a').state, h.nb.view('api', 'b').state, h.nb.view('api', 'b').failures], ['open', 'closed', 3], 'a open; b held closed at the threshold (1 of 3 is the bound)');
  const capped = (await h.metrics.counter('svc_circuit_breaker_ejections_capped_total').get()).values;
  t.same(capped.map((v) => [v.labels, v.value]), [[{ upstream: 'api' }, 2]], 'two openings refused, counted per upstream by the supervisor');
  t.equal(h.lines.filter((l) => l.msg.startsWith('circuit breaker held closed')).length, 1, 'one warn line when first held');
  t.same(h.sent.slice(-2).map((s) => [s.to, s.notice.states.map((n) => [n.key, n.status, n.failures, n.held])]), [['all', [['k-b', 'closed', 3, true]]], [2, [['k-b', 'closed', 3, true]]]], 'held: broadcast when it first reaches the threshold; a failure after it is told to the worker that failed, alone');
  const gauge = (await h.metrics.gauge('svc_circuit_breaker_state').get()).values;
  t.same(gauge.map((v) => [v.labels['backend'], v.value]), [['a', 2], ['b', 0], ['c', 0]], 'svc_circuit_breaker_state: one series per configured backend, the node state');
});

t.test('node breakers: greeting, configure (disabled forgets, open_ms change re-arms, a removed backend goes), close', async (t) => {
  const h = harness();
  t.same(h.nb.greeting(), [], 'nothing held: no greeting');
  h.report(0, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-b', 'failure')]);
  const g = h.nb.greeting()[0] as Extract<ToWorker, { type: 'breakers' }>;
  t.same(g.states.map((n) => [n.key, n.status, n.failures]), [['k-a', 'open', 0], ['k-b', 'closed', 1]], 'a new worker is told the open breaker and the counting one');
  h.nb.configure(h.config({ ...h.cb, open_ms: 200 }));
  h.advance(200);
  t.equal(h.nb.view('api', 'a').state, 'half_open', 'a shorter open_ms applies to a breaker already open');
  const before = h.sent.length;
  h.nb.configure(h.config({ ...h.cb, enabled: false }));
  t.same(h.sent.slice(before).map((s) => s.notice.states.map((n) => [n.key, n.status, n.failures])), [[['k-a', 'closed', 0], ['k-b', 'closed', 0]]], 'disabled: every breaker forgotten, closed for every worker');
  h.report(0, [h.entry('k-a', 'failure')]);
  t.equal(h.nb.view('api', 'a').failures, 0, 'disabled: outcomes count nothing');
  t.same(nodeBreakerPolicy({ enabled: true, failure_threshold: 5, open_ms: 7, half_open_max_probes: 2, failure_statuses: [], max_ejection_percent: 10 }), { enabled: true, failureThreshold: 5, openMs: 7, halfOpenMaxProbes: 2, maxEjectionPercent: 10 });
  h.nb.configure(h.config());
  h.report(0, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-a', 'failure')]);
  h.nb.close();
  t.equal(h.timers().length, 0, 'close clears the timers');
  h.report(0, [h.entry('k-b', 'failure')]);
  t.equal(h.nb.view('api', 'b').failures, 0, 'closed: reports are ignored');
});

// Cases the mutation run found unchecked.
t.test('node breakers: each transition line with its fields; one timer per open breaker, re-armed and cleared', async (t) => {
  const h = harness({ halfOpenMaxProbes: 1 });
  const f3 = [h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-a', 'failure')];
  h.report(0, f3);
  t.same(h.timers().map((x) => x.at), [1_000], 'open: one timer, at open_ms');
  t.same(h.nb.view('api', 'a').openUntilUnixMs, 1_700_000_001_000);
  h.advance(300);
  t.same(h.nb.view('api', 'a').openUntilUnixMs, 1_700_000_001_000, 'open_until_unix_ms does not move with time');
  h.advance(700);
  t.same(h.timers(), [], 'half-open: no timer');
  h.report(0, [h.entry('k-a', 'failure', 1)]);
  t.same(h.timers().map((x) => x.at), [2_000], 're-opened at 1000: one timer at 2000');
  h.advance(1_000);
  h.report(0, [h.entry('k-a', 'success', 2)]);
  t.same(h.timers(), [], 'closed: no timer');
  t.same(h.lines.map((l) => [l.level, l.msg, l.fields['upstream'], l.fields['backend'], l.fields['from'], l.fields['to'], l.fields['consecutive_failures'], l.fields['open_ms']]), [
    ['warn', 'circuit breaker opened: backend failing, not picked until open_ms elapsed', 'api', 'a', 'closed', 'open', 3, 1000],
    ['info', 'circuit breaker half-open: open_ms elapsed, the next request probes the backend', 'api', 'a', 'open', 'half_open', undefined, undefined],
    ['warn', 'circuit breaker re-opened: the half-open probe failed', 'api', 'a', 'half_open', 'open', undefined, 1000],
    ['info', 'circuit breaker half-open: open_ms elapsed, the next request probes the backend', 'api', 'a', 'open', 'half_open', undefined, undefined],
    ['info', 'circuit breaker closed: the probe succeeded', 'api', 'a', 'half_open', 'closed', undefined, undefined],
  ]);
  t.same(h.nb.greeting(), [], 'closed again with no failure: no greeting (its epoch is kept, not shown)');
  const sent = h.sent.length;
  h.report(1, [h.entry('k-a', 'success')]);
  h.report(1, [], ['k-a'], [{ key: 'k-a', epoch: 2 }]);
  h.report(1, [], ['k-zz']);
  t.equal(h.sent.length, sent, 'a success, an ask and a return on a closed breaker, an ask for an unknown one: nothing sent');
});

t.test('node breakers: a longer open_ms re-arms the timer for the rest; a removed backend is forgotten; disabled ignores asks', async (t) => {
  const h = harness();
  h.report(0, [h.entry('k-a', 'failure'), h.entry('k-a', 'failure'), h.entry('k-a', 'failure')]);
  h.advance(500);
  h.nb.configure(h.config({ ...h.cb, open_ms: 5_000 }));
  t.same(h.timers().map((x) => x.at), [5_000], 'open_ms 5000 from its opening at 0');
  h.advance(4_000);
  t.equal(h.nb.view('api', 'a').state, 'open', 'still open at 4500');
  h.advance(500);
  t.equal(h.nb.view('api', 'a').state, 'half_open', 'half-open at 5000');
  h.report(1, [h.entry('k-b', 'failure')]);
  const before = h.sent.length;
  const without = { config: { resilience: { circuit_breaker: h.cb }, upstream: { api: { name: 'api', backends: [{ id: 'b' }, { id: 'c' }] } } } } as never;
  h.nb.configure(without);
  t.same(h.sent.slice(before).map((s) => s.notice.states.map((n) => [n.key, n.status])), [[['k-a', 'closed']]], 'a removed: forgotten, closed for every worker; b kept');
  t.same(h.nb.view('api', 'a'), { state: 'closed', failures: 0, openUntilUnixMs: null });
  t.equal(h.nb.view('api', 'b').failures, 1, 'b still counts its failure');
  const g = await h.metrics.gauge('svc_circuit_breaker_state').get();
  t.same(g.values.map((v) => v.labels['backend']), ['b', 'c'], 'the gauge lists the configured backends only (reset each scrape)');
  h.nb.configure(h.config({ ...h.cb, enabled: false }));
  const n = h.sent.length;
  h.report(0, [], ['k-b'], [{ key: 'k-b', epoch: 0 }]);
  t.equal(h.sent.length, n, 'disabled: asks and returns change nothing');
});

t.test('node breakers: the ejection bound counts half-open backends, keeps a pool reported before, and logs a hold once', async (t) => {
  const h = harness({ maxEjectionPercent: 50 });
  const f3 = (key: string) => [h.entry(key, 'failure'), h.entry(key, 'failure'), h.entry(key, 'failure')];
  h.report(0, f3('k-a'));
  h.advance(1_000);
  t.equal(h.nb.view('api', 'a').state, 'half_open');
  h.report(1, [h.entry('k-b', 'failure'), ...f3('k-b').map((e) => ({ ...e, pool: [] })), h.entry('k-b', 'failure')]);
  t.same([h.nb.view('api', 'b').state, h.nb.view('api', 'b').failures], ['closed', 3], 'a half-open counts as ejected: b held (its pool as reported before it, an empty pool changes nothing)');
  t.equal(h.lines.filter((l) => l.msg.startsWith('circuit breaker held closed')).length, 1, 'three held failures: one line');
  const held = h.lines.find((l) => l.msg.startsWith('circuit breaker held closed'));
  t.same(held?.fields, { upstream: 'api', backend: 'b', ejected: 1, pool_size: 3, max_ejection_percent: 50 });
  const n = h.sent.length;
  h.report(1, []);
  t.equal(h.sent.length, n, 'an empty report: nothing (what a turn sent is not sent again)');
  h.report(2, [], ['k-a']);
  h.report(2, []);
  t.equal(h.sent.length, n, 'an ask with the permit out: it waits, nothing sent');
});
