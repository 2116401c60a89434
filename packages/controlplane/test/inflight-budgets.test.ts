// The in-flight budgets the supervisor's ledger holds for a configuration (limits/lease-service.ts
// `inflightBudgets`): `global`; `upstream:<pool>` where the upstream limit is below the global one;
// `backend:<pool>/<id>` for every backend where the backend limit is below both (the rule the
// workers take a backend slot by, `backendLimitBinds`).
import t from 'tap';
import type { ResolvedConfig } from '@edge-proxy/config';
import { inflightBudgets } from '../src/limits/lease-service.ts';

type Config = ResolvedConfig['config'];

function config(global: number, upstream: number, backend: number): Config {
  const pool = (name: string, ids: string[]): unknown => ({ name, backends: ids.map((id) => ({ id })) });
  return { performance: { global_inflight_limit: global, per_upstream_inflight_limit: upstream, per_backend_inflight_limit: backend }, upstream: { app: pool('app', ['a', 'b']), api: pool('api', ['c']) } } as unknown as Config;
}

t.test('budgets of each binding', async (t) => {
  const cases: [string, Config, Record<string, number>][] = [
    ['every limit binds', config(64, 32, 3), { global: 64, 'upstream:app': 32, 'upstream:api': 32, 'backend:app/a': 3, 'backend:app/b': 3, 'backend:api/c': 3 }],
    ['the backend limit at the upstream one: no backend budget', config(64, 3, 3), { global: 64, 'upstream:app': 3, 'upstream:api': 3 }],
    ['the upstream limit at the global one: no upstream budget, the backend one below it', config(64, 64, 3), { global: 64, 'backend:app/a': 3, 'backend:app/b': 3, 'backend:api/c': 3 }],
    ['the backend limit at the global one: none but global', config(8, 8, 8), { global: 8 }],
  ];
  for (const [name, c, want] of cases) t.same(Object.fromEntries([...inflightBudgets(c)].map(([k, s]) => [k, s.kind === 'slots' ? s.limit : -1])), want, name);
});
