// Entry of a worker process forked by the supervisor (cluster worker, IPC with structured clone).
// Holds no logic: it wires the process channel to IpcWorker and exits when the supervisor is gone.
import { IpcWorker } from './ipc-worker.ts';
import { WORKER_WARMUP_ENV } from '@edge-proxy/ipc';
import type { IpcEndpoint } from '@edge-proxy/ipc';

// The supervisor's compile-cache warm-up (controlplane supervisor/compile-cache.ts): the imports
// above have put every module of a worker in Node's compile cache, which Node writes at exit.
if (process.env[WORKER_WARMUP_ENV] === '1') process.exit(0);
if (process.send === undefined) {
  process.stderr.write('this is a worker process: start it through `edge-proxy serve`\n');
  process.exit(2);
}
const worker = new IpcWorker({ endpoint: process as unknown as IpcEndpoint });
worker.start();
/**
 * Longest a worker lingers once told to go: closing waits for its connections, and a connection
 * that never ends must not keep an orphan holding the port after its supervisor died. (The
 * supervisor's own SIGTERM is followed by its SIGKILL after 2 s anyway.)
 */
const EXIT_DEADLINE_MS = 5000;
function leave(): void {
  setTimeout(() => process.exit(0), EXIT_DEADLINE_MS).unref();
  void worker.close().finally(() => process.exit(0));
}
// The supervisor is the only reason to live: when the channel closes, drain briefly and go.
process.on('disconnect', leave);
process.on('SIGTERM', leave);
