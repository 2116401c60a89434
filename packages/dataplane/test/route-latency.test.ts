// Route latency quantiles: nearest rank over the window, old samples ignored, bounded memory.
import t from 'tap';
import { RouteLatencyWindow } from '../src/proxy/route-latency.ts';
import { Metrics } from '@edge-proxy/telemetry';

t.test('quantiles of 1..100 ms', async (t) => {
  const w = new RouteLatencyWindow(1000, 60_000);
  for (let i = 1; i <= 100; i++) w.observe('api', i, 1000);
  t.same(w.quantiles(1000).get('api'), { p50: 50, p95: 95, p99: 99 });
});

t.test('samples older than the window do not count; the ring keeps the newest', async (t) => {
  const w = new RouteLatencyWindow(10, 1000);
  for (let i = 0; i < 10; i++) w.observe('r', 1000, 0);
  for (let i = 0; i < 5; i++) w.observe('r', 5, 5000);
  t.same(w.quantiles(5500).get('r'), { p50: 5, p95: 5, p99: 5 });
  t.equal(w.quantiles(7000).get('r'), undefined, 'nothing recent');
  w.retain(new Set());
  t.equal(w.quantiles(5500).size, 0);
});

t.test('gauges are computed at scrape time through onCollect', async (t) => {
  const m = new Metrics('worker');
  const w = new RouteLatencyWindow();
  w.observe('api', 12);
  m.onCollect('svc_route_latency_ms_p99', () => {
    for (const [route, q] of w.quantiles()) m.gauge('svc_route_latency_ms_p99').set({ route }, q.p99);
  });
  t.match(await m.registry.metrics(), /svc_route_latency_ms_p99\{route="api"\} 12/);
});
