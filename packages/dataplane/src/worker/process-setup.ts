// What a worker does to its own process on its first commit, from what the supervisor decided at
// start and put in its environment (the supervisor resolves names and checks the host once, and
// fails the start when it cannot; see controlplane supervisor/process-keys.ts):
// - `performance.pin_workers`: before binding, every thread of the process is pinned to one CPU
//   (`taskset -a`; threads started later inherit the mask of the thread that starts them);
// - `security.user` / `security.group`: after every listener is bound, the process switches to
//   that user and group for good (supplementary groups, then gid, then uid), and proves it cannot
//   switch back. A worker that cannot do either fails its commit: it never serves unpinned or as
//   root when the configuration says otherwise.
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { WORKER_CPUS_ENV, WORKER_DROP_ENV } from '@edge-proxy/ipc';
import type { DropTarget } from '@edge-proxy/ipc';

/** What this worker process is to do, read from its environment. */
export interface ProcessPlan {
  /** The CPU to pin this worker to. */
  readonly cpu?: number;
  readonly drop?: DropTarget;
}

function coded(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/**
 * The plan of worker `index`: `EDGE_WORKER_CPUS` is the supervisor's CPU list (`0,1,2`); worker i
 * takes the (i mod n)-th. `EDGE_WORKER_DROP` is `{"user","uid","gid"}` as JSON.
 */
export function processPlan(env: NodeJS.ProcessEnv, index: number): ProcessPlan {
  const cpus = (env[WORKER_CPUS_ENV] ?? '').split(',').filter((c) => /^\d+$/.test(c)).map(Number);
  const dropText = env[WORKER_DROP_ENV];
  const drop = dropText === undefined || dropText === '' ? undefined : (JSON.parse(dropText) as DropTarget);
  return { ...(cpus.length > 0 && index >= 0 ? { cpu: cpus[index % cpus.length] as number } : {}), ...(drop === undefined ? {} : { drop }) };
}

/** The CPU list of each thread of this process (`/proc/self/task/<tid>/status`). */
function threadMasks(): string[] {
  return readdirSync('/proc/self/task').flatMap((tid) => {
    try {
      const m = /^Cpus_allowed_list:\s*(\S+)$/m.exec(readFileSync(`/proc/self/task/${tid}/status`, 'utf8'));
      return m === null ? [] : [m[1] as string];
    } catch {
      return []; // the thread ended meanwhile
    }
  });
}

/**
 * Pins every thread of this process to `cpu` with util-linux `taskset -a` (Node has no affinity
 * call). Synchronous, so the main thread starts no thread meanwhile; checked on every thread.
 */
export function pinToCpu(cpu: number): void {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      execFileSync('taskset', ['-a', '-p', '-c', String(cpu), String(process.pid)], { stdio: 'ignore', timeout: 5000 });
    } catch (err) {
      throw coded('EDGE_WORKER_CPU_PIN', `taskset could not pin the worker to CPU ${cpu}: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (threadMasks().every((m) => m === String(cpu))) return;
  }
  throw coded('EDGE_WORKER_CPU_PIN', `a thread of the worker is not on CPU ${cpu} after taskset`);
}

/**
 * Switches this process to `target` for good. As root: supplementary groups (the user's, plus the
 * group; only the group without a user), gid, uid; then a switch back to uid 0 must fail. Not as
 * root (the supervisor checked that the ids are already ours): nothing to do.
 */
export function dropPrivileges(target: DropTarget): { uid: number; gid: number } {
  if (process.getuid?.() !== 0 && process.geteuid?.() !== 0) return { uid: process.geteuid?.() ?? -1, gid: process.getegid?.() ?? -1 };
  try {
    // process.initgroups (initgroups(3): the user's groups from the group database, plus gid) is not in @types/node.
    if (target.user !== undefined) (process as unknown as { initgroups: (user: string, extraGroup: number) => void }).initgroups(target.user, target.gid);
    else process.setgroups?.([target.gid]);
    process.setgid?.(target.gid);
    if (target.uid !== undefined) process.setuid?.(target.uid);
  } catch (err) {
    throw coded('EDGE_WORKER_PRIVILEGE_DROP', `the worker could not switch to ${target.user ?? `gid ${target.gid}`}: ${err instanceof Error ? err.message : String(err)}`);
  }
  const uid = process.getuid?.() ?? -1;
  const gid = process.getgid?.() ?? -1;
  if (gid !== target.gid || process.getegid?.() !== target.gid || (target.uid !== undefined && (uid !== target.uid || process.geteuid?.() !== target.uid))) {
    throw coded('EDGE_WORKER_PRIVILEGE_DROP', `the worker runs as uid ${uid} gid ${gid} after the switch`);
  }
  if (target.uid !== undefined && target.uid !== 0) {
    let regained = true;
    try {
      process.setuid?.(0);
    } catch {
      regained = false;
    }
    if (regained) throw coded('EDGE_WORKER_PRIVILEGE_DROP', 'the worker could switch back to root after dropping privileges');
  }
  return { uid, gid };
}
