// What a worker reports of its overload protection in each heartbeat (WorkerWindow): its admission
// state and the breaker of each backend of its active generation. Declared here, at the process
// boundary, because both sides read them and ipc imports neither; the data plane re-exports them
// from resilience/overload-view.ts, where its source of these views is declared. Plain data, so
// that they cross IPC unchanged.

/** One worker's admission state (SPEC snapshot `admission` block, per worker). */
export interface AdmissionView {
  /** Whether `resilience.adaptive_admission.enabled` is on in the active generation. */
  readonly adaptiveEnabled: boolean;
  /** The dynamic in-flight limit now (`global_inflight_limit` when adaptive admission is off). */
  readonly adaptiveLimit: number;
  readonly minLimit: number;
  readonly maxLimit: number;
  /** Proxied requests holding an in-flight slot in this worker. */
  readonly inflight: number;
  /** Requests waiting in this worker's route queues. */
  readonly queued: number;
  /** Waiting requests per route (routes with none are left out). */
  readonly queuedByRoute: Readonly<Record<string, number>>;
  readonly brownoutActive: boolean;
}

/** Circuit breaker states (SPEC "Circuit breaker (per backend)"). */
export type BreakerStatus = 'closed' | 'open' | 'half_open';

/** One backend's breaker as one worker sees it. */
export interface BreakerView {
  readonly upstream: string;
  readonly backend: string;
  readonly state: BreakerStatus;
  /** Consecutive failures counted while closed. */
  readonly failures: number;
  /** While open: when half-open probes may start (unix ms); otherwise null. */
  readonly openUntilUnixMs: number | null;
}

/** Where a worker's quota decisions come from (SPEC `backend_mode`). */
export type QuotaMode = 'distributed' | 'local_fallback' | 'local';

/**
 * One worker's quota store as it sees it (the snapshot's `quota_backend_health_summary`, merged):
 * `available` (the mode's store answers), `degraded` (Redis is unreachable and the local fallback
 * decides), `unavailable` (Redis is unreachable and `failure_mode` allow or deny decides), or
 * `disabled` (quota off).
 */
export interface QuotaHealthView {
  readonly backend_mode: QuotaMode;
  readonly availability: 'available' | 'degraded' | 'unavailable' | 'disabled';
}
