// The snapshot's `admission` and `circuit_breakers` blocks merged from worker heartbeats: sums over
// workers, brownout if any, the worst breaker state with per-state worker counts, and only
// heartbeats of the active generation speaking for its backends.
import t from 'tap';
import type { AdmissionView, BreakerView, WorkerWindow } from '@edge-proxy/ipc';
import { overloadSnapshot } from '../src/supervisor/overload-snapshot.ts';
import type { OverloadSettings, ReportingWorker } from '../src/supervisor/overload-snapshot.ts';

const admission = (o: Partial<AdmissionView> = {}): AdmissionView => ({ adaptiveEnabled: true, adaptiveLimit: 100, minLimit: 10, maxLimit: 200, inflight: 5, queued: 0, queuedByRoute: {}, brownoutActive: false, ...o });
const breaker = (upstream: string, backend: string, state: BreakerView['state']): BreakerView => ({ upstream, backend, state, failures: 0, openUntilUnixMs: state === 'open' ? 1 : null });
function worker(i: number, a: AdmissionView, breakers: BreakerView[], generation = 3): ReportingWorker {
  const window: WorkerWindow = { maxLoopDelayMs: 1, requests: 0, timeoutsOrErrors: 0, inflight: a.inflight, inflightLimit: 4096, generation, backendsHealthy: 0, backendsUnhealthy: 0, admission: a, breakers, quota: { backend_mode: 'local', availability: 'disabled' } };
  return { worker: i, pid: 1000 + i, window };
}
const settings: OverloadSettings = {
  activeGeneration: 3,
  adaptiveEnabled: true,
  globalInflightLimit: 4096,
  breakerEnabled: true,
  backends: [{ upstream: 'api', backend: 'a' }, { upstream: 'api', backend: 'b' }, { upstream: 'web', backend: 'c' }],
};

t.test('admission without the node view (the merge alone): top-level numbers are sums over workers, brownout if any worker has it, one entry per worker', async (t) => {
  const out = overloadSnapshot([
    worker(0, admission({ adaptiveLimit: 80, inflight: 7, queued: 3, queuedByRoute: { api: 2, web: 1 } }), []),
    worker(1, admission({ adaptiveLimit: 120, inflight: 2, queued: 1, queuedByRoute: { api: 1 }, brownoutActive: true }), []),
  ], settings);
  t.same(out.admission, {
    adaptive_enabled: true,
    adaptive_limit: 200,
    min_limit: 20,
    max_limit: 400,
    inflight: 9,
    node_inflight: 9,
    queued: 4,
    brownout_active: true,
    global_inflight_limit: 4096,
    leases: [],
    lease_messages: { from_workers: 0, to_workers: 0 },
    token_budgets: [],
    token_messages: { from_workers: 0, to_workers: 0 },
    window_budgets: [],
    workers: [
      { worker: 0, pid: 1000, adaptive_limit: 80, min_limit: 10, max_limit: 200, inflight: 7, queued: 3, queued_by_route: { api: 2, web: 1 }, brownout_active: false },
      { worker: 1, pid: 1001, adaptive_limit: 120, min_limit: 10, max_limit: 200, inflight: 2, queued: 1, queued_by_route: { api: 1 }, brownout_active: true },
    ],
  });
  t.equal(overloadSnapshot([worker(0, admission(), []), worker(1, admission(), [])], settings).admission.brownout_active, false, 'no worker in brownout: false');
});

t.test("admission with the node's view: the adaptive limit, its range, node_inflight and brownout are the node's; inflight and queued sum the heartbeats; each worker's figures as it reported them", async (t) => {
  const nodeAdmission = { adaptiveEnabled: true, adaptiveLimit: 12, minLimit: 4, maxLimit: 16, inflight: 6, brownoutActive: true };
  const out = overloadSnapshot([
    worker(0, admission({ adaptiveLimit: 12, minLimit: 4, maxLimit: 16, inflight: 4, queued: 1, queuedByRoute: { api: 1 }, brownoutActive: true }), []),
    worker(1, admission({ adaptiveLimit: 16, minLimit: 4, maxLimit: 16, inflight: 1, brownoutActive: false }), []),
  ], { ...settings, nodeAdmission });
  const { leases: _l, lease_messages: _m, token_budgets: _b, token_messages: _tm, window_budgets: _wb, workers, ...top } = out.admission;
  t.same(top, { adaptive_enabled: true, adaptive_limit: 12, min_limit: 4, max_limit: 16, inflight: 5, node_inflight: 6, queued: 1, brownout_active: true, global_inflight_limit: 4096 });
  t.same(workers.map((w) => [w.worker, w.adaptive_limit, w.inflight, w.brownout_active]), [[0, 12, 4, true], [1, 16, 1, false]], 'a worker that has not heard the latest notice shows what it applies');
  t.equal(overloadSnapshot([worker(0, admission({ brownoutActive: true }), [])], { ...settings, nodeAdmission: { ...nodeAdmission, brownoutActive: false } }).admission.brownout_active, false, "the node's state, not any worker's");
});

t.test("admission.leases: the ledger's slot budgets with each worker's lease", async (t) => {
  const leases = [
    { key: 'global', limit: 8, granted: 5, free: 3, contended: true, block: 1, holders: [{ worker: 0, granted: 3, used: 3, need: 0 }, { worker: 2, granted: 2, used: 1, need: 4 }] },
    { key: 'upstream:a', limit: 5, granted: 1, free: 4, contended: false, block: 1, holders: [] },
  ];
  t.same(overloadSnapshot([], { ...settings, leases, leaseTraffic: { asksIn: 7, grantsOut: 5 } }).admission.lease_messages, { from_workers: 7, to_workers: 5 });
  t.same(overloadSnapshot([], { ...settings, leases }).admission.leases, [
    { key: 'global', limit: 8, granted: 5, free: 3, contended: true, block: 1, workers: [{ worker: 0, granted: 3, in_use: 3, waiting: 0 }, { worker: 2, granted: 2, in_use: 1, waiting: 4 }] },
    { key: 'upstream:a', limit: 5, granted: 1, free: 4, contended: false, block: 1, workers: [] },
  ]);
});

t.test("admission.token_budgets: the token ledger's budgets with each worker's holdings, and the token messages", async (t) => {
  const tokenBudgets = [{ budget: 'rl:api', rate: 1, burst: 5, keys: 2, held: 3, workers: [{ worker: 0, held: 1 }, { worker: 3, held: 2 }] }];
  const out = overloadSnapshot([], { ...settings, tokenBudgets, tokenTraffic: { asksIn: 9, grantsOut: 8 } }).admission;
  t.same(out.token_budgets, tokenBudgets);
  t.not(out.token_budgets[0], tokenBudgets[0], 'a copy: the snapshot does not alias the ledger view');
  t.same(out.token_messages, { from_workers: 9, to_workers: 8 });
  const windowBudgets = [{ budget: 'retry:api', base: 30, ratio_percent: 10, window_ms: 10_000, keys: 1, deposits: 200, spent: 12, held: 4, workers: [{ worker: 1, held: 4 }] }];
  t.same(overloadSnapshot([], { ...settings, windowBudgets }).admission.window_budgets, windowBudgets, 'admission.window_budgets: the window ledger as given');
});

t.test('admission before any heartbeat: zeros and no worker; the configured values stay', async (t) => {
  t.same(overloadSnapshot([], { ...settings, adaptiveEnabled: false }).admission, { adaptive_enabled: false, adaptive_limit: 0, min_limit: 0, max_limit: 0, inflight: 0, node_inflight: 0, queued: 0, brownout_active: false, global_inflight_limit: 4096, leases: [], lease_messages: { from_workers: 0, to_workers: 0 }, token_budgets: [], token_messages: { from_workers: 0, to_workers: 0 }, window_budgets: [], workers: [] });
});

t.test('circuit breakers: the worst state any worker reports, with per-state counts, in configuration order', async (t) => {
  const cases: [string, BreakerView['state'][], BreakerView['state']][] = [
    ['all closed', ['closed', 'closed', 'closed'], 'closed'],
    ['one half-open', ['closed', 'half_open', 'closed'], 'half_open'],
    ['open beats half-open', ['half_open', 'open', 'closed'], 'open'],
    ['all open', ['open', 'open', 'open'], 'open'],
  ];
  for (const [name, states, expected] of cases) {
    const out = overloadSnapshot(states.map((s, i) => worker(i, admission(), [breaker('api', 'a', s), breaker('web', 'c', 'closed')])), settings);
    const a = out.circuit_breakers.backends[0];
    t.equal(a?.state, expected, `${name}: ${expected}`);
    t.same(a?.workers, { closed: states.filter((s) => s === 'closed').length, open: states.filter((s) => s === 'open').length, half_open: states.filter((s) => s === 'half_open').length }, `${name}: counts`);
  }
  const out = overloadSnapshot([worker(0, admission(), [breaker('web', 'c', 'open'), breaker('api', 'a', 'closed')])], settings);
  t.same(out.circuit_breakers, {
    enabled: true,
    backends: [
      { upstream: 'api', backend: 'a', state: 'closed', workers: { closed: 1, open: 0, half_open: 0 }, open_until_unix_ms: null },
      { upstream: 'api', backend: 'b', state: 'closed', workers: { closed: 0, open: 0, half_open: 0 }, open_until_unix_ms: null },
      { upstream: 'web', backend: 'c', state: 'open', workers: { closed: 0, open: 1, half_open: 0 }, open_until_unix_ms: 1 },
    ],
  }, 'every backend of the configuration, in its order; one no worker reported counts no worker');
  const until = (ms: number | null, state: BreakerView['state'] = 'open'): BreakerView => ({ ...breaker('api', 'a', state), openUntilUnixMs: ms });
  const spread = overloadSnapshot([worker(0, admission(), [until(1_700_000_002_000)]), worker(1, admission(), [until(1_700_000_005_000)]), worker(2, admission(), [until(null, 'half_open')])], settings);
  t.equal(spread.circuit_breakers.backends[0]?.open_until_unix_ms, 1_700_000_005_000, 'open_until_unix_ms: the latest of the workers that see it open');
});

t.test('circuit breakers: a heartbeat of another generation does not speak for the active one; a backend it names is not added', async (t) => {
  const out = overloadSnapshot([
    worker(0, admission(), [breaker('api', 'a', 'open'), breaker('old', 'z', 'open')], 2),
    worker(1, admission(), [breaker('api', 'a', 'closed')], 3),
  ], { ...settings, breakerEnabled: false });
  t.same(out.circuit_breakers, {
    enabled: false,
    backends: [
      { upstream: 'api', backend: 'a', state: 'closed', workers: { closed: 1, open: 0, half_open: 0 }, open_until_unix_ms: null },
      { upstream: 'api', backend: 'b', state: 'closed', workers: { closed: 0, open: 0, half_open: 0 }, open_until_unix_ms: null },
      { upstream: 'web', backend: 'c', state: 'closed', workers: { closed: 0, open: 0, half_open: 0 }, open_until_unix_ms: null },
    ],
  });
  t.equal(out.admission.workers.length, 2, 'admission still lists both workers (its figures do not depend on the generation)');
});

t.test("circuit breakers: with the node's view, state and open_until_unix_ms are the node's; workers still counts the heartbeats", async (t) => {
  const node = (upstream: string, backend: string) => (upstream === 'api' && backend === 'a' ? { state: 'open' as const, openUntilUnixMs: 1_700_000_009_000 } : { state: 'closed' as const, openUntilUnixMs: null });
  const out = overloadSnapshot([worker(0, admission(), [breaker('api', 'a', 'closed'), breaker('web', 'c', 'half_open')]), worker(1, admission(), [breaker('api', 'a', 'open')])], { ...settings, node });
  t.same(out.circuit_breakers.backends, [
    { upstream: 'api', backend: 'a', state: 'open', workers: { closed: 1, open: 1, half_open: 0 }, open_until_unix_ms: 1_700_000_009_000 },
    { upstream: 'api', backend: 'b', state: 'closed', workers: { closed: 0, open: 0, half_open: 0 }, open_until_unix_ms: null },
    { upstream: 'web', backend: 'c', state: 'closed', workers: { closed: 0, open: 0, half_open: 1 }, open_until_unix_ms: null },
  ], 'one state per backend, the node\'s, whatever a worker\'s heartbeat last said');
});
