// The workers' compile cache under a real `edge-proxy serve` (controlplane supervisor/compile-cache.ts):
// the supervisor warms `<state dir>/compile-cache` before forking, and every worker, a re-forked
// one included, then loads its TypeScript already stripped, so Node never loads its type-stripping
// compiler (about 20 MiB per worker, docs/performance.md "Worker memory"). What a worker's Node did
// is read from Node's own compile-cache trace (NODE_DEBUG_NATIVE=COMPILE_CACHE on its stderr): a
// module it had to strip itself is logged "no transpile cache for StrippedTypeScript <file>". A
// directory others could write code into is never used; Node's NODE_DISABLE_COMPILE_CACHE turns
// the cache off. Either way the service serves.
import t from 'tap';
import path from 'node:path';
import type { EventEmitter } from 'node:events';
import { chmodSync, existsSync, mkdirSync, readdirSync, statSync } from 'node:fs';
import { serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { getMany, waitReady, workers } from './support/workers.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import { until } from './support/until.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-compile-cache-');
const backendPort = await namedBackend(t, 'backend');
const token = { token: 'operator-token-compile-cache-0123456789', role: 'operator' as const, actor: 'compile-cache' };
// The suite's shared cache (support/serve.ts) emptied: these starts use the supervisor's own.
const OWN = { NODE_COMPILE_CACHE: '' };
const TRACE = { ...OWN, NODE_DEBUG_NATIVE: 'COMPILE_CACHE' };
const WORKER_MAIN = 'packages/dataplane/src/worker/main.ts';

/** Modules a process of the service stripped itself (Node's compile-cache trace). */
function strippedWithoutCache(s: Served): string[] {
  return [...s.text().matchAll(/no transpile cache for StrippedTypeScript (\S+)/g)].map((m) => m[1] as string);
}

/** How many times a worker's entry was taken from the cache already stripped. */
function entryFromCache(s: Served): number {
  return [...s.text().matchAll(/retrieving transpile cache for StrippedTypeScript (\S+)\.\.\.success/g)].filter((m) => (m[1] as string).endsWith(WORKER_MAIN)).length;
}

t.test('warmed at start: the worker, and the worker re-forked after it died, load every module already stripped', async (t) => {
  const p = await freePorts();
  // One worker: two processes' traces on one stderr would interleave mid-line. The warm-up switch
  // in the supervisor's own environment must not reach the workers (they would leave at once).
  const served = await serve(path.join(dir, 'warm.yaml'), serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1', token }), 60_000, { ...TRACE, EDGE_WORKER_WARMUP: '1' });
  t.teardown(() => served.stop());
  const proxy = { lport: p.l, cport: p.c, ca: caPem, token: token.token };
  const cacheDir = path.join(served.stateDir, 'compile-cache');
  const serving = served.lines.find((l) => l['msg'] === 'edge-proxy serving');
  t.equal(serving?.['compile_cache'], cacheDir, 'the serving line names the directory');
  const st = statSync(cacheDir);
  t.equal(st.mode & 0o777, 0o700, 'mode 0700');
  t.ok(readdirSync(cacheDir, { recursive: true }).length > 100, 'the warm-up filled it');
  t.same(await getMany(proxy, 2), ['backend', 'backend'], 'the worker serves');
  t.equal(entryFromCache(served), 1, 'the worker took its entry from the cache');
  t.same(strippedWithoutCache(served), [], 'and stripped no module itself (the warm-up\'s own trace is not the service\'s)');

  // A worker that dies is re-forked from the same cache.
  const before = await workers(proxy);
  process.kill(before[0]?.pid ?? 0, 'SIGKILL');
  await served.waitFor((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === 0, 30_000);
  t.equal(await waitReady(proxy), 200);
  // Its trace may still be on its way through the stderr pipe.
  await until(served.proc.stderr as NodeJS.ReadableStream & EventEmitter, 'data', () => entryFromCache(served) === 2, () => `entry taken from the cache ${entryFromCache(served)} times`, 10_000);
  t.equal(entryFromCache(served), 2, 'the re-forked worker took its entry from the cache too');
  t.same(strippedWithoutCache(served), [], 'and stripped nothing itself');
  t.same(await getMany(proxy, 2), ['backend', 'backend']);
});

t.test('a cache directory others could write is not used (EDGE_COMPILE_CACHE_UNSAFE): one warning, workers compile for themselves, the service serves', async (t) => {
  const p = await freePorts();
  const file = path.join(dir, 'unsafe.yaml');
  const cacheDir = path.join(dir, 'state-unsafe.yaml', 'compile-cache');
  mkdirSync(cacheDir, { recursive: true });
  chmodSync(cacheDir, 0o777);
  const served = await serve(file, serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1', token }), 60_000, TRACE);
  t.teardown(() => served.stop());
  const warnings = served.lines.filter((l) => l['code'] === 'EDGE_COMPILE_CACHE_UNSAFE');
  t.equal(warnings.length, 1, 'one line');
  t.equal(warnings[0]?.['level'], 'warn');
  t.match(String(warnings[0]?.['msg']), /writable by its group or by others \(mode 777\).*each worker compiles its code itself/);
  t.equal(served.lines.find((l) => l['msg'] === 'edge-proxy serving')?.['compile_cache'], 'unused');
  t.equal(statSync(cacheDir).mode & 0o777, 0o777, 'the operator\'s directory is reported, not changed');
  t.same(readdirSync(cacheDir), [], 'nothing was written into it');
  t.equal(entryFromCache(served), 0, 'the worker was not pointed at it');
  t.same(await getMany({ lport: p.l, cport: p.c, ca: caPem, token: token.token }, 2), ['backend', 'backend'], 'the worker serves');
});

t.test('NODE_DISABLE_COMPILE_CACHE turns it off: no directory, the serving line says so', async (t) => {
  const p = await freePorts();
  const served = await serve(path.join(dir, 'disabled.yaml'), serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1', token }), 60_000, { ...OWN, NODE_DISABLE_COMPILE_CACHE: '1' });
  t.teardown(() => served.stop());
  t.equal(served.lines.find((l) => l['msg'] === 'edge-proxy serving')?.['compile_cache'], 'off: NODE_DISABLE_COMPILE_CACHE');
  t.notOk(existsSync(path.join(served.stateDir, 'compile-cache')), 'no directory made');
  t.same(await getMany({ lport: p.l, cport: p.c, ca: caPem, token: token.token }, 1), ['backend']);
});

t.test('an operator\'s NODE_COMPILE_CACHE is used as it is: no warm-up, no directory of ours, the workers read theirs', async (t) => {
  const p = await freePorts();
  const own = path.join(dir, 'operator-cache');
  mkdirSync(own, { mode: 0o700 });
  const served = await serve(path.join(dir, 'operator.yaml'), serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1', token }), 60_000, { NODE_COMPILE_CACHE: own });
  t.teardown(() => served.stop());
  t.equal(served.lines.find((l) => l['msg'] === 'edge-proxy serving')?.['compile_cache'], 'operator: NODE_COMPILE_CACHE');
  t.notOk(existsSync(path.join(served.stateDir, 'compile-cache')), 'no directory made in the state directory');
  t.same(await getMany({ lport: p.l, cport: p.c, ca: caPem, token: token.token }, 1), ['backend']);
  // The supervisor (at its start) and the worker (when it leaves) write what they compiled there.
  await served.stop();
  t.ok(readdirSync(own, { recursive: true }).length > 100, 'the operator\'s directory holds the service\'s modules');
});
