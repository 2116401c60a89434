// The V8 flags a worker process starts with. Node sizes V8's heap from the machine's memory: on a
// node with 24 GiB, a semi-space may grow to 64 MiB, so the young generation alone reaches 128 MiB
// under load, and every page V8 ever used stays resident. A proxy worker's live heap is 25–40 MiB;
// a young generation of 16 MiB keeps the per-request garbage where it dies without holding a
// hundred MiB per worker. The old generation: V8 lets it grow to its live size times a factor of
// up to 4 before a full collection, and under HTTP/2 and HTTP/3 load requests in flight are
// promoted at 10–20 MB/s, so a worker's old generation filled to 110–125 MiB of garbage around a
// 35 MiB live heap; a factor of 1.5 (`--heap-growing-percent=50`) collects it sooner: 85–100 MiB
// less RSS under load for about 6 % of HTTP/2's throughput and 3 % of HTTP/3's (docs/performance.md
// "Worker memory", docs/decisions.md "Worker V8 flags").
//
// An operator overrides a default by setting the same flag, in NODE_OPTIONS (a systemd drop-in:
// `Environment=NODE_OPTIONS=--max-semi-space-size=32`; `--heap-growing-percent=0` gives V8 back
// its own factor) or on the command line: a flag already set is never added again, whatever its
// value.

/** Flags every worker gets unless the operator set them. */
export const WORKER_V8_DEFAULTS: readonly string[] = ['--max-semi-space-size=16', '--heap-growing-percent=50'];

/** `--max_semi_space_size=8` and `--max-semi-space-size 8` name the same flag: `max-semi-space-size`. */
function flagName(arg: string): string | undefined {
  if (!arg.startsWith('--')) return undefined;
  const eq = arg.indexOf('=');
  return (eq === -1 ? arg.slice(2) : arg.slice(2, eq)).replaceAll('_', '-');
}

/** The worker's execArgv: the supervisor's own, then each default whose flag neither it nor NODE_OPTIONS sets. */
export function workerExecArgv(execArgv: readonly string[], nodeOptions: string | undefined, defaults: readonly string[] = WORKER_V8_DEFAULTS): string[] {
  const set = new Set<string>();
  for (const arg of [...execArgv, ...(nodeOptions ?? '').split(/\s+/)]) {
    const name = flagName(arg);
    if (name !== undefined) set.add(name);
  }
  return [...execArgv, ...defaults.filter((d) => !set.has(flagName(d) ?? d))];
}
