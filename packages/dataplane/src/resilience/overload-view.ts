// What a worker reports of its overload protection (heartbeat → supervisor snapshot, and the
// overload gauges): the admission state of the worker and the breaker state of each backend of
// the active generation. The view types are declared at the process boundary (@edge-proxy/ipc,
// which imports no data plane code) and re-exported here beside their source.
import type { AdmissionView, BreakerView } from '@edge-proxy/ipc';

export type { AdmissionView, BreakerStatus, BreakerView } from '@edge-proxy/ipc';

/** The worker's source of both views (implemented by the data plane). */
export interface OverloadSource {
  admissionView(): AdmissionView;
  breakerViews(): BreakerView[];
}
