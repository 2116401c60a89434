// Quota benchmark: the latency the distributed quota phase adds to a request, and the Redis round
// trips it costs, through a real `edge-proxy serve` and a real `redis-server` on loopback (issue 15,
// "Must show": p99 added < 0.5 ms at a fixed rate, exactly one round trip per request).
//
//   npm run bench:quota [-- --rate 500 --seconds 5 --warmup 1 --rounds 6 --connections 32
//                          --deadline-ms 5000 --timeout-ms 50 --print-config --json FILE]
//
// - Redis: `redis-server` on a free loopback port, no persistence (test/support/redis.ts).
// - Backend: one HTTP/1.1 server in a process of its own answering `200 ok` at once.
// - Proxy: `edge-proxy serve`, one worker, HTTP/1.1 over TLS, two routes on the same backend:
//   `/on/` under a quota policy (dimension client_ip, a limit no request reaches: every request is
//   checked and admitted), `/off/` under none. The same proxy serves both, so the difference
//   between the routes is the quota phase and nothing else (same process, same connections' code
//   path, same backend). Overload protection and the breaker are off.
// - Load (scripts/lib/open-loop.ts): open loop at --rate req/s on one route at a time, --warmup s
//   unmeasured then --seconds s measured. Rounds are pairs of runs, one per route, in alternating
//   order (off, on), (on, off), ... so a drift of the machine over the run weighs on both alike.
//   Per pair: p50 and p99 of each route's 2xx answers, and the difference on − off. The figures
//   are the medians of the pairs' differences, with every pair printed (the noise on these
//   machines is large: FIELD-NOTES.md), and the difference of the pooled percentiles.
// - Round trips: INFO commandstats before and after all rounds: successful EVALSHA (and EVAL)
//   calls ÷ requests sent to `/on/` (warm-ups included), and every other command Redis ran meanwhile
//   (INFO itself excepted). Commandstats also counts the commands a script runs (redis.call): the
//   quota script's TIME (once a run), GET and INCR (once a run per contract: one here, every
//   request admitted) and PEXPIRE (a key's first count) are told apart by those exact counts; any
//   other command, or more of those, is a round trip of its own. The quota outcomes from the metrics endpoint say whether any decision
//   was not `distributed` (a fallback during the run would make the figures meaningless).
// - Verdict: median p99 added < 0.5 ms, and script runs ÷ requests = 1 with no other command.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { median, percentile } from '../lib/bench-load.ts';
import { waitForListeningLine } from '../lib/bench-peers.ts';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { loadPool, runOpenLoop, warmConnections } from '../lib/open-loop.ts';
import type { GeneratorHealth } from '../lib/open-loop.ts';
import { processTree } from '../lib/proc-stats.ts';
import { fmt, fmtCounts } from '../lib/bench-format.ts';
import type { Verdict } from '../lib/bench-format.ts';
import { parseExposition, scrape } from '../../test/support/exposition.ts';
import { serve } from '../../test/support/serve.ts';
import type { Served } from '../../test/support/serve.ts';
import { commandStat, startRedis } from '../../test/support/redis.ts';
import type { RedisServer } from '../../test/support/redis.ts';
import { benchArgs, commandLine, numberArg } from '../lib/bench-args.ts';

const log = (line: string): void => console.log(line);
/** Target of the issue: p99 added by the quota phase, ms. */
const P99_TARGET_MS = 0.5;

/** What the command line asks for. */
export interface QuotaBenchArgs {
  readonly rate: number;
  readonly seconds: number;
  readonly warmup: number;
  readonly rounds: number;
  readonly connections: number;
  readonly deadlineMs: number;
  readonly timeoutMs: number;
  readonly json: string | undefined;
  readonly printConfig: boolean;
  /** Internal: run the backend in this process (the benchmark starts itself so). */
  readonly serveBackend: boolean;
}

/** Parses and checks the command line; throws on a bad value. */
export function parseQuotaArgs(argv: readonly string[]): QuotaBenchArgs {
  const { values } = benchArgs({
    args: [...argv],
    options: {
      rate: { type: 'string', default: '500' },
      seconds: { type: 'string', default: '5' },
      warmup: { type: 'string', default: '1' },
      rounds: { type: 'string', default: '6' },
      connections: { type: 'string', default: '32' },
      'deadline-ms': { type: 'string', default: '5000' },
      'timeout-ms': { type: 'string', default: '50' },
      json: { type: 'string' },
      'print-config': { type: 'boolean', default: false },
      'serve-backend': { type: 'boolean', default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  const int = (n: number): boolean => Number.isInteger(n) && n > 0;
  return {
    rate: numberArg('rate', values.rate, (n) => n > 0),
    seconds: numberArg('seconds', values.seconds, (n) => n > 0),
    warmup: numberArg('warmup', values.warmup, (n) => n >= 0),
    rounds: numberArg('rounds', values.rounds, int),
    connections: numberArg('connections', values.connections, int),
    deadlineMs: numberArg('deadline-ms', values['deadline-ms'], (n) => n > 0),
    timeoutMs: numberArg('timeout-ms', values['timeout-ms'], int),
    json: values.json,
    printConfig: values['print-config'] === true,
    serveBackend: values['serve-backend'] === true,
  };
}

/** Ports and files of the proxy. */
export interface QuotaProxyVars {
  readonly listenPort: number;
  readonly metricsPort: number;
  readonly cert: string;
  readonly key: string;
  readonly backendPort: number;
  readonly redisAddress: string;
  readonly timeoutMs: number;
}

/** The proxy's configuration (YAML). */
export function quotaProxyConfig(v: QuotaProxyVars): string {
  return `# edge-proxy configuration for npm run bench:quota.
listen: { address: 127.0.0.1, port: ${v.listenPort}, tls: { cert: ${v.cert}, key: ${v.key} } }
log: { level: info, format: json }
performance:
  worker_threads: 1
  # Far above what the load keeps in flight: no request waits for admission.
  global_inflight_limit: 4096
  per_upstream_inflight_limit: 4096
  per_backend_inflight_limit: 4096
  # All the load comes from one loopback address.
  max_connections_per_source: 2048
resilience:
  # Nothing but the quota may act on a request.
  adaptive_admission: { enabled: false }
  brownout: { enabled: false }
  circuit_breaker: { enabled: false }
  quota:
    enabled: true
    backend: redis
    redis: { address: "${v.redisAddress}", timeout_ms: ${v.timeoutMs} }
    failure_mode: local_fallback
    # Every request to /on/ is checked in Redis and admitted: the limit is never reached.
    policies: [{ name: bench, routes: ["on"], dimensions: [client_ip], sustained: { limit: 1000000000, window_ms: 86400000 } }]
observability:
  metrics: { address: 127.0.0.1, port: ${v.metricsPort} }
  control_api: { enabled: false }
upstream:
  "on": { route: { path_prefix: /on/ }, backends: [{ id: b, address: "127.0.0.1:${v.backendPort}" }] }
  "off": { route: { path_prefix: /off/ }, backends: [{ id: b, address: "127.0.0.1:${v.backendPort}" }] }
`;
}

/** One measured run on one route. */
interface Run {
  readonly route: 'on' | 'off';
  readonly sent: number;
  readonly measured: number;
  readonly ok: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly failures: Record<string, number>;
  readonly generator: GeneratorHealth;
  /** Sorted 2xx latencies (left out of the JSON). */
  readonly latencies: readonly number[];
}

/** A pair of runs, one per route, and what the quota added. */
interface Pair {
  readonly order: string;
  readonly off: Run;
  readonly on: Run;
  readonly addedP50Ms: number;
  readonly addedP99Ms: number;
}

/** Commands the quota script runs itself (redis.call), counted by commandstats too. */
const SCRIPT_INNER = ['time', 'get', 'incr', 'pexpire'] as const;

/** Successful script runs and every other command (INFO excepted) from `INFO commandstats`. */
function redisCounts(info: string): { scripts: number; failedScripts: number; other: Record<string, number> } {
  const sha = commandStat(info, 'evalsha');
  const ev = commandStat(info, 'eval');
  const other: Record<string, number> = {};
  for (const m of info.matchAll(/^cmdstat_([a-z|_-]+):calls=(\d+)/gm)) {
    const name = m[1] as string;
    if (name === 'evalsha' || name === 'eval' || name === 'info') continue;
    other[name] = Number(m[2]);
  }
  return { scripts: sha.calls - sha.failed - sha.rejected + ev.calls - ev.failed - ev.rejected, failedScripts: sha.failed + sha.rejected + ev.failed + ev.rejected, other };
}

/** `svc_quota_policy_outcomes_total` by `decision/reason/backend_mode`. */
function quotaOutcomes(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of parseExposition(text)) if (s.name === 'svc_quota_policy_outcomes_total') out[`${s.labels['decision']}/${s.labels['reason']}/${s.labels['backend_mode']}`] = (out[`${s.labels['decision']}/${s.labels['reason']}/${s.labels['backend_mode']}`] ?? 0) + s.value;
  return out;
}

function minus(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(a)) if (v - (b[k] ?? 0) !== 0) out[k] = v - (b[k] ?? 0);
  return out;
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

async function main(args: QuotaBenchArgs): Promise<void> {
  if (args.printConfig) {
    process.stdout.write(quotaProxyConfig({ listenPort: 8443, metricsPort: 9090, cert: '/tmp/server.crt', key: '/tmp/server.key', backendPort: 8081, redisAddress: '127.0.0.1:6379', timeoutMs: args.timeoutMs }));
    return;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-quota-'));
  const teardowns: Array<() => unknown> = [];
  let served: Served | undefined;
  let backend: ChildProcess | undefined;
  // Whatever happens, nothing the benchmark started outlives it (redis-server included).
  process.on('exit', () => {
    if (served !== undefined) killServe(served);
    if (backend?.pid !== undefined && backend.exitCode === null) backend.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
  const boundMs = 2 * args.rounds * ((args.warmup + args.seconds) * 1000 + args.deadlineMs) + 120_000;
  setTimeout(() => {
    console.error(`bench:quota: still running after ${boundMs / 1000} s; stopping`);
    process.exit(1);
  }, boundMs).unref();

  const load = loadavg();
  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  let redis: RedisServer | undefined;
  try {
    redis = await startRedis({ teardown: (fn) => void teardowns.push(fn) });
    backend = spawn(process.execPath, [new URL(import.meta.url).pathname, '--serve-backend'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const backendPort = (await waitForListeningLine(backend))['port'] as number;
    const listenPort = await freePort();
    const metricsPort = await freePort();
    const configText = quotaProxyConfig({ listenPort, metricsPort, cert: leaf.cert, key: leaf.key, backendPort, redisAddress: redis.address, timeoutMs: args.timeoutMs });
    served = await serve(path.join(dir, 'quota.yaml'), configText, 60_000);
    const pool = loadPool(`https://127.0.0.1:${listenPort}`, args.connections, readFileSync(ca.cert), 'localhost', args.deadlineMs);

    log(`redis: redis-server ${redis.address} (loopback, no persistence); backend: one HTTP/1.1 server in its own process, 200 at once`);
    log(`proxy: edge-proxy serve, 1 worker, HTTP/1.1 over TLS; /on/ under a quota policy (client_ip, never reached, timeout_ms ${args.timeoutMs}), /off/ under none (npm run bench:quota -- --print-config)`);
    log(`load: open loop, ${args.rate} req/s, ${args.warmup} s warm-up + ${args.seconds} s per run, ${args.rounds} pairs of runs (off/on in alternating order), ${args.connections} connections; load average at start ${load.map((l) => l.toFixed(2)).join(' ')}`);
    try {
      for (const route of ['on', 'off']) {
        const r = await pool.request({ path: `/${route}/check`, method: 'GET' });
        const body = await r.body.text();
        if (r.statusCode !== 200 || body !== 'ok') throw new Error(`/${route}/ through the proxy: expected 200 "ok", got ${r.statusCode} ${JSON.stringify(body.slice(0, 160))}`);
      }
      await warmConnections(pool, args.connections, '/__bench_warm', args.deadlineMs);
      const infoBefore = redisCounts(await redis.command('INFO', 'commandstats'));
      const outcomesBefore = quotaOutcomes(await scrape(metricsPort));
      const pairs: Pair[] = [];
      let onSent = 0;
      const runOne = async (route: 'on' | 'off'): Promise<Run> => {
        const res = await runOpenLoop([{ name: route, path: `/${route}/item`, rate: args.rate, pool }], { warmupSeconds: args.warmup, seconds: args.seconds, deadlineMs: args.deadlineMs });
        const outcomes = res.outcomes.get(route) ?? [];
        const ok = outcomes.filter((o) => o.kind === 'ok').map((o) => o.latencyMs).sort((a, b) => a - b);
        const failures: Record<string, number> = {};
        for (const o of outcomes) if (o.kind !== 'ok') failures[o.detail] = (failures[o.detail] ?? 0) + 1;
        const sent = res.sent.get(route) ?? 0;
        if (route === 'on') onSent += sent;
        return { route, sent, measured: outcomes.length, ok: ok.length, p50Ms: percentile(ok, 0.5), p99Ms: percentile(ok, 0.99), failures, generator: res.generator, latencies: ok };
      };
      for (let i = 0; i < args.rounds; i++) {
        const order: Array<'on' | 'off'> = i % 2 === 0 ? ['off', 'on'] : ['on', 'off'];
        const runs: Partial<Record<'on' | 'off', Run>> = {};
        for (const route of order) runs[route] = await runOne(route);
        const on = runs.on as Run;
        const off = runs.off as Run;
        pairs.push({ order: order.join(', '), off, on, addedP50Ms: on.p50Ms - off.p50Ms, addedP99Ms: on.p99Ms - off.p99Ms });
        log(`  pair ${i + 1} (${order.join(', ')}): off p50 ${fmt(off.p50Ms, 3)} p99 ${fmt(off.p99Ms, 3)}; on p50 ${fmt(on.p50Ms, 3)} p99 ${fmt(on.p99Ms, 3)}; added p50 ${fmt(on.p50Ms - off.p50Ms, 3)} p99 ${fmt(on.p99Ms - off.p99Ms, 3)} ms`);
      }
      const infoAfter = redisCounts(await redis.command('INFO', 'commandstats'));
      const outcomes = minus(quotaOutcomes(await scrape(metricsPort)), outcomesBefore);
      report(args, pairs, { scripts: infoAfter.scripts - infoBefore.scripts, failedScripts: infoAfter.failedScripts - infoBefore.failedScripts, other: minus(infoAfter.other, infoBefore.other), onSent }, outcomes, load, configText);
    } finally {
      await pool.close();
    }
  } finally {
    await served?.stop();
    if (backend !== undefined && backend.exitCode === null) {
      backend.kill('SIGTERM');
    }
    for (const fn of teardowns.reverse()) await fn();
  }
}

interface RoundTrips {
  readonly scripts: number;
  readonly failedScripts: number;
  readonly other: Record<string, number>;
  readonly onSent: number;
}

function report(args: QuotaBenchArgs, pairs: readonly Pair[], rt: RoundTrips, outcomes: Record<string, number>, load: readonly number[], configText: string): void {
  const pooled = (route: 'on' | 'off'): number[] => pairs.flatMap((p) => p[route].latencies).sort((a, b) => a - b);
  const allOn = pooled('on');
  const allOff = pooled('off');
  log(`\n## Quota phase: ${args.rate} req/s, ${args.rounds} pairs of ${args.seconds} s runs, Redis on loopback`);
  log('| pair | order | off: requests | off p50 ms | off p99 ms | on: requests | on p50 ms | on p99 ms | added p50 ms | added p99 ms | failures (off / on) |');
  log('|---|---|---|---|---|---|---|---|---|---|---|');
  pairs.forEach((p, i) => log(`| ${i + 1} | ${p.order} | ${p.off.measured} | ${fmt(p.off.p50Ms, 3)} | ${fmt(p.off.p99Ms, 3)} | ${p.on.measured} | ${fmt(p.on.p50Ms, 3)} | ${fmt(p.on.p99Ms, 3)} | ${fmt(p.addedP50Ms, 3)} | ${fmt(p.addedP99Ms, 3)} | ${fmtCounts(p.off.failures)} / ${fmtCounts(p.on.failures)} |`));
  const medP50 = median(pairs.map((p) => p.addedP50Ms));
  const medP99 = median(pairs.map((p) => p.addedP99Ms));
  log(`| median of pairs | | | | | | | | **${fmt(medP50, 3)}** | **${fmt(medP99, 3)}** | |`);
  log(`| pooled | | ${allOff.length} | ${fmt(percentile(allOff, 0.5), 3)} | ${fmt(percentile(allOff, 0.99), 3)} | ${allOn.length} | ${fmt(percentile(allOn, 0.5), 3)} | ${fmt(percentile(allOn, 0.99), 3)} | ${fmt(percentile(allOn, 0.5) - percentile(allOff, 0.5), 3)} | ${fmt(percentile(allOn, 0.99) - percentile(allOff, 0.99), 3)} | |`);
  const perRequest = rt.onSent === 0 ? NaN : rt.scripts / rt.onSent;
  // The script's own calls: TIME once a run, GET and INCR once a run (one contract, every run admitted), PEXPIRE at most once per window key.
  const inner = { time: rt.other['time'] ?? 0, get: rt.other['get'] ?? 0, incr: rt.other['incr'] ?? 0, pexpire: rt.other['pexpire'] ?? 0 };
  const innerOk = inner.time === rt.scripts && inner.get === rt.scripts && inner.incr === rt.scripts && inner.pexpire <= 1;
  const outside = Object.fromEntries(Object.entries(rt.other).filter(([k]) => !(SCRIPT_INNER as readonly string[]).includes(k)));
  log(`\nRedis round trips: ${rt.scripts} successful script runs (EVALSHA/EVAL) for ${rt.onSent} requests to /on/ (warm-ups included) = ${fmt(perRequest, 4)} per request; failed script calls ${rt.failedScripts}; run by the script itself: ${fmtCounts(inner)} (${innerOk ? 'exactly its own calls' : 'MORE than its own calls'}); other commands: ${fmtCounts(outside)}`);
  log(`quota outcomes over the rounds: ${fmtCounts(outcomes)}`);
  const notDistributed = Object.entries(outcomes).filter(([k]) => !k.endsWith('/distributed')).reduce((a, [, v]) => a + v, 0);
  // The /on/ requests the quota admitted in Redis: without them the comparison measures nothing.
  const decided = outcomes['allow/within_quota/distributed'] ?? 0;
  const lagP99 = Math.max(...pairs.flatMap((p) => [p.on.generator.lagP99Ms, p.off.generator.lagP99Ms]));
  const cpu = Math.max(...pairs.flatMap((p) => [p.on.generator.cpuPercent, p.off.generator.cpuPercent]));
  const failures = pairs.reduce((a, p) => a + (p.on.measured - p.on.ok) + (p.off.measured - p.off.ok), 0);

  const otherCommands = Object.values(outside).reduce((a, v) => a + v, 0);
  const verdicts: Verdict[] = [
    { target: `p99 added by the quota phase < ${P99_TARGET_MS} ms`, met: Number.isFinite(medP99) && medP99 < P99_TARGET_MS && notDistributed === 0 && failures === 0 && decided === rt.onSent, detail: `median of ${pairs.length} pairs ${fmt(medP99, 3)} ms (p50 ${fmt(medP50, 3)} ms); pooled ${fmt(percentile(allOn, 0.99) - percentile(allOff, 0.99), 3)} ms; ${decided} of ${rt.onSent} /on/ requests admitted by Redis${notDistributed > 0 ? `; ${notDistributed} decisions not distributed (a fallback during the run)` : ''}${failures > 0 ? `; ${failures} requests failed` : ''}` },
    { target: 'exactly one Redis round trip per request', met: rt.scripts === rt.onSent && otherCommands === 0 && innerOk && rt.failedScripts === 0, detail: `${rt.scripts} script runs for ${rt.onSent} requests (${fmt(perRequest, 4)}), ${rt.failedScripts} failed, ${otherCommands} other commands${innerOk ? '' : ', commands beyond the script\'s own calls'}` },
  ];
  log('\n## Targets');
  for (const v of verdicts) log(`- ${v.target}: ${v.met === undefined ? 'NOT MEASURED' : v.met ? 'MET' : 'NOT MET'}: ${v.detail}`);
  log(`- load generator: lag (schedule → send) p99 ≤ ${fmt(lagP99, 1)} ms; ≤ ${fmt(cpu)} % of a core${lagP99 >= 10 ? ' (FELL BEHIND its schedule: latencies are also timestamped by it)' : ''}`);
  log(`\nverdict: ${verdicts.every((v) => v.met === true) ? 'PASS' : 'FAIL'}: ${verdicts.map((v) => `${v.target} ${v.met ? 'met' : 'not met'}`).join('; ')}`);
  if (args.json !== undefined) {
    writeFileSync(args.json, `${JSON.stringify({
      benchmark: 'quota',
      measured_at: new Date().toISOString(),
      load_average_at_start: load,
      load: { req_per_s: args.rate, seconds: args.seconds, warmup_seconds: args.warmup, rounds: args.rounds, connections: args.connections, deadline_ms: args.deadlineMs },
      config: configText,
      pairs: pairs.map((p) => ({ ...p, off: { ...p.off, latencies: undefined }, on: { ...p.on, latencies: undefined } })),
      median_added_ms: { p50: medP50, p99: medP99 },
      round_trips: { ...rt, per_request: perRequest },
      quota_outcomes: outcomes,
      verdicts,
    }, null, 2)}\n`);
    log(`\nJSON written to ${args.json}`);
  }
  if (!verdicts.every((v) => v.met === true)) process.exitCode = 1;
}

/** The backend process: `200 ok` at once; one JSON line with its port. */
async function serveBackend(): Promise<void> {
  const server = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('ok'));
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  console.log(JSON.stringify({ event: 'listening', port: (server.address() as AddressInfo).port }));
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
}

if (import.meta.main) {
  const args = commandLine(() => parseQuotaArgs(process.argv.slice(2)));
  if (args.serveBackend) await serveBackend();
  else await main(args);
}
