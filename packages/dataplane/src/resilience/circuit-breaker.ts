// Per-backend circuit breaker as a pure policy (SPEC "Circuit breaker (per backend)"): closed →
// open after `failure_threshold` consecutive failures; open → half-open after `open_ms`, admitting
// at most `half_open_max_probes` concurrent probes. (Not shown in the spec, decided here, see
// docs/decisions.md "The breaker owns consecutive-failure ejection":) a successful probe closes the
// breaker; a failed probe re-opens it for another `open_ms`; a probe that ends neutral (the client
// went away, the request was invalid, our own defect) gives its probe slot back and decides nothing.
// Two bounds keep one client from ejecting a pool for everyone (docs/decisions.md "Breakers count
// gateway failures, and a pool keeps most of its backends"): only gateway failures count by default
// (a transport error, a timeout, a 502/503/504: Envoy's `consecutive_gateway_failure`), since any
// client can make an application answer 500; and at most `max_ejection_percent` of a pool's backends
// are ejected at once (Envoy's `max_ejection_percent`): past it a failing backend is held closed.
// The state lives in resilience/breaker-registry.ts, one per backend identity.
//
// Every function returns the state it was given, the same object, when nothing changes: the closed
// and success path (every request) allocates nothing.
import type { FailureClass, RequestErrorCode } from '../errors.ts';

/** `resilience.circuit_breaker` of the active generation (read per call, so a change is live). */
export interface BreakerPolicy {
  /** `enabled` (default true). Off: every backend may be tried and outcomes change nothing. */
  readonly enabled: boolean;
  /** `failure_threshold`: consecutive failures that open a closed breaker (default 3). */
  readonly failureThreshold: number;
  /** `open_ms`: how long an open breaker refuses before half-open probes may start, ms (default 30000). */
  readonly openMs: number;
  /** `half_open_max_probes`: concurrent probe requests allowed while half-open (default 1). */
  readonly halfOpenMaxProbes: number;
  /** `failure_statuses`: backend response statuses that count as failures (default 502, 503, 504). */
  readonly failureStatuses: ReadonlySet<number>;
  /** `max_ejection_percent`: most of a pool's backends ejected (open or half-open) at once, percent (default 50). */
  readonly maxEjectionPercent: number;
}

/**
 * One backend's breaker. `open` keeps when it opened, not when it may close, so that a new `open_ms`
 * applies to a breaker already open.
 */
export type BreakerState =
  | { readonly status: 'closed'; readonly failures: number }
  | { readonly status: 'open'; readonly openedAt: number }
  | { readonly status: 'half_open'; readonly probesInFlight: number };

/** How an attempt on a backend counts for its breaker (see `breakerOutcome`). */
export type BreakerOutcome = 'success' | 'failure' | 'neutral';

/** A closed breaker with no failure counted (the state of every backend never seen failing). */
export const CLOSED: BreakerState = { status: 'closed', failures: 0 };

/**
 * Whether the backend may be picked at `now` (a peek: nothing is counted). Closed: yes; open: only
 * once `open_ms` elapsed (the attempt will be the first probe); half-open: while a probe slot is free.
 */
export function mayTry(s: BreakerState, p: BreakerPolicy, now: number): boolean {
  if (!p.enabled) return true;
  switch (s.status) {
    case 'closed':
      return true;
    case 'open':
      return now - s.openedAt >= p.openMs;
    case 'half_open':
      return s.probesInFlight < p.halfOpenMaxProbes;
  }
}

/**
 * An attempt on the backend starts at `now`: the state to keep. It differs from `s` exactly when
 * the attempt is a probe (open and due → half-open with one probe; half-open with a free slot → one
 * more probe). The caller filters with `mayTry` first; an attempt begun on a breaker that refuses
 * is no probe and changes nothing.
 */
export function begin(s: BreakerState, p: BreakerPolicy, now: number): BreakerState {
  if (!p.enabled || s.status === 'closed') return s;
  if (s.status === 'open') return now - s.openedAt >= p.openMs ? { status: 'half_open', probesInFlight: 1 } : s;
  return s.probesInFlight < p.halfOpenMaxProbes ? { status: 'half_open', probesInFlight: s.probesInFlight + 1 } : s;
}

/**
 * Records how an attempt ended. `probe` is what `begin` said of that attempt. While half-open only
 * probes decide: an attempt that started before the breaker opened reports on a backend state that
 * is gone, so its outcome is dropped, as is any outcome that arrives while open (a concurrent probe
 * of one that already re-opened it included). A probe that arrives after another probe closed the
 * breaker counts as an ordinary closed outcome.
 *
 * `mayOpen` (`ejectionAllowed` for the backend's pool): false when opening a closed breaker would
 * eject more of its pool than `max_ejection_percent`. The breaker is then held closed at
 * `failure_threshold` failures (see `held`): it keeps serving, and its next failure tries again.
 */
export function record(s: BreakerState, outcome: BreakerOutcome, probe: boolean, p: BreakerPolicy, now: number, mayOpen = true): BreakerState {
  if (!p.enabled) return s;
  switch (s.status) {
    case 'closed': {
      if (outcome === 'neutral') return s;
      if (outcome === 'success') return s.failures === 0 ? s : CLOSED;
      const failures = s.failures + 1;
      if (failures < p.failureThreshold) return { status: 'closed', failures };
      if (mayOpen) return { status: 'open', openedAt: now };
      return s.failures === p.failureThreshold ? s : { status: 'closed', failures: p.failureThreshold };
    }
    case 'half_open':
      if (!probe) return s;
      if (outcome === 'success') return CLOSED;
      if (outcome === 'failure') return { status: 'open', openedAt: now };
      // Neutral: the slot is free again; a half-open breaker with no probe in flight stays half-open
      // (its `open_ms` already elapsed), so the next request probes at once.
      return { status: 'half_open', probesInFlight: Math.max(0, s.probesInFlight - 1) };
    case 'open':
      return s;
  }
}

/**
 * Whether a closed breaker is held closed by the ejection bound: it reached `failure_threshold`
 * and `record` was not allowed to open it (failures never stay at the threshold otherwise).
 */
export function held(s: BreakerState, p: BreakerPolicy): boolean {
  return s.status === 'closed' && s.failures >= p.failureThreshold;
}

/**
 * The state at `now` with time alone moving it: an open breaker whose `open_ms` elapsed is
 * half-open with no probe in flight (the next request that may use the backend probes it). The
 * caller runs this from a timer or before a view, so that the state shown does not wait for
 * traffic; every other state is returned as is.
 */
export function due(s: BreakerState, p: BreakerPolicy, now: number): BreakerState {
  if (!p.enabled || s.status !== 'open' || now - s.openedAt < p.openMs) return s;
  return { status: 'half_open', probesInFlight: 0 };
}

/**
 * Whether one more backend of a pool of `poolSize` may be ejected while `ejected` of them are (open
 * or half-open): at most `max_ejection_percent` of the pool, rounded down, and at least one when the
 * percentage is above 0 (so a pool of one backend can still fail fast; 0 ejects nothing).
 */
export function ejectionAllowed(ejected: number, poolSize: number, p: BreakerPolicy): boolean {
  if (p.maxEjectionPercent <= 0) return false;
  return ejected < Math.max(1, Math.floor((poolSize * p.maxEjectionPercent) / 100));
}

/** Failure classes (errors.ts) that are the backend's: its transport, its TLS, its timeouts. */
const BACKEND_FAILURE_CLASSES: ReadonlySet<FailureClass> = new Set<FailureClass>(['timeout', 'transport', 'tls']);

/**
 * How a forwarding attempt counts for the backend's breaker, from the status and the coded error
 * (errors.ts) of its result and the policy's `failure_statuses`. Failure: a connect failure, reset
 * or other transport error, a TLS failure, a connect/headers/body timeout, or a response whose
 * status is in `failure_statuses` (by default the gateway failures 502, 503, 504: a backend that is
 * down, overloaded or timing out behind it). Neutral: an error of any other class: the client
 * (closed, too slow, body too large), a request undici refused to build, or our own defect (or the
 * pool closed under the request by a generation swap). Success: any other response, a 500 included
 * by default: the backend answered, and what a client can make its application throw is not a
 * sign of a backend to eject. An error wins over the status, which is then the proxy's own answer
 * (502, 504...), not the backend's; so a backend's 5xx whose body the client abandons counts
 * neutral. The one error that carries the backend's own status, a 502/503 discarded to retry
 * (`EDGE_UPSTREAM_ERROR_STATUS`), counts by that status.
 */
export function breakerOutcome(status: number | undefined, error: { readonly code: RequestErrorCode; readonly class: FailureClass } | undefined, failureStatuses: ReadonlySet<number>): BreakerOutcome {
  if (error !== undefined && error.code !== 'EDGE_UPSTREAM_ERROR_STATUS') return BACKEND_FAILURE_CLASSES.has(error.class) ? 'failure' : 'neutral';
  if (status === undefined) return 'neutral';
  return failureStatuses.has(status) ? 'failure' : 'success';
}
