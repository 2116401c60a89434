// Entry of a worker process forked by the supervisor (cluster worker, IPC with structured clone).
// Holds no logic: it wires the process channel to IpcWorker and exits when the supervisor is gone.
import { IpcWorker } from './ipc-worker.ts';
import type { IpcEndpoint } from '@edge-proxy/ipc';

if (process.send === undefined) {
  process.stderr.write('this is a worker process: start it through `edge-proxy serve`\n');
  process.exit(2);
}
const worker = new IpcWorker({ endpoint: process as unknown as IpcEndpoint });
worker.start();
// The supervisor is the only reason to live: when the channel closes, drain briefly and go.
process.on('disconnect', () => {
  void worker.close().finally(() => process.exit(0));
});
process.on('SIGTERM', () => {
  void worker.close().finally(() => process.exit(0));
});
