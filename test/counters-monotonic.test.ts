// Aggregated counters never go back (issue 12, "Failure paths"): the supervisor sums every worker's
// registry at a scrape, so a worker killed and re-forked would take its counts out of the sum (a
// counter reset for Prometheus). A real `edge-proxy serve` under traffic has a worker SIGKILLed;
// scrapes before, during and after the re-fork must never show any counter or histogram series
// lower than an earlier scrape did.
import t from 'tap';
import path from 'node:path';
import { serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { metricValue, parseExposition, scrape } from './support/exposition.ts';
import { getFresh, waitReady, workers } from './support/workers.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-counters-');
const TOKEN = 'viewer-token-counters-0123456789';
const backendPort = await namedBackend(t, 'backend');

/** Every counter and histogram series (`_bucket`, `_sum`, `_count`) of `svc_*`, keyed by name and labels. */
function monotonicSeries(text: string): Map<string, number> {
  const types = new Map<string, string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) types.set(m[1] as string, m[2] as string);
  const out = new Map<string, number>();
  for (const s of parseExposition(text)) {
    const base = s.name.replace(/_(bucket|sum|count)$/, '');
    const type = types.get(s.name) ?? (types.get(base) === 'histogram' ? 'histogram' : undefined);
    if (!s.name.startsWith('svc_') || (type !== 'counter' && type !== 'histogram')) continue;
    const labels = Object.keys(s.labels)
      .sort()
      .map((k) => `${k}="${s.labels[k] as string}"`)
      .join(',');
    out.set(`${s.name}{${labels}}`, s.value);
  }
  return out;
}

t.test('SIGKILL a worker under traffic: across scrapes before, during and after its re-fork, no counter or histogram series decreases', async (t) => {
  const p = await freePorts();
  const served = await serve(
    path.join(dir, 'counters.yaml'),
    serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 2', controlApiTls: leaf, token: { token: TOKEN, role: 'viewer', actor: 'counters' } }),
  );
  t.teardown(() => served.stop());
  const proxy = { lport: p.l, cport: p.c, ca: caPem, token: TOKEN };

  // Traffic throughout, on fresh connections (spread over both workers).
  let running = true;
  let answered = 0;
  const traffic = (async () => {
    while (running) if ((await getFresh(proxy, 5000)) === 'backend') answered++;
  })();
  t.teardown(async () => {
    running = false;
    await traffic;
  });
  const scrapes: { when: string; series: Map<string, number> }[] = [];
  const take = async (when: string): Promise<void> => {
    scrapes.push({ when, series: monotonicSeries(await scrape(p.m)) });
  };
  const until = async (n: number): Promise<void> => {
    const deadline = Date.now() + 60_000;
    while (answered < n && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20)); // traffic runs in this process: poll its count, bounded
  };

  await until(20);
  await take('before');
  await until(40);
  await take('before, more traffic');
  const before = await workers(proxy);
  const victim = before[0] as { pid: number; index: number; incarnation: number };
  t.ok(metricValue(await scrape(p.m), 'svc_requests_total') >= 40, 'requests counted before the kill');
  process.kill(victim.pid, 'SIGKILL');
  // During: scrape until the slot's replacement serves (bounded by the re-fork's own deadline).
  const deadline = Date.now() + 60_000;
  let replaced = false;
  while (!replaced && Date.now() < deadline) {
    await take('during the re-fork');
    const now = (await workers(proxy)).find((w) => w.index === victim.index);
    replaced = now !== undefined && now.pid !== victim.pid && now.state === 'serving' && now.incarnation === victim.incarnation + 1;
  }
  t.ok(replaced, 'the killed worker was re-forked and serves');
  t.equal(await waitReady(proxy), 200, 'ready again');
  const reached = answered;
  await until(reached + 20);
  await take('after');
  await until(reached + 40);
  await take('after, more traffic');

  t.ok(scrapes.filter((s) => s.when === 'during the re-fork').length >= 1, 'at least one scrape while the worker was being replaced');
  const decreases: string[] = [];
  for (let i = 1; i < scrapes.length; i++) {
    const prev = scrapes[i - 1] as (typeof scrapes)[number];
    const cur = scrapes[i] as (typeof scrapes)[number];
    for (const [key, value] of prev.series) {
      const now = cur.series.get(key);
      if (now === undefined || now < value) decreases.push(`${key}: ${value} (${prev.when}) -> ${now ?? 'absent'} (${cur.when})`);
    }
  }
  t.same(decreases, [], `no counter or histogram series decreased across ${scrapes.length} scrapes`);
  const first = scrapes[0]?.series.get('svc_requests_total{}') ?? 0;
  const last = scrapes.at(-1)?.series.get('svc_requests_total{}') ?? 0;
  t.ok(first >= 20 && last >= first + 40, `svc_requests_total kept counting (${first} -> ${last})`);
  t.ok([...(scrapes.at(-1)?.series.keys() ?? [])].some((k) => k.startsWith('svc_upstream_request_latency_ms_bucket')), 'histogram series are compared too');
});
