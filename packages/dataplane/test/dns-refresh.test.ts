// DNS refresh: success/failure counters, address-set change detection, pool rotation; and one
// refresh through the real resolver.
import t from 'tap';
import { Metrics } from '@edge-proxy/telemetry';
import { DnsRefresher } from '../src/upstream/dns-refresh.ts';
import { UpstreamPools } from '../src/upstream/pools.ts';
import type { PoolSpec } from '../src/upstream/pools.ts';

const spec = (host: string): PoolSpec => ({ scheme: 'http', host, port: 8080, connectTimeoutMs: 1000, connections: 4, tls: undefined });
const value = async (m: Metrics, name: string): Promise<number> => (await m.counter(name).get()).values.reduce((s, v) => s + v.value, 0);

t.test('a changed address set rotates the pools of that host only', async (t) => {
  const m = new Metrics('worker');
  const pools = new UpstreamPools();
  t.teardown(() => pools.destroy());
  const answers: Record<string, string[] | Error> = { 'api.internal': ['10.0.0.1', '10.0.0.2'], 'db.internal': ['10.0.1.1'] };
  const refresher = new DnsRefresher(pools, m, async (h) => {
    const a = answers[h];
    if (a instanceof Error || a === undefined) throw a ?? new Error('NXDOMAIN');
    return a;
  });
  t.teardown(() => refresher.close());
  refresher.reconcile([spec('api.internal'), spec('db.internal'), spec('10.9.9.9')], 60_000);
  const apiPool = pools.get(spec('api.internal'));
  const dbPool = pools.get(spec('db.internal'));
  await refresher.refresh();
  t.equal(await value(m, 'svc_backend_dns_refresh_success_total'), 2, 'IP backends are not looked up');
  t.equal(await value(m, 'svc_backend_dns_address_set_changes_total'), 0, 'the first answer is no change');
  answers['api.internal'] = ['10.0.0.2', '10.0.0.3'];
  answers['db.internal'] = ['10.0.1.1'];
  await refresher.refresh();
  t.equal(await value(m, 'svc_backend_dns_address_set_changes_total'), 1);
  t.equal(await value(m, 'svc_backend_client_rotations_total'), 1);
  t.not(pools.get(spec('api.internal')), apiPool, 'api got a new pool');
  t.equal(pools.get(spec('db.internal')), dbPool, 'db kept its pool');
  answers['api.internal'] = new Error('SERVFAIL');
  await refresher.refresh();
  t.equal(await value(m, 'svc_backend_dns_refresh_failure_total'), 1, 'a failed lookup is counted and changes nothing');
  t.match(await m.registry.metrics(), /svc_backend_dns_last_refresh_success_seconds \d{10}/);
});

t.test('the real resolver answers for localhost', async (t) => {
  const m = new Metrics('worker');
  const pools = new UpstreamPools();
  const refresher = new DnsRefresher(pools, m);
  t.teardown(() => refresher.close());
  refresher.reconcile([spec('localhost')], 60_000);
  await refresher.refresh();
  t.equal(await value(m, 'svc_backend_dns_refresh_success_total'), 1);
});
