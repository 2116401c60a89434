// Series handles: what they count reaches the exposition, the JSON the supervisor merges and
// prom-client's own histogram format exactly.
import t from 'tap';
import { AggregatorRegistry, Histogram, Registry } from 'prom-client';
import { LATENCY_BUCKETS_MS, Metrics } from '../src/index.ts';
import { BucketHistogram } from '../src/metrics/series.ts';

t.test('a counter series is added to its counter at every collect, once', async (t) => {
  const m = new Metrics('worker');
  const a = m.counterSeries('svc_upstream_requests_total', { upstream: 'api', status_class: '2xx', outcome: 'success' });
  const again = m.counterSeries('svc_upstream_requests_total', { outcome: 'success', upstream: 'api', status_class: '2xx' });
  t.equal(again, a, 'the same labels in any order give the same handle');
  const total = m.counterSeries('svc_requests_total');
  for (let i = 0; i < 5; i++) a.inc();
  a.inc(2);
  total.inc();
  m.counter('svc_upstream_requests_total').inc({ upstream: 'api', status_class: '2xx', outcome: 'success' }, 10);
  const text = await m.registry.metrics();
  t.match(text, /^svc_upstream_requests_total\{upstream="api",status_class="2xx",outcome="success"\} 17$/m, 'series and direct increments add up');
  t.match(text, /^svc_requests_total 1$/m);
  t.equal(a.pending, 0, 'flushed');
  t.match(await m.registry.metrics(), /^svc_upstream_requests_total\{upstream="api",status_class="2xx",outcome="success"\} 17$/m, 'a second scrape adds nothing');
  a.inc();
  const [value] = (await m.counter('svc_upstream_requests_total').get()).values;
  t.equal(value?.value, 18, "the counter's own get() collects too");
});

t.test('labels are checked when the handle is made, not on every increment', async (t) => {
  const m = new Metrics('worker');
  t.throws(() => m.counterSeries('svc_upstream_requests_total', { nope: 'x' }), /nope/);
  m.counterSeries('svc_upstream_requests_total');
  t.throws(() => m.counterSeries('svc_upstream_requests_total', { nope: 'x' }), /nope/, 'checked on every call, not only when the series is new');
  t.not(m.counterSeries('svc_upstream_requests_total', { upstream: 'x' }), m.counterSeries('svc_upstream_requests_total', { outcome: 'x' }), 'the same value under another label is another series');
  t.throws(() => m.counterSeries('svc_active_connections'), /not a counter/);
  t.throws(() => m.histogram('svc_upstream_request_latency_ms').series({ nope: 'x' }), /no label nope/);
  t.throws(() => m.histogram('svc_upstream_request_latency_ms').series({ upstream: 'a', outcome: 'success' }).observe(Number.NaN), /finite/);
});

t.test("the bucket histogram renders and exports exactly as prom-client's histogram", async (t) => {
  const ours = new Registry();
  const theirs = new Registry();
  const labelNames = ['upstream', 'outcome'];
  const h = new BucketHistogram({ name: 'x_ms', help: 'h', labelNames, buckets: LATENCY_BUCKETS_MS, aggregator: 'sum', registry: ours });
  const p = new Histogram({ name: 'x_ms', help: 'h', labelNames, buckets: [...LATENCY_BUCKETS_MS], registers: [theirs] });
  const samples = [0, 0.5, 0.5000001, 1, 3.2, 7, 99.9, 100, 60000, 60001, 1e9];
  for (const [i, v] of samples.entries()) {
    const labels = { upstream: i % 2 === 0 ? 'api' : 'web', outcome: i % 3 === 0 ? 'success' : 'timeout' };
    h.series(labels).observe(v);
    p.observe(labels, v);
  }
  h.observe({ upstream: 'api', outcome: 'success' }, 2);
  p.observe({ upstream: 'api', outcome: 'success' }, 2);
  t.equal(await ours.metrics(), await theirs.metrics(), 'same exposition text');
  // The JSON the supervisor merges: the same values, labels and names (prom-client adds an empty exemplar).
  const values = async (r: Registry): Promise<unknown[]> => (await r.getMetricsAsJSON()).flatMap((x) => x.values.map((v) => ({ metricName: (v as { metricName?: string }).metricName, labels: v.labels, value: v.value })));
  t.same(await values(ours), await values(theirs), 'same JSON values');
  t.equal((await ours.getMetricsAsJSON())[0]?.aggregator, 'sum');
  const merged = AggregatorRegistry.aggregate([await ours.getMetricsAsJSON(), await ours.getMetricsAsJSON()]);
  // api/success: samples 0 and 99.9, and the 2 above; twice.
  t.match(await merged.metrics(), /^x_ms_count\{upstream="api",outcome="success"\} 6$/m, 'two workers sum');
  t.match(await merged.metrics(), /^x_ms_bucket\{le="0.5",upstream="api",outcome="success"\} 2$/m);
  h.reset();
  t.notMatch(await ours.metrics(), /x_ms_count/);
});
