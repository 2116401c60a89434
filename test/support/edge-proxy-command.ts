// Runs one `edge-proxy` command (`-c FILE`, `serve …`) to its end, as an operator's shell would,
// bounded: a command still running after `limitMs` is killed (SIGKILL) and its exit code is null.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const main = path.join(path.dirname(path.dirname(path.dirname(fileURLToPath(import.meta.url)))), 'packages/cli/src/main.ts');

export interface CommandRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

/** `edge-proxy <args>` with `env` added to this process's environment; its exit code and output. */
export async function runEdgeProxy(args: readonly string[], o: { readonly env?: Record<string, string>; readonly limitMs?: number } = {}): Promise<CommandRun> {
  const started = Date.now();
  const proc = spawn(process.execPath, [main, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...o.env } });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const timer = setTimeout(() => proc.kill('SIGKILL'), o.limitMs ?? 60_000);
  const [code] = (await once(proc, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr, ms: Date.now() - started };
}
