// `performance.memory_trim` in a real `edge-proxy serve`: the supervisor and the worker trim once
// at start-up (whatever the key says); with the key on, a worker that keeps receiving requests
// never trims; once it goes quiet for `idle_ms` it runs one memory-reducing collection, logs it
// (RSS before and after, the pause) and counts it in `svc_worker_memory_trims_total`; it does not
// trim again in the same quiet period, and does after the next request. `quiet_rps: 0` and
// `min_growth_bytes: 0` make the test independent of how much memory the requests happened to
// use (bench:proxy measures what the trim gives back after real load: docs/performance.md).
import t from 'tap';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { api, serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { getFresh, getMany } from './support/workers.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-memory-trim-');
const backendPort = await namedBackend(t, 'backend');
const TOKEN = 'viewer-token-memory-trim-0123456789';
const TRIMMED = 'memory trimmed: the worker was quiet, its heap peak went back to the kernel';

t.test('busy: no trim; quiet for idle_ms: one trim, logged and counted; the next quiet period after a request: one more', async (t) => {
  const p = await freePorts();
  const served = await serve(
    path.join(dir, 'trim.yaml'),
    serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1, memory_trim: { enabled: true, idle_ms: 1500, quiet_rps: 0, min_growth_bytes: 0 }', token: { token: TOKEN, role: 'viewer', actor: 'trim' } }),
  );
  t.teardown(() => served.stop());
  const proxy = { lport: p.l, cport: p.c, ca: caPem, token: TOKEN };
  const trims = (): Record<string, unknown>[] => served.lines.filter((l) => l['msg'] === TRIMMED);

  // Once at start-up, in the supervisor (once serving) and in the worker (before its listeners bind).
  // (The supervisor's line follows its "edge-proxy serving", where `serve` returns; the worker's
  // asynchronous log may reach stdout after both.)
  for (const role of ['supervisor', 'worker']) await served.waitFor((l) => l['msg'] === 'memory trimmed after start-up' && l['role'] === role, 10_000);
  const startup = served.lines.filter((l) => l['msg'] === 'memory trimmed after start-up');
  t.same(startup.map((l) => l['role']).sort(), ['supervisor', 'worker'], 'one start-up trim in each process');
  for (const l of startup) t.ok((l['rss_after_mib'] as number) > 10 && (l['rss_after_mib'] as number) <= (l['rss_before_mib'] as number) + 2, `${String(l['role'])}: RSS ${String(l['rss_before_mib'])} → ${String(l['rss_after_mib'])} MiB in ${String(l['duration_ms'])} ms`);

  // Busy: a request every 200 ms for 4 s; every one-second look sees requests, so none is quiet.
  const busyUntil = Date.now() + 4000;
  let served200 = 0;
  while (Date.now() < busyUntil) {
    if ((await getFresh(proxy)) === 'backend') served200++;
    await new Promise((r) => setTimeout(r, 200));
  }
  t.ok(served200 >= 10, `${served200} requests answered while busy`);
  t.same(trims(), [], 'no trim while requests keep arriving (quiet_rps 0)');

  // Quiet: the trim comes after idle_ms (1.5 s) plus at most one look (1 s).
  const quietFrom = Date.now();
  const line = await served.waitFor((l) => l['msg'] === TRIMMED, 10_000);
  const waited = Date.now() - quietFrom;
  t.ok(waited >= 1000 && waited < 6000, `trimmed ${waited} ms after the last request`);
  t.equal(line['level'], 'info');
  for (const k of ['rss_before_mib', 'rss_after_mib', 'duration_ms']) t.ok(typeof line[k] === 'number' && (line[k] as number) >= 0, `${k}: ${String(line[k])}`);
  t.ok((line['rss_before_mib'] as number) > 10, 'the RSS before is a worker\'s');
  t.equal(metricValue(await scrape(p.m), 'svc_worker_memory_trims_total'), 1, 'counted once on /metrics');

  // Still quiet: no second trim in the same quiet period (three more idle periods).
  await new Promise((r) => setTimeout(r, 4500));
  t.equal(trims().length, 1, 'one trim per quiet period');

  // A request ends the quiet period; the next one trims again.
  t.same(await getMany(proxy, 1), ['backend']);
  await served.waitFor((l) => l['msg'] === TRIMMED && trims().length === 2, 10_000);
  t.equal(metricValue(await scrape(p.m), 'svc_worker_memory_trims_total'), 2, 'counted twice');
  t.ok(served.lines.every((l) => l['msg'] !== 'memory trim unavailable in this process: the worker keeps its heap peak (performance.memory_trim)'), 'the collector was reachable');
});

t.test('performance.memory_trim is live: off in the served generation, no trim however quiet; on after an activation, the quiet worker trims', async (t) => {
  const p = await freePorts();
  const token = { token: 'operator-token-memory-trim-live-0123', role: 'operator' as const, actor: 'trim-live' };
  const config = (enabled: boolean): string => serviceConfig({ ports: p, cert: leaf, backendPort, performance: `worker_threads: 1, memory_trim: { enabled: ${enabled}, idle_ms: 1000, quiet_rps: 0, min_growth_bytes: 0 }`, token });
  const served = await serve(path.join(dir, 'live-a.yaml'), config(false));
  t.teardown(() => served.stop());
  const proxy = { lport: p.l, cport: p.c, ca: caPem, token: token.token };
  t.same(await getMany(proxy, 1), ['backend']);
  // Quiet for three idle periods and more: nothing while enabled is false.
  await new Promise((r) => setTimeout(r, 3500));
  t.equal(served.lines.filter((l) => l['msg'] === TRIMMED).length, 0, 'A (enabled: false): no trim after the quiet period');

  const bFile = path.join(dir, 'live-b.yaml');
  writeFileSync(bFile, config(true));
  const activated = await api(p.c, caPem, 'POST', '/admin/runtime/activate', { token: token.token }, { config_path: bFile, expected_generation: 1 });
  t.equal(activated.status, 202, 'B activated');
  await served.waitFor((l) => l['msg'] === TRIMMED, 10_000);
  t.equal(metricValue(await scrape(p.m), 'svc_worker_memory_trims_total'), 1, 'B (enabled: true): the quiet worker trimmed, with no restart');
});
