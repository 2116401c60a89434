// Overload benchmark: offered load from 0.5× to 10× a slow backend's capacity, through a real
// `edge-proxy serve`, to show what overload protection keeps (issue 13, "Must show").
//
//   npm run bench:overload [-- --workers 1 --steps 0.5,1,2,4,6,8,10 --seconds 6 --warmup 1
//                             --concurrency 8 --service-ms 50 --core-share 0.25 --deadline-ms 10000
//                             --connections 128 --config FILE --print-config --json FILE]
//   npm run bench:overload -- --lease-phase [--workers 4 --limit 64 --service-ms 20 --seconds 2]
//                             (only the lease phase: scripts/bench/overload-lease.ts)
//
// - Backend (scripts/lib/slow-backend.ts, its own process): at most K requests served at once
//   (--concurrency, 8), each taking S ms (--service-ms, 50), the rest waiting in its own FIFO:
//   capacity C = K ÷ S = 160 req/s. Both routes' pools point at this one backend process, so bulk
//   traffic and core traffic compete for the same K slots as they would in front of one real
//   service: without protection, bulk's backlog becomes core's latency.
// - Proxy: `edge-proxy serve` (--workers, 1 by default; every limit is the node's), HTTP/1.1 over
//   TLS on the listener's TCP ingress, plain HTTP/1.1 to the backend; the configuration is
//   DEFAULT_CONFIG below (--config FILE: a template of the same form, --print-config prints it).
// - Load (scripts/lib/open-loop.ts): open loop on loopback. Per step the core route gets a fixed
//   --core-share × C (40 req/s) and the bulk route the rest of the step's total (--steps × C).
//   Each step is --warmup s (not counted) plus --seconds s; every request has a --deadline-ms
//   deadline. Between steps the script waits for the backend's backlog to clear.
// - Per step: offered rate, goodput, success, shed rate and reasons per route; p50/p99 of admitted
//   (2xx) and of shed (503 + Retry-After) answers; other failures; shed reasons from
//   `svc_overload_shed_by_reason_total` (metrics endpoint, before/after); brownout state and
//   adaptive limit mid-step; worker RSS (/proc of the serve process's children); worker restarts
//   (control API snapshot `workers.exits`/`reforks`, and worker pids changing); the generator's
//   own schedule lag, connection wait and CPU.
// - Output: markdown tables on stdout, a JSON file with --json, and a verdict on the issue's
//   targets: core ≥ 95 % success at 10×, shed answers p99 < 5 ms, no worker restart.
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { percentile } from '../lib/bench-load.ts';
import { Processes, waitForListeningLine } from '../lib/bench-peers.ts';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { loadPool, runOpenLoop, warmConnections } from '../lib/open-loop.ts';
import type { GeneratorHealth, Outcome } from '../lib/open-loop.ts';
import { childPids, cpuMicros, processTree, rssMiB } from '../lib/proc-stats.ts';
import { startSlowBackend } from '../lib/slow-backend.ts';
import type { SlowBackendStats } from '../lib/slow-backend.ts';
import { parseExposition, scrape, sumByLabel } from '../../test/support/exposition.ts';
import type { Sample } from '../../test/support/exposition.ts';
import { api, serve } from '../../test/support/serve.ts';
import { fmt, fmtCounts, fmtPct } from '../lib/bench-format.ts';
import type { Verdict } from '../lib/bench-format.ts';
import { scriptArgs } from '../lib/bench-args.ts';
import { leasePhase } from './overload-lease.ts';

const { values } = scriptArgs({
  options: {
    workers: { type: 'string', default: '1' },
    steps: { type: 'string', default: '0.5,1,2,4,6,8,10' },
    seconds: { type: 'string', default: '6' },
    warmup: { type: 'string', default: '1' },
    concurrency: { type: 'string', default: '8' },
    'service-ms': { type: 'string', default: '50' },
    'core-share': { type: 'string', default: '0.25' },
    'deadline-ms': { type: 'string', default: '10000' },
    connections: { type: 'string', default: '128' },
    config: { type: 'string' },
    'lease-phase': { type: 'boolean', default: false },
    limit: { type: 'string', default: '64' },
    'print-config': { type: 'boolean', default: false },
    json: { type: 'string' },
    // Internal: run the slow backend in this process (the benchmark starts itself so).
    'serve-backend': { type: 'boolean', default: false },
  },
  strict: true,
});

/**
 * The proxy's configuration, as a template: `${NAME}` is filled in by the script (ports, files,
 * token, workers). The knobs assume the default backend (K = 8, S = 50 ms, C = 160 req/s); with
 * other --concurrency/--service-ms, pass a --config of your own. Every limit is the node's,
 * whatever --workers (docs/overload.md "One node, one set of limits").
 */
const DEFAULT_CONFIG = `# edge-proxy configuration for npm run bench:overload; the script fills in the \${...} placeholders.
listen: { address: 127.0.0.1, port: \${LISTEN_PORT}, tls: { cert: \${CERT}, key: \${KEY} } }
log: { level: info, format: json }
performance:
  worker_threads: \${WORKERS}
  # Hard ceiling of requests in flight on the node; adaptive admission moves below it.
  global_inflight_limit: 64
  per_upstream_inflight_limit: 64
  # The backend serves K = 8 at once. 4K in flight per backend lets its FIFO hold 3K behind the K
  # being served (at most 4 S = 200 ms of waiting there, enough to keep it busy) and keeps the rest
  # in our route queues, where they can be shed, instead of the backend's, where they cannot.
  per_backend_inflight_limit: 32
  # All the load comes from one loopback address: the default per-source cap (256 connections)
  # would refuse the generator's connections, which is a different protection than the one measured.
  max_connections_per_source: 2048
  timeouts:
    # An answer later than 5 s helps nobody; shorter than the generator's 10 s deadline, so the
    # proxy gives up (504, counted as a failure) before the client does.
    backend_request_ms: 5000
    shutdown_drain_ms: 2000
resilience:
  adaptive_admission:
    enabled: true
    # Never below the backend's own concurrency K: a lower limit would leave backend slots idle.
    min_limit: 8
    # Start at the hard ceiling; the controller finds the level the backend sustains.
    max_limit: 64
    # Cut fast, grow slowly: a latency spike empties the backend's FIFO within a few windows,
    # and recovery probes upward 2 at a time (about 100 ms per window).
    decrease_step: 8
    increase_step: 2
    # 3 S: a request that waited two service times in the backend's FIFO is queueing, not working.
    high_latency_ms: 150
  brownout:
    enabled: true
    # Spec defaults: shed bulk once in-flight reaches 90 % of the limit in force, admit it again
    # at 60 % (hysteresis so the state does not flap on every request).
    trigger_inflight_percent: 90
    recover_inflight_percent: 60
    # The route that must stay served (>= 95 % success at 10x); every other pool is shed first.
    core_routes: [core]
  route_queue:
    # Core sends 40 req/s: 128 waiters is about 3 s of its traffic, so core is never shed for a full
    # queue while max_wait_ms bounds its wait. Bulk gets a short queue: past 64 waiters an
    # immediate 503 is kinder than a 1 s wait that ends in a 503 anyway.
    default_cap: 64
    caps: { core: 128, bulk: 64 }
    global_cap: 256
    # About 20 S: long enough to ride out a burst, short enough that a client's retry (after
    # Retry-After) is not racing its own queued request.
    max_wait_ms: 1000
    shed_retry_after_seconds: 1
  circuit_breaker:
    # The backend is slow, never failing (it answers 200): the breaker must stay closed throughout.
    enabled: true
observability:
  metrics: { address: 127.0.0.1, port: \${METRICS_PORT} }
  control_api: { address: 127.0.0.1, port: \${CONTROL_PORT}, auth: { bearer_tokens: [{ token: \${TOKEN}, role: operator, actor_id: bench }] } }
upstream:
  core: { route: { path_prefix: /core/ }, backends: [{ id: slow, address: "127.0.0.1:\${BACKEND_PORT}" }] }
  bulk: { route: { path_prefix: /bulk/ }, backends: [{ id: slow, address: "127.0.0.1:\${BACKEND_PORT}" }] }
`;

const TOKEN = 'bench-overload-token-0123456789abcdef';
const ROUTES = ['core', 'bulk'] as const;
type Route = (typeof ROUTES)[number];
const log = (line: string): void => console.log(line);

/** `${NAME}` → vars[NAME]; an unknown name is an error (a typo in a --config file). */
function fill(template: string, vars: Record<string, string | number>): string {
  return template.replace(/\$\{([A-Z_]+)\}/g, (_, name: string) => {
    if (!(name in vars)) throw new Error(`--config: unknown placeholder \${${name}} (known: ${Object.keys(vars).join(', ')})`);
    return String(vars[name]);
  });
}

/** Figures of one route in one step. */
interface RouteStep {
  readonly route: Route;
  readonly targetRate: number;
  readonly offeredPerSec: number;
  readonly goodputPerSec: number;
  readonly successPercent: number;
  readonly shedPerSec: number;
  readonly shedByReason: Record<string, number>;
  readonly okP50Ms: number;
  readonly okP99Ms: number;
  readonly shedP50Ms: number;
  readonly shedP99Ms: number;
  /** Answers neither 2xx nor shed, and requests with no answer, by status or error. */
  readonly otherFailures: Record<string, number>;
  /** Share of the answers that closed their HTTP/1.1 connection (`connection: close`), %. */
  readonly closedPercent: number;
}

/** Figures of one step, both routes. */
interface Step {
  readonly multiple: number;
  readonly totalRate: number;
  readonly routes: readonly RouteStep[];
  /** Δ svc_overload_shed_by_reason_total over the step (all routes, all workers). */
  readonly metricShedByReason: Record<string, number>;
  /** Gauges scraped halfway through the measured window (NaN if absent). */
  readonly midStep: { brownoutActive: number; adaptiveLimit: number; inflight: number };
  /** Highest RSS of each worker during the step, MiB, by pid. */
  readonly workerRssMiB: Record<string, number>;
  /** CPU of the workers over the step (warm-up included), % of one core, summed over workers. */
  readonly workerCpuPercent: number;
  /** Δ of the snapshot's worker exits + reforks, and whether the worker pids changed. */
  readonly workerRestarts: number;
  readonly workerPidsChanged: boolean;
  /** Backend figures from the step's start to its last answer (warm-up included). */
  readonly backend: { servedPerSec: number; dropped: number; maxQueued: number };
  /** Connections open at the step's start, both Pools. */
  readonly connectionsAtStart: number;
  readonly generator: GeneratorHealth;
  /** Time the backend took to clear its backlog after the step, s. */
  readonly drainSeconds: number;
}

/**
 * Offered rate, success and latencies are over the requests sent in the measured window; goodput
 * is the 2xx answers received in it (an answer that came late belongs to the time it came).
 */
function summarise(route: Route, targetRate: number, outcomes: readonly Outcome[], okInWindow: number, seconds: number): RouteStep {
  const ok = outcomes.filter((o) => o.kind === 'ok').map((o) => o.latencyMs).sort((a, b) => a - b);
  const shed = outcomes.filter((o) => o.kind === 'shed');
  const shedLat = shed.map((o) => o.latencyMs).sort((a, b) => a - b);
  const count = (xs: readonly Outcome[]): Record<string, number> => {
    const out: Record<string, number> = {};
    for (const o of xs) out[o.detail] = (out[o.detail] ?? 0) + 1;
    return out;
  };
  return {
    route,
    targetRate,
    offeredPerSec: outcomes.length / seconds,
    goodputPerSec: okInWindow / seconds,
    successPercent: outcomes.length === 0 ? NaN : (ok.length / outcomes.length) * 100,
    shedPerSec: shed.length / seconds,
    shedByReason: count(shed),
    okP50Ms: percentile(ok, 0.5),
    okP99Ms: percentile(ok, 0.99),
    shedP50Ms: percentile(shedLat, 0.5),
    shedP99Ms: percentile(shedLat, 0.99),
    otherFailures: count(outcomes.filter((o) => o.kind === 'status' || o.kind === 'error')),
    closedPercent: outcomes.length === 0 ? NaN : (outcomes.filter((o) => o.closed).length / outcomes.length) * 100,
  };
}

/** The control API snapshot's count of worker exits and re-forks, and the worker pids it lists. */
async function workerRecord(controlPort: number, ca: Buffer): Promise<{ restarts: number; pids: number[] }> {
  const r = await api(controlPort, ca, 'GET', '/admin/runtime', { token: TOKEN });
  if (r.status !== 200) throw new Error(`GET /admin/runtime answered ${r.status}`);
  const w = r.body['workers'] as { list: Array<{ pid: number }>; exits: Record<string, number>; reforks: number };
  const exits = Object.values(w.exits).reduce((a, b) => a + b, 0);
  return { restarts: exits + Number(w.reforks ?? 0), pids: w.list.map((x) => x.pid).sort((a, b) => a - b) };
}

async function backendStats(port: number, reset = false): Promise<SlowBackendStats> {
  const res = await fetch(`http://127.0.0.1:${port}/__stats${reset ? '?reset=1' : ''}`, { signal: AbortSignal.timeout(5000) });
  return (await res.json()) as SlowBackendStats;
}

/** Polls the backend until nothing is queued or served; resolves with the wait, s (at most `maxMs`). */
async function drainBackend(port: number, maxMs: number): Promise<number> {
  const t0 = Date.now();
  while (Date.now() - t0 < maxMs) {
    const s = await backendStats(port);
    if (s.queued === 0 && s.active === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return (Date.now() - t0) / 1000;
}

/** One scrape of the metrics endpoint, parsed. */
async function metrics(port: number): Promise<Sample[]> {
  return parseExposition(await scrape(port));
}

/** Sum of `name`'s samples; NaN when the metric is not exported (a gauge not built yet). */
function total(samples: readonly Sample[], name: string): number {
  const xs = samples.filter((s) => s.name === name);
  return xs.length === 0 ? NaN : xs.reduce((sum, s) => sum + s.value, 0);
}

function delta(after: Map<string, number>, before: Map<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) {
    const d = v - (before.get(k) ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}

async function main(): Promise<void> {
  if (values['lease-phase']) {
    // Only the lease phase (scripts/bench/overload-lease.ts): lease traffic and the in-flight bound while the load moves between workers.
    await leasePhase({ workers: values.workers === '1' ? 4 : Number(values.workers), limit: Number(values.limit), serviceMs: values['service-ms'] === '50' ? 20 : Number(values['service-ms']), seconds: values.seconds === '6' ? 2 : Number(values.seconds) }, log);
    return;
  }
  if (values['print-config']) {
    process.stdout.write(DEFAULT_CONFIG);
    return;
  }
  const workers = Number(values.workers);
  const steps = String(values.steps).split(',').map(Number);
  const seconds = Number(values.seconds);
  const warmup = Number(values.warmup);
  const k = Number(values.concurrency);
  const serviceMs = Number(values['service-ms']);
  const capacity = (k * 1000) / serviceMs;
  const coreRate = Number(values['core-share']) * capacity;
  const deadlineMs = Number(values['deadline-ms']);
  const connections = Number(values.connections);
  if (steps.some((s) => !(s > 0)) || !(seconds > 0) || !(capacity > 0)) throw new Error('--steps, --seconds, --concurrency and --service-ms must be positive numbers');

  const dir = mkdtempSync(path.join(tmpdir(), 'bench-overload-'));
  const procs = new Processes();
  // Whatever happens, nothing the benchmark started outlives it.
  process.on('exit', () => {
    procs.killAll();
    rmSync(dir, { recursive: true, force: true });
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));

  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  const caPem = readFileSync(ca.cert);

  const backendProc: ChildProcess = procs.spawn(process.execPath, [new URL(import.meta.url).pathname, '--serve-backend', '--concurrency', String(k), '--service-ms', String(serviceMs)], { stdout: 'pipe' });
  const backendPort = Number((await waitForListeningLine(backendProc))['port']);

  const ports = { LISTEN_PORT: await freePort(), METRICS_PORT: await freePort(), CONTROL_PORT: await freePort() };
  const template = values.config === undefined ? DEFAULT_CONFIG : readFileSync(values.config, 'utf8');
  const configText = fill(template, { ...ports, BACKEND_PORT: backendPort, CERT: leaf.cert, KEY: leaf.key, TOKEN, WORKERS: workers });
  const served = await serve(path.join(dir, 'overload.yaml'), configText, 60_000);
  const servePid = served.proc.pid as number;
  // serve() stops a proxy that failed to start; one that started is killed with its workers on any exit.
  process.on('exit', () => {
    if (served.proc.exitCode !== null || served.proc.signalCode !== null) return;
    for (const pid of processTree(servePid)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  });
  const origin = `https://127.0.0.1:${ports.LISTEN_PORT}`;
  // Bulk needs about per_backend_inflight_limit + its queue cap (32 + 64) connections at once, core
  // 40 req/s × (max_wait_ms + a few S) ≈ 50. Bigger pools made this process open connections in
  // the middle of a run (undici spreads a burst over idle ones) and fall behind: measured on the
  // 2-core machine against a bare TLS server at 1,560 req/s, 128 connections kept a p99 lag of
  // 4 ms, 256 gave 190 ms. A request that finds every connection busy waits in the generator
  // and is reported ("waiting for a connection").
  const poolSize: Record<Route, number> = { core: Math.min(64, connections), bulk: connections };
  const pools: Record<Route, ReturnType<typeof loadPool>> = {
    core: loadPool(origin, poolSize.core, caPem, 'localhost', deadlineMs),
    bulk: loadPool(origin, poolSize.bulk, caPem, 'localhost', deadlineMs),
  };
  for (const r of ROUTES) {
    const res = await pools[r].request({ path: `/${r}/check`, method: 'GET' });
    const body = await res.body.text();
    if (res.statusCode !== 200 || body !== 'ok') throw new Error(`/${r}/ through the proxy: expected 200 "ok", got ${res.statusCode} ${JSON.stringify(body.slice(0, 120))}`);
  }

  log(`backend: K = ${k} concurrent, S = ${serviceMs} ms → capacity C = ${capacity} req/s (one process behind both pools, FIFO beyond K)`);
  log(`proxy: edge-proxy serve, ${workers} worker(s), HTTP/1.1 over TLS; config: ${values.config ?? 'built-in (npm run bench:overload -- --print-config)'}`);
  log(`load: open loop, core ${coreRate} req/s fixed, bulk = step × C − core; steps ${steps.join(', ')} × C; ${warmup} s warm-up + ${seconds} s per step; deadline ${deadlineMs} ms; ≤ ${connections} + ${poolSize.core} connections (bulk + core), opened before each step (kept only if the proxy keeps its 404 connections alive)`);

  const results: Step[] = [];
  const allShedLatencies: number[] = [];
  const firstRecord = await workerRecord(ports.CONTROL_PORT, caPem);
  for (const multiple of steps) {
    const totalRate = multiple * capacity;
    const rates: Record<Route, number> = { core: Math.min(coreRate, totalRate), bulk: Math.max(0, totalRate - coreRate) };
    // Every connection the step may need is open before it starts (see warmConnections); the
    // path matches no route, so the proxy answers 404 itself and admission sees nothing.
    const open = await Promise.all(ROUTES.map((r) => warmConnections(pools[r], poolSize[r], '/__bench_warm', deadlineMs)));
    const before = { at: performance.now(), connections: open.reduce((a, b) => a + b, 0), metrics: await metrics(ports.METRICS_PORT), record: await workerRecord(ports.CONTROL_PORT, caPem), backend: await backendStats(backendPort, true) };
    const rssMax = new Map<number, number>();
    const sampleRss = (): void => {
      for (const pid of childPids(servePid)) rssMax.set(pid, Math.max(rssMax.get(pid) ?? 0, rssMiB(pid)));
    };
    const workerCpu = (): number => childPids(servePid).reduce((sum, pid) => sum + cpuMicros(pid), 0);
    const cpuBefore = workerCpu();
    const t0 = performance.now();
    let mid: Sample[] | undefined;
    const midTimer = setTimeout(() => void metrics(ports.METRICS_PORT).then((m) => (mid = m), () => undefined), (warmup + seconds / 2) * 1000);
    const run = await runOpenLoop(ROUTES.map((r) => ({ name: r, path: `/${r}/item`, rate: rates[r], pool: pools[r] })), { warmupSeconds: warmup, seconds, deadlineMs, onSample: sampleRss });
    clearTimeout(midTimer);
    const workerCpuPercent = ((workerCpu() - cpuBefore) / 1000 / (performance.now() - t0)) * 100;
    const backendAfterLoad = await backendStats(backendPort);
    const untilLastAnswer = (performance.now() - before.at) / 1000;
    const drainSeconds = await drainBackend(backendPort, 20_000);
    const after = { metrics: await metrics(ports.METRICS_PORT), record: await workerRecord(ports.CONTROL_PORT, caPem) };
    const routes = ROUTES.map((r) => summarise(r, rates[r], run.outcomes.get(r) ?? [], run.okInWindow.get(r) ?? 0, run.seconds));
    for (const r of ROUTES) for (const o of run.outcomes.get(r) ?? []) if (o.kind === 'shed') allShedLatencies.push(o.latencyMs);
    const step: Step = {
      multiple,
      totalRate,
      routes,
      metricShedByReason: delta(sumByLabel(after.metrics, 'svc_overload_shed_by_reason_total', 'reason'), sumByLabel(before.metrics, 'svc_overload_shed_by_reason_total', 'reason')),
      midStep: mid === undefined
        ? { brownoutActive: NaN, adaptiveLimit: NaN, inflight: NaN }
        : { brownoutActive: total(mid, 'svc_brownout_active'), adaptiveLimit: total(mid, 'svc_adaptive_admission_limit'), inflight: total(mid, 'svc_inflight_requests') },
      workerRssMiB: Object.fromEntries([...rssMax].map(([pid, mib]) => [String(pid), Math.round(mib)])),
      workerCpuPercent,
      workerRestarts: after.record.restarts - before.record.restarts,
      workerPidsChanged: after.record.pids.join(',') !== before.record.pids.join(','),
      backend: { servedPerSec: (backendAfterLoad.served - before.backend.served) / untilLastAnswer, dropped: backendAfterLoad.dropped - before.backend.dropped, maxQueued: backendAfterLoad.maxQueued },
      generator: run.generator,
      connectionsAtStart: before.connections,
      drainSeconds,
    };
    results.push(step);
    const c = routes[0] as RouteStep;
    const b = routes[1] as RouteStep;
    log(`  ${multiple}× C: core ${fmtPct(c.successPercent)} ok, bulk ${fmtPct(b.successPercent)} ok, ${fmt(c.shedPerSec + b.shedPerSec)} shed/s; generator lag p99 ${fmt(run.generator.lagP99Ms, 1)} ms; drained in ${fmt(drainSeconds, 1)} s`);
  }
  const lastRecord = await workerRecord(ports.CONTROL_PORT, caPem);
  await served.stop();
  await procs.stopAll();
  await Promise.all(ROUTES.map((r) => pools[r].close()));

  allShedLatencies.sort((a, b) => a - b);
  const restarts = lastRecord.restarts - firstRecord.restarts;
  const pidsChanged = lastRecord.pids.join(',') !== firstRecord.pids.join(',');
  const verdicts = report(results, allShedLatencies, restarts, pidsChanged, capacity, workers);
  if (values.json !== undefined) {
    writeFileSync(values.json, `${JSON.stringify({
      benchmark: 'overload',
      measured_at: new Date().toISOString(),
      backend: { concurrency: k, service_ms: serviceMs, capacity_req_per_s: capacity },
      load: { core_req_per_s: coreRate, steps, seconds, warmup_seconds: warmup, deadline_ms: deadlineMs, connections },
      workers,
      config: configText.replace(TOKEN, '<token>'),
      steps: results,
      shed_p99_ms_all_steps: percentile(allShedLatencies, 0.99),
      worker_restarts: restarts,
      worker_pids_changed: pidsChanged,
      verdicts,
    }, null, 2)}\n`);
    log(`\nJSON written to ${values.json}`);
  }
}

function report(results: readonly Step[], shedLatencies: readonly number[], restarts: number, pidsChanged: boolean, capacity: number, workers: number): Verdict[] {
  log(`\n## Overload: per route (C = ${capacity} req/s; rates per second over the measured window)`);
  log('| load | route | offered | goodput (2xx received) | success | shed | shed reasons (count) | 2xx p50 / p99 ms | shed p50 / p99 ms | other failures (count) | answers closing the connection |');
  log('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const s of results) {
    for (const r of s.routes) {
      log(`| ${s.multiple}× | ${r.route} | ${fmt(r.offeredPerSec)} | ${fmt(r.goodputPerSec)} | ${fmtPct(r.successPercent)} | ${fmt(r.shedPerSec)} | ${fmtCounts(r.shedByReason)} | ${fmt(r.okP50Ms, 1)} / ${fmt(r.okP99Ms, 1)} | ${fmt(r.shedP50Ms, 2)} / ${fmt(r.shedP99Ms, 2)} | ${fmtCounts(r.otherFailures)} | ${fmtPct(r.closedPercent)} |`);
    }
  }
  log(`\n## Overload: per step (proxy, backend, generator; ${workers} worker(s))`);
  log('| load | shed by reason (metrics Δ) | brownout mid-step | adaptive limit mid-step | in flight mid-step | worker RSS MiB (max) | worker CPU % | worker restarts | backend served/s | backend dropped | backend max FIFO | generator lag p99 / max ms | wait for a connection p99 ms | connections at start / max | new connections/s | waiting for a connection (max) | generator CPU % | drain s |');
  log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const s of results) {
    const rss = Object.values(s.workerRssMiB);
    log(`| ${s.multiple}× | ${fmtCounts(s.metricShedByReason)} | ${fmt(s.midStep.brownoutActive)} | ${fmt(s.midStep.adaptiveLimit)} | ${fmt(s.midStep.inflight)} | ${rss.length === 0 ? '–' : rss.join(' / ')} | ${fmt(s.workerCpuPercent)} | ${s.workerRestarts}${s.workerPidsChanged ? ' (pids changed)' : ''} | ${fmt(s.backend.servedPerSec)} | ${s.backend.dropped} | ${s.backend.maxQueued} | ${fmt(s.generator.lagP99Ms, 1)} / ${fmt(s.generator.lagMaxMs, 1)} | ${fmt(s.generator.connWaitP99Ms, 1)} | ${s.connectionsAtStart} / ${s.generator.maxConnections} | ${fmt(s.generator.newConnectionsPerSec)} | ${s.generator.maxWaitingForConnection} | ${fmt(s.generator.cpuPercent)} | ${fmt(s.drainSeconds, 1)} |`);
  }

  const verdicts: Verdict[] = [];
  const top = results.find((s) => s.multiple === 10);
  const core = top?.routes.find((r) => r.route === 'core');
  verdicts.push(core === undefined
    ? { target: 'core ≥ 95 % success at 10×', met: undefined, detail: 'not measured (--steps has no 10)' }
    : { target: 'core ≥ 95 % success at 10×', met: core.successPercent >= 95, detail: `${fmtPct(core.successPercent)} (${fmt(core.goodputPerSec)} of ${fmt(core.offeredPerSec)} req/s)` });
  const shedP99 = percentile(shedLatencies, 0.99);
  verdicts.push(shedLatencies.length === 0
    ? { target: 'shed answers p99 < 5 ms', met: undefined, detail: 'no shed answers in the run' }
    : { target: 'shed answers p99 < 5 ms', met: shedP99 < 5, detail: `p99 ${fmt(shedP99, 2)} ms over ${shedLatencies.length} shed answers, every step` });
  verdicts.push({ target: 'no worker restart', met: restarts === 0 && !pidsChanged, detail: `${restarts} exits/re-forks in the snapshot${pidsChanged ? ', worker pids changed' : ', same worker pids throughout'}` });
  log('\n## Targets');
  for (const v of verdicts) log(`- ${v.target}: ${v.met === undefined ? 'NOT MEASURED' : v.met ? 'MET' : 'NOT MET'}: ${v.detail}`);
  // The generator is the bottleneck if it did not send what was asked, or sent it late (its lag:
  // scheduled time → send, this process's event loop). Latencies are timestamped by the same
  // process, so its lag also bounds how finely they resolve. A wait for a connection is reported
  // apart: it comes from the server closing connections (each reopened with a TLS handshake) or
  // keeping every one busy, not from this process being slow.
  const offeredShare = Math.min(...results.flatMap((s) => s.routes.filter((r) => r.targetRate > 0).map((r) => r.offeredPerSec / r.targetRate)));
  const lagP99 = Math.max(...results.map((s) => s.generator.lagP99Ms));
  const waitP99 = Math.max(...results.map((s) => s.generator.connWaitP99Ms));
  const closed = Math.max(...results.flatMap((s) => s.routes.map((r) => r.closedPercent)));
  const cpu = Math.max(...results.map((s) => s.generator.cpuPercent));
  const kept = offeredShare >= 0.98 && lagP99 < 10;
  log(`- load generator ${kept ? 'kept its schedule' : offeredShare < 0.98 ? 'WAS THE BOTTLENECK (it sent less than asked: the server saw less load than the table says)' : 'FELL BEHIND its schedule (late sends make the arrivals burstier than asked; on a shared machine, often other jobs taking its core)'}: sent ≥ ${fmtPct(offeredShare * 100)} of every asked rate; lag (schedule → send) p99 ≤ ${fmt(lagP99, 1)} ms in every step (< 10 ms asked); ${fmt(cpu)} % of a core at most`);
  if (waitP99 >= 5) {
    const why = closed >= 1 ? `the proxy closed the connection after up to ${fmtPct(closed)} of a route's answers, so requests queued behind reconnections (TLS handshakes)` : 'every connection of a Pool was busy at times';
    log(`- requests waited for a connection (p99 up to ${fmt(waitP99, 1)} ms): ${why}; their latencies above exclude that wait, their deadline does not`);
  }
  const all = verdicts.every((v) => v.met === true);
  log(`\nverdict: ${all ? 'PASS' : 'FAIL'}: ${verdicts.map((v) => `${v.target} ${v.met === undefined ? 'not measured' : v.met ? 'met' : 'not met'}`).join('; ')}`);
  return verdicts;
}

if (values['serve-backend']) {
  const b = await startSlowBackend({ concurrency: Number(values.concurrency), serviceMs: Number(values['service-ms']) });
  console.log(JSON.stringify({ event: 'listening', port: b.port }));
  process.on('SIGTERM', () => void b.close().then(() => process.exit(0)));
} else {
  await main();
}
