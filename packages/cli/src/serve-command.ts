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

export async function serveCommand(file: string, output: Output, stateDir?: string, forceConfig = false): Promise<number> {
  const supervisor = new Supervisor({ configPath: file, workerExec: workerEntry(), reexecForThreads: true, ...(stateDir === undefined ? {} : { stateDir }), forceConfig });
  try {
    await supervisor.start();
  } catch (err) {
    if (err instanceof StartupError) {
      for (const i of err.issues) output.err(formatIssue(i));
      output.err(`edge-proxy serve: ${err.code}: ${err.message}`);
    } else {
      output.err(`edge-proxy serve: ${err instanceof Error ? err.message : String(err)}`);
    }
    await supervisor.stop().catch(() => undefined);
    return 1;
  }
  const stop = (): void => {
    void supervisor.stop().finally(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.on('SIGHUP', () => void supervisor.sighup());
  return new Promise<number>(() => {
    /* serves until a signal */
  });
}
