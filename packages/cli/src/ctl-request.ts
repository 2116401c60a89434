// `edge-proxy ctl`: what each operation asks of the control API (docs/control-api.md), and what its
// answer means for a script: the exit status and the one stderr line of a failure. Pure: no
// sockets, no files; the HTTPS call is ctl-client.ts, the target ctl-target.ts.
import path from 'node:path';
import { formatIssue } from '@edge-proxy/config';
import type { ConfigIssue } from '@edge-proxy/config';

/**
 * Exit statuses of `edge-proxy ctl` (docs/operations.md "edge-proxy ctl"), declared once. `usage`
 * and `unreachable` share 1: no answer came from the control API (bad arguments, connection
 * refused, TLS failure, timeout, an answer too large or not JSON).
 */
export const CTL_EXIT = Object.freeze({
  ok: 0,
  usage: 1,
  unreachable: 1,
  /** 400 (and any other 4xx not listed), or a validate/preview plan with `candidate_status: invalid`. */
  invalid: 2,
  /** 409 (`stale_generation`, `restart_required`, ...), or such a validate/preview plan. */
  conflict: 3,
  /** 401 or 403: authentication, role, source address, `config_path_not_allowed`. */
  denied: 4,
  /** 404: `generation_not_retained`, or a route the server does not have. */
  not_found: 5,
  /** 5xx: `prepare_failed`, `swap_failed`, `cert_reload_failed`, `control_plane_busy`, ... */
  server_error: 6,
});

/** The operations, in the order `--help` lists them. */
export const CTL_OPERATIONS = ['status', 'history', 'validate', 'preview', 'activate', 'reload', 'rollback', 'reload-certs', 'restart'] as const;
export type CtlOperation = (typeof CTL_OPERATIONS)[number];

/** Operations whose body is an activation request (`config_path`, `expected_generation`, ...). */
export const ACTIVATION_OPERATIONS: readonly CtlOperation[] = ['validate', 'preview', 'activate', 'reload'];

/** What the command line asked for (options that do not apply to the operation are absent). */
export interface CtlArgs {
  readonly operation: CtlOperation;
  /** `history N`: one generation's records. */
  readonly generation?: number;
  /** `rollback --to N`. */
  readonly to?: number;
  readonly configPath?: string;
  readonly expectedGeneration?: number;
  readonly expectedActiveGeneration?: number;
  readonly reason?: string;
  readonly requestedBy?: string;
}

/** The two configurable routes (`observability.control_api.reload_path`, `reload_certs_path`). */
export interface ApiPaths {
  readonly reload: string;
  readonly reloadCerts: string;
}

export const DEFAULT_API_PATHS: ApiPaths = { reload: '/admin/runtime/reload', reloadCerts: '/admin/runtime/reload-certs' };

export interface CtlRequest {
  readonly method: 'GET' | 'POST';
  readonly path: string;
  /** JSON body of a POST (an empty object when the operation takes none). */
  readonly body?: Readonly<Record<string, unknown>>;
}

const defined = (o: Record<string, unknown>): Record<string, unknown> => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));

/**
 * The request of an operation. `config_path` is made absolute against `cwd`: the service resolves
 * a relative one against its own working directory, not the caller's.
 */
export function ctlRequest(a: CtlArgs, paths: ApiPaths = DEFAULT_API_PATHS, cwd = process.cwd()): CtlRequest {
  const activation = (): Record<string, unknown> =>
    defined({
      config_path: a.configPath === undefined ? undefined : path.resolve(cwd, a.configPath),
      expected_generation: a.expectedGeneration,
      reason: a.reason,
      requested_by: a.requestedBy,
    });
  switch (a.operation) {
    case 'status':
      return { method: 'GET', path: '/admin/runtime' };
    case 'history':
      return { method: 'GET', path: a.generation === undefined ? '/admin/runtime/history' : `/admin/runtime/history/${a.generation}` };
    case 'validate':
    case 'preview':
    case 'activate':
      return { method: 'POST', path: `/admin/runtime/${a.operation}`, body: activation() };
    case 'reload':
      return { method: 'POST', path: paths.reload, body: activation() };
    case 'rollback':
      return { method: 'POST', path: '/admin/runtime/rollback', body: defined({ target_generation: a.to, expected_active_generation: a.expectedActiveGeneration, reason: a.reason, requested_by: a.requestedBy }) };
    case 'reload-certs':
      return { method: 'POST', path: paths.reloadCerts, body: {} };
    case 'restart':
      return { method: 'POST', path: '/admin/runtime/restart', body: {} };
  }
}

/** The exit status of an HTTP status. */
export function exitForStatus(status: number): number {
  if (status >= 200 && status < 300) return CTL_EXIT.ok;
  if (status === 401 || status === 403) return CTL_EXIT.denied;
  if (status === 404) return CTL_EXIT.not_found;
  if (status === 409) return CTL_EXIT.conflict;
  if (status >= 400 && status < 500) return CTL_EXIT.invalid;
  if (status >= 500 && status < 600) return CTL_EXIT.server_error;
  return CTL_EXIT.unreachable;
}

type Body = Record<string, unknown>;
const isObject = (v: unknown): v is Body => v !== null && typeof v === 'object' && !Array.isArray(v);

/**
 * Plans of validate and preview are answered 200 whatever the candidate is worth; a script asks
 * whether activation would take it, so a plan activation would refuse fails as activation would
 * (same reason and message as activate's 400/409).
 */
const PLAN_REFUSALS: Readonly<Record<string, { exit: number; reason: string; message: string }>> = {
  invalid: { exit: CTL_EXIT.invalid, reason: 'invalid_config', message: 'the candidate configuration is invalid' },
  stale_generation: { exit: CTL_EXIT.conflict, reason: 'stale_generation', message: 'expected_generation does not match the active generation' },
  restart_required: { exit: CTL_EXIT.conflict, reason: 'restart_required', message: 'the candidate changes settings that require a restart' },
};

/** What an answer means: its exit status and, for a failure, the reason and message to print. */
export interface Outcome {
  readonly exit: number;
  readonly reason?: string;
  readonly message?: string;
}

/** The outcome of an answer (`body` undefined when it was not JSON). */
export function outcomeOf(operation: CtlOperation, status: number, body: unknown): Outcome {
  const exit = exitForStatus(status);
  if (exit === CTL_EXIT.ok) {
    if (!isObject(body)) return { exit: CTL_EXIT.unreachable, reason: 'invalid_response', message: 'the answer is not a JSON object' };
    const planStatus = operation === 'validate' || operation === 'preview' ? body['candidate_status'] : undefined;
    const refusal = typeof planStatus === 'string' ? PLAN_REFUSALS[planStatus] : undefined;
    return refusal ?? { exit };
  }
  const reason = isObject(body) && typeof body['reason'] === 'string' ? body['reason'] : 'http_error';
  const message = isObject(body) && typeof body['message'] === 'string' ? body['message'] : 'the answer carries no JSON error';
  return { exit, reason, message };
}

/** `path: CODE: message` of an issue or a rejected change (restart-required changes name their reason). */
function problemLine(p: unknown): string | undefined {
  if (!isObject(p) || typeof p['path'] !== 'string') return undefined;
  if (typeof p['code'] === 'string') return formatIssue({ path: p['path'], code: p['code'], message: typeof p['message'] === 'string' ? p['message'] : '' } as ConfigIssue);
  if (typeof p['activation'] === 'string') return `${p['path']}: ${p['activation']}: ${typeof p['reason'] === 'string' ? p['reason'] : String(p['change'] ?? '')}`;
  return undefined;
}

/**
 * Every configuration problem an answer carries, one `path: CODE: message` each: `errors[]` (a plan,
 * reload-certs), `rejected_changes[]` (a plan: restart-required changes, stale generation), and the
 * same inside `plan` (the 400 and 409 answers of activate and reload).
 */
export function problemLines(body: unknown): string[] {
  if (!isObject(body)) return [];
  const from = (b: Body): unknown[] => [...(Array.isArray(b['errors']) ? b['errors'] : []), ...(Array.isArray(b['rejected_changes']) ? b['rejected_changes'] : [])];
  const all = [...from(body), ...(isObject(body['plan']) ? from(body['plan']) : [])];
  return [...new Set(all.map(problemLine).filter((l): l is string => l !== undefined))];
}

/** One printable line: control characters (newlines included) become spaces. */
export function oneLine(s: string): string {
  return s.replace(/\p{Cc}/gu, ' ');
}

/**
 * The stderr line of a failure: `edge-proxy ctl OP: STATUS REASON: MESSAGE[; PROBLEM]...` (STATUS
 * is `-` when no answer came).
 */
export function failureLine(operation: CtlOperation | undefined, status: number | undefined, reason: string, message: string, problems: readonly string[] = []): string {
  const head = `edge-proxy ctl${operation === undefined ? '' : ` ${operation}`}: ${status ?? '-'} ${reason}: ${message}`;
  return oneLine([head, ...problems].join('; '));
}
