// A real Prometheus for tests of the operator bundle (issue 17): Debian's `prometheus` started on a
// free loopback port with a temporary TSDB, a generated configuration that scrapes one running
// edge-proxy's metrics endpoint every second and evaluates the given rule files every second;
// ready once `/-/ready` answers 200; queried through the HTTP API (`/api/v1/query`,
// `/api/v1/rules`); killed at teardown. Prometheus has no push notification for "the series now
// has this value", so `until` polls a query, bounded, and fails with the last answer it saw.
import http from 'node:http';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../../scripts/lib/free-port.ts';
import { toolPath } from '../../scripts/system-tools.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** What to scrape and which rules to load. */
export interface PrometheusSetup {
  /** `host:port` of the edge-proxy metrics endpoint. */
  readonly target: string;
  /** Its path (default `/metrics`). */
  readonly metricsPath?: string;
  /** Rule files (absolute paths) for `rule_files`. */
  readonly ruleFiles: readonly string[];
  /** Scrape and rule evaluation interval, seconds (default 1). */
  readonly intervalSeconds?: number;
}

/** One series of an instant vector: its labels and its value. */
export interface VectorSample {
  readonly metric: Readonly<Record<string, string>>;
  readonly value: number;
  /** Evaluation time of the query, seconds since the epoch. */
  readonly at: number;
}

/** One rule as `/api/v1/rules` reports it. */
export interface LoadedRule {
  readonly name: string;
  readonly type: 'recording' | 'alerting';
  readonly health: string;
  readonly query: string;
  readonly lastError?: string;
  readonly group: string;
  readonly file: string;
}

export interface PrometheusServer {
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** The generated configuration file. */
  readonly configFile: string;
  /** Everything Prometheus logged so far (stderr), for failure messages. */
  log(): string;
  /** Instant query (at `time`, seconds, when given; else now); the result vector. Throws on an API error or a non-vector result. */
  query(expr: string, time?: number): Promise<VectorSample[]>;
  /** Instant query whose result must be empty or one series; its value (undefined when empty). */
  value(expr: string, time?: number): Promise<number | undefined>;
  /**
   * Polls `value(expr)` every 200 ms until `pred` holds for it, for at most `timeoutMs`; the value.
   * Rejects after the deadline with the last value read and `what`.
   */
  until(expr: string, pred: (v: number | undefined) => boolean, what: string, timeoutMs?: number): Promise<number | undefined>;
  /** Every rule of every loaded group. */
  rules(): Promise<LoadedRule[]>;
  /** The scrape target's health as `/api/v1/targets` reports it (`up`, `down`, `unknown`) and its last error. */
  target(): Promise<{ health: string; lastError: string; lastScrape: string }>;
}

/** The path of Debian's `prometheus`; throws naming the package when it is not installed. */
export function prometheusBinary(): string {
  const bin = toolPath('prometheus');
  if (bin === undefined) throw new Error('prometheus is not installed: install the Debian package `prometheus` (apt-get install prometheus), which also provides promtool');
  return bin;
}

/** The configuration: one job scraping `target`, global scrape and evaluation interval `interval`. */
export function prometheusConfig(o: PrometheusSetup): string {
  const s = `${o.intervalSeconds ?? 1}s`;
  return [
    'global:',
    `  scrape_interval: ${s}`,
    `  scrape_timeout: ${s}`,
    `  evaluation_interval: ${s}`,
    'rule_files:',
    ...o.ruleFiles.map((f) => `  - ${JSON.stringify(f)}`),
    'scrape_configs:',
    '  - job_name: edge-proxy',
    `    metrics_path: ${JSON.stringify(o.metricsPath ?? '/metrics')}`,
    '    static_configs:',
    `      - targets: [${JSON.stringify(o.target)}]`,
    '',
  ].join('\n');
}

/** GET `url`; status and body. */
function get(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.setTimeout(10_000, () => req.destroy(new Error(`GET ${url}: no answer within 10 s`)));
    req.on('error', reject);
  });
}

/** The `data` of a Prometheus API answer; throws with the API's error otherwise. */
async function apiData(url: string): Promise<unknown> {
  const r = await get(url);
  let parsed: { status?: string; data?: unknown; error?: string; errorType?: string };
  try {
    parsed = JSON.parse(r.body) as typeof parsed;
  } catch {
    throw new Error(`${url}: HTTP ${r.status}, not JSON: ${r.body.slice(0, 300)}`);
  }
  if (parsed.status !== 'success') throw new Error(`${url}: HTTP ${r.status}, ${parsed.errorType ?? '?'}: ${parsed.error ?? r.body.slice(0, 300)}`);
  return parsed.data;
}

/** Kills `proc` (SIGTERM, then SIGKILL after 5 s) and waits for its exit. */
async function kill(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = once(proc, 'exit');
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

/**
 * Starts Prometheus scraping `o.target` with `o.ruleFiles`; resolves once `/-/ready` answers 200
 * (at most `timeoutMs`); killed and its directory removed at teardown. A port taken between
 * freePort() and Prometheus's bind is retried on another port (at most three times).
 */
export async function startPrometheus(t: Teardown, o: PrometheusSetup, timeoutMs = 30_000): Promise<PrometheusServer> {
  const bin = prometheusBinary();
  const dir = mkdtempSync(path.join(tmpdir(), 'edge-prometheus-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const configFile = path.join(dir, 'prometheus.yml');
  writeFileSync(configFile, prometheusConfig(o));
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const dataDir = path.join(dir, `data-${attempt}`);
    const proc = spawn(bin, [`--config.file=${configFile}`, `--storage.tsdb.path=${dataDir}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=info'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let logged = '';
    proc.stdout?.on('data', (d: Buffer) => (logged += d.toString()));
    proc.stderr?.on('data', (d: Buffer) => (logged += d.toString()));
    t.teardown(() => kill(proc));
    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + timeoutMs;
    let ready = false;
    while (!ready && proc.exitCode === null && proc.signalCode === null && Date.now() < deadline) {
      ready = await get(`${url}/-/ready`).then(
        (r) => r.status === 200,
        () => false,
      );
      if (!ready) await sleep(100); // another process starting: poll its readiness endpoint, bounded
    }
    if (!ready) {
      await kill(proc);
      if (/address already in use/.test(logged) && attempt < 3) continue;
      throw new Error(`prometheus (${bin}) not ready on ${url} within ${timeoutMs} ms (exit ${String(proc.exitCode ?? proc.signalCode)}):\n${logged.slice(-3000)}`);
    }
    const server: PrometheusServer = {
      url,
      port,
      configFile,
      log: () => logged,
      async query(expr, time) {
        const q = new URLSearchParams({ query: expr, ...(time === undefined ? {} : { time: String(time) }) });
        const data = (await apiData(`${url}/api/v1/query?${q}`)) as { resultType: string; result: Array<{ metric: Record<string, string>; value: [number, string] }> };
        if (data.resultType !== 'vector') throw new Error(`${expr}: result type ${data.resultType}, not a vector`);
        return data.result.map((r) => ({ metric: r.metric, value: Number(r.value[1]), at: r.value[0] }));
      },
      async value(expr, time) {
        const v = await server.query(expr, time);
        if (v.length > 1) throw new Error(`${expr}: ${v.length} series, expected at most one: ${JSON.stringify(v)}`);
        return v[0]?.value;
      },
      async until(expr, pred, what, waitMs = 20_000) {
        const end = Date.now() + waitMs;
        let v = await server.value(expr);
        while (!pred(v)) {
          if (Date.now() >= end) throw new Error(`prometheus: ${what} not within ${waitMs} ms; last value of ${expr}: ${String(v)}`);
          await sleep(200); // Prometheus scrapes and evaluates on its own clock: poll, bounded
          v = await server.value(expr);
        }
        return v;
      },
      async rules() {
        const data = (await apiData(`${url}/api/v1/rules`)) as { groups: Array<{ name: string; file: string; rules: Array<Omit<LoadedRule, 'group' | 'file'>> }> };
        return data.groups.flatMap((g) => g.rules.map((r) => ({ ...r, group: g.name, file: g.file })));
      },
      async target() {
        const data = (await apiData(`${url}/api/v1/targets?state=active`)) as { activeTargets: Array<{ health: string; lastError: string; lastScrape: string }> };
        const only = data.activeTargets[0];
        if (data.activeTargets.length !== 1 || only === undefined) throw new Error(`prometheus: ${data.activeTargets.length} active targets, expected 1`);
        return { health: only.health, lastError: only.lastError, lastScrape: only.lastScrape };
      },
    };
    return server;
  }
}
