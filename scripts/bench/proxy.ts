// Proxy benchmark: small GETs through one edge-proxy worker against the same backend direct and
// against peer proxies (nginx, haproxy, caddy, @fastify/http-proxy), all measured in one run.
//
//   npm run bench:proxy [-- --runs 2 --seconds 8 --h3-runs 3 --latency-at 0.5 --latency-runs N --latency-clients K --profile h1|h2|h3|h3c|h3b --alloc-profile h1|h2|h3|h3c|h3b
//                         [--profile-variant access|tracing|bare] --baseline REV --json FILE]
//                       [--targets ours,ours-access,ours-tracing,ours-notrim,ours-trim,ours-nocache,baseline,serve1,serve2,nginx,haproxy,caddy,fastify --phases h1,h2,h3,h3c,h3b,h3bc,latency]
//                       [--ours-flags="V8 FLAGS"|none] [--alt-flags="V8 FLAGS"|none ...] [--alt-env "NAME=VALUE ..." ...]
//                       [--settle-seconds 13] [--h3-warmup-rounds 1] [--datagrams] [--alloc-survivors]
// (a value that starts with dashes goes after `=`: `--alt-flags=--max-semi-space-size=8`)
//
// Our worker starts with the flags a supervised worker gets (controlplane worker-flags.ts: the
// environment's EDGE_PROXY_WORKER_FLAGS, then the defaults it does not name), or --ours-flags;
// each --alt-flags adds a target `ours-altN`, the same worker with other flags, so that flags can
// be compared in one run, and each --alt-env a target `ours-envN`, the same worker with those
// environment variables added (glibc's malloc tunables, say). The RSS columns are each
// process's at the end of the last phase and after --settle-seconds of idleness, when our worker's
// memory_trim has run.
//
// Layout on the 2-core machine: every proxy gets core 1 (one at a time is loaded; the others idle),
// the load generator and the backend share core 0. The backend is Debian nginx answering
// `return 200 "ok"` over plain HTTP/1.1 with keep-alive (and over TLS + HTTP/2 on a second port
// for the HTTP/2 "direct" baseline). Downstream is TLS for every proxy; "direct" HTTP/1.1 is
// plain HTTP straight to the backend.
//
// Phases, each repeated `--runs` times with the targets interleaved inside a round:
// - HTTP/1.1: `wrk -t1 -c50 -d8s --latency` → req/s, p99;
// - HTTP/2: `h2load -t1 -c50 -m10 -D 8` (1 s warm-up) → req/s (fastify: HTTP/1.1 only);
// - HTTP/3: ours and caddy's reverse_proxy, `gtlsclient -n 3000` on one connection (h3.ts),
//   after `--h3-warmup-rounds` (default 1) such runs per target as warm-up (the many-connections
//   phase likewise);
// - HTTP/3 from a second, independent client (phases h3b and h3bc): headless Chromium on the
//   client core (bench-browser.ts), its page's fetch() on one connection (100 loops, 3,000
//   requests) and on many (10 browser contexts at once, 20 requests each, their connections
//   closed before each of 5 waves). Pinned to one core Chromium asks 500-650 req/s, far below what
//   one proxy core serves, so the req/s of these phases are the client's; the proxies are compared
//   by their CPU per request at that rate (the report's "CPU: this ÷ ours");
// - HTTP/3, many connections (phase h3c): 30 gtlsclient processes at once, each its own
//   connection with 20 requests, 5 waves: handshakes and per-connection state count;
// - added latency: HTTP/1.1 at a fixed rate, half of our measured peak (--latency-at: fractions),
//   the same rate against direct, ours and nginx (`h2load --h1 --rps`, per-request log;
//   --latency-runs rounds, default --runs; --latency-clients K splits the connections over K
//   h2load processes started apart, bursts of C/K requests instead of C)
//   → p99(ours) − p99(direct);
// - proxy CPU per request: utime + stime of the proxy's process tree from /proc around each run.
// --baseline REV adds the worker of git revision REV (every workspace package as of REV;
// third-party modules are today's) as a second "ours" in the same rounds: before/after figures
// from one run.
// "serve1" and "serve2" are `edge-proxy serve` (supervisor and workers) with one worker on the
// proxy core and with two workers on both cores (the second shared with the load generator);
// their CPU and RSS are the whole tree's, the supervisor's included.
// "ours-access" is our worker with the access log on, one line per request to a file;
// "ours-nocache" without the compile cache (every other "ours" target loads its code from one,
// warmed first, as a supervised worker does: controlplane supervisor/compile-cache.ts);
// "ours-tracing" with tracing on at the default sample_ratio (0.01), exporting to a stand-in
// collector in the benchmark process (answers 200, counts exports).
// The "bare" target (node:http2's secure server with HTTP/1.1 allowed, as our worker's, in front of
// an undici Pool, no proxy logic; our worker's V8 flags) measures the floor of the stack we build
// on, in the same rounds (HTTP/1.1, HTTP/2 and the fixed-rate phase).
// --profile h1|h2|h3|h3c|h3b runs our worker once more under --cpu-prof with that load and prints where its
// time goes; --alloc-profile h1|h2|h3|h3c|h3b the same under V8's sampling heap profiler
// (scripts/lib/alloc-sampler.ts), and prints the bytes it allocates per request and where;
// with --alloc-survivors only the bytes the young generation did not free (promoted or pretenured).
// --profile-variant bare profiles the bare node:http2 + undici process instead (HTTP/1.1 or HTTP/2).
// --datagrams captures each HTTP/3 target's UDP port during the h3 and h3c rounds (tcpdump on lo,
// on the client's core) and prints the datagrams it sent and received per request.
import { execFileSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { IncomingMessage } from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { childPids, memoryShares, treeCpuMicros, treeMemoryShares, treeRssMiB } from '../lib/proc-stats.ts';
import type { MemoryShares } from '../lib/proc-stats.ts';
import { gtlsclient, gtlsclientMany, h1AtRate, h2load, median, wrk } from '../lib/bench-load.ts';
import type { LoadResult } from '../lib/bench-load.ts';
import { BENCH_TOOLS, Processes, caddyConfig, caddyEnv, edgeProxyConfig, ensureBenchTools, haproxyConfig, nginxBackendConfig, nginxProxyConfig, waitForJsonLine, waitForListeningLine, waitForTcp } from '../lib/bench-peers.ts';
import type { EdgeProxyVariant } from '../lib/bench-peers.ts';
import { parseWorkerFlags, WORKER_FLAGS_ENV, workerExecArgv, workerMallocTunables } from '../../packages/controlplane/src/supervisor/worker-flags.ts';
import { warmCompileCache } from '../../packages/controlplane/src/supervisor/compile-cache.ts';
import { commandLine, numberArg, scriptArgs, usageError } from '../lib/bench-args.ts';
import { BrowserLoad, spkiHash } from '../lib/bench-browser.ts';
import { toolPath } from '../system-tools.ts';
import { DatagramCapture } from '../lib/datagram-capture.ts';
import type { DatagramCounts } from '../lib/datagram-capture.ts';

const { values } = scriptArgs({
  options: {
    runs: { type: 'string', default: '2' },
    seconds: { type: 'string', default: '8' },
    connections: { type: 'string', default: '50' },
    'h3-requests': { type: 'string', default: '3000' },
    'h3-runs': { type: 'string', default: '3' },
    'h3-warmup-rounds': { type: 'string', default: '1' },
    profile: { type: 'string' },
    'alloc-profile': { type: 'string' },
    'profile-variant': { type: 'string' },
    baseline: { type: 'string' },
    json: { type: 'string' },
    'latency-at': { type: 'string', default: '0.5' },
    // Rounds of the fixed-rate phase (default: --runs). Its p99 swings by several ms between
    // identical rounds here, so a tail verdict within 0.5 ms needs more rounds than throughput.
    'latency-runs': { type: 'string' },
    // h2load processes the fixed-rate phase's connections are split over, started a fraction of
    // the send period apart (bench-load.ts h1AtRate): 1 sends each period's requests in one burst.
    'latency-clients': { type: 'string', default: '1' },
    // After the last phase, every target idles this long and its RSS is read again (target
    // ours-trim's memory_trim runs after 10 s of quiet, plus one 1-s look; `ours` runs the default,
    // trim off); 0 skips the wait.
    'settle-seconds': { type: 'string', default: '13' },
    targets: { type: 'string', default: 'ours,baseline,bare,nginx,haproxy,caddy,fastify' },
    phases: { type: 'string', default: 'h1,h2,h3,h3c,h3b,h3bc,latency' },
    // Our worker's V8 flags: by default those a supervised worker gets (worker-flags.ts); 'none' for none.
    'ours-flags': { type: 'string' },
    // Each adds a target `ours-altN`: our worker with these flags instead ('none': no flags), for A/B runs.
    'alt-flags': { type: 'string', multiple: true },
    // Each adds a target `ours-envN`: our worker with these variables added ("NAME=VALUE ..."; an empty value unsets one's effect).
    'alt-env': { type: 'string', multiple: true },
    'serve-fastify': { type: 'boolean', default: false },
    // Counts the UDP datagrams each HTTP/3 target sends and receives per request in the h3 and h3c
    // rounds (tcpdump on lo, pinned to the client's core; scripts/lib/datagram-capture.ts).
    datagrams: { type: 'boolean', default: false },
    // With --alloc-profile: count only what the young generation did not free (promoted by a
    // scavenge, or pretenured into the old generation), instead of everything allocated.
    'alloc-survivors': { type: 'boolean', default: false },
    cert: { type: 'string' },
    key: { type: 'string' },
    upstream: { type: 'string' },
  },
  strict: true,
});

/** Core of the proxies; the load generator and the backend run on the other one. */
const PROXY_CORE = 1;
const CLIENT_CORE = 0;
/** HTTP/3 warm-up rounds per target before the measured ones (checked before anything starts). */
const warmupRounds = commandLine(() => numberArg('h3-warmup-rounds', values['h3-warmup-rounds'], (n) => Number.isInteger(n) && n >= 0));

/** The operator's worker flags from the environment, as `edge-proxy serve` reads them. */
const envWorkerFlags = ((): readonly string[] => {
  const parsed = parseWorkerFlags(process.env[WORKER_FLAGS_ENV]);
  return parsed.ok ? parsed.flags : usageError(`${WORKER_FLAGS_ENV}: ${parsed.message}`);
})();

const here = path.dirname(new URL(import.meta.url).pathname);
const repo = path.resolve(here, '../..');

/** Something that answers the load: a proxy or the backend itself. */
interface Target {
  readonly key: string;
  readonly name: string;
  /** Process whose tree's CPU is the target's cost. */
  readonly proc: ChildProcess;
  readonly h1Url?: string;
  readonly h2Url?: string;
  readonly h3Port?: number;
  readonly ours?: boolean;
}

interface Sample extends LoadResult {
  readonly cpuUsPerReq: number;
  /** The target's process tree's RSS right after this run. */
  readonly rssMiB: number;
  /** The part of it the tree holds alone (proc-stats `memoryShares`). */
  readonly privateMiB: number;
}

/** `h1`, `h2`, `h3`, or `lat:F` for the fixed-rate run at fraction F of our HTTP/1.1 peak. */
type Phase = string;

/** The load phases with a table of their own. */
const LOAD_PHASES = ['h1', 'h2', 'h3', 'h3c', 'h3b', 'h3bc'] as const;
type LoadPhase = (typeof LOAD_PHASES)[number];
/** Phases whose req/s is the client's (Chromium): their proxies are compared by CPU per request. */
const CLIENT_BOUND: ReadonlySet<LoadPhase> = new Set(['h3b', 'h3bc']);
/** Chromium's loads: one connection, and many (contexts × requests, waves). */
const BROWSER_ONE = { requests: 3000, concurrency: 100 } as const;
const BROWSER_MANY = { contexts: 10, requests: 20, waves: 5 } as const;

const PHASE_TITLE: Record<LoadPhase, string> = {
  h1: 'HTTP/1.1 (wrk -t1 -c50, closed loop)',
  h2: 'HTTP/2 over TLS (h2load -t1 -c50 -m10)',
  h3: 'HTTP/3 (gtlsclient, one connection, -n 3000)',
  h3c: 'HTTP/3, many connections (30 gtlsclient connections at once, -n 20 each, 5 waves)',
  h3b: `HTTP/3 from Chromium (one connection, ${BROWSER_ONE.concurrency} fetch loops, ${fmtInt(BROWSER_ONE.requests)} requests)`,
  h3bc: `HTTP/3 from Chromium, many connections (${BROWSER_MANY.contexts} browser contexts at once, ${BROWSER_MANY.requests} requests each, ${BROWSER_MANY.waves} waves)`,
};

/** The fixed-rate phase's heading (its load shape from the validated options). */
function latencyTitle(fraction: number, rate: number): string {
  const connections = Number(values.connections);
  const clients = Number(values['latency-clients']);
  return `HTTP/1.1 at ${Math.round(fraction * 100)} % of our peak: ${fmtInt(rate)} req/s asked of each (h2load --h1 -c${connections} --rps${clients > 1 ? `, ${clients} staggered h2load clients` : ''})`;
}

class Results {
  readonly samples = new Map<string, Sample[]>();

  add(phase: Phase, key: string, s: Sample): void {
    const k = `${phase}:${key}`;
    this.samples.set(k, [...(this.samples.get(k) ?? []), s]);
  }

  get(phase: Phase, key: string): Sample[] {
    return this.samples.get(`${phase}:${key}`) ?? [];
  }
}

const log = (line: string): void => console.log(line);

async function main(): Promise<void> {
  const runs = Number(values.runs);
  const latencyRuns = Number(values['latency-runs'] ?? values.runs);
  if (!Number.isInteger(latencyRuns) || latencyRuns < 1) throw new Error(`--latency-runs must be a positive integer, not ${values['latency-runs']}`);
  const seconds = Number(values.seconds);
  const connections = Number(values.connections);
  const latencyClients = Number(values['latency-clients']);
  if (!Number.isInteger(latencyClients) || latencyClients < 1 || connections % latencyClients !== 0) throw new Error(`--latency-clients must divide --connections (${connections}), not ${values['latency-clients']}`);
  const tools = ensureBenchTools(log);
  for (const t of BENCH_TOOLS) if (!tools.has(t.command)) log(`${t.command} missing (Debian package ${t.debianPackage}): what needs it is skipped`);
  if (!tools.has('nginx') || !tools.has('taskset')) throw new Error('the backend needs nginx (Debian package nginx) and taskset (util-linux)');

  const tcpdump = values.datagrams ? toolPath('tcpdump') : undefined;
  if (values.datagrams && tcpdump === undefined) throw new Error('--datagrams needs tcpdump (Debian package tcpdump)');

  const dir = mkdtempSync(path.join(tmpdir(), 'bench-proxy-'));
  const procs = new Processes();
  let baselineDir: string | undefined;
  let collector: OtlpSink | undefined;
  const cleanup = (): void => {
    procs.killAll();
    rmSync(dir, { recursive: true, force: true });
    if (baselineDir !== undefined) rmSync(baselineDir, { recursive: true, force: true });
  };
  process.on('exit', cleanup);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  const started = Date.now();
  try {
    const leaf = makeLeaf(dir, 'bench', undefined, { sans: ['localhost', '127.0.0.1'] });
    const node = process.execPath;
    const results = new Results();

    // The backend, on the client's core.
    const backendPort = await freePort();
    const backendTlsPort = await freePort();
    const nginx = tools.get('nginx') as string;
    const backend = procs.spawnPinned(CLIENT_CORE, nginx, ['-p', dir, '-e', path.join(dir, 'backend-stderr.log'), '-c', nginxBackendConfig(dir, backendPort, backendTlsPort, leaf.cert, leaf.key)]);
    await waitForTcp(backendPort, backend);
    const direct: Target = { key: 'direct', name: 'backend direct (nginx return 200)', proc: backend, h1Url: `http://127.0.0.1:${backendPort}/`, h2Url: `https://127.0.0.1:${backendTlsPort}/` };

    // The proxies, each on the proxy core.
    const targets: Target[] = [];
    const wanted = new Set(String(values.targets).split(','));
    const phases = new Set(String(values.phases).split(','));
    const start = async (key: string, name: string, fn: () => Promise<Target>): Promise<void> => {
      if (!wanted.has(key)) return;
      try {
        targets.push(await fn());
      } catch (err) {
        log(`${name}: not started, skipped (${err instanceof Error ? err.message : String(err)})`);
      }
    };
    // Unless --ours-flags says otherwise, our worker gets the flags a supervised worker would:
    // EDGE_PROXY_WORKER_FLAGS (checked as `serve` checks it), then the defaults it does not name.
    const flagsOf = (spec: string | undefined): string[] => (spec === undefined ? workerExecArgv([], process.env['NODE_OPTIONS'], envWorkerFlags) : spec === 'none' ? [] : spec.split(/\s+/).filter((f) => f !== ''));
    const oursFlags = flagsOf(values['ours-flags']);
    // And the malloc tunables a supervised worker gets (worker-flags.ts), for every "ours" and bare.
    const tunables = workerMallocTunables(process.env);
    const oursEnv: NodeJS.ProcessEnv = tunables === undefined ? {} : { GLIBC_TUNABLES: tunables };
    // Our workers load their code from a compile cache warmed first, as a supervised worker does
    // (controlplane supervisor/compile-cache.ts); the baseline as its revision did (`cache` false).
    const compileCache = path.join(dir, 'compile-cache');
    mkdirSync(compileCache, { mode: 0o700 });
    const startOurs = async (key: string, name: string, standalone: string, variant: EdgeProxyVariant = {}, flags: readonly string[] = oursFlags, cache = true, extraEnv: NodeJS.ProcessEnv = {}): Promise<Target> => {
      const port = await freePort();
      if (cache) {
        const warm = await warmCompileCache({ exec: standalone, execArgv: flags, dir: compileCache });
        if (!warm.ok) throw new Error(`compile cache warm-up: ${warm.message}`);
      }
      const env = { ...process.env, ...oursEnv, ...(cache ? { NODE_COMPILE_CACHE: compileCache } : {}), ...extraEnv };
      const p = procs.spawnPinned(PROXY_CORE, node, [...flags, standalone, '-c', edgeProxyConfig(dir, port, backendPort, leaf.cert, leaf.key, variant), '--port', String(port)], { stdout: 'pipe', env });
      const line = await waitForListeningLine(p);
      const l = (line['listeners'] as Array<{ tcp: number; udp: number }>)[0] as { tcp: number; udp: number };
      return { key, name, proc: p, ours: true, h1Url: `https://127.0.0.1:${l.tcp}/`, h2Url: `https://127.0.0.1:${l.tcp}/`, h3Port: l.udp };
    };
    await start('ours', 'edge-proxy', () => startOurs('ours', 'edge-proxy (one worker)', path.join(repo, 'packages/dataplane/src/worker/standalone.ts')));
    // The same worker writing an access log line per request to a file (observability.access_log).
    await start('ours-access', 'edge-proxy with access log', () => startOurs('ours-access', 'edge-proxy, access log on (to a file)', path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), { accessLog: path.join(dir, 'access.log') }));
    // The same worker with performance.memory_trim off: between the rounds of a phase our worker idles
    // while the other targets are measured, long enough to trim; this target shows what that costs.
    await start('ours-notrim', 'edge-proxy without memory trim', () => startOurs('ours-notrim', 'edge-proxy, memory_trim off', path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), { memoryTrim: false }));
    // And with it on: between the rounds it trims, so each round measures the load after a trim.
    await start('ours-trim', 'edge-proxy with memory trim', () => startOurs('ours-trim', 'edge-proxy, memory_trim on', path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), { memoryTrim: true }));
    // The same worker without the compile cache: it strips its TypeScript itself, as every worker did
    // before the supervisor kept one (what the cache saves: docs/performance.md "Worker memory").
    await start('ours-nocache', 'edge-proxy without compile cache', () => startOurs('ours-nocache', 'edge-proxy, no compile cache', path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), {}, oursFlags, false));
    // The same worker with tracing on (sample_ratio 0.01), exporting to a collector stand-in in this process.
    if (wanted.has('ours-tracing')) {
      collector = await otlpSink();
      const url = collector.url;
      await start('ours-tracing', 'edge-proxy with tracing', () => startOurs('ours-tracing', 'edge-proxy, tracing on (sample_ratio 0.01)', path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), { tracingEndpoint: url }));
    }
    for (const [i, spec] of (values['alt-flags'] ?? []).entries()) {
      const key = `ours-alt${i + 1}`;
      wanted.add(key);
      await start(key, `edge-proxy ${spec}`, () => startOurs(key, `edge-proxy, flags: ${spec}`, path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), {}, flagsOf(spec)));
    }
    for (const [i, spec] of (values['alt-env'] ?? []).entries()) {
      const key = `ours-env${i + 1}`;
      wanted.add(key);
      const extra = Object.fromEntries(spec.split(/\s+/).filter((v) => v.includes('=')).map((v) => [v.slice(0, v.indexOf('=')), v.slice(v.indexOf('=') + 1)]));
      await start(key, `edge-proxy ${spec}`, () => startOurs(key, `edge-proxy, env: ${spec}`, path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), {}, oursFlags, true, extra));
    }
    // `edge-proxy serve` with one and with two workers (supervisor and all, as an operator runs it):
    // one worker on the proxy core as every other proxy; two on both cores, the second shared with
    // the load generator and the backend (this machine has two; docs/performance.md "Two workers").
    for (const [key, workers, cores] of [['serve1', 1, String(PROXY_CORE)], ['serve2', 2, `${CLIENT_CORE},${PROXY_CORE}`]] as const) {
      await start(key, `edge-proxy serve, ${workers} worker(s)`, async () => {
        const port = await freePort();
        const file = edgeProxyConfig(dir, port, backendPort, leaf.cert, leaf.key, { workers });
        const p = procs.spawn('taskset', ['-c', cores, node, path.join(repo, 'packages/cli/src/main.ts'), 'serve', '-c', file, '--state-dir', path.join(dir, `state-${key}`)], { stdout: 'pipe' });
        // "edge-proxy serving": every worker has committed and bound.
        await waitForJsonLine(p, '"msg":"edge-proxy serving"', 'not serving', 60_000);
        return { key, name: `edge-proxy serve, ${workers} worker${workers === 1 ? '' : 's'} (cores ${cores})`, proc: p, ours: true, h1Url: `https://127.0.0.1:${port}/`, h2Url: `https://127.0.0.1:${port}/`, h3Port: port };
      });
    }
    if (oursFlags.length > 0) log(`our worker's flags: ${oursFlags.join(' ')}`);
    if (tunables !== undefined) log(`our worker's GLIBC_TUNABLES: ${tunables}`);
    // The baseline runs with our worker's V8 flags and malloc tunables (today's defaults), so ours ÷ baseline compares code.
    if (values.baseline !== undefined) {
      const rev = values.baseline;
      baselineDir = extractBaseline(rev);
      await start('baseline', `edge-proxy@${rev}`, () => startOurs('baseline', `edge-proxy @ ${rev} (before)`, path.join(baselineDir as string, 'packages/dataplane/src/worker/standalone.ts'), {}, oursFlags, hasWarmup(baselineDir as string)));
    }
    if (tools.has('nginx')) {
      await start('nginx', 'nginx', async () => {
        const port = await freePort();
        const p = procs.spawnPinned(PROXY_CORE, nginx, ['-p', dir, '-e', path.join(dir, 'proxy-stderr.log'), '-c', nginxProxyConfig(dir, port, backendPort, leaf.cert, leaf.key)]);
        await waitForTcp(port, p);
        return { key: 'nginx', name: 'nginx proxy_pass', proc: p, h1Url: `https://127.0.0.1:${port}/`, h2Url: `https://127.0.0.1:${port}/` };
      });
    }
    if (tools.has('haproxy')) {
      await start('haproxy', 'haproxy', async () => {
        const port = await freePort();
        const p = procs.spawnPinned(PROXY_CORE, tools.get('haproxy') as string, ['-db', '-f', haproxyConfig(dir, port, backendPort, leaf.cert, leaf.key)]);
        await waitForTcp(port, p);
        return { key: 'haproxy', name: 'haproxy', proc: p, h1Url: `https://127.0.0.1:${port}/`, h2Url: `https://127.0.0.1:${port}/` };
      });
    } else log('haproxy skipped: install the Debian package haproxy');
    if (tools.has('caddy')) {
      await start('caddy', 'caddy', async () => {
        const port = await freePort();
        mkdirSync(path.join(dir, 'caddy-home'), { recursive: true });
        const p = procs.spawnPinned(PROXY_CORE, tools.get('caddy') as string, ['run', '--config', caddyConfig(dir, port, backendPort, leaf.cert, leaf.key), '--adapter', 'caddyfile'], { env: caddyEnv(dir) });
        await waitForTcp(port, p);
        return { key: 'caddy', name: 'caddy reverse_proxy', proc: p, h1Url: `https://127.0.0.1:${port}/`, h2Url: `https://127.0.0.1:${port}/`, h3Port: port };
      });
    } else log('caddy skipped: install the Debian package caddy');
    await start('fastify', '@fastify/http-proxy', async () => {
      const p = procs.spawnPinned(PROXY_CORE, node, [path.join(here, 'proxy.ts'), '--serve-fastify', '--cert', leaf.cert, '--key', leaf.key, '--upstream', `http://127.0.0.1:${backendPort}`], { stdout: 'pipe' });
      const line = await waitForListeningLine(p);
      return { key: 'fastify', name: '@fastify/http-proxy', proc: p, h1Url: `https://127.0.0.1:${Number(line['port'])}/` };
    });

    await start('bare', 'bare node:http2 + undici', async () => {
      // With our worker's V8 flags and malloc tunables (ours ÷ bare then compares the request path,
      // not heap settings) and its code from a compile cache, as our worker's (no TypeScript stripper).
      const p = await startBare(node, oursFlags, oursEnv, compileCache, leaf, backendPort, procs);
      const line = await waitForListeningLine(p);
      const url = `https://127.0.0.1:${Number(line['port'])}/`;
      return { key: 'bare', name: 'bare node:http2 + undici (no proxy logic)', proc: p, h1Url: url, h2Url: url };
    });

    // Every target must answer 200 "ok" from the backend before it is measured.
    for (const t of [direct, ...targets]) {
      if (t.h1Url !== undefined) await checkAnswer(t.h1Url, 'h1', t.name);
      if (t.h2Url !== undefined) await checkAnswer(t.h2Url, 'h2', t.name);
    }
    const all = [direct, ...targets];
    log(`\nbackend: nginx on core ${CLIENT_CORE} (with the load generators); proxies on core ${PROXY_CORE}; ${runs} rounds of ${seconds} s`);
    log(`targets: ${all.map((t) => t.name).join(', ')}`);

    const measure = async (phase: Phase, t: Target, run: () => Promise<LoadResult>): Promise<Sample> => {
      const pid = t.proc.pid as number;
      const before = treeCpuMicros(pid);
      const r = await run();
      const cpu = treeCpuMicros(pid) - before;
      const mem = treeMemoryShares(pid);
      const s = { ...r, cpuUsPerReq: r.requests > 0 ? cpu / r.requests : NaN, rssMiB: mem.rssMiB, privateMiB: mem.privateMiB };
      results.add(phase, t.key, s);
      log(`  ${phase} ${t.name}: ${Math.round(r.reqPerSec)} req/s, p99 ${fmtMs(r.p99)} ms, ${Math.round(s.cpuUsPerReq)} µs CPU/req${r.errors > 0 ? `, ${r.errors} errors` : ''}`);
      if (r.requests === 0) log(r.raw);
      return s;
    };

    // --datagrams: an HTTP/3 round under a capture of the target's UDP port.
    const datagramRows: DatagramRow[] = [];
    const counted = async (phase: Phase, t: Target, run: () => Promise<LoadResult>): Promise<LoadResult> => {
      if (tcpdump === undefined) return run();
      const file = path.join(dir, `datagrams-${t.key}.pcap`);
      const capture = await DatagramCapture.start(tcpdump, CLIENT_CORE, t.h3Port as number, file);
      let r: LoadResult | undefined;
      try {
        r = await run();
      } finally {
        const counts = await capture.stop();
        rmSync(file, { force: true });
        if (r !== undefined) {
          datagramRows.push({ phase, target: t.key, requests: r.requests, counts });
          log(`  ${phase} ${t.name} datagrams: ${fmtDatagrams(counts, r.requests)}`);
        }
      }
      return r;
    };

    if (!phases.has('h1')) log('HTTP/1.1 phase not asked for');
    else if (tools.has('wrk')) {
      log('\n== HTTP/1.1 warm-up (2 s each)');
      for (const t of all) if (t.h1Url !== undefined) await wrk(CLIENT_CORE, t.h1Url, connections, 2);
      for (let round = 0; round < runs; round++) {
        log(`== ${PHASE_TITLE.h1}, round ${round + 1}`);
        for (const t of all) if (t.h1Url !== undefined) await measure('h1', t, () => wrk(CLIENT_CORE, t.h1Url as string, connections, seconds));
      }
    } else log('HTTP/1.1 phase skipped: install the Debian package wrk');

    if (!phases.has('h2')) log('HTTP/2 phase not asked for');
    else if (tools.has('h2load')) {
      for (let round = 0; round < runs; round++) {
        log(`== ${PHASE_TITLE.h2}, round ${round + 1}`);
        for (const t of all) if (t.h2Url !== undefined) await measure('h2', t, () => h2load(CLIENT_CORE, t.h2Url as string, connections, 10, seconds));
      }
    } else log('HTTP/2 phase skipped: install the Debian package nghttp2-client');

    const h3Targets = all.filter((t) => t.h3Port !== undefined);
    if (!phases.has('h3')) log('HTTP/3 phase not asked for');
    else if (tools.has('gtlsclient') && h3Targets.length > 0) {
      const n = Number(values['h3-requests']);
      // Warm-up: --h3-warmup-rounds rounds' worth per target (default one). With 200 requests
      // (before 2026-11-25) round 1 measured a Node worker still compiling its HTTP/3 path and
      // growing its young generation: 3,058-3,699 req/s for ours and the baseline against medians
      // of 3,488-5,525 (docs/performance.md, "HTTP/3 warm-up in bench:proxy"); ten rounds did not
      // move the median against caddy ("Why HTTP/3 rounds on one connection spread so widely").
      const h3Round = (t: Target): Promise<LoadResult> => gtlsclient(CLIENT_CORE, '127.0.0.1', t.h3Port as number, `https://localhost:${t.h3Port}/`, n);
      log(`\n== HTTP/3 warm-up (${warmupRounds} × ${n} requests each)`);
      for (const t of h3Targets) for (let k = 0; k < warmupRounds; k++) await h3Round(t);
      for (let round = 0; round < Number(values['h3-runs']); round++) {
        log(`== ${PHASE_TITLE.h3}, round ${round + 1}`);
        for (const t of h3Targets) await measure('h3', t, () => counted('h3', t, () => h3Round(t)));
      }
    } else log('HTTP/3 phase skipped: needs gtlsclient (Debian package ngtcp2-client)');

    // The second HTTP/3 client run: many connections with few streams each (handshakes count).
    if (!phases.has('h3c')) log('HTTP/3 many-connections phase not asked for');
    else if (tools.has('gtlsclient') && h3Targets.length > 0) {
      const h3cRound = (t: Target): Promise<LoadResult> => gtlsclientMany(CLIENT_CORE, '127.0.0.1', t.h3Port as number, `https://localhost:${t.h3Port}/`, 30, 20, 5);
      // Warm-up: --h3-warmup-rounds rounds of the same shape per target (as the one-connection phase's).
      log(`\n== HTTP/3 many-connections warm-up (${warmupRounds} round(s) each)`);
      for (const t of h3Targets) for (let k = 0; k < warmupRounds; k++) await h3cRound(t);
      for (let round = 0; round < Number(values['h3-runs']); round++) {
        log(`== ${PHASE_TITLE.h3c}, round ${round + 1}`);
        for (const t of h3Targets) await measure('h3c', t, () => counted('h3c', t, () => h3cRound(t)));
      }
    } else log('HTTP/3 many-connections phase skipped: needs gtlsclient (Debian package ngtcp2-client)');

    // The second, independent HTTP/3 client: Chromium, on one connection and on many.
    const browserPhases = (['h3b', 'h3bc'] as const).filter((p) => phases.has(p));
    const chromium = browserPhases.length === 0 ? undefined : toolPath('chromium');
    if (browserPhases.length === 0) log('HTTP/3 Chromium phases not asked for');
    else if (chromium !== undefined && h3Targets.length > 0) {
      const origin = (t: Target): string => `127.0.0.1:${t.h3Port}`;
      const browser = await BrowserLoad.launch(chromium, CLIENT_CORE, h3Targets.map(origin), spkiHash(readFileSync(leaf.cert)));
      try {
        const rounds: Record<'h3b' | 'h3bc', (t: Target) => Promise<LoadResult>> = {
          h3b: (t) => browser.oneConnection(origin(t), BROWSER_ONE.requests, BROWSER_ONE.concurrency),
          h3bc: (t) => browser.manyConnections(origin(t), BROWSER_MANY.contexts, BROWSER_MANY.requests, BROWSER_MANY.waves),
        };
        for (const phase of browserPhases) {
          log(`\n== ${PHASE_TITLE[phase]}: warm-up (${warmupRounds} round(s) each)`);
          for (const t of h3Targets) for (let k = 0; k < warmupRounds; k++) await rounds[phase](t);
          for (let round = 0; round < Number(values['h3-runs']); round++) {
            log(`== ${PHASE_TITLE[phase]}, round ${round + 1}`);
            for (const t of h3Targets) await measure(phase, t, () => rounds[phase](t));
          }
        }
      } finally {
        await browser.close();
      }
    } else log('HTTP/3 Chromium phases skipped: needs chromium (Debian package chromium; `npm test` installs it)');

    const rates = new Map<number, number>();
    const peak = median(results.get('h1', 'ours').map((s) => s.reqPerSec));
    if (!phases.has('latency')) log('added-latency phase not asked for');
    else if (tools.has('h2load') && Number.isFinite(peak)) {
      const latTargets = all.filter((t) => t.key === 'direct' || t.ours === true || t.key === 'bare' || t.key === 'nginx' || t.key === 'caddy');
      for (const fraction of String(values['latency-at']).split(',').map(Number)) {
        const rate = Math.round(peak * fraction);
        rates.set(fraction, rate);
        for (let round = 0; round < latencyRuns; round++) {
          log(`== ${latencyTitle(fraction, rate)}, round ${round + 1}`);
          for (const t of latTargets) {
            await measure(`lat:${fraction}`, t, () => h1AtRate(CLIENT_CORE, t.h1Url as string, connections, rate, seconds, path.join(dir, `rate-${t.key}-${fraction}-${round}.log`), latencyClients));
          }
        }
      }
    } else log('added-latency phase skipped: needs h2load and an HTTP/1.1 peak of ours');

    // One reading of each process at the end of the load: its RSS, and the part it holds alone
    // (private: what its exit would free; the `node` binary's pages are shared with every other
    // node process here, as a worker's are with its supervisor and the other workers on an edge
    // node).
    const endMem = new Map(all.map((t) => [t.key, treeMemoryShares(t.proc.pid as number)]));
    // A supervised worker's own memory (the serve targets' tree holds the supervisor too): the
    // worker as an operator runs it, without the configuration loader the standalone "ours" carries.
    const workerMem = new Map(all.filter((t) => t.key.startsWith('serve')).map((t) => [t.key, childPids(t.proc.pid as number).map(memoryShares)]));
    for (const t of all) {
      const w = workerMem.get(t.key);
      const tree = endMem.get(t.key);
      if (w === undefined || tree === undefined) continue;
      const sup = memoryShares(t.proc.pid as number);
      log(`${t.name}: worker RSS ${w.map((m) => fmtInt(m.rssMiB)).join(' / ')} MiB (private ${w.map((m) => fmtInt(m.privateMiB)).join(' / ')}), supervisor ${fmtInt(sup.rssMiB)} MiB (private ${fmtInt(sup.privateMiB)}); the tree's PSS ${fmtInt(tree.pssMiB)} MiB, RSS summed ${fmtInt(tree.rssMiB)}`);
    }
    // The same after a quiet period: what each process gives back once the load is gone.
    const settleSeconds = Number(values['settle-seconds']);
    let settled: Map<string, number> | undefined;
    if (settleSeconds > 0) {
      log(`\nidle for ${settleSeconds} s, then RSS again`);
      await new Promise((r) => setTimeout(r, settleSeconds * 1000));
      settled = new Map(all.map((t) => [t.key, treeRssMiB(t.proc.pid as number)]));
    }
    for (const t of targets) await procs.stop(t.proc);
    const report = printReport(results, all, rates, endMem, seconds, settled, settleSeconds, workerMem);
    if (datagramRows.length > 0) printDatagrams(datagramRows, all);
    const accessLog = path.join(dir, 'access.log');
    if (existsSync(accessLog)) log(`access log of ours-access: ${readFileSync(accessLog, 'utf8').split('\n').filter((l) => l.includes('"log_type":"access"')).length} lines written`);
    if (collector !== undefined) log(`collector of ours-tracing: ${collector.exports} exports received (${collector.bytes} bytes)`);
    if (values.json !== undefined) writeFileSync(values.json, JSON.stringify({ rates: Object.fromEntries(rates), rss: Object.fromEntries([...endMem].map(([k, m]) => [k, m.rssMiB])), privateMiB: Object.fromEntries([...endMem].map(([k, m]) => [k, m.privateMiB])), workerPrivateMiB: Object.fromEntries([...workerMem].map(([k, w]) => [k, w.map((m) => m.privateMiB)])), rssSettled: settled === undefined ? null : Object.fromEntries(settled), datagrams: datagramRows, workerRss: Object.fromEntries([...workerMem].map(([k, w]) => [k, w.map((m) => m.rssMiB)])), report, samples: Object.fromEntries([...results.samples].map(([k, v]) => [k, v.map(({ raw: _raw, ...s }) => s)])) }, null, 2));
    // The backend keeps serving for the profile.
    if (values.profile !== undefined || values['alloc-profile'] !== undefined) {
      // --profile-variant access|tracing: the worker of target ours-access or ours-tracing instead;
      // bare: the bare node:http2 + undici process (HTTP/1.1 or HTTP/2), to compare a profile with its floor.
      const pv = values['profile-variant'];
      const variant: EdgeProxyVariant | 'bare' = pv === 'bare' ? 'bare' : pv === 'access' ? { accessLog: path.join(dir, 'profile-access.log') } : pv === 'tracing' && collector !== undefined ? { tracingEndpoint: collector.url } : {};
      const protoOf = (v: string | undefined): 'h1' | 'h2' | 'h3' | 'h3c' | 'h3b' => (v === 'h2' || v === 'h3' || v === 'h3c' || v === 'h3b' ? v : 'h1');
      // The flags of target `ours` (a supervised worker's by default), for bare as well.
      if (values.profile !== undefined) await profileOurs(protoOf(values.profile), node, oursFlags, dir, backendPort, leaf, connections, seconds, procs, variant);
      if (values['alloc-profile'] !== undefined) await profileOurs(protoOf(values['alloc-profile']), node, oursFlags, dir, backendPort, leaf, connections, seconds, procs, variant, values['alloc-survivors'] ? 'survivors' : 'alloc');
    }
    log(`\ntotal time ${Math.round((Date.now() - started) / 1000)} s`);
  } finally {
    await procs.stopAll();
    collector?.close();
  }
}

/** A stand-in OTLP/HTTP collector on 127.0.0.1: answers every export 200 and counts them. */
interface OtlpSink {
  readonly url: string;
  readonly exports: number;
  readonly bytes: number;
  close(): void;
}

async function otlpSink(): Promise<OtlpSink> {
  let exports = 0;
  let bytes = 0;
  const server = http.createServer((req, res) => {
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      exports++;
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1/traces`,
    get exports() {
      return exports;
    },
    get bytes() {
      return bytes;
    },
    close: () => server.close(),
  };
}

/**
 * Whether the extracted revision's worker knows the compile-cache warm-up (WORKER_WARMUP_ENV): a
 * revision from before it would serve instead of exiting, so it runs as its revision ran, compiling
 * its code itself.
 */
function hasWarmup(baselineDir: string): boolean {
  return readFileSync(path.join(baselineDir, 'packages/dataplane/src/worker/standalone.ts'), 'utf8').includes('WORKER_WARMUP_ENV');
}

/** The dataplane package of git revision `rev`, next to today's packages (node_modules resolves). */
function extractBaseline(rev: string): string {
  // Every workspace package of REV, so that the baseline's data plane runs with REV's telemetry,
  // config and http3 rather than today's. `node_modules/@edge-proxy/*` in the extract points at
  // the extracted packages; third-party modules resolve to the repository's (the extract lives
  // inside it), and a package's own node_modules are linked from the repository.
  const out = mkdtempSync(path.join(repo, '.bench-proxy-baseline-'));
  const tar = execFileSync('git', ['-C', repo, 'archive', rev, 'packages'], { maxBuffer: 256 * 1024 * 1024 });
  execFileSync('tar', ['-x', '-C', out], { input: tar });
  mkdirSync(path.join(out, 'node_modules/@edge-proxy'), { recursive: true });
  for (const pkg of readdirSync(path.join(out, 'packages'))) {
    const dir = path.join(out, 'packages', pkg);
    const own = path.join(repo, 'packages', pkg, 'node_modules');
    if (existsSync(own)) symlinkSync(own, path.join(dir, 'node_modules'));
    const { name } = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8')) as { name: string };
    if (name.startsWith('@edge-proxy/')) symlinkSync(dir, path.join(out, 'node_modules', name));
  }
  writeFileSync(path.join(out, 'package.json'), JSON.stringify({ type: 'module', private: true }));
  baselinePatchedModules(rev, out);
  return out;
}

/**
 * Third-party modules whose patch (patches/, patch-package) differs at `rev`: a copy of each under
 * the extract's node_modules, with today's patch reversed and REV's applied, so the baseline
 * runs the library code of its revision (the QUIC library's hot path is patched there).
 */
function baselinePatchedModules(rev: string, out: string): void {
  const list = (ref: string | undefined): Map<string, string> => {
    const names = ref === undefined ? readdirSync(path.join(repo, 'patches')) : execFileSync('git', ['-C', repo, 'ls-tree', '--name-only', `${ref}:patches`], { encoding: 'utf8' }).split('\n').filter((n) => n !== '');
    return new Map(names.map((n) => [n, ref === undefined ? readFileSync(path.join(repo, 'patches', n), 'utf8') : execFileSync('git', ['-C', repo, 'show', `${ref}:patches/${n}`], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })]));
  };
  const now = list(undefined);
  const then = list(rev);
  // "@matrixai+quic+2.0.9.patch" patches node_modules/@matrixai/quic.
  const moduleOf = (file: string): string => file.replace(/\+[^+]+\.patch$/, '').replace('+', '/');
  for (const file of new Set([...now.keys(), ...then.keys()])) {
    if (now.get(file) === then.get(file)) continue;
    const mod = moduleOf(file);
    // A scoped module comes with its whole scope: its siblings (@matrixai/async-init, ...) must
    // import the same copy of a patched one (@matrixai/events), or their symbols differ.
    const unit = mod.startsWith('@') ? (mod.split('/')[0] as string) : mod;
    if (!existsSync(path.join(out, 'node_modules', unit))) cpSync(path.join(repo, 'node_modules', unit), path.join(out, 'node_modules', unit), { recursive: true, dereference: true });
    const apply = (text: string, reverse: boolean): void => {
      execFileSync('patch', ['-s', '-p1', '-d', out, ...(reverse ? ['-R'] : [])], { input: text });
    };
    const current = now.get(file);
    const old = then.get(file);
    if (current !== undefined) apply(current, true);
    if (old !== undefined) apply(old, false);
    log(`baseline: node_modules/${mod} as patched at ${rev}`);
  }
}

/** GET `url` once over HTTP/1.1 or HTTP/2 and insist on the backend's `200 ok`. */
async function checkAnswer(url: string, proto: 'h1' | 'h2', name: string): Promise<void> {
  const { status, body } = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no answer over ${proto} in 5 s`)), 5000);
    const done = (status: number, body: string): void => {
      clearTimeout(timer);
      resolve({ status, body });
    };
    // A transport error names the target too (a bare "socket hang up" said nothing of which).
    const fail = (err: Error): void => {
      clearTimeout(timer);
      reject(new Error(`${name}: no answer over ${proto}: ${err.message}`));
    };
    if (proto === 'h1') {
      const onRes = (res: IncomingMessage): void => {
        let b = '';
        res.on('data', (d: Buffer) => (b += d.toString()));
        res.on('end', () => done(res.statusCode ?? 0, b));
      };
      const req = url.startsWith('https:') ? https.get(url, { rejectUnauthorized: false, agent: false }, onRes) : http.get(url, { agent: false }, onRes);
      req.on('error', fail);
    } else {
      const session = http2.connect(url, { rejectUnauthorized: false });
      session.on('error', fail);
      const s = session.request({ ':path': '/' });
      s.on('error', fail);
      let b = '';
      let st = 0;
      s.on('response', (h) => (st = Number(h[':status'])));
      s.on('data', (d: Buffer) => (b += d.toString()));
      s.on('end', () => {
        session.close();
        done(st, b);
      });
    }
  });
  if (status !== 200 || body !== 'ok') throw new Error(`${name} over ${proto}: expected 200 "ok", got ${status} ${JSON.stringify(body.slice(0, 80))}`);
}

function fmtMs(v: number): string {
  return Number.isFinite(v) ? v.toFixed(2) : '–';
}

function fmtInt(v: number): string {
  return Number.isFinite(v) ? Math.round(v).toLocaleString('en-US') : '–';
}

function fmtRatio(v: number): string {
  return Number.isFinite(v) ? `${v.toFixed(2)}×` : '–';
}

/** Per-round ratios a_i / b_i (rounds paired by index: measured minutes apart, in the same order). */
function ratios(a: readonly Sample[], b: readonly Sample[]): number[] {
  const n = Math.min(a.length, b.length);
  return Array.from({ length: n }, (_, i) => (a[i] as Sample).reqPerSec / (b[i] as Sample).reqPerSec);
}

/** Per round, b's CPU per request ÷ a's: above 1 when a costs less (a = ours). */
function cpuRatios(a: readonly Sample[], b: readonly Sample[]): number[] {
  const n = Math.min(a.length, b.length);
  return Array.from({ length: n }, (_, i) => (b[i] as Sample).cpuUsPerReq / (a[i] as Sample).cpuUsPerReq);
}

interface Verdict {
  readonly target: string;
  readonly met: boolean | undefined;
  readonly detail: string;
}

function printReport(results: Results, all: readonly Target[], rates: Map<number, number>, endMem: Map<string, MemoryShares>, seconds: number, settled: Map<string, number> | undefined, settleSeconds: number, workerMem: Map<string, MemoryShares[]>): Verdict[] {
  const byKey = new Map(all.map((t) => [t.key, t]));
  const ours = (phase: Phase): Sample[] => results.get(phase, 'ours');
  // Rounds per phase differ (--runs for HTTP/1.1, HTTP/2 and the fixed rate, --h3-runs for every
  // HTTP/3 phase), so each phase's title counts its own.
  log(`\n## Results (figures per round, "a / b"; closed-loop HTTP/1.1 and HTTP/2 rounds of ${seconds} s, HTTP/3 rounds of a fixed number of requests)`);
  log('Direct HTTP/1.1 is plain HTTP to the backend; direct HTTP/2 is the backend\'s own TLS + HTTP/2 listener; every proxy is measured over TLS.');
  log('CPU is the proxy\'s process tree (utime + stime) per request; for "direct" it is the backend\'s.');
  for (const phase of LOAD_PHASES) {
    const rows = all.filter((t) => results.get(phase, t.key).length > 0);
    if (rows.length === 0) continue;
    const rounds = Math.max(...rows.map((t) => results.get(phase, t.key).length));
    log(`\n### ${PHASE_TITLE[phase]}: ${rounds} round${rounds === 1 ? '' : 's'}`);
    if (CLIENT_BOUND.has(phase)) log('The client sets the rate here: compare the proxies by CPU per request ("CPU: this ÷ ours", above 1 when ours costs less).');
    log(`| target | req/s | p99 ms | CPU µs/req | × direct | ours ÷ this | CPU: this ÷ ours | RSS MiB after each round | RSS MiB at end of load | private MiB at end of load${settled === undefined ? '' : ` | RSS MiB after ${settleSeconds} s idle`} |`);
    log(`|---|---|---|---|---|---|---|---|---|---|${settled === undefined ? '' : '---|'}`);
    const d = results.get(phase, 'direct');
    for (const t of rows) {
      const s = results.get(phase, t.key);
      const vsDirect = d.length > 0 && t.key !== 'direct' ? ratios(s, d).map(fmtRatio).join(' / ') : '';
      const oursOverThis = t.key !== 'ours' && ours(phase).length > 0 ? ratios(ours(phase), s).map(fmtRatio).join(' / ') : '';
      const cpuOverOurs = t.key !== 'ours' && t.key !== 'direct' && ours(phase).length > 0 ? cpuRatios(ours(phase), s).map(fmtRatio).join(' / ') : '';
      log(`| ${t.name} | ${s.map((x) => fmtInt(x.reqPerSec)).join(' / ')} | ${s.map((x) => fmtMs(x.p99)).join(' / ')} | ${s.map((x) => fmtInt(x.cpuUsPerReq)).join(' / ')} | ${vsDirect} | ${oursOverThis} | ${cpuOverOurs} | ${s.map((x) => fmtInt(x.rssMiB)).join(' / ')} | ${fmtInt(endMem.get(t.key)?.rssMiB ?? NaN)} | ${fmtInt(endMem.get(t.key)?.privateMiB ?? NaN)} |${settled === undefined ? '' : ` ${fmtInt(settled.get(t.key) ?? NaN)} |`}`);
    }
  }
  const lat = (fraction: number, key: string): Sample[] => results.get(`lat:${fraction}`, key);
  for (const [fraction, rate] of rates) {
    if (lat(fraction, 'ours').length === 0) continue;
    log(`\n### ${latencyTitle(fraction, rate)}`);
    log('| target | achieved req/s | p50 ms | p99 ms | p99.9 ms | p99 − direct ms | CPU µs/req |');
    log('|---|---|---|---|---|---|---|');
    const direct = lat(fraction, 'direct');
    const alts = all.filter((t) => t.key.startsWith('ours-')).map((t) => t.key);
    for (const key of ['direct', 'ours', ...alts, 'baseline', 'bare', 'nginx', 'caddy']) {
      const s = lat(fraction, key) as Array<Sample & { p999?: number; achievedRate?: number }>;
      if (s.length === 0) continue;
      const added = key === 'direct' ? '' : s.map((x, i) => fmtMs(x.p99 - (direct[i]?.p99 ?? NaN))).join(' / ');
      log(`| ${byKey.get(key)?.name ?? key} | ${s.map((x) => fmtInt(x.achievedRate ?? x.reqPerSec)).join(' / ')} | ${s.map((x) => fmtMs(x.p50)).join(' / ')} | ${s.map((x) => fmtMs(x.p99)).join(' / ')} | ${s.map((x) => fmtMs(x.p999 ?? NaN)).join(' / ')} | ${added} | ${s.map((x) => fmtInt(x.cpuUsPerReq)).join(' / ')} |`);
    }
  }

  const verdicts: Verdict[] = [];
  /** A verdict on per-round ratios `r` (`what` names them): met when their median is at least `min`. */
  const roundsVerdict = (label: string, r: readonly number[], min: number, what: string, missing: string, tail = ''): void => {
    if (r.length === 0) {
      verdicts.push({ target: label, met: undefined, detail: `not measured (${missing})` });
      return;
    }
    const m = median(r);
    const all = r.every((x) => x >= min);
    verdicts.push({ target: label, met: m >= min, detail: `${what} = ${r.map(fmtRatio).join(' / ')} per round (median ${fmtRatio(m)}; ${all ? 'every round' : 'not every round'} ≥ ${min}×)${tail}` });
  };
  const ratioTarget = (phase: Phase, peer: string, min: number, label: string): void => {
    roundsVerdict(label, ratios(ours(phase), results.get(phase, peer)), min, `ours ÷ ${byKey.get(peer)?.name ?? peer}`, `${peer} or ours missing`);
  };
  ratioTarget('h1', 'fastify', 1.5, 'HTTP/1.1 ≥ 1.5× @fastify/http-proxy');
  ratioTarget('h1', 'caddy', 1, 'HTTP/1.1 ≥ Caddy reverse_proxy');
  ratioTarget('h2', 'caddy', 2, 'HTTP/2 ≥ 2× Caddy reverse_proxy');
  /** Per round at half of peak: p99(ours) − p99(peer), rounds where both were measured. */
  const addedOver = (peer: string): number[] => lat(0.5, 'ours').map((s, i) => s.p99 - (lat(0.5, peer)[i]?.p99 ?? NaN)).filter(Number.isFinite);
  const added = addedOver('direct');
  if (added.length > 0) {
    const m = median(added);
    verdicts.push({ target: 'p99 added latency < 2 ms at half of peak', met: m < 2, detail: `p99(ours) − p99(direct) = ${added.map((x) => `${fmtMs(x)} ms`).join(' / ')} per round at ${fmtInt(rates.get(0.5) ?? NaN)} req/s (median ${fmtMs(m)} ms)` });
  } else verdicts.push({ target: 'p99 added latency < 2 ms at half of peak', met: undefined, detail: 'not measured (--latency-at must include 0.5)' });
  // Issue 19's targets (the performance campaign).
  ratioTarget('h1', 'nginx', 0.55, 'HTTP/1.1 ≥ 0.55× nginx');
  ratioTarget('h2', 'nginx', 0.7, 'HTTP/2 ≥ 0.7× nginx');
  ratioTarget('h3', 'caddy', 1, 'HTTP/3 ≥ 1.0× Caddy');
  ratioTarget('h3c', 'caddy', 1, 'HTTP/3 ≥ 1.0× Caddy, many connections');
  // Chromium sets the rate of its phases, so there the capacity comparison is CPU per request.
  const cpuTarget = (phase: Phase, peer: string, label: string): void => {
    const tail = `; req/s ours ÷ it ${ratios(ours(phase), results.get(phase, peer)).map(fmtRatio).join(' / ')} (the client's rate)`;
    roundsVerdict(label, cpuRatios(ours(phase), results.get(phase, peer)), 1, `CPU per request, ${byKey.get(peer)?.name ?? peer}'s ÷ ours`, `${peer} or ours missing, or chromium`, tail);
  };
  cpuTarget('h3b', 'caddy', 'HTTP/3 ≥ 1.0× Caddy, Chromium client, one connection');
  cpuTarget('h3bc', 'caddy', 'HTTP/3 ≥ 1.0× Caddy, Chromium client, many connections');
  const oursRss = endMem.get('ours')?.rssMiB;
  const oursSettled = settled?.get('ours');
  if (oursRss !== undefined) {
    // One reading swings by tens of MiB (where in its GC cycle the worker stops), so the verdict
    // takes the worst of the reading after each load phase's last round and the final one.
    const afterPhase = LOAD_PHASES.flatMap((phase) => {
      const last = ours(phase).at(-1);
      return last === undefined ? [] : [{ phase, mib: last.rssMiB, privateMib: last.privateMiB }];
    });
    const worst = Math.max(oursSettled ?? oursRss, ...afterPhase.map((r) => r.mib));
    const served = workerMem.get('serve1');
    const phases = afterPhase.length === 0 ? '' : `after each phase's last round ${afterPhase.map((r) => `${r.phase} ${fmtInt(r.mib)} (private ${fmtInt(r.privateMib)})`).join(', ')} MiB; `;
    verdicts.push({ target: 'worker RSS ≤ 128 MiB after the load phases', met: worst <= 128, detail: `${phases}${fmtInt(oursRss)} MiB at the end of the last phase${oursSettled === undefined ? '' : `, ${fmtInt(oursSettled)} MiB after ${settleSeconds} s idle (performance.memory_trim off, its default; target ours-trim has it on)`}${served === undefined ? '' : `; the worker of \`edge-proxy serve\` (serve1): ${served.map((m) => fmtInt(m.rssMiB)).join(' / ')} MiB`}; private (not shared with other processes, what another worker adds to a node) at the end: ${fmtInt(endMem.get('ours')?.privateMiB ?? NaN)} MiB${served === undefined ? '' : `, serve1's worker ${served.map((m) => fmtInt(m.privateMiB)).join(' / ')} MiB`}` });
  }
  const vsBare = addedOver('bare');
  if (vsBare.length > 0) verdicts.push({ target: 'p99 at half of peak within 0.5 ms of the bare stack', met: median(vsBare) <= 0.5, detail: `p99(ours) − p99(bare) = ${vsBare.map((x) => `${fmtMs(x)} ms`).join(' / ')} per round (median ${fmtMs(median(vsBare))} ms)` });
  const vsCaddy = addedOver('caddy');
  if (vsCaddy.length > 0) verdicts.push({ target: 'p99 at half of peak ≤ Caddy\'s at the same rate', met: median(vsCaddy) <= 0, detail: `p99(ours) − p99(caddy) = ${vsCaddy.map((x) => `${fmtMs(x)} ms`).join(' / ')} per round (median ${fmtMs(median(vsCaddy))} ms)` });
  log('\n## Targets (one worker, each peer on one core, same run)');
  for (const v of verdicts) log(`- ${v.target}: ${v.met === undefined ? 'NOT MEASURED' : v.met ? 'MET' : 'NOT MET'}: ${v.detail}`);
  log('\n## Ratios without a target (ours ÷ peer, per round)');
  for (const phase of LOAD_PHASES) {
    for (const peer of ['nginx', 'haproxy', 'caddy', 'fastify', 'baseline', 'bare']) {
      const r = ratios(ours(phase), results.get(phase, peer));
      if (r.length > 0) log(`- ${phase}: ours ÷ ${byKey.get(peer)?.name ?? peer} = ${r.map(fmtRatio).join(' / ')}${CLIENT_BOUND.has(phase) ? ` (req/s, the client's); CPU per request, its ÷ ours = ${cpuRatios(ours(phase), results.get(phase, peer)).map(fmtRatio).join(' / ')}` : ''}`);
    }
  }
  return verdicts;
}

/** One HTTP/3 round's datagram counts (--datagrams). */
interface DatagramRow {
  readonly phase: Phase;
  readonly target: string;
  readonly requests: number;
  readonly counts: DatagramCounts;
}

/** "sent 1.06 per request (107 bytes each), received 0.12 per request (176 bytes each)". */
function fmtDatagrams(c: DatagramCounts, requests: number): string {
  const flow = (f: DatagramCounts['sent']): string => `${fmtMs(f.datagrams / requests)} per request (${fmtInt(f.bytes / Math.max(1, f.datagrams))} bytes each)`;
  return `sent ${flow(c.sent)}, received ${flow(c.received)}${c.dropped > 0 ? `; ${c.dropped} dropped by the capture` : ''}`;
}

/** Per target and HTTP/3 phase: datagrams sent and received per request, each round and the median. */
function printDatagrams(rows: readonly DatagramRow[], all: readonly Target[]): void {
  log('\n## HTTP/3 datagrams per request (--datagrams: the target\'s UDP port on lo, per round)');
  log('| phase | target | sent per request | bytes per sent datagram | received per request | bytes per received datagram |');
  log('|---|---|---|---|---|---|');
  for (const phase of ['h3', 'h3c'] as const) {
    for (const t of all) {
      const mine = rows.filter((r) => r.phase === phase && r.target === t.key && r.requests > 0);
      if (mine.length === 0) continue;
      const per = (f: (r: DatagramRow) => number, show: (v: number) => string): string => `${mine.map((r) => show(f(r))).join(' / ')} (median ${show(median(mine.map(f)))})`;
      const dropped = mine.reduce((n, r) => n + r.counts.dropped, 0);
      log(`| ${phase} | ${t.name}${dropped > 0 ? ` (${dropped} dropped by the capture)` : ''} | ${per((r) => r.counts.sent.datagrams / r.requests, fmtMs)} | ${per((r) => r.counts.sent.bytes / Math.max(1, r.counts.sent.datagrams), fmtInt)} | ${per((r) => r.counts.received.datagrams / r.requests, fmtMs)} | ${per((r) => r.counts.received.bytes / Math.max(1, r.counts.received.datagrams), fmtInt)} |`);
    }
  }
}

/** A CPU profile, a sampling heap profile of every allocation, or of those the young generation did not free. */
type ProfileKind = 'cpu' | 'alloc' | 'survivors';

/** Our worker once more under --cpu-prof with the same load; self time by owner and the top functions. */
async function profileOurs(proto: 'h1' | 'h2' | 'h3' | 'h3c' | 'h3b', node: string, v8Flags: readonly string[], dir: string, backendPort: number, leaf: { cert: string; key: string }, connections: number, seconds: number, procs: Processes, variant: EdgeProxyVariant | 'bare', kind: ProfileKind = 'cpu'): Promise<void> {
  const profDir = path.join(dir, kind === 'cpu' ? 'prof' : 'alloc');
  mkdirSync(profDir, { recursive: true });
  const allocFile = path.join(profDir, 'alloc.heapprofile');
  if (variant === 'bare' && proto !== 'h1' && proto !== 'h2') throw new Error('--profile-variant bare: HTTP/1.1 or HTTP/2 only (--profile h1|h2)');
  const port = await freePort();
  const args = variant === 'bare'
    ? [path.join(here, 'bare-proxy.ts'), '--cert', leaf.cert, '--key', leaf.key, '--upstream', `http://127.0.0.1:${backendPort}`]
    : [path.join(repo, 'packages/dataplane/src/worker/standalone.ts'), '-c', edgeProxyConfig(dir, port, backendPort, leaf.cert, leaf.key, variant), '--port', String(port)];
  const flags = [...v8Flags, ...(kind === 'cpu' ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : ['--import', path.join(repo, 'scripts/lib/alloc-sampler.ts')])];
  const p = procs.spawnPinned(PROXY_CORE, node, [...flags, ...args], { stdout: 'pipe', env: { ...process.env, EDGE_ALLOC_OUT: allocFile, ...(kind === 'survivors' ? { EDGE_ALLOC_SURVIVORS: '1' } : {}) } });
  const line = await waitForListeningLine(p);
  const udp = (line['listeners'] as Array<{ udp: number }> | undefined)?.[0]?.udp as number;
  const url = `https://127.0.0.1:${variant === 'bare' ? Number(line['port']) : port}/`;
  // HTTP/3: gtlsclient on one connection, as the h3 phase; its request count scales with --seconds.
  const h3 = (n: number): Promise<LoadResult> => gtlsclient(CLIENT_CORE, '127.0.0.1', udp, `https://localhost:${udp}/`, n);
  // h3c: the many-connections phase's shape (30 connections of 20 requests per wave), one wave per second asked.
  const h3c = (s: number): Promise<LoadResult> => gtlsclientMany(CLIENT_CORE, '127.0.0.1', udp, `https://localhost:${udp}/`, 30, 20, Math.max(1, s));
  // h3b: Chromium on one connection, as the h3b phase; about 600 requests per second asked (its rate here).
  const chromium = proto === 'h3b' ? toolPath('chromium') : undefined;
  if (proto === 'h3b' && chromium === undefined) throw new Error('--profile h3b needs chromium (Debian package chromium)');
  const origin = `127.0.0.1:${udp}`;
  const browser = chromium === undefined ? undefined : await BrowserLoad.launch(chromium, CLIENT_CORE, [origin], spkiHash(readFileSync(leaf.cert)));
  const h3b = (s: number): Promise<LoadResult> => (browser as BrowserLoad).oneConnection(origin, Math.max(200, s * 600), BROWSER_ONE.concurrency);
  const run = (s: number): Promise<LoadResult> => (proto === 'h1' ? wrk(CLIENT_CORE, url, connections, s) : proto === 'h2' ? h2load(CLIENT_CORE, url, connections, 10, s) : proto === 'h3' ? h3(Math.max(200, s * 1000)) : proto === 'h3b' ? h3b(s) : h3c(s));
  const loadName = `${variant === 'bare' ? 'the bare node:http2 + undici process' : 'our worker'} under ${proto === 'h1' ? 'wrk' : proto === 'h2' ? 'h2load' : proto === 'h3' ? 'gtlsclient' : proto === 'h3b' ? 'Chromium, one connection' : 'gtlsclient, 30 connections per wave'}`;
  try {
    await profileRun(p, run, kind, seconds, allocFile, loadName, procs, profDir);
  } finally {
    await browser?.close();
  }
}

/** Runs the profiled load on the worker `p` and reports what the profile says. */
async function profileRun(p: ChildProcess, run: (s: number) => Promise<LoadResult>, kind: ProfileKind, seconds: number, allocFile: string, loadName: string, procs: Processes, profDir: string): Promise<void> {
  await run(2);
  if (kind !== 'cpu') {
    const sampling = waitForJsonLine(p, 'alloc-sampling', 'the allocation sampler did not start', 10_000);
    p.kill('SIGUSR2');
    await sampling;
    const r = await run(seconds);
    const written = waitForJsonLine(p, 'alloc-written', 'the allocation profile was not written', 30_000);
    p.kill('SIGUSR2');
    await written;
    await procs.stop(p, 10_000);
    log(`\n## ${kind === 'survivors' ? 'Allocations the young generation did not free (promoted or pretenured)' : 'Allocations'} of ${loadName} (${Math.round(r.reqPerSec)} req/s while sampled${r.errors > 0 ? `, ${r.errors} ERRORS` : ''})`);
    reportAllocations(JSON.parse(readFileSync(allocFile, 'utf8')) as AllocProfile, r.requests, kind === 'survivors' ? 'not freed by the young generation' : 'allocated');
    return;
  }
  const r = await run(seconds);
  log(`\n## CPU profile of ${loadName} (${Math.round(r.reqPerSec)} req/s while profiled${r.errors > 0 ? `, ${r.errors} ERRORS` : ''})`);
  await procs.stop(p, 10_000);
  const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
  if (file === undefined) {
    log('no profile written');
    return;
  }
  const prof = JSON.parse(readFileSync(path.join(profDir, file), 'utf8')) as { nodes: Array<{ id: number; children?: number[]; callFrame: { url: string; functionName: string; lineNumber: number } }>; samples: number[]; timeDeltas: number[] };
  const self = new Map<number, number>();
  prof.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (prof.timeDeltas[i] ?? 0)));
  const owners = new Map<string, number>();
  const functions = new Map<string, number>();
  let total = 0;
  for (const n of prof.nodes) {
    const t = self.get(n.id) ?? 0;
    const { url, functionName } = n.callFrame;
    if (functionName === '(idle)' || t === 0) continue;
    total += t;
    const owner = functionName === '(garbage collector)' ? 'garbage collection'
      : url.includes('/prom-client/') ? 'prom-client'
      : url.includes('/undici/') ? 'undici'
      : url.includes('/@matrixai/') ? '@matrixai (QUIC library and its helpers)'
      : url.includes('/packages/http3/') ? 'ours: packages/http3'
      : url.includes('/node_modules/') ? 'other node_modules'
      : url.includes('/packages/dataplane/') ? 'ours: packages/dataplane'
      : url.includes('/packages/') ? 'ours: other packages'
      : url.startsWith('node:') ? 'Node internals (http, http2, tls, net, streams)'
      : 'native (TLS, syscalls, V8)';
    owners.set(owner, (owners.get(owner) ?? 0) + t);
    const fn = frameName(n.callFrame);
    functions.set(fn, (functions.get(fn) ?? 0) + t);
  }
  log('| owner | share of busy time |');
  log('|---|---|');
  for (const [k, v] of [...owners].sort((a, b) => b[1] - a[1])) log(`| ${k} | ${((v / total) * 100).toFixed(1)} % |`);
  log('\ntop functions by self time:');
  for (const [k, v] of [...functions].sort((a, b) => b[1] - a[1]).slice(0, 30)) log(`  ${((v / total) * 100).toFixed(1).padStart(5)} %  ${k}`);
  // Inclusive time of our own functions (self + callees), each function counted once per stack.
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const inclusive = new Map<string, number>();
  for (const n of prof.nodes) {
    const t = self.get(n.id) ?? 0;
    if (t === 0 || n.callFrame.functionName === '(idle)') continue;
    const seen = new Set<string>();
    for (let id: number | undefined = n.id; id !== undefined; id = parent.get(id)) {
      const f = (byId.get(id) as typeof n).callFrame;
      if (!f.url.includes('/packages/') || f.url.includes('/node_modules/')) continue;
      const k = frameName(f);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + t);
    }
  }
  log('\nour functions by inclusive time (self + callees):');
  for (const [k, v] of [...inclusive].sort((a, b) => b[1] - a[1]).slice(0, 30)) log(`  ${((v / total) * 100).toFixed(1).padStart(5)} %  ${k}`);
}

/** A profile frame as the reports print it: function, path from `packages/` or `node_modules/`, line. */
function frameName(f: { readonly functionName: string; readonly url: string; readonly lineNumber: number }): string {
  return `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*\/(packages|node_modules)\//, '$1/')}:${f.lineNumber + 1}`;
}

interface AllocNode {
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly selfSize: number;
  readonly children: readonly AllocNode[];
}
interface AllocProfile {
  readonly head: AllocNode;
}

/** Prints what a sampling heap profile says was allocated per request: the total, by site, and under each of our functions. */
function reportAllocations(profile: AllocProfile, requests: number, what: string): void {
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let total = 0;
  // Depth first with the names on the stack, so a recursive function is counted once per stack.
  const walk = (n: AllocNode, stack: ReadonlySet<string>): number => {
    const k = frameName(n.callFrame);
    self.set(k, (self.get(k) ?? 0) + n.selfSize);
    total += n.selfSize;
    const inner = new Set(stack).add(k);
    let sub = n.selfSize;
    for (const c of n.children) sub += walk(c, inner);
    if (!stack.has(k) && n.callFrame.url.includes('/packages/') && !n.callFrame.url.includes('/node_modules/')) inclusive.set(k, (inclusive.get(k) ?? 0) + sub);
    return sub;
  };
  walk(profile.head, new Set());
  const perReq = (b: number): string => `${Math.round(b / Math.max(1, requests)).toLocaleString('en-US').padStart(6)} B`;
  log(`${(total / 2 ** 20).toFixed(0)} MiB ${what} over ${requests.toLocaleString('en-US')} requests: ${(total / Math.max(1, requests) / 1024).toFixed(1)} KiB per request (sampled estimate)`);
  log('\ntop allocation sites (self), per request:');
  for (const [k, v] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 25)) log(`  ${perReq(v)}  ${k}`);
  log('\nour functions (self + callees), per request:');
  for (const [k, v] of [...inclusive].sort((a, b) => b[1] - a[1]).slice(0, 20)) log(`  ${perReq(v)}  ${k}`);
}

/** The @fastify/http-proxy peer: an https fastify server proxying every path to `upstream`. */
async function serveFastify(cert: string, key: string, upstream: string): Promise<void> {
  const { default: Fastify } = await import('fastify');
  const { default: proxy } = await import('@fastify/http-proxy');
  const app = Fastify({ logger: false, https: { cert: readFileSync(cert), key: readFileSync(key) } });
  await app.register(proxy, { upstream });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  console.log(JSON.stringify({ event: 'listening', port: typeof address === 'object' && address !== null ? address.port : 0 }));
  process.on('SIGTERM', () => void app.close().then(() => process.exit(0)));
}

/**
 * The bare floor (bare-proxy.ts) on the proxy core with `flags`, its code from `cacheDir`: a first
 * run, stopped once it listens, fills the cache (node writes it at exit).
 */
async function startBare(node: string, flags: readonly string[], oursEnv: NodeJS.ProcessEnv, cacheDir: string, leaf: { cert: string; key: string }, backendPort: number, procs: Processes): Promise<ChildProcess> {
  const args = [...flags, path.join(here, 'bare-proxy.ts'), '--cert', leaf.cert, '--key', leaf.key, '--upstream', `http://127.0.0.1:${backendPort}`];
  const env = { ...process.env, ...oursEnv, NODE_COMPILE_CACHE: cacheDir };
  const warm = procs.spawn(node, args, { stdout: 'pipe', env });
  await waitForListeningLine(warm);
  await procs.stop(warm);
  return procs.spawnPinned(PROXY_CORE, node, args, { stdout: 'pipe', env });
}

if (values['serve-fastify']) {
  await serveFastify(values.cert as string, values.key as string, values.upstream as string);
} else {
  await main();
}
