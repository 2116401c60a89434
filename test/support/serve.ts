// Harness for end-to-end tests of `edge-proxy serve`: runs the real command as a child process on a
// configuration file, waits for it to serve, keeps every log line (JSON) for audit checks, and
// calls the control API over real HTTPS with bearer tokens or client certificates.
import https from 'node:https';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { suiteCompileCache } from '../../scripts/lib/suite-compile-cache.ts';

const root = path.resolve(import.meta.dirname, '../..');

/**
 * One compile cache for every `serve` of the suite (NODE_COMPILE_CACHE). The supervisor leaves a
 * cache the operator set as it is: no warm-up process per start (0.4–0.8 s each, on a fresh state
 * directory every time), and the supervisors and workers of later starts read what earlier ones
 * compiled. test/compile-cache.test.ts empties it to test the supervisor's own cache.
 */
export const SUITE_COMPILE_CACHE = suiteCompileCache();

export interface Served {
  readonly proc: ChildProcess;
  /** The `--state-dir` it runs with. */
  readonly stateDir: string;
  /** Every stdout line parsed as JSON (non-JSON lines are kept as { raw }). */
  readonly lines: Record<string, unknown>[];
  /** Every stdout and stderr byte as text (secret-leak checks). */
  readonly text: () => string;
  /** Resolves with the first logged line (past or future) matching `predicate`; rejects after `timeoutMs`. */
  waitFor(predicate: (line: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  stop(): Promise<number | null>;
}

/**
 * Starts `edge-proxy serve -c <file>` with its state directory `state-<file name>/` beside the file
 * (a test's temp dir; one per file, since the state resumes the last activated generation);
 * resolves once it logs "edge-proxy serving". `env` adds environment variables (e.g. the test-only
 * EDGE_TEST_PAUSE hook of the workers); `args` more `serve` arguments (e.g. `--force-config`).
 */
export async function serve(configFile: string, configText: string, timeoutMs = 60_000, env: Record<string, string> = {}, args: readonly string[] = []): Promise<Served> {
  writeFileSync(configFile, configText);
  const stateDir = path.join(path.dirname(configFile), `state-${path.basename(configFile)}`);
  const proc = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', configFile, '--state-dir', stateDir, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_COMPILE_CACHE: SUITE_COMPILE_CACHE, ...env } });
  const lines: Record<string, unknown>[] = [];
  const events = new EventEmitter();
  let all = '';
  proc.stderr?.on('data', (d: Buffer) => (all += d.toString()));
  const rl = readline.createInterface({ input: proc.stdout! });
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start within ${timeoutMs} ms:\n${all}`)), timeoutMs);
    rl.on('line', (line) => {
      all += `${line}\n`;
      let parsed: Record<string, unknown>;
      try {
        parsed = JSON.parse(line) as Record<string, unknown>;
      } catch {
        parsed = { raw: line };
      }
      lines.push(parsed);
      events.emit('line', parsed);
      if (parsed['msg'] === 'edge-proxy serving') {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited with ${code} before serving:\n${all}`));
    });
  });
  try {
    await ready;
  } catch (err) {
    // A serve that did not start must not outlive the test.
    if (proc.exitCode === null) {
      proc.kill('SIGKILL');
      await once(proc, 'exit');
    }
    throw err;
  }
  return {
    proc,
    stateDir,
    lines,
    text: () => all,
    waitFor(predicate, timeoutMs = 10_000) {
      const found = lines.find(predicate);
      if (found !== undefined) return Promise.resolve(found);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          events.off('line', on);
          reject(new Error('no matching log line in time'));
        }, timeoutMs);
        const on = (line: Record<string, unknown>): void => {
          if (!predicate(line)) return;
          clearTimeout(timer);
          events.off('line', on);
          resolve(line);
        };
        events.on('line', on);
      });
    },
    async stop() {
      // Already gone (a test may SIGKILL it: then exitCode stays null and signalCode is set).
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      const [code] = (await once(proc, 'exit')) as [number | null];
      return code;
    },
  };
}

/** Audit events logged so far. */
export function auditEvents(s: Served): Record<string, unknown>[] {
  return s.lines.filter((l) => l['audit'] === true);
}

export interface Credentials {
  readonly token?: string;
  readonly cert?: string | Buffer;
  readonly key?: string | Buffer;
  /** Raw Authorization header (malformed-header tests). */
  readonly authorization?: string;
}

export interface ApiResponse {
  readonly status: number;
  readonly body: Record<string, unknown>;
}

/** One control API call over HTTPS (no keep-alive; a fresh TLS session each time). */
export function api(port: number, ca: Buffer, method: string, p: string, creds: Credentials = {}, body?: unknown): Promise<ApiResponse> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const headers: Record<string, string> = {};
    if (creds.token !== undefined) headers['authorization'] = `Bearer ${creds.token}`;
    if (creds.authorization !== undefined) headers['authorization'] = creds.authorization;
    if (payload !== undefined) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(Buffer.byteLength(payload));
    }
    const req = https.request(
      { host: '127.0.0.1', port, path: p, method, ca, servername: 'localhost', headers, agent: false, ...(creds.cert === undefined ? {} : { cert: creds.cert, key: creds.key }) },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          let parsed: Record<string, unknown> = {};
          try {
            parsed = text.length > 0 ? (JSON.parse(text) as Record<string, unknown>) : {};
          } catch {
            parsed = { raw: text };
          }
          resolve({ status: res.statusCode ?? 0, body: parsed });
        });
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error('control API call timed out')));
    req.on('error', reject);
    req.end(payload);
  });
}

/**
 * The first stdout chunk of a standalone worker (its "listening" line); rejects at once if the
 * process exits first, so a worker that failed to start fails its test instead of hanging it.
 */
export async function listeningLine(proc: ChildProcess): Promise<Buffer> {
  const exited = once(proc, 'exit').then(([code, signal]) => {
    throw new Error(`worker exited (${String(code ?? signal)}) before listening`);
  });
  exited.catch(() => undefined);
  const [line] = (await Promise.race([once(proc.stdout!, 'data'), exited])) as [Buffer];
  return line;
}
