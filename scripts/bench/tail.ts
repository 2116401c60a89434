// Tail-latency benchmark: hedged requests against a backend pool with a slow tail, and retries
// against a failing backend, through a real `edge-proxy serve` (issue 14, "Must show").
//
//   npm run bench:tail [-- --rate 300 --seconds 10 --warmup 1 --phases A,B,C --fail-mode both
//                         --slow-percent 5 --slow-ms 200 --fail-percent 10 --seed 1 --delay-ms N
//                         --connections 64 --deadline-ms 5000 --print-config --json FILE]
//
// - Backends (scripts/lib/tail-backend.ts; 3 HTTP/1.1 servers in one process of their own): each
//   answers 200 at once, except exactly --slow-percent % of its requests (5 %: one in every 20,
//   at a position drawn from a PRNG seeded by --seed) answered after --slow-ms (200). Each counts
//   the requests it receives: extra upstream load = upstream requests ÷ client requests − 1.
// - Proxy: `edge-proxy serve`, one worker, HTTP/1.1 over TLS on the listener's TCP ingress, one
//   upstream `tail` with the 3 backends, round-robin, plain HTTP/1.1 to them. Overload protection
//   is kept out of the way (adaptive admission and brownout off, limits far above the load) and
//   the circuit breaker is off. A fresh serve per phase (its own config file and state dir).
// - Load (scripts/lib/open-loop.ts): open loop at --rate req/s, --warmup s (not measured) then
//   --seconds s, every request with a --deadline-ms deadline.
// - Phase A: hedging off. Phase B: hedging on, `delay_ms` = phase A's p95 (the median of its
//   per-second p95s, rounded up, ≥ 1 ms: scripts/lib/hedge-delay.ts). `retry_budget.ratio_percent`
//   is 20 in both, so the budget (30 per 10 s + 20 % of primaries) never refuses the ~5 % of
//   hedges. Phase C: hedging off, default retry budget (ratio 10), backend 1 failing
//   --fail-percent % (10) of its requests, by a reset without an answer and by a 503
//   (--fail-mode reset|503|both: two sub-phases).
// - Per phase: client requests, success, p50/p95/p99/p99.9 of the 2xx answers, upstream requests
//   and extra load (whole phase, warm-up included, on both sides), the hedge and retry counters
//   from the metrics endpoint (before/after), and the generator's own health.
// - Output: markdown tables on stdout, a JSON file with --json, a verdict on the issue's targets:
//   p99 with hedging at least 3× lower than without, extra upstream requests with hedging < 10 %.
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { percentile } from '../lib/bench-load.ts';
import { hedgeDelay } from '../lib/hedge-delay.ts';
import { Processes, waitForListeningLine } from '../lib/bench-peers.ts';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { loadPool, runOpenLoop, warmConnections } from '../lib/open-loop.ts';
import type { GeneratorHealth, Outcome } from '../lib/open-loop.ts';
import { processTree } from '../lib/proc-stats.ts';
import { startTailBackend } from '../lib/tail-backend.ts';
import type { FailMode, TailBackend, TailBackendStats } from '../lib/tail-backend.ts';
import { parseExposition, scrape, sumByLabel } from '../../test/support/exposition.ts';
import type { Sample } from '../../test/support/exposition.ts';
import { serve } from '../../test/support/serve.ts';
import type { Served } from '../../test/support/serve.ts';
import { fmt, fmtCounts, fmtPct } from '../lib/bench-format.ts';
import type { Verdict } from '../lib/bench-format.ts';
import { benchArgs, commandLine, numberArg } from '../lib/bench-args.ts';

/** Number of backends in the pool. */
const BACKENDS = 3;
/** The retry budget ratio of phases A and B: hedges draw on the budget, ~5 % of primaries. */
const HEDGE_PHASE_RETRY_RATIO = 20;
const log = (line: string): void => console.log(line);

/** What the command line asks for. */
export interface TailArgs {
  readonly rate: number;
  readonly seconds: number;
  readonly warmup: number;
  readonly phases: ReadonlySet<'A' | 'B' | 'C'>;
  readonly failModes: readonly Exclude<FailMode, 'none'>[];
  readonly slowPercent: number;
  readonly slowMs: number;
  readonly failPercent: number;
  readonly seed: number;
  /** Hedge delay forced by --delay-ms; undefined: taken from phase A. */
  readonly delayMs: number | undefined;
  readonly connections: number;
  readonly deadlineMs: number;
  readonly json: string | undefined;
  readonly printConfig: boolean;
  /** Internal: run the backends in this process (the benchmark starts itself so). */
  readonly serveBackends: boolean;
}

/** Parses and checks the command line; throws on a bad value. */
export function parseTailArgs(argv: readonly string[]): TailArgs {
  const { values } = benchArgs({
    args: [...argv],
    options: {
      rate: { type: 'string', default: '300' },
      seconds: { type: 'string', default: '10' },
      warmup: { type: 'string', default: '1' },
      phases: { type: 'string', default: 'A,B,C' },
      'fail-mode': { type: 'string', default: 'both' },
      'slow-percent': { type: 'string', default: '5' },
      'slow-ms': { type: 'string', default: '200' },
      'fail-percent': { type: 'string', default: '10' },
      seed: { type: 'string', default: '1' },
      'delay-ms': { type: 'string' },
      connections: { type: 'string', default: '64' },
      'deadline-ms': { type: 'string', default: '5000' },
      json: { type: 'string' },
      'print-config': { type: 'boolean', default: false },
      'serve-backends': { type: 'boolean', default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  const pos = (n: number): boolean => n > 0;
  const pct = (n: number): boolean => Number.isInteger(n) && n >= 0 && n <= 100;
  const phases = String(values.phases).split(',').map((p) => p.trim().toUpperCase());
  for (const p of phases) if (p !== 'A' && p !== 'B' && p !== 'C') throw new Error(`--phases: unknown phase ${JSON.stringify(p)} (A, B, C)`);
  // B takes its delay from A's p95 unless it is given.
  if (phases.includes('B') && !phases.includes('A') && values['delay-ms'] === undefined) throw new Error('--phases: B without A needs --delay-ms');
  const fm = String(values['fail-mode']);
  if (fm !== 'both' && fm !== 'reset' && fm !== '503') throw new Error(`--fail-mode: ${JSON.stringify(fm)} is not reset, 503 or both`);
  return {
    rate: numberArg('rate', values.rate, pos),
    seconds: numberArg('seconds', values.seconds, pos),
    warmup: numberArg('warmup', values.warmup, (n) => n >= 0),
    phases: new Set(phases as Array<'A' | 'B' | 'C'>),
    failModes: fm === 'both' ? ['reset', '503'] : [fm],
    slowPercent: numberArg('slow-percent', values['slow-percent'], pct),
    slowMs: numberArg('slow-ms', values['slow-ms'], pos),
    failPercent: numberArg('fail-percent', values['fail-percent'], pct),
    seed: numberArg('seed', values.seed, Number.isInteger),
    delayMs: values['delay-ms'] === undefined ? undefined : numberArg('delay-ms', values['delay-ms'], (n) => Number.isInteger(n) && n >= 1),
    connections: numberArg('connections', values.connections, (n) => Number.isInteger(n) && n > 0),
    deadlineMs: numberArg('deadline-ms', values['deadline-ms'], pos),
    json: values.json,
    printConfig: values['print-config'] === true,
    serveBackends: values['serve-backends'] === true,
  };
}

/** Ports, files and the resilience settings of one phase's proxy. */
export interface ProxyConfigVars {
  readonly listenPort: number;
  readonly metricsPort: number;
  readonly cert: string;
  readonly key: string;
  readonly backendPorts: readonly number[];
  /** Hedging on with this delay, ms; undefined: hedging off. */
  readonly hedgeDelayMs: number | undefined;
  /** `retry_budget.ratio_percent`; undefined: the default (10). */
  readonly retryRatioPercent: number | undefined;
}

/** The proxy's configuration for one phase (YAML). */
export function tailProxyConfig(v: ProxyConfigVars): string {
  const backends = v.backendPorts.map((p, i) => `{ id: b${i + 1}, address: "127.0.0.1:${p}" }`).join(', ');
  const retry = v.retryRatioPercent === undefined
    ? '  # Default retry budget: ratio_percent 10, max_attempts 2.\n'
    : `  # Hedges draw on the retry budget (30 per 10 s + ratio_percent % of primaries): ${v.retryRatioPercent} % leaves room for\n  # the ~5 % of primaries that outlive the hedge delay.\n  retry_budget: { ratio_percent: ${v.retryRatioPercent} }\n`;
  const hedging = v.hedgeDelayMs === undefined ? '' : `  hedging: { enabled: true, delay_ms: ${v.hedgeDelayMs} }\n`;
  return `# edge-proxy configuration for npm run bench:tail (one phase).
listen: { address: 127.0.0.1, port: ${v.listenPort}, tls: { cert: ${v.cert}, key: ${v.key} } }
log: { level: info, format: json }
performance:
  worker_threads: 1
  # Far above what the load keeps in flight (a few dozen): no request waits for admission.
  global_inflight_limit: 4096
  per_upstream_inflight_limit: 4096
  per_backend_inflight_limit: 4096
  # All the load comes from one loopback address.
  max_connections_per_source: 2048
  timeouts: { backend_request_ms: 5000, shutdown_drain_ms: 1000 }
resilience:
  # Overload protection is not what is measured: nothing may shed or queue.
  adaptive_admission: { enabled: false }
  brownout: { enabled: false }
  # Off: a breaker opening on the failing backend would take it out of rotation for 30 s, and the
  # phase would measure the breaker instead of retries.
  circuit_breaker: { enabled: false }
${retry}${hedging}observability:
  metrics: { address: 127.0.0.1, port: ${v.metricsPort} }
  control_api: { enabled: false }
upstream:
  tail: { route: { path_prefix: /tail/ }, load_balancing: { type: round-robin }, backends: [${backends}] }
`;
}

/** Sum of `name`'s samples (0 when absent: a counter never incremented is not exported). */
function sum(samples: readonly Sample[], name: string): number {
  return samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

function delta(after: Map<string, number>, before: Map<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) {
    const d = v - (before.get(k) ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}

const HEDGE_COUNTERS = ['svc_hedge_triggered_total', 'svc_hedge_won_total', 'svc_hedge_wasted_total', 'svc_hedge_primary_won_after_trigger_total', 'svc_hedge_primary_late_ms_total', 'svc_hedge_primary_late_samples_total'] as const;

/** Figures of one phase. */
interface PhaseResult {
  readonly name: string;
  readonly hedgeDelayMs: number | undefined;
  readonly retryRatioPercent: number;
  readonly failMode: FailMode;
  /** Requests sent over the whole phase (warm-up included) and in the measured window. */
  readonly clientSent: number;
  readonly measured: number;
  readonly successPercent: number;
  readonly p50Ms: number;
  readonly p95Ms: number;
  readonly p99Ms: number;
  readonly p999Ms: number;
  /** Client outcomes other than 2xx, by status or error. */
  readonly failures: Record<string, number>;
  /** Requests the backends received over the whole phase, and per backend. */
  readonly upstream: number;
  readonly backends: readonly TailBackendStats[];
  /** upstream ÷ clientSent − 1, %. */
  readonly extraLoadPercent: number;
  /** Δ of each hedge counter over the phase. */
  readonly hedge: Record<string, number>;
  readonly retries: number;
  readonly retryAttempts: Record<string, number>;
  readonly retryDenied: Record<string, number>;
  readonly generator: GeneratorHealth;
  /** The 2xx answers: when due and latency (kept for the hedge delay; left out of the JSON). */
  readonly okAnswers: ReadonlyArray<{ readonly at: number; readonly ms: number }>;
}

interface Env {
  readonly args: TailArgs;
  readonly dir: string;
  readonly caPem: Buffer;
  readonly cert: string;
  readonly key: string;
  readonly backendPorts: readonly number[];
  readonly served: Set<Served>;
  readonly configs: Record<string, string>;
}

async function backendCall(port: number, query: string): Promise<TailBackendStats> {
  const res = await fetch(`http://127.0.0.1:${port}${query}`, { signal: AbortSignal.timeout(5000) });
  return (await res.json()) as TailBackendStats;
}

/** SIGKILL to a serve and its workers (the last resort on exit). */
function killServe(s: Served): void {
  if (s.proc.pid === undefined || s.proc.exitCode !== null || s.proc.signalCode !== null) return;
  for (const pid of processTree(s.proc.pid)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

async function runPhase(env: Env, name: string, hedgeDelayMs: number | undefined, retryRatioPercent: number | undefined, failMode: FailMode): Promise<PhaseResult> {
  const { args } = env;
  const listenPort = await freePort();
  const metricsPort = await freePort();
  const configText = tailProxyConfig({ listenPort, metricsPort, cert: env.cert, key: env.key, backendPorts: env.backendPorts, hedgeDelayMs, retryRatioPercent });
  env.configs[name] = configText;
  const served = await serve(path.join(env.dir, `tail-${name}.yaml`), configText, 60_000);
  env.served.add(served);
  const pool = loadPool(`https://127.0.0.1:${listenPort}`, args.connections, env.caPem, 'localhost', args.deadlineMs);
  try {
    const res = await pool.request({ path: '/tail/check', method: 'GET' });
    const body = await res.body.text();
    if (res.statusCode !== 200 || body !== 'ok') throw new Error(`/tail/ through the proxy: expected 200 "ok", got ${res.statusCode} ${JSON.stringify(body.slice(0, 120))}`);
    // Every connection the phase may need is open before it starts (the proxy answers the
    // unrouted path itself: the backends see nothing).
    await warmConnections(pool, args.connections, '/__bench_warm', args.deadlineMs);
    // Backend 1 fails in phase C; the counters start from zero on every backend.
    await Promise.all(env.backendPorts.map((p, i) => backendCall(p, `/__mode?fail=${i === 0 ? failMode : 'none'}&reset=1`)));
    const before = parseExposition(await scrape(metricsPort));
    const run = await runOpenLoop([{ name: 'tail', path: '/tail/item', rate: args.rate, pool }], { warmupSeconds: args.warmup, seconds: args.seconds, deadlineMs: args.deadlineMs });
    const backends = await Promise.all(env.backendPorts.map((p) => backendCall(p, '/__stats')));
    const after = parseExposition(await scrape(metricsPort));
    const outcomes: readonly Outcome[] = run.outcomes.get('tail') ?? [];
    const ok = outcomes.filter((o) => o.kind === 'ok').map((o) => o.latencyMs).sort((a, b) => a - b);
    const failures: Record<string, number> = {};
    for (const o of outcomes) if (o.kind !== 'ok') failures[o.detail] = (failures[o.detail] ?? 0) + 1;
    const clientSent = run.sent.get('tail') ?? 0;
    const upstream = backends.reduce((a, b) => a + b.received, 0);
    const hedge: Record<string, number> = {};
    for (const c of HEDGE_COUNTERS) hedge[c] = sum(after, c) - sum(before, c);
    return {
      name,
      hedgeDelayMs,
      retryRatioPercent: retryRatioPercent ?? 10,
      failMode,
      clientSent,
      measured: outcomes.length,
      successPercent: outcomes.length === 0 ? NaN : (ok.length / outcomes.length) * 100,
      p50Ms: percentile(ok, 0.5),
      p95Ms: percentile(ok, 0.95),
      p99Ms: percentile(ok, 0.99),
      p999Ms: percentile(ok, 0.999),
      failures,
      upstream,
      backends,
      extraLoadPercent: clientSent === 0 ? NaN : (upstream / clientSent - 1) * 100,
      hedge,
      retries: sum(after, 'svc_retries_total') - sum(before, 'svc_retries_total'),
      retryAttempts: delta(sumByLabel(after, 'svc_retry_attempts_total', 'reason'), sumByLabel(before, 'svc_retry_attempts_total', 'reason')),
      retryDenied: delta(sumByLabel(after, 'svc_retry_denied_total', 'reason'), sumByLabel(before, 'svc_retry_denied_total', 'reason')),
      generator: run.generator,
      okAnswers: outcomes.filter((o) => o.kind === 'ok').map((o) => ({ at: o.scheduledAt, ms: o.latencyMs })),
    };
  } finally {
    await pool.close();
    await served.stop();
    env.served.delete(served);
  }
}

function report(args: TailArgs, results: readonly PhaseResult[], delayRule: string | undefined, failed: Readonly<Record<string, string>>): Verdict[] {
  const hedgePhases = results.filter((r) => r.failMode === 'none');
  const retryPhases = results.filter((r) => r.failMode !== 'none');
  if (hedgePhases.length > 0) {
    log(`\n## Hedging: ${BACKENDS} backends, ${args.slowPercent} % of answers after ${args.slowMs} ms; ${args.rate} req/s for ${args.seconds} s (+ ${args.warmup} s warm-up); retry_budget.ratio_percent ${HEDGE_PHASE_RETRY_RATIO}`);
    log('| phase | hedging | client requests (measured) | success | p50 ms | p95 ms | p99 ms | p99.9 ms | upstream requests / client requests (whole phase) | extra upstream load | slow answers / abandoned at backends | failures |');
    log('|---|---|---|---|---|---|---|---|---|---|---|---|');
    for (const r of hedgePhases) {
      const slow = r.backends.reduce((a, b) => a + b.slow, 0);
      const abandoned = r.backends.reduce((a, b) => a + b.abandoned, 0);
      log(`| ${r.name} | ${r.hedgeDelayMs === undefined ? 'off' : `on, delay ${r.hedgeDelayMs} ms`} | ${r.measured} | ${fmtPct(r.successPercent, 2)} | ${fmt(r.p50Ms, 2)} | ${fmt(r.p95Ms, 2)} | ${fmt(r.p99Ms, 2)} | ${fmt(r.p999Ms, 2)} | ${r.upstream} / ${r.clientSent} | ${fmtPct(r.extraLoadPercent, 2)} | ${slow} / ${abandoned} | ${fmtCounts(r.failures)} |`);
    }
    log('\n| phase | hedges sent | hedge won | hedge wasted | primary won after the hedge | primary late, mean ms | retries | retry denied (reason) |');
    log('|---|---|---|---|---|---|---|---|');
    for (const r of hedgePhases) {
      const h = r.hedge;
      const late = (h['svc_hedge_primary_late_ms_total'] ?? 0) / (h['svc_hedge_primary_late_samples_total'] ?? 0);
      log(`| ${r.name} | ${h['svc_hedge_triggered_total']} | ${h['svc_hedge_won_total']} | ${h['svc_hedge_wasted_total']} | ${h['svc_hedge_primary_won_after_trigger_total']} | ${fmt(late, 1)} | ${r.retries} | ${fmtCounts(r.retryDenied)} |`);
    }
    if (delayRule !== undefined) log(`\nhedging delay: ${delayRule}`);
  }
  if (retryPhases.length > 0) {
    log(`\n## Retries: backend b1 fails ${args.failPercent} % of its requests (${(args.failPercent / BACKENDS).toFixed(1)} % of all without retries); hedging off; default retry budget (ratio_percent 10, max_attempts 2)`);
    log('| phase | failure | client requests (measured) | success | p50 ms | p95 ms | p99 ms | p99.9 ms | failed at b1 | upstream / client requests | extra upstream load | retries | retry attempts (reason) | retry denied (reason) | client failures |');
    log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
    for (const r of retryPhases) {
      log(`| ${r.name} | ${r.failMode === 'reset' ? 'reset, no answer' : '503'} | ${r.measured} | ${fmtPct(r.successPercent, 2)} | ${fmt(r.p50Ms, 2)} | ${fmt(r.p95Ms, 2)} | ${fmt(r.p99Ms, 2)} | ${fmt(r.p999Ms, 2)} | ${r.backends[0]?.failed ?? 0} | ${r.upstream} / ${r.clientSent} | ${fmtPct(r.extraLoadPercent, 2)} | ${r.retries} | ${fmtCounts(r.retryAttempts)} | ${fmtCounts(r.retryDenied)} | ${fmtCounts(r.failures)} |`);
    }
  }

  const a = results.find((r) => r.name === 'A');
  const b = results.find((r) => r.name === 'B');
  const verdicts: Verdict[] = [];
  // A phase asked for that failed fails its targets; one not asked for leaves them unmeasured.
  const missing = (names: readonly string[]): Verdict['met'] => (names.some((n) => failed[n] !== undefined) ? false : undefined);
  const why = (names: readonly string[], otherwise: string): string => names.filter((n) => failed[n] !== undefined).map((n) => `phase ${n} failed (above)`).join('; ') || otherwise;
  verdicts.push(a === undefined || b === undefined
    ? { target: 'p99 with hedging ≥ 3× lower than without', met: missing(['A', 'B']), detail: why(['A', 'B'], 'phases A and B not both run') }
    : { target: 'p99 with hedging ≥ 3× lower than without', met: a.p99Ms >= 3 * b.p99Ms, detail: `${fmt(a.p99Ms, 2)} → ${fmt(b.p99Ms, 2)} ms (${fmt(a.p99Ms / b.p99Ms, 1)}×); p99.9 ${fmt(a.p999Ms, 2)} → ${fmt(b.p999Ms, 2)} ms` });
  verdicts.push(b === undefined
    ? { target: 'extra upstream requests with hedging < 10 %', met: missing(['B']), detail: why(['B'], 'phase B not run') }
    : { target: 'extra upstream requests with hedging < 10 %', met: b.extraLoadPercent < 10, detail: `${fmtPct(b.extraLoadPercent, 2)} (${b.upstream} upstream for ${b.clientSent} client requests; ${b.hedge['svc_hedge_triggered_total']} hedges sent)` });
  log('\n## Targets');
  for (const [n, msg] of Object.entries(failed)) log(`- phase ${n} FAILED: ${msg}`);
  for (const v of verdicts) log(`- ${v.target}: ${v.met === undefined ? 'NOT MEASURED' : v.met ? 'MET' : 'NOT MET'}: ${v.detail}`);
  if (results.length === 0) {
    log('\nverdict: FAIL: no phase ran');
    return verdicts;
  }
  const lagP99 = Math.max(...results.map((r) => r.generator.lagP99Ms));
  const sentShare = Math.min(...results.map((r) => r.measured / (args.rate * args.seconds)));
  const cpu = Math.max(...results.map((r) => r.generator.cpuPercent));
  const newConn = Math.max(...results.map((r) => r.generator.newConnectionsPerSec));
  log(`- load generator: sent ≥ ${fmtPct(sentShare * 100)} of the asked requests in every phase; lag (schedule → send) p99 ≤ ${fmt(lagP99, 1)} ms; ≤ ${fmt(cpu)} % of a core; ≤ ${fmt(newConn, 1)} new connections/s during a phase${lagP99 >= 10 ? ' (FELL BEHIND its schedule: latencies are also timestamped by it)' : ''}`);
  // INCOMPLETE: nothing failed, but a target was not measured (a --phases subset).
  const word = verdicts.some((v) => v.met === false) ? 'FAIL' : verdicts.every((v) => v.met === true) ? 'PASS' : 'INCOMPLETE';
  log(`\nverdict: ${word}: ${verdicts.map((v) => `${v.target} ${v.met === undefined ? 'not measured' : v.met ? 'met' : 'not met'}`).join('; ')}`);
  return verdicts;
}

async function main(args: TailArgs): Promise<void> {
  if (args.printConfig) {
    process.stdout.write(tailProxyConfig({ listenPort: 8443, metricsPort: 9090, cert: '/tmp/server.crt', key: '/tmp/server.key', backendPorts: [8081, 8082, 8083], hedgeDelayMs: args.delayMs ?? 5, retryRatioPercent: HEDGE_PHASE_RETRY_RATIO }));
    return;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-tail-'));
  const procs = new Processes();
  const served = new Set<Served>();
  // Whatever happens, nothing the benchmark started outlives it.
  process.on('exit', () => {
    for (const s of served) killServe(s);
    procs.killAll();
    rmSync(dir, { recursive: true, force: true });
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  // Bounded whatever the proxy does: every phase's load, its deadline and a minute of start-up.
  const phaseCount = (args.phases.has('A') ? 1 : 0) + (args.phases.has('B') ? 1 : 0) + (args.phases.has('C') ? args.failModes.length : 0);
  const boundMs = phaseCount * ((args.warmup + args.seconds) * 1000 + args.deadlineMs + 60_000);
  setTimeout(() => {
    console.error(`bench:tail: still running after ${boundMs / 1000} s; stopping`);
    process.exit(1);
  }, boundMs).unref();

  const load = loadavg();
  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  const backendProc: ChildProcess = procs.spawn(process.execPath, [new URL(import.meta.url).pathname, '--serve-backends', '--slow-percent', String(args.slowPercent), '--slow-ms', String(args.slowMs), '--fail-percent', String(args.failPercent), '--seed', String(args.seed)], { stdout: 'pipe' });
  const backendPorts = ((await waitForListeningLine(backendProc))['ports'] as number[]);
  const env: Env = { args, dir, caPem: readFileSync(ca.cert), cert: leaf.cert, key: leaf.key, backendPorts, served, configs: {} };

  log(`backends: ${BACKENDS} HTTP/1.1 servers in one process; each answers 200 at once except exactly ${args.slowPercent} % of its requests (seeded, --seed ${args.seed}) after ${args.slowMs} ms`);
  log(`proxy: edge-proxy serve, 1 worker, HTTP/1.1 over TLS, round-robin over the ${BACKENDS}; adaptive admission, brownout and circuit breaker off; a fresh serve per phase (npm run bench:tail -- --print-config)`);
  log(`load: open loop, ${args.rate} req/s, ${args.warmup} s warm-up + ${args.seconds} s per phase, deadline ${args.deadlineMs} ms, ${args.connections} connections opened before each phase; load average at start ${load.map((l) => l.toFixed(2)).join(' ')}`);

  const results: PhaseResult[] = [];
  // A phase that cannot run (its serve refused the configuration, say) is reported, and the others still run.
  const failed: Record<string, string> = {};
  const attempt = async (name: string, run: () => Promise<PhaseResult>): Promise<PhaseResult | undefined> => {
    try {
      const r = await run();
      results.push(r);
      return r;
    } catch (err) {
      failed[name] = String((err as Error).message).split('\n').slice(0, 6).join(' ').slice(0, 600);
      log(`  ${name}: FAILED: ${failed[name]}`);
      return undefined;
    }
  };
  let delay = args.delayMs;
  let delayRule = args.delayMs === undefined ? undefined : `${args.delayMs} ms (--delay-ms)`;
  if (args.phases.has('A')) {
    const a = await attempt('A', () => runPhase(env, 'A', undefined, HEDGE_PHASE_RETRY_RATIO, 'none'));
    if (a !== undefined) {
      log(`  A (hedging off): p50 ${fmt(a.p50Ms, 2)} p95 ${fmt(a.p95Ms, 2)} p99 ${fmt(a.p99Ms, 2)} p99.9 ${fmt(a.p999Ms, 2)} ms, extra upstream ${fmtPct(a.extraLoadPercent, 2)}`);
      if (delay === undefined) {
        const d = hedgeDelay(a.okAnswers, args.slowMs);
        delay = d.delayMs;
        const over = a.okAnswers.filter((o) => o.ms > d.delayMs).length / Math.max(1, a.okAnswers.length);
        delayRule = `${d.delayMs} ms = phase A's p95: the ${d.rule}, rounded up (the p95 of the whole phase: ${fmt(d.wholeP95Ms, 2)} ms); ${fmtPct(over * 100, 2)} of phase A's answers took longer (about the share of requests a hedge would be sent for)`;
      }
    }
  }
  if (args.phases.has('B')) {
    const hedgeMs = delay;
    const b = hedgeMs === undefined ? undefined : await attempt('B', () => runPhase(env, 'B', hedgeMs, HEDGE_PHASE_RETRY_RATIO, 'none'));
    if (hedgeMs === undefined) failed['B'] = 'no hedging delay: phase A failed';
    if (b !== undefined) log(`  B (hedging on, ${hedgeMs} ms): p50 ${fmt(b.p50Ms, 2)} p95 ${fmt(b.p95Ms, 2)} p99 ${fmt(b.p99Ms, 2)} p99.9 ${fmt(b.p999Ms, 2)} ms, extra upstream ${fmtPct(b.extraLoadPercent, 2)}, ${b.hedge['svc_hedge_triggered_total']} hedges`);
  }
  if (args.phases.has('C')) {
    for (const mode of args.failModes) {
      const c = await attempt(`C-${mode}`, () => runPhase(env, `C-${mode}`, undefined, undefined, mode));
      if (c !== undefined) log(`  C-${mode}: success ${fmtPct(c.successPercent, 2)}, ${c.retries} retries, extra upstream ${fmtPct(c.extraLoadPercent, 2)}`);
    }
  }
  await procs.stopAll();

  const verdicts = report(args, results, delayRule, failed);
  // A phase that could not run is an error of the run, not a figure: the exit status says so.
  if (Object.keys(failed).length > 0) process.exitCode = 1;
  if (args.json !== undefined) {
    writeFileSync(args.json, `${JSON.stringify({
      benchmark: 'tail',
      measured_at: new Date().toISOString(),
      load_average_at_start: load,
      backends: { count: BACKENDS, slow_percent: args.slowPercent, slow_ms: args.slowMs, fail_percent: args.failPercent, seed: args.seed },
      load: { req_per_s: args.rate, seconds: args.seconds, warmup_seconds: args.warmup, deadline_ms: args.deadlineMs, connections: args.connections },
      hedge_delay: { ms: delay, rule: delayRule },
      configs: env.configs,
      phases: results.map(({ okAnswers: _, ...r }) => r),
      failed_phases: failed,
      verdicts,
    }, null, 2)}\n`);
    log(`\nJSON written to ${args.json}`);
  }
}

/** The backend process: BACKENDS servers, each with its own seed; one JSON line with their ports. */
async function serveBackends(args: TailArgs): Promise<void> {
  const backends: TailBackend[] = [];
  for (let i = 0; i < BACKENDS; i++) backends.push(await startTailBackend({ slowPercent: args.slowPercent, slowMs: args.slowMs, failPercent: args.failPercent, seed: args.seed * 1000 + i }));
  console.log(JSON.stringify({ event: 'listening', ports: backends.map((b) => b.port) }));
  process.on('SIGTERM', () => void Promise.all(backends.map((b) => b.close())).then(() => process.exit(0)));
}

if (import.meta.main) {
  const args = commandLine(() => parseTailArgs(process.argv.slice(2)));
  if (args.serveBackends) await serveBackends(args);
  else await main(args);
}
