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
  ['GET', '/admin/runtime/history/12/x', 'not_found'],
  ['POST', '/admin/runtime/history/12', 'method_not_allowed'],
  ['POST', '/admin/runtime/restart', 'restart admin'],
  ['POST', '/admin/runtime/rollback', 'rollback operator'],
];
for (const [method, path, expected] of cases) {
  const m = matchRoute(table, method, path);
  t.equal(typeof m === 'string' ? m : `${m.route.action} ${m.route.role ?? '-'}`, expected, `${method} ${path}`);
}
t.equal((matchRoute(table, 'GET', '/admin/runtime/history/12') as { generation: number }).generation, 12);
t.equal((matchRoute(table, 'GET', '/admin/runtime/history/2147483647') as { generation: number }).generation, 2147483647, 'the largest generation number');
// Not generation numbers: the route matches (a viewer is answered 400, generation-number.ts), with no number.
for (const seg of ['x', '0', '-1', '00', '012', '1.5', '1e3', '2147483648', '9007199254740993', '..', '%2e%2e', '1%00']) {
  const m = matchRoute(table, 'GET', `/admin/runtime/history/${seg}`);
  t.same(typeof m === 'string' ? m : { action: m.route.action, generation: m.generation }, { action: 'history_generation', generation: undefined }, `history/${seg}: no generation number`);
}
