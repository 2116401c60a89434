// The node's JWKS sources (issue 16): the supervisor fetches each key set once for every worker,
// pushes the keys to the workers, refreshes when a worker meets an unknown `kid` (within the
// source's cooldown), and serves the `svc_jwks_*` metrics and the snapshot's `jwks.sources[]`.
import { JWKS_STATES, JwksSources, jwksSourceSpecs } from '@edge-proxy/auth';
import type { JwksSourceView } from '@edge-proxy/auth';
import type { ResolvedConfig } from '@edge-proxy/config';
import type { ToWorker } from '@edge-proxy/ipc';
import type { Logger, Metrics } from '@edge-proxy/telemetry';

/** Where key sets go: every worker now (a new worker gets `greeting()` after its `init`). */
export interface KeySetSink {
  broadcast(notice: Extract<ToWorker, { type: 'jwks' }>): void;
}

export class NodeJwks {
  private readonly sources: JwksSources;

  constructor(sink: KeySetSink, metrics: Metrics, log: Logger) {
    this.sources = new JwksSources({
      onKeySet: (set) => sink.broadcast({ type: 'jwks', sets: [set] }),
      log: { info: (fields, message) => log.info(fields, message), warn: (fields, message) => log.warn(fields, message) },
      onRefresh: (id, result) => metrics.counter(result === 'success' ? 'svc_jwks_refresh_success_total' : 'svc_jwks_refresh_failure_total').inc({ jwks_source_id: id }),
    });
    // Each gauge from the sources' state at scrape time (a removed source's series disappear).
    const per = (name: string, value: (v: JwksSourceView) => number | null): void =>
      metrics.onCollect(name, () => {
        const g = metrics.gauge(name);
        g.reset();
        for (const v of this.sources.views()) {
          const x = value(v);
          if (x !== null) g.set({ jwks_source_id: v.jwks_source_id }, x);
        }
      });
    per('svc_jwks_age_seconds', (v) => v.age_seconds);
    per('svc_jwks_active_keys', (v) => v.active_keys);
    per('svc_jwks_last_refresh_attempt_seconds', (v) => (v.last_refresh_attempt_unix_ms === null ? null : Math.floor(v.last_refresh_attempt_unix_ms / 1000)));
    per('svc_jwks_last_refresh_success_seconds', (v) => (v.last_refresh_success_unix_ms === null ? null : Math.floor(v.last_refresh_success_unix_ms / 1000)));
    metrics.onCollect('svc_jwks_state', () => {
      const g = metrics.gauge('svc_jwks_state');
      g.reset();
      for (const v of this.sources.views()) for (const s of JWKS_STATES) g.set({ jwks_source_id: v.jwks_source_id, state: s }, s === v.state ? 1 : 0);
    });
  }

  /** The active generation's sources: new ones start fetching, removed ones stop. */
  configure(resolved: ResolvedConfig): void {
    this.sources.configure(jwksSourceSpecs(resolved));
  }

  /** A worker met a `kid` the set lacks, or waits on a set never fetched. */
  refresh(sourceId: string): void {
    this.sources.requestRefresh(sourceId);
  }

  /** What a new worker is told after `init`: every key set the node holds. */
  greeting(): ToWorker[] {
    const sets = this.sources.keySets();
    return sets.length === 0 ? [] : [{ type: 'jwks', sets }];
  }

  /** The snapshot's `jwks.sources[]`. */
  views(): JwksSourceView[] {
    return this.sources.views();
  }

  close(): void {
    this.sources.close();
  }
}
