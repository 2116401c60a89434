// Which per-backend budgets a configuration defines (inflight-budgets.ts): the one rule both the
// supervisor's ledger and the workers' backend selection decide by, and the budget key.
import t from 'tap';
import { backendBudgetKey, backendLimitBinds } from '../src/index.ts';

t.test('per_backend_inflight_limit binds only below the lower of the global and the upstream limit', async (t) => {
  const cases: [number, number, number, boolean][] = [
    // global, per upstream, per backend, binds
    [4096, 2048, 512, true],
    [4096, 2048, 2047, true],
    [4096, 2048, 2048, false],
    [64, 64, 3, true],
    [3, 64, 3, false],
    [64, 3, 3, false],
    [4, 64, 3, true],
    [64, 4, 3, true],
    [1, 1, 1, false],
  ];
  for (const [g, u, b, binds] of cases) t.equal(backendLimitBinds({ global_inflight_limit: g, per_upstream_inflight_limit: u, per_backend_inflight_limit: b }), binds, `global ${g}, upstream ${u}, backend ${b}`);
});

t.test('the budget key names the pool and the backend id', async (t) => {
  t.equal(backendBudgetKey('app', 'a1'), 'backend:app/a1');
  t.not(backendBudgetKey('app', 'a1'), backendBudgetKey('app', 'a2'));
  t.not(backendBudgetKey('app', 'a1'), backendBudgetKey('api', 'a1'));
});
