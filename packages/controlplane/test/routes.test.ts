// The route table: configured reload paths, fixed routes, roles, 404/405.
import t from 'tap';
import { matchRoute, routeTable } from '../src/api/routes.ts';

const table = routeTable('/ops/reload', '/ops/certs');
const cases: [string, string, string][] = [
  ['POST', '/ops/reload', 'reload operator'],
  ['POST', '/ops/certs', 'reload_certs operator'],
  ['POST', '/admin/runtime/reload', 'not_found'],
  ['GET', '/ops/reload', 'method_not_allowed'],
  ['GET', '/health', 'health -'],
  ['GET', '/admin/runtime', 'snapshot viewer'],
  ['GET', '/admin/runtime/history/12', 'history_generation viewer'],
  ['GET', '/admin/runtime/history/x', 'not_found'],
  ['POST', '/admin/runtime/history/12', 'method_not_allowed'],
  ['POST', '/admin/runtime/restart', 'restart admin'],
  ['POST', '/admin/runtime/rollback', 'rollback operator'],
];
for (const [method, path, expected] of cases) {
  const m = matchRoute(table, method, path);
  t.equal(typeof m === 'string' ? m : `${m.route.action} ${m.route.role ?? '-'}`, expected, `${method} ${path}`);
}
t.equal((matchRoute(table, 'GET', '/admin/runtime/history/12') as { generation: number }).generation, 12);
