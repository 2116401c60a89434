// RetiredCounters: the final counts of gone workers, merged series by series; gauges never kept.
import t from 'tap';
import { AggregatorRegistry } from 'prom-client';
import { Metrics } from '@edge-proxy/telemetry';
import { RetiredCounters, countersOf } from '../src/supervisor/retired-counters.ts';

async function workerJson(requests: number, latencies: readonly number[], connections: number): Promise<unknown> {
  const m = new Metrics('worker');
  for (let i = 0; i < requests; i++) m.counter('svc_requests_total').inc();
  for (const l of latencies) m.histogram('svc_upstream_request_latency_ms').observe({ upstream: 'app', outcome: 'success' }, l);
  m.gauge('svc_active_connections').set(connections);
  return m.registry.getMetricsAsJSON();
}

t.test('counters and histograms of gone workers add up; their gauges are dropped', async (t) => {
  const retired = new RetiredCounters();
  t.same(retired.toJson(), [], 'nothing retired: nothing added');
  retired.add(countersOf(await workerJson(3, [1, 700], 5)));
  retired.add(countersOf(await workerJson(4, [2], 7)));
  t.equal(retired.retired, 2);
  const live = await workerJson(10, [3], 2);
  const merged = await AggregatorRegistry.aggregate([live, retired.toJson()] as object[]).metrics();
  t.match(merged, /^svc_requests_total 17$/m, 'the live worker and both gone ones');
  t.match(merged, /^svc_upstream_request_latency_ms_count\{upstream="app",outcome="success"\} 4$/m, 'histogram count');
  t.match(merged, /^svc_upstream_request_latency_ms_sum\{upstream="app",outcome="success"\} 706$/m, 'histogram sum');
  t.match(merged, /^svc_upstream_request_latency_ms_bucket\{le="500",upstream="app",outcome="success"\} 3$/m, 'histogram buckets, per bound');
  t.match(merged, /^svc_active_connections 2$/m, 'only the gauge of the live worker');
});

t.test('countersOf keeps only summed counters and histograms, and ignores what is not registry JSON', async (t) => {
  const json = (await workerJson(1, [1], 1)) as { name: string }[];
  const names = countersOf(json).map((m) => m.name);
  t.ok(names.includes('svc_requests_total') && names.includes('svc_upstream_request_latency_ms'));
  t.notOk(names.includes('svc_active_connections'), 'no gauge');
  t.same(countersOf(undefined), []);
  t.same(countersOf([{ nope: 1 }, null]), []);
});
