// One memory-reducing garbage collection, for the processes' memory trims (the worker's
// `performance.memory_trim`, and once at start-up in the supervisor and each worker;
// docs/performance.md "Memory trim after load"). V8's `last-resort` collection is its low-memory
// notification: full collections until nothing more is freed, the page pool handed back to the
// kernel, the young generation shrunk. It stops the process's event loop (50-200 ms).
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

type GcFunction = (options?: { type?: 'major' | 'minor'; execution?: 'sync' | 'async'; flavor?: 'regular' | 'last-resort' }) => void;

let collector: (() => void) | undefined;

/**
 * The collection, without a global `gc`: `--expose-gc` set at run time applies to contexts created
 * after it, so a fresh context hands over its `gc`; nothing is added to this context's globals.
 * Throws if V8 does not hand it over.
 */
export function memoryReducingCollector(): () => void {
  if (collector !== undefined) return collector;
  const exposed = (globalThis as { gc?: GcFunction }).gc;
  let gc: GcFunction | undefined = typeof exposed === 'function' ? exposed : undefined;
  if (gc === undefined) {
    setFlagsFromString('--expose-gc');
    const fromContext: unknown = runInNewContext('typeof gc === "function" ? gc : undefined');
    if (typeof fromContext !== 'function') throw new Error('V8 did not expose its collector to a new context');
    gc = fromContext as GcFunction;
  }
  const run = gc;
  collector = () => run({ type: 'major', execution: 'sync', flavor: 'last-resort' });
  return collector;
}

export interface MemoryTrimmed {
  readonly rssBefore: number;
  readonly rssAfter: number;
  readonly durationMs: number;
}

/** One collection now, measured; throws what `memoryReducingCollector` or the collection throws. */
export function trimMemoryNow(collect: () => void = memoryReducingCollector(), rss: () => number = () => process.memoryUsage.rss()): MemoryTrimmed {
  const rssBefore = rss();
  const t0 = performance.now();
  collect();
  const durationMs = performance.now() - t0;
  return { rssBefore, rssAfter: rss(), durationMs };
}

/**
 * The start-up trim of a process (the supervisor once serving, a worker before its listeners
 * bind): one collection, one info line, or one warning if the collector cannot be reached.
 */
export function trimAfterStartup(log: { info(fields: object, msg: string): void; warn(fields: object, msg: string): void } | undefined, role: 'supervisor' | 'worker'): MemoryTrimmed | undefined {
  try {
    const r = trimMemoryNow();
    log?.info(trimFields(r), 'memory trimmed after start-up');
    return r;
  } catch (err) {
    log?.warn({ reason: err instanceof Error ? err.message : String(err) }, `memory trim unavailable in this process: the ${role} keeps its start-up heap (performance.memory_trim)`);
    return undefined;
  }
}

/** The fields of a trim's log line, in MiB and whole ms. */
export function trimFields(r: MemoryTrimmed): { rss_before_mib: number; rss_after_mib: number; duration_ms: number } {
  const MiB = 1024 * 1024;
  return { rss_before_mib: Math.round(r.rssBefore / MiB), rss_after_mib: Math.round(r.rssAfter / MiB), duration_ms: Math.round(r.durationMs) };
}
