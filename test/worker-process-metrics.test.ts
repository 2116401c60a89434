// The worker process gauges (issue 19, declared extensions): a real `edge-proxy serve` with two
// workers exports `svc_worker_resident_memory_bytes{worker}`,
// `svc_worker_anonymous_memory_bytes{worker}` and `svc_worker_event_loop_delay_p99_seconds{worker}`
// on the supervisor's /metrics, one series per worker slot of the runtime snapshot, set at each
// heartbeat.
import t from 'tap';
import path from 'node:path';
import { serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { parseExposition, scrape } from './support/exposition.ts';
import type { Sample } from './support/exposition.ts';
import { getMany, workers } from './support/workers.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import { readFileSync } from 'node:fs';
import { memoryShares, rssMiB } from '../scripts/lib/proc-stats.ts';
import { WORKER_V8_DEFAULTS } from '../packages/controlplane/src/supervisor/worker-flags.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-worker-gauges-');
const TOKEN = 'viewer-token-worker-gauges-0123456';
const backendPort = await namedBackend(t, 'backend');
const MiB = 1024 * 1024;

t.test('two workers: RSS and event-loop delay p99 per worker label, plausible values', async (t) => {
  const p = await freePorts();
  const served = await serve(
    path.join(dir, 'gauges.yaml'),
    serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 2, worker_heartbeat_ms: 500', token: { token: TOKEN, role: 'viewer', actor: 'gauges' } }),
  );
  t.teardown(() => served.stop());
  const proxy = { lport: p.l, cport: p.c, ca: caPem, token: TOKEN };
  t.same(await getMany(proxy, 4), ['backend', 'backend', 'backend', 'backend'], 'the proxy serves');
  const slots = (await workers(proxy)).filter((w) => w.state === 'serving');
  t.equal(slots.length, 2, 'two workers serve');
  for (const w of slots) {
    // The supervisor forks each worker with the default V8 flags (worker-flags.ts); the test runner sets none of them.
    const argv = readFileSync(`/proc/${w.pid}/cmdline`, 'utf8').split('\0');
    t.same(WORKER_V8_DEFAULTS.filter((f) => !argv.includes(f)), [], `worker ${w.index} runs with ${WORKER_V8_DEFAULTS.join(' ')}`);
  }

  // The gauges appear at each worker's first heartbeat after its start: poll, bounded.
  let samples: Sample[] = [];
  const of = (name: string): Sample[] => samples.filter((s) => s.name === name);
  const deadline = Date.now() + 20_000;
  do {
    samples = parseExposition(await scrape(p.m));
    if (of('svc_worker_resident_memory_bytes').length === 2 && of('svc_worker_anonymous_memory_bytes').length === 2 && of('svc_worker_event_loop_delay_p99_seconds').length === 2) break;
    await new Promise((r) => setTimeout(r, 200));
  } while (Date.now() < deadline);

  const labels = (name: string): string[] => of(name).map((s) => s.labels['worker'] as string).sort();
  const want = slots.map((w) => String(w.index)).sort();
  t.same(labels('svc_worker_resident_memory_bytes'), want, 'one RSS series per worker slot');
  t.same(labels('svc_worker_event_loop_delay_p99_seconds'), want, 'one p99 series per worker slot');
  t.same(labels('svc_worker_anonymous_memory_bytes'), want, 'one anonymous-memory series per worker slot');
  for (const s of of('svc_worker_resident_memory_bytes')) {
    t.ok(s.value > 10 * MiB && s.value < 4 * 1024 * MiB, `worker ${s.labels['worker']}: RSS ${(s.value / MiB).toFixed(1)} MiB in (10 MiB, 4 GiB)`);
    // The same process: the kernel's count for that worker's pid is of the same order.
    const pid = slots.find((w) => String(w.index) === s.labels['worker'])?.pid as number;
    const proc = rssMiB(pid) * MiB;
    t.ok(proc > s.value / 2 && proc < s.value * 2, `worker ${s.labels['worker']}: /proc says ${(proc / MiB).toFixed(1)} MiB`);
  }
  for (const s of of('svc_worker_anonymous_memory_bytes')) {
    // The worker's own memory: below its RSS by the binary's pages, which the two workers and the
    // supervisor share, and of the order of what the kernel counts as private to that pid.
    const worker = s.labels['worker'];
    const rss = of('svc_worker_resident_memory_bytes').find((r) => r.labels['worker'] === worker)?.value ?? NaN;
    t.ok(s.value > 10 * MiB && s.value < rss - 20 * MiB, `worker ${worker}: anonymous ${(s.value / MiB).toFixed(1)} MiB in (10 MiB, RSS ${(rss / MiB).toFixed(1)} − 20 MiB)`);
    const pid = slots.find((w) => String(w.index) === worker)?.pid as number;
    const priv = memoryShares(pid).privateMiB * MiB;
    t.ok(priv > s.value / 2 && priv < s.value * 2, `worker ${worker}: /proc says ${(priv / MiB).toFixed(1)} MiB private`);
  }
  for (const s of of('svc_worker_event_loop_delay_p99_seconds')) {
    t.ok(Number.isFinite(s.value) && s.value >= 0 && s.value < 60, `worker ${s.labels['worker']}: loop delay p99 ${s.value} s is finite and non-negative`);
  }
});
