// The QUIC ingress counters of a worker (`svc_ingress_*` datagram counters, the ingress queue
// gauge). The patched QUIC library counts datagrams as plain numbers on each server's socket: no
// metric update per datagram. At a scrape this sums the live servers plus what closed servers
// counted, and moves the prom-client counters by the difference since the last scrape.
import type { IngressCounts } from '@edge-proxy/http3';
import type { Metrics } from '@edge-proxy/telemetry';

/** What the worker reads: one QUIC server's counters. */
export interface IngressCountSource {
  ingressCounts(): IngressCounts;
}

/** Counter metric of each monotonic count (SPEC "Connection/ingress" family). */
const COUNTERS = [
  ['svc_ingress_packets_total', 'packets'],
  ['svc_ingress_bad_header_total', 'badHeader'],
  ['svc_ingress_unroutable_total', 'unroutable'],
  ['svc_ingress_draining_drops_total', 'drainingDrops'],
  ['svc_ingress_connection_create_failed_total', 'connectionCreateFailed'],
  ['svc_ingress_version_neg_failed_total', 'versionNegotiations'],
  ['svc_ingress_queue_drops', 'queueDrops'],
  ['svc_ingress_queue_drop_bytes', 'queueDropBytes'],
] as const satisfies readonly (readonly [string, keyof IngressCounts])[];

type Totals = Record<(typeof COUNTERS)[number][1], number>;

function zero(): Totals {
  const t = {} as Totals;
  for (const [, key] of COUNTERS) t[key] = 0;
  return t;
}

export class QuicIngressCounters {
  private readonly metrics: Metrics;
  private readonly live = new Set<IngressCountSource>();
  /** Final counts of servers that closed. */
  private readonly retired = zero();
  /** Totals already added to the prom-client counters. */
  private readonly published = zero();

  constructor(metrics: Metrics) {
    this.metrics = metrics;
    const publish = (): void => this.publish();
    for (const [name] of COUNTERS) metrics.onCollect(name, publish);
    metrics.onCollect('svc_ingress_queue_bytes', publish);
  }

  /** Counts `source` from now on; the returned function retires it (its last counts are kept). */
  track(source: IngressCountSource): () => void {
    this.live.add(source);
    return () => {
      if (!this.live.delete(source)) return;
      const last = source.ingressCounts();
      for (const [, key] of COUNTERS) this.retired[key] += last[key];
    };
  }

  /** Brings the metrics up to date (idempotent: every hooked metric calls it at a scrape). */
  publish(): void {
    const total = { ...this.retired };
    let queueBytes = 0;
    for (const source of this.live) {
      const c = source.ingressCounts();
      for (const [, key] of COUNTERS) total[key] += c[key];
      queueBytes += c.queueBytes;
    }
    for (const [name, key] of COUNTERS) {
      const delta = total[key] - this.published[key];
      if (delta > 0) this.metrics.counter(name).inc(delta);
      this.published[key] = total[key];
    }
    this.metrics.gauge('svc_ingress_queue_bytes').set(queueBytes);
  }
}
