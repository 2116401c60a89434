// Periodic backend DNS refresh. Connections resolve the backend host when they open; keep-alive
// connections would otherwise stay on old addresses forever. Every interval, each backend named
// by host is resolved again; when its address set changed, its pool is rotated so that new
// requests connect to the new addresses. IP-addressed backends are never looked up.
import net from 'node:net';
import { lookup as dnsLookup } from 'node:dns/promises';
import type { Metrics } from '@edge-proxy/telemetry';
import type { PoolSpec, UpstreamPools } from './pools.ts';

/** Resolves a host to its addresses (the internal interface tests replace). */
export type Resolve = (host: string) => Promise<string[]>;

/** The system resolver (getaddrinfo, as connections use it). */
export const systemResolve: Resolve = async (host) => (await dnsLookup(host, { all: true })).map((a) => a.address);

export class DnsRefresher {
  private readonly pools: UpstreamPools;
  private readonly metrics: Metrics;
  private readonly resolve: Resolve;
  private specs: readonly PoolSpec[] = [];
  private readonly known = new Map<string, string>();
  private timer: NodeJS.Timeout | undefined;
  private intervalMs = 30_000;
  private running: Promise<void> | undefined;

  constructor(pools: UpstreamPools, metrics: Metrics, resolve: Resolve = systemResolve) {
    this.pools = pools;
    this.metrics = metrics;
    this.resolve = resolve;
  }

  /** Sets the backends to watch and the interval (a generation was activated). */
  reconcile(specs: readonly PoolSpec[], intervalMs: number): void {
    this.specs = specs.filter((s) => net.isIP(s.host) === 0);
    const hosts = new Set(this.specs.map((s) => s.host));
    for (const h of this.known.keys()) if (!hosts.has(h)) this.known.delete(h);
    if (this.timer === undefined || intervalMs !== this.intervalMs) {
      this.intervalMs = intervalMs;
      if (this.timer !== undefined) clearInterval(this.timer);
      this.timer = setInterval(() => void this.refresh(), intervalMs);
      this.timer.unref();
    }
  }

  /** One refresh of every watched host; concurrent calls share one run. */
  refresh(): Promise<void> {
    this.running ??= this.refreshAll().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async refreshAll(): Promise<void> {
    const hosts = [...new Set(this.specs.map((s) => s.host))];
    await Promise.all(
      hosts.map(async (host) => {
        let addresses: string[];
        try {
          addresses = await this.resolve(host);
        } catch {
          this.metrics.counter('svc_backend_dns_refresh_failure_total').inc();
          return;
        }
        this.metrics.counter('svc_backend_dns_refresh_success_total').inc();
        this.metrics.gauge('svc_backend_dns_last_refresh_success_seconds').set(Math.floor(Date.now() / 1000));
        const set = [...new Set(addresses)].sort().join(',');
        const before = this.known.get(host);
        this.known.set(host, set);
        if (before === undefined || before === set) return;
        this.metrics.counter('svc_backend_dns_address_set_changes_total').inc();
        for (const spec of this.specs) if (spec.host === host && this.pools.rotate(spec)) this.metrics.counter('svc_backend_client_rotations_total').inc();
      }),
    );
  }

  close(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }
}
