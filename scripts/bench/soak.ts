// Soak: mixed HTTP/1.1, HTTP/2 and HTTP/3 traffic through a real `edge-proxy serve` for
// --minutes, with a configuration activated every --activate-every s (issue 19, "Must show").
//
//   npm run bench:soak [-- --minutes 10 --activate-every 30 --workers 1 --h1-rate 300 --h2-rate 300
//                         --h3-rate 100 --h3-streams 20 --h2-sessions 4 --connections 16
//                         --deadline-ms 5000 --print-config --json FILE]
//
// - Backend: one plain HTTP/1.1 server answering `200 ok` at once, in a process of its own.
// - Proxy: `edge-proxy serve` (--workers workers), one TLS listener (HTTP/1.1 and HTTP/2 on TCP,
//   HTTP/3 on the QUIC ingress, same port), one upstream `app` on `/`, the metrics endpoint, and
//   the control API on loopback with an operator token. Overload protection as configured by
//   default; only the per-source connection limit is raised (all the load comes from 127.0.0.1).
// - Load (scripts/lib/soak-load.ts), for the whole run, each an open loop at a fixed rate with a
//   --deadline-ms deadline per request: HTTP/1.1 over TLS (--connections keep-alive connections),
//   HTTP/2 (--h2-sessions sessions), HTTP/3 (`gtlsclient -n --h3-streams` runs, one QUIC connection
//   each, spaced so they add up to --h3-rate). A failure is any request without a complete 2xx
//   answer by its deadline.
// - Activations: every --activate-every s, `POST /admin/runtime/activate` with `expected_generation`,
//   alternating between config A and config B (B adds an upstream `soak_alt` on `/alt/`: a live
//   change of the routes), so each makes a new generation; checked by the 202's `generation` and
//   by `GET /admin/runtime`.
// - Every minute a markdown row: requests sent / ok / failed per protocol, activations, each
//   worker's RSS (/proc and `svc_worker_resident_memory_bytes`), its private part (/proc) and
//   own memory (`svc_worker_anonymous_memory_bytes`), its event-loop delay p99 (the
//   highest of `svc_worker_event_loop_delay_p99_seconds`, a 1-s window, sampled every 5 s), its
//   CPU, the supervisor's RSS and the generator's CPU. Then a summary and a verdict per target:
//   requests failed 0; RSS flat: every worker's RSS grew < 2 % from minute N−2 to minute N (the
//   last three minutes; N−1 with a 2-minute run).
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { Processes, waitForListeningLine } from '../lib/bench-peers.ts';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { loadPool, warmConnections } from '../lib/open-loop.ts';
import { cpuMicros, memoryShares, processTree, rssMiB } from '../lib/proc-stats.ts';
import { addCounts, h1Load, h2Load, h3Load } from '../lib/soak-load.ts';
import type { Load, TallyCounts } from '../lib/soak-load.ts';
import { fmt, fmtCounts, fmtPct } from '../lib/bench-format.ts';
import type { Verdict } from '../lib/bench-format.ts';
import { benchArgs, commandLine, numberArg } from '../lib/bench-args.ts';
import { median } from '../lib/bench-load.ts';
import { toolPath } from '../system-tools.ts';
import { parseExposition, scrape } from '../../test/support/exposition.ts';
import { api, serve } from '../../test/support/serve.ts';
import type { Served } from '../../test/support/serve.ts';
import { freePorts } from '../../test/support/service-config.ts';
import type { ServicePorts } from '../../test/support/service-config.ts';

const log = (line: string): void => console.log(line);
const TOKEN = 'soak-operator-token-0123456789abcdef';
/** RSS growth from minute N−2 to N below which a worker's memory counts as flat, %. */
const FLAT_RSS_PERCENT = 2;
/** How often the event-loop gauges are sampled within a minute, ms. */
const LOOP_SAMPLE_MS = 5000;
const PROTOCOLS = ['h1', 'h2', 'h3'] as const;
type Protocol = (typeof PROTOCOLS)[number];

/** What the command line asks for. */
export interface SoakArgs {
  readonly minutes: number;
  readonly activateEvery: number;
  readonly workers: number;
  readonly rates: Readonly<Record<Protocol, number>>;
  readonly h3Streams: number;
  readonly h2Sessions: number;
  readonly connections: number;
  readonly deadlineMs: number;
  readonly json: string | undefined;
  readonly printConfig: boolean;
  /** Internal: run the backend in this process (the benchmark starts itself so). */
  readonly serveBackend: boolean;
}

/** Parses and checks the command line; throws on a bad value. */
export function parseSoakArgs(argv: readonly string[]): SoakArgs {
  const { values } = benchArgs({
    args: [...argv],
    options: {
      minutes: { type: 'string', default: '10' },
      'activate-every': { type: 'string', default: '30' },
      workers: { type: 'string', default: '1' },
      'h1-rate': { type: 'string', default: '300' },
      'h2-rate': { type: 'string', default: '300' },
      'h3-rate': { type: 'string', default: '100' },
      'h3-streams': { type: 'string', default: '20' },
      'h2-sessions': { type: 'string', default: '4' },
      connections: { type: 'string', default: '16' },
      'deadline-ms': { type: 'string', default: '5000' },
      json: { type: 'string' },
      'print-config': { type: 'boolean', default: false },
      'serve-backend': { type: 'boolean', default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  const posInt = (n: number): boolean => Number.isInteger(n) && n > 0;
  const rate = (n: number): boolean => n >= 0;
  return {
    minutes: numberArg('minutes', values.minutes, posInt),
    activateEvery: numberArg('activate-every', values['activate-every'], (n) => n >= 1),
    workers: numberArg('workers', values.workers, posInt),
    rates: { h1: numberArg('h1-rate', values['h1-rate'], rate), h2: numberArg('h2-rate', values['h2-rate'], rate), h3: numberArg('h3-rate', values['h3-rate'], rate) },
    h3Streams: numberArg('h3-streams', values['h3-streams'], (n) => posInt(n) && n <= 100),
    h2Sessions: numberArg('h2-sessions', values['h2-sessions'], posInt),
    connections: numberArg('connections', values.connections, posInt),
    deadlineMs: numberArg('deadline-ms', values['deadline-ms'], (n) => n >= 100),
    json: values.json,
    printConfig: values['print-config'] === true,
    serveBackend: values['serve-backend'] === true,
  };
}

/** Ports and files of the proxy's configuration. */
export interface SoakConfigVars {
  readonly ports: ServicePorts;
  readonly cert: string;
  readonly key: string;
  readonly backendPort: number;
  readonly workers: number;
}

/** The proxy's configuration (YAML): A, or B = A plus an upstream `soak_alt` on `/alt/`. */
export function soakConfig(v: SoakConfigVars, variant: 'A' | 'B'): string {
  const alt = variant === 'B' ? `\n  soak_alt: { route: { path_prefix: /alt/ }, backends: [{ id: alt, address: "127.0.0.1:${v.backendPort}" }] }` : '';
  return `# edge-proxy configuration for npm run bench:soak (config ${variant}; B adds the upstream soak_alt).
listen: { address: 127.0.0.1, port: ${v.ports.l}, tls: { cert: ${v.cert}, key: ${v.key} } }
log: { level: info, format: json }
performance:
  worker_threads: ${v.workers}
  # All the load comes from one loopback address (HTTP/3: a new QUIC connection per gtlsclient run).
  max_connections_per_source: 2048
upstream:
  app: { route: { path_prefix: / }, backends: [{ id: app, address: "127.0.0.1:${v.backendPort}" }] }${alt}
observability:
  metrics: { address: 127.0.0.1, port: ${v.ports.m} }
  control_api:
    address: 127.0.0.1
    port: ${v.ports.c}
    tls: { cert: ${v.cert}, key: ${v.key} }
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: operator, actor_id: bench-soak }] }
`;
}

/** One worker as the snapshot lists it. */
interface WorkerFacts {
  readonly index: number;
  readonly pid: number;
}

/** One minute's figures. */
interface MinuteRow {
  readonly minute: number;
  readonly requests: Readonly<Record<Protocol, TallyCounts>>;
  readonly activationsOk: number;
  readonly activationsFailed: number;
  readonly generation: number;
  /**
   * Per worker index: RSS from /proc and from the metric, and the part of it the worker holds
   * alone (proc-stats `memoryShares`: what another worker adds to a node) and the metric of it
   * (`svc_worker_anonymous_memory_bytes`), MiB; loop p99 (max of the samples), ms; CPU % of a core.
   */
  readonly workers: ReadonlyArray<{ readonly index: number; readonly pid: number; readonly rssMiB: number; readonly metricRssMiB: number; readonly privateMiB: number; readonly metricAnonMiB: number; readonly loopP99Ms: number; readonly cpuPercent: number }>;
  readonly supervisorRssMiB: number;
  readonly generatorCpuPercent: number;
  readonly h2Reconnects: number;
}

/** An activation's outcome, kept for the report. */
interface Activation {
  readonly at: string;
  readonly from: number;
  readonly to: number | undefined;
  readonly variant: 'A' | 'B';
  readonly status: number;
  readonly ms: number;
  readonly ok: boolean;
  readonly detail: string;
}

async function runtimeSnapshot(ports: ServicePorts, ca: Buffer): Promise<{ generation: number; workers: WorkerFacts[] }> {
  const r = await api(ports.c, ca, 'GET', '/admin/runtime', { token: TOKEN });
  if (r.status !== 200) throw new Error(`GET /admin/runtime: ${r.status} ${JSON.stringify(r.body).slice(0, 200)}`);
  const list = ((r.body['workers'] as { list?: WorkerFacts[] } | undefined)?.list ?? []).map((w) => ({ index: w.index, pid: w.pid }));
  return { generation: Number(r.body['generation']), workers: list };
}

/** Activates `file` on top of `expected`; ok when the answer is 202 with generation expected + 1 and the snapshot agrees. */
async function activate(ports: ServicePorts, ca: Buffer, file: string, variant: 'A' | 'B', expected: number): Promise<Activation> {
  const t0 = performance.now();
  const at = new Date().toISOString();
  try {
    const r = await api(ports.c, ca, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: file, expected_generation: expected, requested_by: 'bench:soak', reason: `soak: config ${variant}` });
    const ms = performance.now() - t0;
    const to = typeof r.body['generation'] === 'number' ? r.body['generation'] : undefined;
    if (r.status !== 202 || to !== expected + 1) return { at, from: expected, to, variant, status: r.status, ms, ok: false, detail: JSON.stringify(r.body).slice(0, 400) };
    const snap = await runtimeSnapshot(ports, ca);
    if (snap.generation !== to) return { at, from: expected, to, variant, status: r.status, ms, ok: false, detail: `202 for generation ${to} but GET /admin/runtime says ${snap.generation}` };
    return { at, from: expected, to, variant, status: r.status, ms, ok: true, detail: '' };
  } catch (err) {
    return { at, from: expected, to: undefined, variant, status: 0, ms: performance.now() - t0, ok: false, detail: String((err as Error).message) };
  }
}

/** Per worker label: the value of a worker gauge, from one scrape. */
function byWorker(text: string, name: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const s of parseExposition(text)) if (s.name === name) out.set(s.labels['worker'] ?? '', s.value);
  return out;
}

/** SIGKILL to a serve and its workers (the last resort on exit). */
function killTree(pid: number | undefined): void {
  if (pid === undefined) return;
  for (const p of processTree(pid)) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

function cell(c: TallyCounts): string {
  return `${c.sent} / ${c.ok} / ${c.failed}${c.failed > 0 ? ` (${fmtCounts(c.failures)})` : ''}`;
}

function printRow(r: MinuteRow): void {
  const w = (f: (x: MinuteRow['workers'][number]) => string): string => r.workers.map((x) => `w${x.index} ${f(x)}`).join(', ');
  log(`| ${r.minute} | ${cell(r.requests.h1)} | ${cell(r.requests.h2)} | ${cell(r.requests.h3)} | ${r.activationsOk} / ${r.activationsFailed} (gen ${r.generation}) | ${w((x) => fmt(x.rssMiB, 1))} | ${w((x) => fmt(x.metricRssMiB, 1))} | ${w((x) => fmt(x.privateMiB, 1))} | ${w((x) => fmt(x.metricAnonMiB, 1))} | ${w((x) => fmt(x.loopP99Ms, 1))} | ${w((x) => fmt(x.cpuPercent))} | ${fmt(r.supervisorRssMiB, 1)} | ${fmt(r.generatorCpuPercent)} |`);
}

/** RSS growth of each worker from minute `from` to the last (1-based), MiB and %. */
function rssGrowth(rows: readonly MinuteRow[], from: number): Array<{ index: number; fromMiB: number; toMiB: number; mib: number; pct: number }> {
  const first = rows[from - 1];
  const last = rows.at(-1);
  if (first === undefined || last === undefined) return [];
  return last.workers.map((w) => {
    const before = first.workers.find((x) => x.index === w.index)?.rssMiB ?? NaN;
    return { index: w.index, fromMiB: before, toMiB: w.rssMiB, mib: w.rssMiB - before, pct: ((w.rssMiB - before) / before) * 100 };
  });
}

function report(args: SoakArgs, rows: readonly MinuteRow[], activations: readonly Activation[], finalGeneration: number, aborted: string | undefined): Verdict[] {
  const NONE: TallyCounts = { sent: 0, ok: 0, failed: 0, failures: {} };
  const totals = new Map(PROTOCOLS.map((p) => [p, rows.reduce((a, r) => addCounts(a, r.requests[p]), NONE)]));
  const total = (p: Protocol): TallyCounts => totals.get(p) as TallyCounts;
  log('\n## Summary');
  log('| protocol | rate req/s | sent | ok | failed | failures |');
  log('|---|---|---|---|---|---|');
  for (const p of PROTOCOLS) {
    const t = total(p);
    log(`| ${p === 'h1' ? 'HTTP/1.1' : p === 'h2' ? 'HTTP/2' : 'HTTP/3'} | ${args.rates[p]} | ${t.sent} | ${t.ok} | ${t.failed} | ${fmtCounts(t.failures)} |`);
  }
  const failedActs = activations.filter((a) => !a.ok);
  log(`\nactivations: ${activations.length - failedActs.length} ok, ${failedActs.length} failed; generation ${activations[0]?.from ?? '–'} → ${finalGeneration}; activation call p50 ${fmt(median(activations.map((a) => a.ms)))} ms, max ${fmt(Math.max(...activations.map((a) => a.ms)))} ms`);
  for (const a of failedActs) log(`- activation at ${a.at} (${a.from} → config ${a.variant}) FAILED: status ${a.status}: ${a.detail}`);
  const n = rows.length;
  const from = Math.max(1, n - 2);
  const growth = rssGrowth(rows, from);
  const firstRow = rows[0];
  if (firstRow !== undefined) {
    for (const g of growth) {
      const m1 = firstRow.workers.find((w) => w.index === g.index)?.rssMiB ?? NaN;
      const privateOf = (r: MinuteRow | undefined): number => r?.workers.find((w) => w.index === g.index)?.privateMiB ?? NaN;
      log(`worker ${g.index} RSS: minute 1 ${fmt(m1, 1)} MiB; minute ${from} ${fmt(g.fromMiB, 1)} → minute ${n} ${fmt(g.toMiB, 1)} MiB (${g.mib >= 0 ? '+' : ''}${fmt(g.mib, 1)} MiB, ${fmtPct(g.pct, 2)}); private: minute 1 ${fmt(privateOf(firstRow), 1)}, minute ${from} ${fmt(privateOf(rows[from - 1]), 1)} → minute ${n} ${fmt(privateOf(rows.at(-1)), 1)} MiB`);
    }
  }
  log(`event-loop delay p99 per minute (max over workers, ms): ${rows.map((r) => fmt(Math.max(...r.workers.map((w) => w.loopP99Ms)), 1)).join(', ')}`);

  const failedTotal = PROTOCOLS.reduce((a, p) => a + total(p).failed, 0);
  const sentTotal = PROTOCOLS.reduce((a, p) => a + total(p).sent, 0);
  const verdicts: Verdict[] = [
    { target: 'requests failed 0', met: n === 0 ? undefined : failedTotal === 0, detail: `${failedTotal} failed of ${sentTotal} (${PROTOCOLS.map((p) => `${p} ${total(p).failed}`).join(', ')})` },
    n < 2
      ? { target: `RSS flat over the last minutes (growth < ${FLAT_RSS_PERCENT} % from minute N−2 to N, every worker)`, met: undefined, detail: 'fewer than 2 minutes' }
      : { target: `RSS flat over the last minutes (growth < ${FLAT_RSS_PERCENT} % from minute ${from} to ${n}, every worker)`, met: growth.length > 0 && growth.every((g) => g.pct < FLAT_RSS_PERCENT), detail: growth.map((g) => `w${g.index} ${fmtPct(g.pct, 2)}`).join(', ') },
    { target: 'every activation applied (202, generation +1)', met: activations.length === 0 ? undefined : failedActs.length === 0, detail: `${activations.length - failedActs.length} of ${activations.length}` },
  ];
  log('\n## Targets');
  if (aborted !== undefined) log(`- run ABORTED: ${aborted}`);
  for (const v of verdicts) log(`- ${v.target}: ${v.met === undefined ? 'NOT MEASURED' : v.met ? 'MET' : 'NOT MET'}: ${v.detail}`);
  const word = aborted !== undefined || verdicts.some((v) => v.met === false) ? 'FAIL' : verdicts.every((v) => v.met === true) ? 'PASS' : 'INCOMPLETE';
  log(`\nverdict: ${word}`);
  return verdicts;
}

async function main(args: SoakArgs): Promise<void> {
  const placeholder = { ports: { l: 8443, c: 9443, m: 9090 }, cert: '/tmp/server.crt', key: '/tmp/server.key', backendPort: 8081, workers: args.workers };
  if (args.printConfig) {
    process.stdout.write(`${soakConfig(placeholder, 'A')}\n${soakConfig(placeholder, 'B')}`);
    return;
  }
  if (args.rates.h3 > 0 && toolPath('gtlsclient') === undefined) throw new Error('gtlsclient not found (Debian package ngtcp2-client; npm run bench:proxy installs it as root), or pass --h3-rate 0');
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-soak-'));
  const procs = new Processes();
  let served: Served | undefined;
  const loads: Array<Load & { children?: ReadonlySet<ChildProcess> }> = [];
  // Whatever happens, nothing the benchmark started outlives it.
  process.on('exit', () => {
    killTree(served?.proc.pid);
    for (const l of loads) for (const c of l.children ?? []) killTree(c.pid);
    procs.killAll();
    rmSync(dir, { recursive: true, force: true });
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  // Bounded whatever the proxy does: the run, every deadline, and two minutes of start and stop.
  const boundMs = args.minutes * 60_000 + 2 * args.deadlineMs + 120_000;
  setTimeout(() => {
    console.error(`bench:soak: still running after ${boundMs / 1000} s; stopping`);
    process.exit(1);
  }, boundMs).unref();

  const load = loadavg();
  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  const caPem = readFileSync(ca.cert);
  const backendProc = procs.spawn(process.execPath, [new URL(import.meta.url).pathname, '--serve-backend'], { stdout: 'pipe' });
  const backendPort = (await waitForListeningLine(backendProc))['port'] as number;
  const ports = await freePorts();
  const vars: SoakConfigVars = { ports, cert: leaf.cert, key: leaf.key, backendPort, workers: args.workers };
  const files = { A: path.join(dir, 'soak.yaml'), B: path.join(dir, 'soak-b.yaml') } as const;
  const configs = { A: soakConfig(vars, 'A'), B: soakConfig(vars, 'B') };
  writeFileSync(files.B, configs.B);
  served = await serve(files.A, configs.A, 60_000);

  log(`backend: one HTTP/1.1 server answering 200 "ok" at once, in a process of its own`);
  log(`proxy: edge-proxy serve, ${args.workers} worker(s), one TLS listener (HTTP/1.1 + HTTP/2 on TCP, HTTP/3 on QUIC, port ${ports.l}); configs A and B (B adds an upstream on /alt/) (npm run bench:soak -- --print-config)`);
  log(`load: open loops, HTTP/1.1 ${args.rates.h1} req/s on ${args.connections} connections, HTTP/2 ${args.rates.h2} req/s on ${args.h2Sessions} sessions, HTTP/3 ${args.rates.h3} req/s as gtlsclient runs of ${args.h3Streams} streams on one connection each; deadline ${args.deadlineMs} ms per request`);
  log(`activation every ${args.activateEvery} s (A ↔ B) for ${args.minutes} min; load average at start ${load.map((l) => l.toFixed(2)).join(' ')}\n`);

  const pool = loadPool(`https://127.0.0.1:${ports.l}`, args.connections, caPem, 'localhost', args.deadlineMs);
  const check = await pool.request({ path: '/', method: 'GET' });
  const body = await check.body.text();
  if (check.statusCode !== 200 || body !== 'ok') throw new Error(`through the proxy: expected 200 "ok", got ${check.statusCode} ${JSON.stringify(body.slice(0, 120))}`);
  await warmConnections(pool, args.connections, '/', args.deadlineMs);

  const h1 = h1Load(pool, '/', args.rates.h1, args.deadlineMs);
  const h2 = h2Load(`https://127.0.0.1:${ports.l}`, caPem, args.h2Sessions, '/', args.rates.h2, args.deadlineMs);
  const h3 = h3Load('127.0.0.1', ports.l, '/', args.rates.h3, args.h3Streams, args.deadlineMs);
  loads.push(h1, h2, h3);

  // Activations on their own timer; one at a time (a slow one delays the next, never overlaps it).
  const activations: Activation[] = [];
  let generation = (await runtimeSnapshot(ports, caPem)).generation;
  let nextVariant: 'A' | 'B' = 'B';
  let activating: Promise<void> = Promise.resolve();
  const actTimer = setInterval(() => {
    activating = activating.then(async () => {
      const a = await activate(ports, caPem, files[nextVariant], nextVariant, generation);
      activations.push(a);
      if (a.ok && a.to !== undefined) {
        generation = a.to;
        nextVariant = nextVariant === 'A' ? 'B' : 'A';
      } else {
        log(`  activation ${a.from} → config ${a.variant} FAILED: status ${a.status}: ${a.detail}`);
        generation = (await runtimeSnapshot(ports, caPem).catch(() => ({ generation }))).generation;
      }
    });
  }, args.activateEvery * 1000);

  log('| minute | HTTP/1.1 sent / ok / failed | HTTP/2 sent / ok / failed | HTTP/3 sent / ok / failed | activations ok / failed (generation) | worker RSS MiB (/proc) | worker RSS MiB (metric) | worker private MiB (/proc) | worker own MiB (metric) | worker loop p99 ms | worker CPU % | supervisor RSS MiB | generator CPU % |');
  log('|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  const rows: MinuteRow[] = [];
  let aborted: string | undefined;
  let actSeen = 0;
  let reconnectsSeen = 0;
  try {
    for (let minute = 1; minute <= args.minutes; minute++) {
      const workers = (await runtimeSnapshot(ports, caPem)).workers;
      const cpu0 = new Map(workers.map((w) => [w.pid, cpuMicros(w.pid)]));
      const gen0 = process.cpuUsage();
      const t0 = performance.now();
      const loopMax = new Map<string, number>();
      const end = t0 + 60_000;
      while (performance.now() < end) {
        await new Promise((r) => setTimeout(r, Math.min(LOOP_SAMPLE_MS, Math.max(0, end - performance.now()))));
        const text = await scrape(ports.m).catch(() => '');
        for (const [w, v] of byWorker(text, 'svc_worker_event_loop_delay_p99_seconds')) loopMax.set(w, Math.max(loopMax.get(w) ?? 0, v * 1000));
        if (served.proc.exitCode !== null || served.proc.signalCode !== null) throw new Error(`edge-proxy serve exited (${served.proc.exitCode ?? served.proc.signalCode}): ${served.text().slice(-800)}`);
      }
      const wall = performance.now() - t0;
      const gen = process.cpuUsage(gen0);
      const exposition = await scrape(ports.m);
      const metricRss = byWorker(exposition, 'svc_worker_resident_memory_bytes');
      const metricAnon = byWorker(exposition, 'svc_worker_anonymous_memory_bytes');
      const now = (await runtimeSnapshot(ports, caPem)).workers;
      const acts = activations.slice(actSeen);
      actSeen = activations.length;
      const reconnects = h2.reconnects();
      const row: MinuteRow = {
        minute,
        requests: { h1: h1.tally.take(), h2: h2.tally.take(), h3: h3.tally.take() },
        activationsOk: acts.filter((a) => a.ok).length,
        activationsFailed: acts.filter((a) => !a.ok).length,
        generation,
        workers: now.map((w) => {
          const mem = memoryShares(w.pid);
          return {
            index: w.index,
            pid: w.pid,
            rssMiB: mem.rssMiB,
            privateMiB: mem.privateMiB,
            metricRssMiB: (metricRss.get(String(w.index)) ?? NaN) / (1024 * 1024),
            metricAnonMiB: (metricAnon.get(String(w.index)) ?? NaN) / (1024 * 1024),
            loopP99Ms: loopMax.get(String(w.index)) ?? NaN,
            // A worker re-forked during the minute has no CPU figure for it.
            cpuPercent: cpu0.has(w.pid) ? ((cpuMicros(w.pid) - (cpu0.get(w.pid) as number)) / 1000 / wall) * 100 : NaN,
          };
        }),
        supervisorRssMiB: rssMiB(served.proc.pid as number),
        generatorCpuPercent: ((gen.user + gen.system) / 1000 / wall) * 100,
        h2Reconnects: reconnects - reconnectsSeen,
      };
      reconnectsSeen = reconnects;
      rows.push(row);
      printRow(row);
    }
  } catch (err) {
    aborted = String((err as Error).message).slice(0, 1000);
    log(`\nrun aborted: ${aborted}`);
  }
  clearInterval(actTimer);
  await activating;
  await Promise.all([h1.stop(), h2.stop(), h3.stop()]);
  // Requests that ended after the last row (sent before it, answered within their deadline).
  const late = { h1: h1.tally.take(), h2: h2.tally.take(), h3: h3.tally.take() };
  const last = rows.at(-1);
  if (last !== undefined) {
    rows[rows.length - 1] = { ...last, requests: { h1: addCounts(last.requests.h1, late.h1), h2: addCounts(last.requests.h2, late.h2), h3: addCounts(last.requests.h3, late.h3) } };
    const lateActs = activations.slice(actSeen);
    log(`(after the last row, counted in the summary: answers ${PROTOCOLS.map((p) => `${p} ${late[p].ok} ok / ${late[p].failed} failed`).join(', ')}; activations ${lateActs.filter((a) => a.ok).length} ok / ${lateActs.filter((a) => !a.ok).length} failed, generation ${generation}. HTTP/2 sessions re-opened during the run: ${rows.reduce((a, r) => a + r.h2Reconnects, 0)})`);
  }
  await pool.close();
  const exitCode = await served.stop();
  served = undefined;
  await procs.stopAll();

  const verdicts = report(args, rows, activations, generation, aborted);
  if (aborted !== undefined) process.exitCode = 1;
  if (exitCode !== 0) log(`(edge-proxy serve exited with ${exitCode} on SIGTERM)`);
  if (args.json !== undefined) {
    writeFileSync(args.json, `${JSON.stringify({
      benchmark: 'soak',
      measured_at: new Date().toISOString(),
      load_average_at_start: load,
      args: { ...args, json: undefined, printConfig: undefined, serveBackend: undefined },
      configs,
      minutes: rows,
      activations,
      flat_rss_percent: FLAT_RSS_PERCENT,
      aborted,
      verdicts,
    }, null, 2)}\n`);
    log(`\nJSON written to ${args.json}`);
  }
}

/** The backend process: `200 ok` at once, keep-alive; one JSON line with its port. */
async function serveBackend(): Promise<void> {
  const s = http.createServer({ keepAliveTimeout: 60_000 }, (_req, res) => res.end('ok'));
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  console.log(JSON.stringify({ event: 'listening', port: (s.address() as { port: number }).port }));
  process.on('SIGTERM', () => {
    s.closeAllConnections();
    s.close(() => process.exit(0));
  });
}

if (import.meta.main) {
  const args = commandLine(() => parseSoakArgs(process.argv.slice(2)));
  if (args.serveBackend) await serveBackend();
  else {
    try {
      await main(args);
    } catch (err) {
      console.error(`bench:soak: ${(err as Error).message}`);
      process.exit(1);
    }
  }
}
