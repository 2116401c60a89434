// A worker process without a supervisor: loads a configuration file, activates it as generation 1
// and serves every listener. For end-to-end tests and benchmarks of the data plane; in production
// the supervisor forks workers and hands them generations over IPC.
//
//   node packages/dataplane/src/worker/standalone.ts -c FILE [--port N]
//
// Prints one JSON line on stdout once serving: {"event":"listening","listeners":[{name,udp,tcp}]},
// and exits 0 after SIGTERM/SIGINT once in-flight work is done (bounded by shutdown_drain_ms).
import { randomBytes } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import { formatIssue, loadConfigFile } from '@edge-proxy/config';
import { JwksSources, jwksSourceSpecs } from '@edge-proxy/auth';
import { WORKER_WARMUP_ENV } from '@edge-proxy/ipc';
import { Metrics, createLogging } from '@edge-proxy/telemetry';
import { Dataplane } from '../runtime/dataplane.ts';
import { serveListeners } from './serve-listeners.ts';
import { workerTracer } from './worker-tracer.ts';

// A compile-cache warm-up, as for a supervised worker (worker/main.ts): the imports are cached; leave.
if (process.env[WORKER_WARMUP_ENV] === '1') process.exit(0);
const { values } = parseArgs({ options: { config: { type: 'string', short: 'c' }, port: { type: 'string' } } });
if (values.config === undefined) {
  process.stderr.write('usage: standalone.ts -c FILE [--port N]\n');
  process.exit(2);
}
const loaded = await loadConfigFile(values.config);
if (!loaded.ok) {
  for (const i of loaded.issues) process.stderr.write(`${formatIssue(i)}\n`);
  process.exit(1);
}
const metrics = new Metrics('worker');
const l = loaded.value.config.log;
// stdout carries the one "listening" line; logs go to stderr (or the configured file). A file is
// written as a supervised worker writes it, asynchronously (the benchmarks measure the access log
// to a file); stderr stays synchronous for the tests that read it.
const { logger } = createLogging({ level: l.level, format: l.format, fields: { role: 'worker', worker: 0 }, ...(l.file === undefined ? { destination: process.stderr } : { file: l.file, async: true }) });
// No supervisor to fetch JWKS key sets: this process runs the sources itself, for its one worker.
// (Key sets arrive after a fetch, by then `dataplane` is set.)
const jwks = new JwksSources({ onKeySet: (set) => dataplane.deps.auth.keys.update(set), log: { info: (f, m) => logger.info(f, m), warn: (f, m) => logger.warn(f, m) } });
// Tracing as a worker under a supervisor has it (worker slot 0); `dataplane.close` exports what is buffered.
const tracer = await workerTracer(loaded.value.config, 0, metrics, logger);
const dataplane = new Dataplane(metrics, (err) => process.stderr.write(`panic: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`), logger, availableParallelism(), (id) => jwks.requestRefresh(id), tracer);
jwks.configure(jwksSourceSpecs(loaded.value));
dataplane.commit(dataplane.prepare(loaded.value, 1));
dataplane.trimAtStart();
const handles = await serveListeners(loaded.value, dataplane, metrics, { cryptoKey: randomBytes(32), ticketKey: randomBytes(48) }, values.port === undefined ? undefined : Number(values.port));
process.stdout.write(`${JSON.stringify({ event: 'listening', pid: process.pid, listeners: handles.map((h) => ({ name: h.name, udp: h.udpPort, tcp: h.tcpPort })) })}\n`);

let stopping = false;
async function stop(): Promise<void> {
  if (stopping) return;
  stopping = true;
  const drainMs = loaded.ok ? loaded.value.config.performance.timeouts.shutdown_drain_ms : 0;
  const deadline = setTimeout(() => process.exit(0), drainMs);
  deadline.unref();
  await Promise.all(handles.map((h) => Promise.all([h.quic.close(Math.min(drainMs, 5000)), h.bootstrap.close()])));
  jwks.close();
  await dataplane.close();
  process.exit(0);
}
process.on('SIGTERM', () => void stop());
process.on('SIGINT', () => void stop());
