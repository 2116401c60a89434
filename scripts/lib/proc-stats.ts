// CPU time and memory of a process and its descendants, read from /proc (Linux). Benchmarks read
// CPU before and after a load run: nginx and haproxy do their work in child processes, so the
// whole tree counts.
import { readFileSync, readdirSync } from 'node:fs';

/** USER_HZ: the unit of utime/stime in /proc/<pid>/stat; 100 on every Linux we run on. */
const TICKS_PER_SECOND = 100;

function readOr(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

/** Direct children of `pid` still alive (listed per thread in /proc/<pid>/task/<tid>/children). */
export function childPids(pid: number): number[] {
  let tasks: string[] = [];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  return tasks.flatMap((t) => readOr(`/proc/${pid}/task/${t}/children`).split(' ').filter((c) => c.trim().length > 0).map(Number));
}

/** `pid` and every descendant still alive. */
export function processTree(pid: number): number[] {
  const out: number[] = [];
  const pending = [pid];
  while (pending.length > 0) {
    const p = pending.pop() as number;
    out.push(p);
    pending.push(...childPids(p));
  }
  return out;
}

/** utime + stime of one process (all its threads) in microseconds; 0 once it has exited. */
export function cpuMicros(pid: number): number {
  // Fields after the command name, which ends with ") " and may itself contain spaces.
  const stat = readOr(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
  const ticks = Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
  return Number.isFinite(ticks) ? (ticks * 1e6) / TICKS_PER_SECOND : 0;
}

/** CPU of `pid` and its descendants, microseconds. */
export function treeCpuMicros(pid: number): number {
  let sum = 0;
  for (const p of processTree(pid)) sum += cpuMicros(p);
  return sum;
}

/** Resident memory (VmRSS) of one process, MiB; 0 once it has exited. */
export function rssMiB(pid: number): number {
  return Number(/VmRSS:\s+(\d+)/.exec(readOr(`/proc/${pid}/status`))?.[1] ?? 0) / 1024;
}

/** Resident memory of `pid` and its descendants, MiB. */
export function treeRssMiB(pid: number): number {
  let mib = 0;
  for (const p of processTree(pid)) mib += rssMiB(p);
  return mib;
}

/**
 * How one process's resident memory divides, MiB, from /proc/<pid>/smaps_rollup (zeros once it
 * has exited):
 * - `privateMiB` (USS: Private_Clean + Private_Dirty) is what its exit would free. For a worker
 *   that is what each further worker adds to a node: the `node` binary's pages and the addons'
 *   are shared with the supervisor and the other workers and counted once.
 * - `pssMiB` charges each shared page to the processes mapping it in equal parts, so the PSS of
 *   every process on the machine sums to the memory in use.
 */
export interface MemoryShares {
  readonly rssMiB: number;
  readonly pssMiB: number;
  readonly privateMiB: number;
}

/** A `Field:   123 kB` line of smaps_rollup. */
const SMAPS_FIELD = /^(\w+):\s+(\d+) kB$/gm;

export function memoryShares(pid: number): MemoryShares {
  const kib = new Map<string, number>();
  for (const m of readOr(`/proc/${pid}/smaps_rollup`).matchAll(SMAPS_FIELD)) kib.set(m[1] as string, Number(m[2]));
  const of = (field: string): number => kib.get(field) ?? 0;
  return { rssMiB: of('Rss') / 1024, pssMiB: of('Pss') / 1024, privateMiB: (of('Private_Clean') + of('Private_Dirty')) / 1024 };
}

/** `memoryShares` summed over `pid` and its descendants. */
export function treeMemoryShares(pid: number): MemoryShares {
  const sum = { rssMiB: 0, pssMiB: 0, privateMiB: 0 };
  for (const p of processTree(pid)) {
    const m = memoryShares(p);
    sum.rssMiB += m.rssMiB;
    sum.pssMiB += m.pssMiB;
    sum.privateMiB += m.privateMiB;
  }
  return sum;
}
