// `edge-proxy serve [-c FILE]`: runs the supervisor, which forks the workers. SIGTERM/SIGINT drain
// and exit 0 (systemd); SIGHUP reloads the active configuration source.
import path from 'node:path';
import { createRequire } from 'node:module';
import { Supervisor, StartupError } from '@edge-proxy/controlplane';
import { formatIssue } from '@edge-proxy/config';
import type { Output } from './validate-command.ts';

/** The worker entry module, resolved through the dataplane package. */
export function workerEntry(): string {
  const require = createRequire(import.meta.url);
  return path.join(path.dirname(require.resolve('@edge-proxy/dataplane/package.json')), 'src/worker/main.ts');
}

/** The one line a startup failure prints: its service code (EDGE_STARTUP_FAILED when it has none) and message. */
export function startupLine(err: unknown): string {
  const code = (err as { code?: unknown } | undefined)?.code;
  const message = (err instanceof Error ? err.message : String(err)).split('\n')[0];
  return `edge-proxy serve: ${typeof code === 'string' && code.startsWith('EDGE_') ? code : 'EDGE_STARTUP_FAILED'}: ${message}`;
}

export async function serveCommand(file: string, output: Output, stateDir?: string, forceConfig = false): Promise<number> {
  const supervisor = new Supervisor({ configPath: file, workerExec: workerEntry(), reexecForThreads: true, ...(stateDir === undefined ? {} : { stateDir }), forceConfig });
  try {
    await supervisor.start();
  } catch (err) {
    if (err instanceof StartupError) for (const i of err.issues) output.err(formatIssue(i));
    output.err(startupLine(err));
    await supervisor.stop().catch(() => undefined);
    return 1;
  }
  const stop = (): void => {
    // A stop that fails is said in one coded line and makes the exit non-zero (systemd records it).
    void supervisor.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        output.err(`edge-proxy serve: EDGE_STOP_FAILED: ${err instanceof Error ? err.message : String(err)}`);
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.on('SIGHUP', () => void supervisor.sighup());
  return new Promise<number>(() => {
    /* serves until a signal */
  });
}
