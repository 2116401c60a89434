// Peer proxies and the backend for `npm run bench:proxy`, each run in the foreground from its own
// configuration file in a temp dir, on 127.0.0.1, pinned to one core with `taskset`. Nothing here
// starts a system service: packages are installed with services held back by policy-rc.d, and
// every process is killed (with its children) when the benchmark ends.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { toolPath } from '../system-tools.ts';
import { processTree } from './proc-stats.ts';

/** A tool the benchmark uses and the Debian package that ships it. */
export interface BenchTool {
  readonly command: string;
  readonly debianPackage: string;
}

export const BENCH_TOOLS: readonly BenchTool[] = [
  { command: 'nginx', debianPackage: 'nginx' },
  { command: 'haproxy', debianPackage: 'haproxy' },
  { command: 'caddy', debianPackage: 'caddy' },
  { command: 'wrk', debianPackage: 'wrk' },
  { command: 'h2load', debianPackage: 'nghttp2-client' },
  { command: 'gtlsclient', debianPackage: 'ngtcp2-client' },
  { command: 'taskset', debianPackage: 'util-linux' },
];

const POLICY_RC_D = '/usr/sbin/policy-rc.d';

/**
 * Installs the missing tools with apt-get when running as root. Debian starts a service (nginx,
 * haproxy, caddy) on install unless policy-rc.d says no: a temporary one that answers 101
 * ("action forbidden") holds them back, and is removed afterwards.
 * Returns the paths of the tools present afterwards.
 */
export function ensureBenchTools(log: (line: string) => void): Map<string, string> {
  const found = (): Map<string, string> => new Map(BENCH_TOOLS.flatMap((t) => {
    const p = toolPath(t.command);
    return p === undefined ? [] : [[t.command, p] as [string, string]];
  }));
  let have = found();
  const missing = BENCH_TOOLS.filter((t) => !have.has(t.command));
  if (missing.length === 0) return have;
  const packages = [...new Set(missing.map((t) => t.debianPackage))];
  if (process.getuid?.() !== 0) {
    log(`not root: not installing ${packages.join(' ')}`);
    return have;
  }
  log(`installing Debian packages: ${packages.join(' ')}`);
  const ownPolicy = !existsSync(POLICY_RC_D);
  if (ownPolicy) writeFileSync(POLICY_RC_D, '#!/bin/sh\n# bench:proxy: no service starts while installing peers\nexit 101\n', { mode: 0o755 });
  try {
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    const opts = { stdio: 'inherit' as const, env, timeout: 300_000 };
    if (spawnSync('apt-get', ['update', '-qq'], opts).status === 0) {
      spawnSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...packages], opts);
    }
  } finally {
    if (ownPolicy) rmSync(POLICY_RC_D, { force: true });
  }
  have = found();
  return have;
}

/** Children started by the benchmark, killed with their descendants at the end. */
export class Processes {
  private readonly procs: ChildProcess[] = [];

  /** Spawns `command` pinned to `core` (taskset execs it: the pid is the command's). */
  spawnPinned(core: number, command: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv; stdout?: 'pipe' | 'ignore' } = {}): ChildProcess {
    return this.spawn('taskset', ['-c', String(core), command, ...args], options);
  }

  /** Spawns `command` on any core; its stderr tail is kept for error messages (`stderrTail`). */
  spawn(command: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv; stdout?: 'pipe' | 'ignore' } = {}): ChildProcess {
    const p = spawn(command, args, { stdio: ['ignore', options.stdout ?? 'ignore', 'pipe'], env: options.env ?? process.env });
    let err = '';
    p.stderr?.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    Object.defineProperty(p, 'stderrTail', { get: () => err });
    this.procs.push(p);
    return p;
  }

  /** SIGTERM to the tree, then SIGKILL to what is left after `graceMs`. */
  async stop(p: ChildProcess, graceMs = 3000): Promise<void> {
    if (p.pid === undefined || p.exitCode !== null || p.signalCode !== null) return;
    const tree = processTree(p.pid);
    const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
    p.kill('SIGTERM');
    const timer = new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref());
    await Promise.race([exited, timer]);
    for (const pid of tree) killQuietly(pid);
  }

  async stopAll(): Promise<void> {
    await Promise.all(this.procs.map((p) => this.stop(p)));
  }

  /** Synchronous last resort (process exit): SIGKILL every tree. */
  killAll(): void {
    for (const p of this.procs) {
      if (p.pid === undefined || p.exitCode !== null || p.signalCode !== null) continue;
      for (const pid of processTree(p.pid)) killQuietly(pid);
    }
  }
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** Last lines a child wrote on stderr (for error messages). */
export function stderrTail(p: ChildProcess): string {
  return String((p as ChildProcess & { stderrTail?: string }).stderrTail ?? '');
}

/** Resolves once a TCP connection to 127.0.0.1:`port` succeeds; rejects after `timeoutMs` or if `p` exits. */
export async function waitForTcp(port: number, p: ChildProcess, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (p.exitCode !== null || p.signalCode !== null) throw new Error(`exited (${p.exitCode ?? p.signalCode}): ${stderrTail(p).slice(-600)}`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`nothing listening on ${port} after ${timeoutMs} ms: ${stderrTail(p).slice(-600)}`);
}

/** Resolves with the first JSON line on `p`'s stdout that has `event: "listening"`. */
export function waitForListeningLine(p: ChildProcess, timeoutMs = 30_000): Promise<Record<string, unknown>> {
  return waitForJsonLine(p, '"listening"', 'no listening line', timeoutMs);
}

/**
 * Resolves with the first JSON line on `p`'s stdout that contains `marker`; rejects after
 * `timeoutMs` (the message starts with `what`) or if `p` exits first.
 */
export function waitForJsonLine(p: ChildProcess, marker: string, what: string, timeoutMs: number): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const timer = setTimeout(() => reject(new Error(`${what} after ${timeoutMs} ms: ${stderrTail(p).slice(-600)}`)), timeoutMs);
    p.stdout?.on('data', (d: Buffer) => {
      buf += d.toString();
      for (const line of buf.split('\n')) {
        if (!line.includes(marker)) continue;
        try {
          const v = JSON.parse(line) as Record<string, unknown>;
          clearTimeout(timer);
          resolve(v);
        } catch {
          // partial line: wait for more
        }
      }
    });
    p.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`exited with ${code}: ${stderrTail(p).slice(-600)}`));
    });
  });
}

/** Runs as root: nginx would otherwise switch its workers to `nobody`, who cannot read the temp dir. */
const asRoot = process.getuid?.() === 0;

function nginxCommon(dir: string, name: string): string {
  const d = path.join(dir, name);
  return `${asRoot ? 'user root;\n' : ''}daemon off;
master_process on;
worker_processes 1;
pid ${d}.pid;
error_log ${d}-error.log warn;
events { worker_connections 8192; }
`;
}

function nginxHttpCommon(dir: string, name: string): string {
  const d = path.join(dir, name);
  return `access_log off;
  client_body_temp_path ${d}-body; proxy_temp_path ${d}-proxy; fastcgi_temp_path ${d}-fastcgi;
  uwsgi_temp_path ${d}-uwsgi; scgi_temp_path ${d}-scgi;
  keepalive_requests 10000000;
  keepalive_timeout 60s;`;
}

/**
 * The backend: nginx answering every request with `200 ok`, plain HTTP/1.1 with keep-alive on
 * `port`, and the same over TLS with HTTP/2 on `tlsPort` (the HTTP/2 "direct" baseline).
 */
export function nginxBackendConfig(dir: string, port: number, tlsPort: number, cert: string, key: string): string {
  const file = path.join(dir, 'backend-nginx.conf');
  writeFileSync(file, `${nginxCommon(dir, 'backend')}http {
  ${nginxHttpCommon(dir, 'backend')}
  server {
    listen 127.0.0.1:${port} reuseport backlog=4096;
    listen 127.0.0.1:${tlsPort} ssl http2;
    ssl_certificate ${cert};
    ssl_certificate_key ${key};
    location / { return 200 "ok"; }
  }
}
`);
  return file;
}

/** nginx as a TLS (HTTP/1.1 + HTTP/2) reverse proxy with a keep-alive upstream pool. */
export function nginxProxyConfig(dir: string, port: number, backendPort: number, cert: string, key: string): string {
  const file = path.join(dir, 'proxy-nginx.conf');
  writeFileSync(file, `${nginxCommon(dir, 'proxy')}http {
  ${nginxHttpCommon(dir, 'proxy')}
  upstream backend { server 127.0.0.1:${backendPort}; keepalive 128; keepalive_requests 10000000; }
  server {
    listen 127.0.0.1:${port} ssl http2 backlog=4096;
    ssl_certificate ${cert};
    ssl_certificate_key ${key};
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`);
  return file;
}

/**
 * haproxy in the foreground (`-db`), one thread, TLS with ALPN h2 and http/1.1, server connections
 * reused across requests. maxconn stays below the file-descriptor limit (FIELD-NOTES).
 */
export function haproxyConfig(dir: string, port: number, backendPort: number, cert: string, key: string): string {
  const pem = path.join(dir, 'haproxy.pem');
  writeFileSync(pem, readFileSync(cert, 'utf8') + readFileSync(key, 'utf8'), { mode: 0o600 });
  const file = path.join(dir, 'haproxy.cfg');
  writeFileSync(file, `global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:${port} ssl crt ${pem} alpn h2,http/1.1
  default_backend be
backend be
  server s1 127.0.0.1:${backendPort}
`);
  return file;
}

/** Caddy's reverse_proxy, TLS from the same files, HTTP/1.1, HTTP/2 and HTTP/3, no admin API, no ACME. */
export function caddyConfig(dir: string, port: number, backendPort: number, cert: string, key: string): string {
  const file = path.join(dir, 'Caddyfile');
  writeFileSync(file, `{
\tadmin off
\tauto_https off
\tservers {
\t\tprotocols h1 h2 h3
\t}
}
https://127.0.0.1:${port}, https://localhost:${port} {
\tbind 127.0.0.1
\ttls ${cert} ${key}
\treverse_proxy 127.0.0.1:${backendPort}
}
`);
  return file;
}

/** Environment for caddy: its data and config dirs inside the temp dir, not the user's home. */
export function caddyEnv(dir: string): NodeJS.ProcessEnv {
  const home = path.join(dir, 'caddy-home');
  return { ...process.env, HOME: home, XDG_DATA_HOME: home, XDG_CONFIG_HOME: home };
}

/** Our worker's configuration: one listener, one upstream, no metrics endpoint, no control API. */
/** What a variant of our worker turns on: the access log to a file, span export to an OTLP endpoint. */
export interface EdgeProxyVariant {
  readonly accessLog?: string;
  readonly tracingEndpoint?: string;
  /** `performance.worker_threads`, for `edge-proxy serve` (a standalone worker is one process whatever it says); logs at info, for its "edge-proxy serving" line. */
  readonly workers?: number;
  /** `performance.memory_trim.enabled` set (targets ours-notrim and ours-trim); unset: the default (off). */
  readonly memoryTrim?: boolean;
}

export function edgeProxyConfig(dir: string, port: number, backendPort: number, cert: string, key: string, v: EdgeProxyVariant = {}): string {
  const name = v.accessLog !== undefined ? 'access' : v.tracingEndpoint !== undefined ? 'tracing' : v.workers !== undefined ? `serve-${v.workers}` : v.memoryTrim === false ? 'notrim' : v.memoryTrim === true ? 'trim' : undefined;
  const file = path.join(dir, name === undefined ? 'edge-proxy.yaml' : `edge-proxy-${name}.yaml`);
  const observability = [
    'metrics: { enabled: false }',
    'control_api: { enabled: false }',
    ...(v.accessLog === undefined ? [] : ['access_log: { enabled: true }']),
    // The default sample_ratio (0.01): what an operator turning tracing on gets.
    ...(v.tracingEndpoint === undefined ? [] : [`tracing: { enabled: true, endpoint: "${v.tracingEndpoint}" }`]),
  ];
  writeFileSync(file, `listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${cert}, key: ${key} } }
log: { level: ${v.workers === undefined ? 'warn' : 'info'}, format: json${v.accessLog === undefined ? '' : `, file: ${v.accessLog}`} }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${backendPort}" }] } }
observability: { ${observability.join(', ')} }
${v.workers === undefined ? '' : `performance: { worker_threads: ${v.workers} }\n`}${v.memoryTrim === undefined ? '' : `performance: { memory_trim: { enabled: ${v.memoryTrim} } }\n`}`);
  return file;
}
