// Every control API route with its minimum role, in one table (SPEC "Endpoints"). The reload and
// reload-certs paths come from the configuration; everything else is fixed.
import type { Role } from './auth.ts';
import { parseGenerationText } from '../generations/generation-number.ts';

/** What a route does; also the audit `action` of mutating routes. */
export type RouteAction = 'health' | 'ready' | 'snapshot' | 'history' | 'history_generation' | 'validate' | 'preview' | 'activate' | 'rollback' | 'reload' | 'reload_certs' | 'restart';

export interface RouteDef {
  readonly method: 'GET' | 'POST';
  readonly action: RouteAction;
  /** Undefined: no authentication (SPEC: /health and /ready). */
  readonly role: Role | undefined;
  /** Whether the route changes state (attempt/result audit events, request body allowed). */
  readonly mutating: boolean;
}

export interface RouteMatch {
  readonly route: RouteDef;
  /** `history_generation`: N, or undefined when the segment is not a generation number (answered 400). */
  readonly generation?: number;
}

/** The route table for the configured reload paths. */
export function routeTable(reloadPath: string, reloadCertsPath: string): ReadonlyMap<string, RouteDef> {
  const get = (action: RouteAction, role: Role | undefined): RouteDef => ({ method: 'GET', action, role, mutating: false });
  const post = (action: RouteAction, role: Role): RouteDef => ({ method: 'POST', action, role, mutating: true });
  return new Map<string, RouteDef>([
    ['/health', get('health', undefined)],
    ['/ready', get('ready', undefined)],
    ['/admin/runtime', get('snapshot', 'viewer')],
    ['/admin/runtime/history', get('history', 'viewer')],
    ['/admin/runtime/validate', post('validate', 'operator')],
    ['/admin/runtime/preview', post('preview', 'operator')],
    ['/admin/runtime/activate', post('activate', 'operator')],
    ['/admin/runtime/rollback', post('rollback', 'operator')],
    [reloadPath, post('reload', 'operator')],
    [reloadCertsPath, post('reload_certs', 'operator')],
    ['/admin/runtime/restart', post('restart', 'admin')],
  ]);
}

/** One segment after the history path; whether it is a generation number is generation-number.ts's call. */
const HISTORY_ITEM = /^\/admin\/runtime\/history\/([^/]+)$/;

/** Finds the route of a path; `method_not_allowed` when the path exists for another method. */
export function matchRoute(table: ReadonlyMap<string, RouteDef>, method: string, path: string): RouteMatch | 'not_found' | 'method_not_allowed' {
  const item = HISTORY_ITEM.exec(path);
  if (item !== null) {
    if (method !== 'GET') return 'method_not_allowed';
    const generation = parseGenerationText(item[1] as string);
    return { route: { method: 'GET', action: 'history_generation', role: 'viewer', mutating: false }, ...(generation === undefined ? {} : { generation }) };
  }
  const route = table.get(path);
  if (route === undefined) return 'not_found';
  return route.method === method ? { route } : 'method_not_allowed';
}
