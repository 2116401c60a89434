// Load generators for `npm run bench:proxy`, all independent C clients pinned to one core:
// wrk (HTTP/1.1), h2load (HTTP/2, and HTTP/1.1 at a fixed request rate with a per-request log),
// gtlsclient (HTTP/3 on one connection). Each run is bounded in time and its output parsed.
import { spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { streamLatencies } from './gtlsclient-log.ts';

/** One load run: what the client counted. Latencies in milliseconds. */
export interface LoadResult {
  readonly requests: number;
  readonly seconds: number;
  readonly reqPerSec: number;
  readonly p50: number;
  readonly p99: number;
  /** Requests that failed or answered other than 2xx. */
  readonly errors: number;
  /** The client's own summary, for the log when something looks wrong. */
  readonly raw: string;
}

/** Runs `command` pinned to `core`, killed after `timeoutMs`; resolves with stdout + stderr. */
export function runPinned(core: number, command: string, args: readonly string[], timeoutMs: number): Promise<string> {
  return runBounded('taskset', ['-c', String(core), command, ...args], timeoutMs);
}

/** Runs `command`, killed after `timeoutMs`; resolves with stdout + stderr (and the spawn error, if it could not start). */
export function runBounded(command: string, args: readonly string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve) => {
    const p = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const parts: Buffer[] = [];
    p.stdout.on('data', (d: Buffer) => parts.push(d));
    p.stderr.on('data', (d: Buffer) => parts.push(d));
    p.on('error', (err) => parts.push(Buffer.from(`${command}: ${err.message}\n`))); // 'close' follows
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(parts).toString());
    });
  });
}

const UNIT_MS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000 };

/** wrk prints durations as `812.00us`, `1.23ms`, `2.01s`. */
function wrkDuration(v: string | undefined, unit: string | undefined): number {
  return v === undefined || unit === undefined ? NaN : Number(v) * (UNIT_MS[unit] ?? NaN);
}

/** `wrk -t1 -cC -dDs --latency URL`: closed loop, C connections, each one request at a time. */
export async function wrk(core: number, url: string, connections: number, seconds: number, headers: readonly string[] = []): Promise<LoadResult> {
  const out = await runPinned(core, 'wrk', ['-t1', `-c${connections}`, `-d${seconds}s`, '--latency', ...headers.flatMap((h) => ['-H', h]), url], (seconds + 20) * 1000);
  const requests = Number(/(\d+) requests in ([\d.]+)(us|ms|s|m)/.exec(out)?.[1] ?? 0);
  const m = /requests in ([\d.]+)(us|ms|s|m)/.exec(out);
  const elapsed = wrkDuration(m?.[1], m?.[2]) / 1000;
  const p50 = /^\s+50%\s+([\d.]+)(us|ms|s|m)/m.exec(out);
  const p99 = /^\s+99%\s+([\d.]+)(us|ms|s|m)/m.exec(out);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
  const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const sockErrors = sock === null ? 0 : sock.slice(1).reduce((a, b) => a + Number(b), 0);
  return {
    requests,
    seconds: elapsed,
    reqPerSec: Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN),
    p50: wrkDuration(p50?.[1], p50?.[2]),
    p99: wrkDuration(p99?.[1], p99?.[2]),
    errors: non2xx + sockErrors,
    raw: out,
  };
}

/** What h2load's summary says: requests that succeeded, those that did not or answered other than 2xx, the rate and the time. */
export function h2loadCounts(out: string): { requests: number; errors: number; reqPerSec: number; seconds: number } {
  const r = /requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout/.exec(out);
  const f = /finished in ([\d.]+)(us|ms|s|m), ([\d.]+) req\/s/.exec(out);
  const status = /status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/.exec(out);
  const bad = status === null ? 0 : Number(status[2]) + Number(status[3]) + Number(status[4]);
  return {
    requests: Number(r?.[4] ?? 0),
    errors: Number(r?.[5] ?? 0) + Number(r?.[6] ?? 0) + Number(r?.[7] ?? 0) + bad,
    reqPerSec: Number(f?.[3] ?? NaN),
    seconds: wrkDuration(f?.[1], f?.[2]) / 1000,
  };
}

/** `h2load -t1 -cC -mM -D S URL` over TLS (HTTP/2 by ALPN): throughput only (h2load has no percentiles). */
export async function h2load(core: number, url: string, connections: number, streams: number, seconds: number): Promise<LoadResult> {
  const out = await runPinned(core, 'h2load', ['-t1', `-c${connections}`, `-m${streams}`, '-D', String(seconds), '--warm-up-time=1', url], (seconds + 25) * 1000);
  const c = h2loadCounts(out);
  return { ...c, p50: NaN, p99: NaN, raw: out.split('\n').filter((l) => /finished|requests:|status codes|traffic|time for request/.test(l)).join('\n') };
}

/** The median of the finite values of `xs` (the mean of the two middle ones when their number is even); NaN when none. */
export function median(xs: readonly number[]): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

/** Nearest-rank percentile `p` (0-1) of an ascending array; NaN when empty. */
export function percentile(sorted: readonly number[], p: number): number {
  return sorted.length === 0 ? NaN : (sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * p) - 1)] as number);
}

/**
 * HTTP/1.1 at a fixed overall request rate: `h2load --h1 -cC --rps R/C`, each connection sending
 * on its own timer whether or not the others are slow. With one request in flight per connection,
 * a request that comes due while the previous one is still out waits for it, and h2load times it
 * from its actual send; at half of peak the previous one has long finished (intervals of several
 * ms against sub-ms latencies), so the schedule holds. Latency per request comes from h2load's
 * log file (send to end of response, µs).
 *
 * One h2load's timers fall into step after its connections are up: every connection sends in the
 * same millisecond, a burst of C requests per period (docs/performance.md, "Tail latency at half
 * of peak"). `clients` > 1 splits the connections over that many h2load processes, each started
 * a `1/clients` of the period after the one before, so the bursts are C/clients requests and
 * spread over the period: closer to many independent clients. `connections` must divide by it.
 */
export async function h1AtRate(core: number, url: string, connections: number, totalRate: number, seconds: number, logFile: string, clients = 1): Promise<LoadResult & { p999: number; achievedRate: number }> {
  if (!Number.isInteger(clients) || clients < 1 || connections % clients !== 0) throw new Error(`h1AtRate: ${connections} connections cannot be split over ${clients} clients`);
  const perConnection = Math.max(1, Math.round(totalRate / connections));
  const periodMs = 1000 / perConnection;
  const logs = Array.from({ length: clients }, (_, i) => (clients === 1 ? logFile : `${logFile}.${i}`));
  const runs: Promise<string>[] = [];
  for (const [i, log] of logs.entries()) {
    rmSync(log, { force: true });
    if (i > 0) await new Promise((r) => setTimeout(r, periodMs / clients));
    runs.push(runPinned(core, 'h2load', ['--h1', '-t1', `-c${connections / clients}`, `--rps=${perConnection}`, '-D', String(seconds), '--warm-up-time=1', `--log-file=${log}`, url], (seconds + 25) * 1000));
  }
  const outs = await Promise.all(runs);
  const counts = outs.map(h2loadCounts);
  const lat: number[] = [];
  let first = Infinity;
  let last = 0;
  for (const log of logs) {
    for (const line of readFileSync(log, 'utf8').split('\n')) {
      const [start, status, us] = line.split('\t');
      if (start === undefined || us === undefined || status === undefined) continue;
      const t = Number(start);
      first = Math.min(first, t);
      last = Math.max(last, t);
      lat.push(Number(us) / 1000);
    }
  }
  lat.sort((a, b) => a - b);
  return {
    requests: counts.reduce((n, c) => n + c.requests, 0),
    errors: counts.reduce((n, c) => n + c.errors, 0),
    reqPerSec: counts.reduce((n, c) => n + c.reqPerSec, 0),
    seconds: Math.max(...counts.map((c) => c.seconds)),
    p50: percentile(lat, 0.5),
    p99: percentile(lat, 0.99),
    p999: percentile(lat, 0.999),
    achievedRate: lat.length / Math.max(1e-6, (last - first) / 1e6),
    raw: `${outs.map((out) => out.split('\n').filter((l) => /finished|requests:|status codes/.test(l)).join('\n')).join('\n')}\nasked ${perConnection} req/s on each of ${connections} connections${clients > 1 ? ` from ${clients} clients` : ''}`,
  };
}

/**
 * `gtlsclient -n N` on one QUIC connection (as scripts/bench/h3.ts): it keeps as many request
 * streams open as the server allows. req/s over the span from the first request's STREAM frame
 * to the last response's FIN, latency per stream, both from its frame log (ms resolution).
 */
export async function gtlsclient(core: number, host: string, port: number, url: string, n: number): Promise<LoadResult> {
  const out = await gtlsclientRun(core, host, port, url, n);
  const { latencies: lat, first, last } = streamLatencies(out);
  lat.sort((a, b) => a - b);
  const seconds = Math.max(1, last - first) / 1000;
  return { requests: lat.length, seconds, reqPerSec: lat.length / seconds, p50: percentile(lat, 0.5), p99: percentile(lat, 0.99), errors: n - lat.length, raw: out.slice(-400) };
}

/** One gtlsclient process: `n` requests on one QUIC connection; its frame log. */
function gtlsclientRun(core: number, host: string, port: number, url: string, n: number): Promise<string> {
  return runPinned(core, 'gtlsclient', ['--no-quic-dump', '--no-http-dump', '--exit-on-all-streams-close', '--timeout=20s', '-n', String(n), host, String(port), url], 60_000);
}

/**
 * Many QUIC connections with few streams each: `connections` gtlsclient processes at once, each
 * opening its own connection (full handshake) for `-n perConnection` requests, `waves` times in
 * a row. req/s over the wall time of all waves, handshakes included; latency per stream from the
 * frame logs (ms resolution). A process that fails counts its missing streams as errors.
 */
export async function gtlsclientMany(core: number, host: string, port: number, url: string, connections: number, perConnection: number, waves: number): Promise<LoadResult> {
  const lat: number[] = [];
  let raw = '';
  const start = process.hrtime.bigint();
  for (let w = 0; w < waves; w++) {
    const outs = await Promise.all(
      Array.from({ length: connections }, () => gtlsclientRun(core, host, port, url, perConnection)),
    );
    for (const out of outs) {
      const { latencies } = streamLatencies(out);
      for (const l of latencies) lat.push(l);
      if (latencies.length < perConnection) raw = out.slice(-400);
    }
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  lat.sort((a, b) => a - b);
  const asked = connections * perConnection * waves;
  return { requests: lat.length, seconds, reqPerSec: lat.length / seconds, p50: percentile(lat, 0.5), p99: percentile(lat, 0.99), errors: asked - lat.length, raw };
}
