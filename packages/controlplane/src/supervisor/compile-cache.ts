// Node's compile cache for the workers (docs/decisions.md, "Compile cache for the workers").
//
// Node runs our TypeScript through its type stripping, which loads a WebAssembly compiler (amaro,
// SWC) into the process on the first `.ts` file and keeps it for the life of the process: about
// 15 MiB of memory outside V8's heap plus 5–6 MiB more of the node binary's pages in every worker
// (docs/performance.md, "Worker memory"). Node's compile cache keeps the stripped source and V8's
// code cache of each module on disk; a process whose modules are all in it never loads the
// compiler. So the supervisor keeps one in the state directory (`compile-cache/`), fills it at each
// start with one short-lived process that loads a worker's modules and exits (0.8 s of CPU when
// cold, 0.4 s when warm), and forks every worker with NODE_COMPILE_CACHE pointing at it.
// Node checks each entry against the hash of its source, so an upgrade or an edit recompiles only
// what changed.
//
// The directory holds code the workers run before they drop privileges, so it is used only when it
// is a real directory (not a link), owned by the supervisor's user and writable by nobody else;
// otherwise the workers compile for themselves, which costs memory, never correctness (one warning
// line with its code). An operator's own NODE_COMPILE_CACHE is left as it is, and Node's
// NODE_DISABLE_COMPILE_CACHE turns the cache off for every process.
import { spawn } from 'node:child_process';
import { lstatSync, mkdirSync } from 'node:fs';
import type { Stats } from 'node:fs';
import path from 'node:path';
import { WORKER_WARMUP_ENV } from '@edge-proxy/ipc';
import type { ServiceErrorCode } from '../errors.ts';
import { describeSystemError } from './startup-failure.ts';

/** The cache's directory below the state directory. */
export const COMPILE_CACHE_SUBDIR = 'compile-cache';

/** Longest the warm-up process may take before it is killed and the workers compile for themselves. */
export const WARMUP_TIMEOUT_MS = 30_000;

/** The last bytes of the warm-up's stderr kept for the log line of a failed warm-up. */
const STDERR_TAIL_BYTES = 2048;

/** What the workers get: a directory, or none and why. */
export type CompileCachePlan =
  | { readonly dir: string }
  | { readonly dir?: undefined; readonly off: 'disabled' | 'operator' }
  | { readonly dir?: undefined; readonly problem: { readonly code: ServiceErrorCode; readonly message: string } };

/**
 * Creates (mode 0700) or checks `<stateDir>/compile-cache` for the workers. `euid` is the
 * supervisor's effective user id (the owner the directory must have).
 */
export function planCompileCache(stateDir: string, env: NodeJS.ProcessEnv = process.env, euid: number = process.geteuid?.() ?? -1): CompileCachePlan {
  if (env['NODE_DISABLE_COMPILE_CACHE'] !== undefined && env['NODE_DISABLE_COMPILE_CACHE'] !== '') return { off: 'disabled' };
  if (env['NODE_COMPILE_CACHE'] !== undefined && env['NODE_COMPILE_CACHE'] !== '') return { off: 'operator' };
  const dir = path.resolve(stateDir, COMPILE_CACHE_SUBDIR);
  let st: Stats;
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    st = lstatSync(dir);
  } catch (err) {
    return { problem: { code: 'EDGE_COMPILE_CACHE_UNUSABLE', message: `cannot create or read ${dir}: ${describeSystemError(err)}` } };
  }
  // lstat: a link is never a directory (and a file in its place failed mkdir above).
  if (!st.isDirectory()) return { problem: { code: 'EDGE_COMPILE_CACHE_UNSAFE', message: `${dir} is a link, not a directory of its own` } };
  if (euid !== -1 && st.uid !== euid) return { problem: { code: 'EDGE_COMPILE_CACHE_UNSAFE', message: `${dir} is owned by uid ${st.uid}, not by the service's uid ${euid}` } };
  if ((st.mode & 0o022) !== 0) return { problem: { code: 'EDGE_COMPILE_CACHE_UNSAFE', message: `${dir} is writable by its group or by others (mode ${(st.mode & 0o777).toString(8)})` } };
  return { dir };
}

/**
 * What a worker's environment gets for the cache: its directory, and WORKER_WARMUP_ENV emptied
 * (a value inherited from the supervisor's environment would make every worker leave at once).
 */
export function workerCacheEnv(plan: CompileCachePlan): Record<string, string> {
  return plan.dir === undefined ? { [WORKER_WARMUP_ENV]: '' } : { NODE_COMPILE_CACHE: plan.dir, [WORKER_WARMUP_ENV]: '' };
}

/** How a warm-up ended. */
export type WarmupResult = { readonly ok: true; readonly ms: number } | { readonly ok: false; readonly message: string };

/**
 * Runs `exec` once as a worker would start (same node, same `execArgv`) with the cache enabled and
 * WORKER_WARMUP_ENV set: the worker entry loads its modules and exits 0, and Node writes what it
 * compiled into `dir`. Never rejects.
 */
export function warmCompileCache(o: { readonly exec: string; readonly execArgv: readonly string[]; readonly dir: string; readonly env?: NodeJS.ProcessEnv; readonly timeoutMs?: number }): Promise<WarmupResult> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    let stderr = '';
    let settled = false;
    const done = (r: WarmupResult): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(r);
    };
    const child = spawn(process.execPath, [...o.execArgv, o.exec], {
      env: { ...(o.env ?? process.env), NODE_COMPILE_CACHE: o.dir, [WORKER_WARMUP_ENV]: '1' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      done({ ok: false, message: `the warm-up process was still running after ${o.timeoutMs ?? WARMUP_TIMEOUT_MS} ms: killed` });
    }, o.timeoutMs ?? WARMUP_TIMEOUT_MS);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk: string) => {
      stderr = (stderr + chunk).slice(-STDERR_TAIL_BYTES);
    });
    child.on('error', (err) => done({ ok: false, message: `the warm-up process could not be started: ${describeSystemError(err)}` }));
    child.on('close', (code, signal) => {
      if (code === 0) done({ ok: true, ms: Math.round(performance.now() - t0) });
      else done({ ok: false, message: `the warm-up process ${signal === null ? `exited ${String(code)}` : `was ended by ${signal}`}${lastLine(stderr)}` });
    });
  });
}

/** `: <the last non-empty line>` of a process's stderr, bounded, or nothing. */
function lastLine(text: string): string {
  const line = text.trimEnd().split('\n').at(-1)?.trim() ?? '';
  return line.length === 0 ? '' : `: ${line.slice(0, 300)}`;
}
