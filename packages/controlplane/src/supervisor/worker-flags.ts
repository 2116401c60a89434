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
// An operator overrides a default by setting the same flag in EDGE_PROXY_WORKER_FLAGS (a systemd
// drop-in: `Environment="EDGE_PROXY_WORKER_FLAGS=--heap-growing-percent=0"` gives V8 back its own
// factor), in NODE_OPTIONS or on the command line: a flag already set is never added again,
// whatever its value. NODE_OPTIONS takes only the V8 flags Node allows there
// (`--max-semi-space-size`, `--max-old-space-size`, not `--heap-growing-percent` or
// `--memory-saver-mode`: Node refuses to start, "is not allowed in NODE_OPTIONS"), and the shipped
// unit runs a wrapper that passes no Node flags, so EDGE_PROXY_WORKER_FLAGS is the one place where
// every flag can be set, for the workers alone.

import { execFile } from 'node:child_process';
import type { HostProblem } from './process-keys.ts';

/** Flags every worker gets unless the operator set them. */
export const WORKER_V8_DEFAULTS: readonly string[] = ['--max-semi-space-size=16', '--heap-growing-percent=50'];

/** The supervisor's environment variable with the operator's Node and V8 flags for the workers. */
export const WORKER_FLAGS_ENV = 'EDGE_PROXY_WORKER_FLAGS';

/** Bounds on EDGE_PROXY_WORKER_FLAGS: flags, and characters per flag. */
export const WORKER_FLAGS_MAX = 32;
export const WORKER_FLAG_MAX_CHARS = 256;

/** `--name` or `--name=value`: a name of letters, digits, `-` and `_`; a value without blanks. */
const FLAG_SHAPE = /^--[A-Za-z0-9][A-Za-z0-9_-]*(=\S*)?$/;

export type WorkerFlagsParse = { readonly ok: true; readonly flags: readonly string[] } | { readonly ok: false; readonly message: string };

/**
 * EDGE_PROXY_WORKER_FLAGS split on blanks: every token must be one `--flag` or `--flag=value`, so
 * that a value cannot be taken for a script or an option of ours (`--flag value` is refused: write
 * `--flag=value`). Whether Node and V8 know the flags is checked by starting node with them
 * (`checkWorkerFlags`).
 */
export function parseWorkerFlags(value: string | undefined): WorkerFlagsParse {
  const flags = (value ?? '').split(/\s+/).filter((f) => f !== '');
  if (flags.length > WORKER_FLAGS_MAX) return { ok: false, message: `${flags.length} flags, more than ${WORKER_FLAGS_MAX}` };
  for (const f of flags) {
    if (f.length > WORKER_FLAG_MAX_CHARS) return { ok: false, message: `a flag of ${f.length} characters, more than ${WORKER_FLAG_MAX_CHARS}` };
    if (!FLAG_SHAPE.test(f)) return { ok: false, message: `${JSON.stringify(f.slice(0, 64))} is not a --flag or --flag=value` };
  }
  return { ok: true, flags };
}

/** `--max_semi_space_size=8` and `--max-semi-space-size 8` name the same flag: `max-semi-space-size`. */
function flagName(arg: string): string | undefined {
  if (!arg.startsWith('--')) return undefined;
  const eq = arg.indexOf('=');
  return (eq === -1 ? arg.slice(2) : arg.slice(2, eq)).replaceAll('_', '-');
}

/**
 * The worker's execArgv: the supervisor's own, then the operator's EDGE_PROXY_WORKER_FLAGS, then
 * each default whose flag none of them nor NODE_OPTIONS sets.
 */
export function workerExecArgv(execArgv: readonly string[], nodeOptions: string | undefined, operatorFlags: readonly string[] = [], defaults: readonly string[] = WORKER_V8_DEFAULTS): string[] {
  const set = new Set<string>();
  for (const arg of [...execArgv, ...operatorFlags, ...(nodeOptions ?? '').split(/\s+/)]) {
    const name = flagName(arg);
    if (name !== undefined) set.add(name);
  }
  return [...execArgv, ...operatorFlags, ...defaults.filter((d) => !set.has(flagName(d) ?? d))];
}

/** How long node may take to start with the flags and exit, ms. */
const CHECK_TIMEOUT_MS = 10_000;

/**
 * Starts `exec` (the node the workers run on) with the operator's flags and an empty script: Node
 * refuses an unknown or malformed flag ("bad option") before any code runs. Resolves undefined
 * when it ran, else what it said, first line, bounded. Only run when the operator set flags.
 */
export function checkWorkerFlags(exec: string, flags: readonly string[]): Promise<string | undefined> {
  return new Promise((resolve) => {
    execFile(exec, [...flags, '-e', ''], { timeout: CHECK_TIMEOUT_MS, maxBuffer: 64 * 1024, env: { ...process.env, NODE_OPTIONS: '' } }, (err, _stdout, stderr) => {
      if (err === null) return resolve(undefined);
      const said = stderr.split('\n').find((l) => l.trim() !== '')?.trim().slice(0, 300);
      const how = err.killed ? `still running after ${CHECK_TIMEOUT_MS} ms` : `exit ${String(err.code ?? err.signal ?? 'unknown')}`;
      resolve(said === undefined ? `node with these flags failed (${how})` : `node refused them (${how}): ${said}`);
    });
  });
}

// glibc's malloc, under the V8 heap: OpenSSL, nghttp2, quiche, libuv and V8's own compiler and GC
// threads allocate there. glibc adapts its mmap threshold to the largest block freed (up to 32 MiB)
// and its trim threshold to twice that, so after a load a worker's arenas keep 15–30 MiB of freed
// memory they never give back. Fixed thresholds (glibc's own initial 128 KiB) turn that dynamic
// adjustment off: a block of 128 KiB or more is mapped and unmapped on its own, and a heap's free
// top is returned above 128 KiB. Measured at the end of three load phases, paired runs without and
// with: 183–194 → 172–174 MiB, throughput the same within the rounds' noise (docs/performance.md
// "Worker memory", "glibc's malloc thresholds"). Set in the
// worker's environment because glibc reads it once, when the process starts. An operator's
// GLIBC_TUNABLES is kept and only the tunables it does not name are added; the older
// MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ variables count as naming them. Other C libraries
// (musl) ignore the variable.

/** Malloc tunables every worker gets unless the operator set them, and the older variable for each. */
export const WORKER_MALLOC_DEFAULTS: ReadonlyArray<{ readonly tunable: string; readonly value: string; readonly legacyEnv: string }> = [
  { tunable: 'glibc.malloc.trim_threshold', value: '131072', legacyEnv: 'MALLOC_TRIM_THRESHOLD_' },
  { tunable: 'glibc.malloc.mmap_threshold', value: '131072', legacyEnv: 'MALLOC_MMAP_THRESHOLD_' },
];

/** The worker's GLIBC_TUNABLES: the operator's, then each default it does not name; undefined when nothing is added. */
export function workerMallocTunables(env: Readonly<Record<string, string | undefined>>, defaults = WORKER_MALLOC_DEFAULTS): string | undefined {
  const own = (env['GLIBC_TUNABLES'] ?? '').split(':').filter((t) => t !== '');
  const named = new Set(own.map((t) => t.split('=')[0]));
  const added = defaults.filter((d) => !named.has(d.tunable) && env[d.legacyEnv] === undefined).map((d) => `${d.tunable}=${d.value}`);
  return added.length === 0 ? undefined : [...own, ...added].join(':');
}

/**
 * The operator's worker flags from `env` (EDGE_PROXY_WORKER_FLAGS), parsed and tried on `exec`:
 * the flags, or the problem `serve` refuses to start with (and `edge-proxy -c` reports).
 */
export async function operatorWorkerFlags(env: Readonly<Record<string, string | undefined>>, exec: string): Promise<{ readonly flags: readonly string[] } | { readonly problem: HostProblem }> {
  const parsed = parseWorkerFlags(env[WORKER_FLAGS_ENV]);
  if (!parsed.ok) return { problem: { path: WORKER_FLAGS_ENV, code: 'EDGE_STARTUP_WORKER_FLAGS', message: parsed.message } };
  if (parsed.flags.length > 0) {
    const refused = await checkWorkerFlags(exec, parsed.flags);
    if (refused !== undefined) return { problem: { path: `${WORKER_FLAGS_ENV}=${parsed.flags.join(' ').slice(0, 500)}`, code: 'EDGE_STARTUP_WORKER_FLAGS', message: refused } };
  }
  return { flags: parsed.flags };
}
