// What a worker reports of its overload protection: the admission view and the breaker views that
// go into each heartbeat (the supervisor's snapshot) and the overload gauges of the worker's
// registry, from the data plane's OverloadSource (resilience/overload-control.ts).
import type { Metrics } from '@edge-proxy/telemetry';
import type { Dataplane } from '../runtime/dataplane.ts';
import type { AdmissionView, BreakerView } from '../resilience/overload-view.ts';
import type { QuotaHealthView } from '@edge-proxy/ipc';

/** Both views of one worker at one moment. */
export interface OverloadReport {
  readonly admission: AdmissionView;
  readonly breakers: BreakerView[];
}

/** The admission view of a worker with no active generation yet (nothing admitted, no limit). */
export const NO_ADMISSION: AdmissionView = { adaptiveEnabled: false, adaptiveLimit: 0, minLimit: 0, maxLimit: 0, inflight: 0, queued: 0, queuedByRoute: {}, brownoutActive: false };
/** The quota view of a worker with no data plane yet. */
export const NO_QUOTA: QuotaHealthView = { backend_mode: 'local', availability: 'disabled' };

/** Requests holding a runtime of any generation in this worker (queued and answered locally included). */
export function inflightOf(dp: Dataplane | undefined): number {
  let n = 0;
  for (const v of dp?.inflight().values() ?? []) n += v;
  return n;
}

/** The worker's report now; undefined before its first generation is active. */
export function overloadReport(dp: Dataplane | undefined): OverloadReport | undefined {
  if (dp?.current === undefined) return undefined;
  return { admission: dp.overload.admissionView(), breakers: dp.overload.breakerViews() };
}

/**
 * Fills the overload gauges at each scrape from the report of the moment (declared extensions in
 * the metric catalogue): the queue depth per route and the requests in flight
 * (`svc_circuit_breaker_state`, `svc_adaptive_admission_limit` and `svc_brownout_active` are the
 * node's: the supervisor serves them).
 */
export function registerOverloadGauges(metrics: Metrics, report: () => OverloadReport | undefined): void {
  metrics.onCollect('svc_route_queue_depth', () => {
    const g = metrics.gauge('svc_route_queue_depth');
    g.reset();
    for (const [route, n] of Object.entries(report()?.admission.queuedByRoute ?? {})) g.set({ route }, n);
  });
  metrics.onCollect('svc_inflight_requests', () => {
    const a = report()?.admission;
    const g = metrics.gauge('svc_inflight_requests');
    g.reset();
    if (a !== undefined) g.set(a.inflight);
  });
}
