// The process keys, as the supervisor carries them out at start (docs/decisions.md, "Privilege
// drop and process keys"):
// - `security.user` / `security.group`: resolved here once, through NSS (`getent`, as the
//   workers' initgroups will see them); a name that does not exist fails the start, and so does a
//   start that could not switch (neither root nor already that account). Each worker gets the
//   numeric ids and drops after binding (dataplane worker/process-setup.ts). The supervisor keeps
//   its identity: it re-forks workers, which bind as it does, and re-reads certificate and secret
//   files. A root start without `user` logs a warning.
// - `performance.pin_workers`: `taskset` must exist; each worker gets the supervisor's CPU list
//   and pins itself to one CPU of it before binding.
// - `performance.control_plane_threads`: libuv sizes its thread pool from UV_THREADPOOL_SIZE once,
//   when the pool starts, so the value must be in the environment at exec: `serve` re-executes
//   itself once (process.execve: same pid, same arguments) with it set, and afterwards puts the
//   environment back as it was, so that workers and `restart_command` inherit the operator's.
import { execFileSync } from 'node:child_process';
import { randomFill } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { NormalizedConfig } from '@edge-proxy/config';
import { WORKER_CPUS_ENV, WORKER_DROP_ENV } from '@edge-proxy/ipc';
import type { DropTarget } from '@edge-proxy/ipc';
import type { ServiceErrorCode } from '../errors.ts';

/** A host condition that keeps the configuration from being carried out, with the key it is about. */
export interface HostProblem {
  readonly path: string;
  readonly code: ServiceErrorCode;
  readonly message: string;
}

/** Set across the re-exec: the environment's UV_THREADPOOL_SIZE before it (empty: unset). */
const THREADPOOL_WAS_ENV = 'EDGE_PROXY_UV_THREADPOOL_SIZE_WAS';
/** libuv's pool size when UV_THREADPOOL_SIZE is unset. */
const LIBUV_DEFAULT_THREADS = 4;

/** One passwd or group entry through NSS (`getent`); /etc/passwd, /etc/group where getent is missing. */
function lookup(db: 'passwd' | 'group', name: string): string[] | undefined {
  try {
    const line = execFileSync('getent', [db, name], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).split('\n')[0] ?? '';
    return line.length > 0 ? line.split(':') : undefined;
  } catch (err) {
    // getent exits 2 when the key is not found.
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return undefined;
    try {
      const entry = readFileSync(`/etc/${db}`, 'utf8')
        .split('\n')
        .find((l) => l.split(':')[0] === name);
      return entry?.split(':');
    } catch {
      return undefined;
    }
  }
}

/** Resolves `security.user` / `security.group`; a name with no entry is a problem. */
export function resolveDropTarget(security: NormalizedConfig['security']): { target?: DropTarget; problems: HostProblem[] } {
  const problems: HostProblem[] = [];
  if (security.user === undefined && security.group === undefined) return { problems };
  let uid: number | undefined;
  let userGid: number | undefined;
  if (security.user !== undefined) {
    const pw = lookup('passwd', security.user);
    if (pw === undefined) problems.push({ path: 'security.user', code: 'EDGE_STARTUP_ACCOUNT', message: `no user '${security.user}' on this host` });
    else [uid, userGid] = [Number(pw[2]), Number(pw[3])];
  }
  let gid = userGid;
  if (security.group !== undefined) {
    const gr = lookup('group', security.group);
    if (gr === undefined) problems.push({ path: 'security.group', code: 'EDGE_STARTUP_ACCOUNT', message: `no group '${security.group}' on this host` });
    else gid = Number(gr[2]);
  }
  if (problems.length > 0 || gid === undefined) return { problems };
  return { target: { ...(security.user === undefined ? {} : { user: security.user }), ...(uid === undefined ? {} : { uid }), gid }, problems };
}

/** Whether util-linux `taskset` can be run. */
function hasTaskset(): boolean {
  try {
    execFileSync('taskset', ['--version'], { stdio: 'ignore', timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

/**
 * What the host keeps from being carried out, as far as it can be known without starting:
 * accounts that do not exist, `pin_workers` without `taskset`. `edge-proxy -c` prints these too.
 */
export function hostProblems(config: Pick<NormalizedConfig, 'security' | 'performance'>): HostProblem[] {
  const problems = [...resolveDropTarget(config.security).problems];
  if (config.performance.pin_workers && (process.platform !== 'linux' || !hasTaskset())) {
    problems.push({ path: 'performance.pin_workers', code: 'EDGE_STARTUP_PIN_WORKERS', message: 'pin_workers needs Linux and util-linux `taskset` on PATH' });
  }
  return problems;
}

/** The CPUs this process may run on (`Cpus_allowed_list`: `0-3,6`), in order. */
export function allowedCpus(status = readFileSync('/proc/self/status', 'utf8')): number[] {
  const list = /^Cpus_allowed_list:\s*(\S+)$/m.exec(status)?.[1] ?? '';
  return list.split(',').flatMap((part) => {
    const [a, b] = part.split('-').map(Number);
    if (a === undefined || !Number.isInteger(a)) return [];
    return b === undefined ? [a] : Array.from({ length: b - a + 1 }, (_, i) => a + i);
  });
}

/**
 * Re-executes this process with UV_THREADPOOL_SIZE = `threads` when the environment would give
 * libuv another size. Returns only when there is nothing to do (or it was done: the marker is set).
 */
export function reexecForThreadpool(threads: number, env: NodeJS.ProcessEnv = process.env): void {
  if (env[THREADPOOL_WAS_ENV] !== undefined) return;
  const current = Number(env['UV_THREADPOOL_SIZE'] ?? LIBUV_DEFAULT_THREADS);
  if (current === threads) return;
  process.execve?.(process.execPath, [process.execPath, ...process.execArgv, ...process.argv.slice(1)], { ...env, UV_THREADPOOL_SIZE: String(threads), [THREADPOOL_WAS_ENV]: env['UV_THREADPOOL_SIZE'] ?? '' });
}

/** Starts libuv's pool (if nothing has yet), then gives the environment its value from before the re-exec. */
async function restoreThreadpoolEnv(env: NodeJS.ProcessEnv): Promise<void> {
  const was = env[THREADPOOL_WAS_ENV];
  if (was === undefined) return;
  // A crypto job runs on the pool: once it has run, the pool exists with its size fixed.
  await new Promise((resolve) => randomFill(Buffer.alloc(1), resolve));
  if (was === '') delete env['UV_THREADPOOL_SIZE'];
  else env['UV_THREADPOOL_SIZE'] = was;
  delete env[THREADPOOL_WAS_ENV];
}

/** How the supervisor carries out the process keys, or the problem that stops the start. */
export interface ProcessKeys {
  /** Environment of every worker: its CPU list and the account to switch to. */
  readonly workerEnv: Record<string, string>;
  readonly problem?: HostProblem;
  /** Lines to log: the root start without `user`, what the workers will do. */
  readonly notes: { readonly level: 'info' | 'warn'; readonly fields: Record<string, unknown>; readonly message: string }[];
}

/** The supervisor's effective ids. */
export interface ProcessIds {
  readonly euid: number;
  readonly egid: number;
}

/** Checks the host and prepares the workers' environment. */
export async function prepareProcessKeys(
  config: Pick<NormalizedConfig, 'security' | 'performance'>,
  workers: number,
  ids: ProcessIds = { euid: process.geteuid?.() ?? -1, egid: process.getegid?.() ?? -1 },
  env: NodeJS.ProcessEnv = process.env,
): Promise<ProcessKeys> {
  const { euid, egid } = ids;
  const threads = config.performance.control_plane_threads;
  // Re-executed for it, or the environment already said so (reexecForThreadpool returned).
  const sized = env[THREADPOOL_WAS_ENV] !== undefined || Number(env['UV_THREADPOOL_SIZE'] ?? LIBUV_DEFAULT_THREADS) === threads;
  await restoreThreadpoolEnv(env);
  const notes: ProcessKeys['notes'][number][] = [];
  if (sized) notes.push({ level: 'info', fields: { control_plane_threads: threads }, message: 'control-plane thread pool sized' });
  else notes.push({ level: 'warn', fields: { control_plane_threads: threads, uv_threadpool_size: env['UV_THREADPOOL_SIZE'] ?? String(LIBUV_DEFAULT_THREADS) }, message: 'control_plane_threads not applied: this supervisor was not started by `edge-proxy serve`, which re-executes itself to size the pool' });
  const problem = hostProblems(config)[0];
  if (problem !== undefined) return { workerEnv: {}, problem, notes };
  const { target } = resolveDropTarget(config.security);
  const workerEnv: Record<string, string> = {};
  if (target !== undefined) {
    // Not root: the workers cannot switch, unless they already run as that account.
    if (euid !== 0 && ((target.uid !== undefined && target.uid !== euid) || target.gid !== egid)) {
      const who = [config.security.user, config.security.group].filter((x) => x !== undefined).join(':');
      return { workerEnv, problem: { path: config.security.user === undefined ? 'security.group' : 'security.user', code: 'EDGE_STARTUP_PRIVILEGE', message: `the service runs as uid ${euid}, not root: its workers cannot switch to ${who}` }, notes };
    }
    workerEnv[WORKER_DROP_ENV] = JSON.stringify(target);
    const fields = { user: config.security.user ?? null, group: config.security.group ?? null, uid: target.uid ?? null, gid: target.gid };
    notes.push({ level: 'info', fields, message: euid === 0 ? 'workers drop privileges after binding' : 'already running as security.user/group: nothing to switch' });
  }
  if (euid === 0 && target?.uid === undefined) {
    notes.push({ level: 'warn', fields: { uid: 0 }, message: 'running as root without security.user: the workers keep root after binding (set security.user and security.group, or run the service as its own user)' });
  }
  if (config.performance.pin_workers) {
    const cpus = allowedCpus();
    workerEnv[WORKER_CPUS_ENV] = cpus.join(',');
    notes.push({ level: 'info', fields: { cpus, workers }, message: 'workers pinned one per CPU' });
  }
  return { workerEnv, notes };
}
