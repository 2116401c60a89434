// Backend health as a pure policy: (state, observation) → state. Active probes move a backend
// between healthy and unhealthy after consecutive thresholds. Outcomes of real requests (passive
// health) are counted (`svc_health_failures_total{reason}`) but eject nothing: consecutive-failure
// ejection belongs to the circuit breaker (resilience/circuit-breaker.ts, docs/decisions.md "The
// breaker owns consecutive-failure ejection"), which brings a backend back after `open_ms`.

/** Passive failure reasons (SPEC: `svc_health_failures_total{reason}`). */
export type PassiveReason = '5xx' | 'timeout' | 'transport' | 'tls';

export interface HealthThresholds {
  /** Consecutive successes that make an unhealthy backend healthy again. */
  readonly healthyThreshold: number;
  /** Consecutive failures that make a healthy backend unhealthy. */
  readonly unhealthyThreshold: number;
}

export interface HealthState {
  /** Result of active checking (true when there is none). */
  readonly activeHealthy: boolean;
  /** Consecutive passing probes. */
  readonly successes: number;
  /** Consecutive failing probes. */
  readonly failures: number;
}

export const INITIAL_HEALTH: HealthState = { activeHealthy: true, successes: 0, failures: 0 };

/** Whether the backend may receive traffic (as far as health checks know). */
export function isEligible(s: HealthState): boolean {
  return s.activeHealthy;
}

/** An active probe result. */
export function observeProbe(s: HealthState, ok: boolean, t: HealthThresholds): HealthState {
  if (ok) {
    const successes = s.successes + 1;
    return { successes, failures: 0, activeHealthy: s.activeHealthy || successes >= t.healthyThreshold };
  }
  const failures = s.failures + 1;
  return { failures, successes: 0, activeHealthy: s.activeHealthy && failures < t.unhealthyThreshold };
}
