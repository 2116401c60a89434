// Backend health as a pure policy: (state, observation, now) → state. Active probes move a backend
// between healthy and unhealthy after consecutive thresholds; passive outcomes of real requests
// (5xx, timeout, transport, tls) eject it for a backoff that grows with repeated ejections
// (30 s × ejections, at most 300 s), so a backend without active checks still comes back.

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
  readonly successes: number;
  readonly failures: number;
  /** Consecutive passive failures since the last passive success. */
  readonly passiveFailures: number;
  /** Passive ejection end (ms since epoch); 0 when not ejected. */
  readonly ejectedUntil: number;
  /** Ejections in a row (resets after a healthy period of twice the last ejection). */
  readonly ejections: number;
  readonly lastEjectedAt: number;
}

export const BASE_EJECTION_MS = 30_000;
export const MAX_EJECTION_MS = 300_000;

export const INITIAL_HEALTH: HealthState = { activeHealthy: true, successes: 0, failures: 0, passiveFailures: 0, ejectedUntil: 0, ejections: 0, lastEjectedAt: 0 };

/** Whether the backend may receive traffic at `now`. */
export function isEligible(s: HealthState, now: number): boolean {
  return s.activeHealthy && now >= s.ejectedUntil;
}

/** An active probe result. */
export function observeProbe(s: HealthState, ok: boolean, t: HealthThresholds): HealthState {
  if (ok) {
    const successes = s.successes + 1;
    // A passing probe also lifts a passive ejection: the backend answered its health endpoint.
    const recovered = !s.activeHealthy && successes >= t.healthyThreshold;
    return { ...s, successes, failures: 0, activeHealthy: s.activeHealthy || recovered, ejectedUntil: recovered ? 0 : s.ejectedUntil };
  }
  const failures = s.failures + 1;
  return { ...s, failures, successes: 0, activeHealthy: s.activeHealthy && failures < t.unhealthyThreshold };
}

/** A real request's outcome: `ok`, or a failure reason. */
export function observePassive(s: HealthState, outcome: 'ok' | PassiveReason, t: HealthThresholds, now: number): HealthState {
  if (outcome === 'ok') {
    const calm = s.ejections > 0 && now - s.lastEjectedAt > 2 * ejectionMs(s.ejections);
    return { ...s, passiveFailures: 0, ejections: calm ? 0 : s.ejections };
  }
  const passiveFailures = s.passiveFailures + 1;
  if (passiveFailures < t.unhealthyThreshold || now < s.ejectedUntil) return { ...s, passiveFailures };
  const ejections = s.ejections + 1;
  return { ...s, passiveFailures: 0, ejections, lastEjectedAt: now, ejectedUntil: now + ejectionMs(ejections) };
}

/** Ejection length after `n` ejections in a row. */
export function ejectionMs(n: number): number {
  return Math.min(MAX_EJECTION_MS, BASE_EJECTION_MS * Math.max(1, n));
}
