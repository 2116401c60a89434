// The QUIC ingress counters of a worker (`svc_ingress_*` datagram counters, the ingress queue
// gauge, and failed QUIC handshakes in `svc_downstream_tls_handshake_failure_total`). The patched
// QUIC library counts datagrams as plain numbers on each server's socket: no metric update per
// datagram. At a scrape this sums the live servers plus what closed servers counted, and moves
// the prom-client counters by the difference since the last scrape.
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

/**
 * The downstream TLS failure series of QUIC handshakes: the library counts a connection whose
 * handshake failed or timed out (`connectionCreateFailed`) without saying why, so the reason is
 * the SPEC's generic `handshake`.
 */
const HANDSHAKE_FAILURES = 'svc_downstream_tls_handshake_failure_total';

function zero(): Totals {
  const t = {} as Totals;
  for (const [, key] of COUNTERS) t[key] = 0;
  return t;
}

export class QuicIngressCounters {
  private readonly metrics: Metrics;
  /** Live servers, with the listener each serves. */
  private readonly live = new Map<IngressCountSource, string>();
  /** Final counts of servers that closed. */
  private readonly retired = zero();
  /** Totals already added to the prom-client counters. */
  private readonly published = zero();
  /** Failed handshakes per listener: of servers that closed, and already published. */
  private readonly retiredFailures = new Map<string, number>();
  private readonly publishedFailures = new Map<string, number>();

  constructor(metrics: Metrics) {
    this.metrics = metrics;
    const publish = (): void => this.publish();
    for (const [name] of COUNTERS) metrics.onCollect(name, publish);
    metrics.onCollect('svc_ingress_queue_bytes', publish);
    metrics.onCollect(HANDSHAKE_FAILURES, publish);
  }

  /**
   * Counts `source` (the QUIC server of `listener`) from now on; the returned function retires it
   * (its last counts are kept).
   */
  track(source: IngressCountSource, listener: string): () => void {
    this.live.set(source, listener);
    return () => {
      if (!this.live.delete(source)) return;
      const last = source.ingressCounts();
      for (const [, key] of COUNTERS) this.retired[key] += last[key];
      this.retiredFailures.set(listener, (this.retiredFailures.get(listener) ?? 0) + last.connectionCreateFailed);
    };
  }

  /** Brings the metrics up to date (idempotent: every hooked metric calls it at a scrape). */
  publish(): void {
    const total = { ...this.retired };
    const failures = new Map(this.retiredFailures);
    let queueBytes = 0;
    for (const [source, listener] of this.live) {
      const c = source.ingressCounts();
      for (const [, key] of COUNTERS) total[key] += c[key];
      queueBytes += c.queueBytes;
      failures.set(listener, (failures.get(listener) ?? 0) + c.connectionCreateFailed);
    }
    for (const [name, key] of COUNTERS) {
      const delta = total[key] - this.published[key];
      if (delta > 0) this.metrics.counter(name).inc(delta);
      this.published[key] = total[key];
    }
    for (const [listener, n] of failures) {
      const delta = n - (this.publishedFailures.get(listener) ?? 0);
      if (delta > 0) this.metrics.counter(HANDSHAKE_FAILURES).inc({ listener, reason: 'handshake' }, delta);
      this.publishedFailures.set(listener, n);
    }
    this.metrics.gauge('svc_ingress_queue_bytes').set(queueBytes);
  }
}
