// The memory of a standalone worker process, read so that retained JavaScript (a leak) shows apart
// from what the allocators keep after a peak. The worker runs with `memoryProbeArgs` (before its
// script): --expose-gc and a preload that answers SIGUSR2, once every downstream connection it
// accepted has closed (or 15 s have passed), with one memory-reducing collection (V8's `last-resort`
// flavour, as the memory trims run it: packages/telemetry/src/memory.ts) and one `MEM {...}` line
// on stderr (its memoryUsage(), the connections still open, how long it waited). Downstream connections are
// the sockets node's servers accept ('net.server.socket'); the worker's connections to its
// backends are client sockets and not counted.
import type { ChildProcess } from 'node:child_process';
import { rssMiB } from '../../scripts/lib/proc-stats.ts';

const preload = `data:text/javascript,${encodeURIComponent(`
const open = new Set();
process.getBuiltinModule('diagnostics_channel').subscribe('net.server.socket', ({ socket }) => {
  open.add(socket);
  socket.once('close', () => open.delete(socket));
});
process.on('SIGUSR2', () => {
  const start = performance.now();
  const report = () => {
    globalThis.gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    const m = { ...process.memoryUsage(), open: open.size, waitedMs: Math.round(performance.now() - start) };
    process.stderr.write('MEM ' + JSON.stringify(m) + '\\n');
  };
  if (open.size === 0) return report();
  const limit = setTimeout(report, 15000);
  for (const s of open) s.once('close', () => { if (open.size === 0) { clearTimeout(limit); report(); } });
});
`)}`;

/** Node arguments that give a worker the probe; they go before its script. */
export const memoryProbeArgs: readonly string[] = ['--expose-gc', '--import', preload];

/** One reading: memoryUsage() after the GCs (bytes), the downstream connections still open, ms waited, VmRSS in MiB. */
export type MemoryReading = NodeJS.MemoryUsage & { open: number; waitedMs: number; rssMiB: number };

export interface MemoryProbe {
  /** Hand it each stderr line of the worker; true when the line was the probe's (not a log line). */
  line(text: string): boolean;
  /** Signals the worker and resolves with its reading, taken once its downstream connections have closed. */
  read(): Promise<MemoryReading>;
}

export function memoryProbe(worker: ChildProcess): MemoryProbe {
  const waiting: ((m: MemoryReading) => void)[] = [];
  return {
    line(text) {
      if (!text.startsWith('MEM ')) return false;
      const m = JSON.parse(text.slice(4)) as Omit<MemoryReading, 'rssMiB'>;
      waiting.shift()?.({ ...m, rssMiB: rssMiB(worker.pid as number) });
      return true;
    },
    read() {
      return new Promise((resolve) => {
        waiting.push(resolve);
        worker.kill('SIGUSR2');
      });
    },
  };
}
