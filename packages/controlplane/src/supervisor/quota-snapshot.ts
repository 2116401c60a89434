// The snapshot's `observability.quota_backend_health_summary` ({ backend_mode, availability }),
// merged from the latest heartbeat of each worker, conservatively: the node is as bad as its worst
// worker. A worker deciding from its local fallback makes the node `local_fallback`; one that cannot
// reach Redis makes it `degraded` or `unavailable`. Pure: heartbeats and the configuration in.
import type { QuotaHealthView, QuotaMode } from '@edge-proxy/ipc';

const MODE_RANK: Readonly<Record<QuotaMode, number>> = { local: 0, distributed: 1, local_fallback: 2 };
const AVAILABILITY_RANK: Readonly<Record<QuotaHealthView['availability'], number>> = { disabled: 0, available: 1, degraded: 2, unavailable: 3 };

/** The summary from the workers' views (`quota` of each latest heartbeat) and the active configuration. */
export function quotaSummary(views: readonly QuotaHealthView[], configured: { readonly enabled: boolean; readonly backend: 'local' | 'redis' }): QuotaHealthView {
  const mode: QuotaMode = configured.backend === 'redis' ? 'distributed' : 'local';
  if (!configured.enabled) return { backend_mode: mode, availability: 'disabled' };
  // No heartbeat yet: a local store is there, a Redis store is not known to answer.
  if (views.length === 0) return { backend_mode: mode, availability: configured.backend === 'local' ? 'available' : 'unavailable' };
  let worst = views[0] as QuotaHealthView;
  let backend = worst.backend_mode;
  for (const v of views) {
    if (AVAILABILITY_RANK[v.availability] > AVAILABILITY_RANK[worst.availability]) worst = v;
    if (MODE_RANK[v.backend_mode] > MODE_RANK[backend]) backend = v.backend_mode;
  }
  return { backend_mode: backend, availability: worst.availability };
}
