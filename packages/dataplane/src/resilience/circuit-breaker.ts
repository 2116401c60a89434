// Per-backend circuit breaker as a pure policy (SPEC "Circuit breaker (per backend)"): closed →
// open after `failure_threshold` consecutive failures; open → half-open after `open_ms`, admitting
// at most `half_open_max_probes` concurrent probes. (Not shown in the spec, decided here, see
// docs/decisions.md "The breaker owns consecutive-failure ejection":) a successful probe closes the
// breaker; a failed probe re-opens it for another `open_ms`; a probe that ends neutral (the client
// went away, the request was invalid, our own defect) gives its probe slot back and decides nothing.
// The state lives in resilience/breaker-registry.ts, one per backend identity.
//
// Every function returns the state it was given, the same object, when nothing changes: the closed
// and success path (every request) allocates nothing.

/** `resilience.circuit_breaker` of the active generation (read per call, so a change is live). */
import type { FailureClass } from '../errors.ts';

export interface BreakerPolicy {
  /** `enabled` (default true). Off: every backend may be tried and outcomes change nothing. */
  readonly enabled: boolean;
  /** `failure_threshold`: consecutive failures that open a closed breaker (default 3). */
  readonly failureThreshold: number;
  /** `open_ms`: how long an open breaker refuses before half-open probes may start, ms (default 30000). */
  readonly openMs: number;
  /** `half_open_max_probes`: concurrent probe requests allowed while half-open (default 1). */
  readonly halfOpenMaxProbes: number;
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
 */
export function record(s: BreakerState, outcome: BreakerOutcome, probe: boolean, p: BreakerPolicy, now: number): BreakerState {
  if (!p.enabled) return s;
  switch (s.status) {
    case 'closed': {
      if (outcome === 'neutral') return s;
      if (outcome === 'success') return s.failures === 0 ? s : CLOSED;
      const failures = s.failures + 1;
      return failures >= p.failureThreshold ? { status: 'open', openedAt: now } : { status: 'closed', failures };
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

/** Failure classes (errors.ts) that are the backend's: its transport, its TLS, its timeouts. */
const BACKEND_FAILURE_CLASSES: ReadonlySet<FailureClass> = new Set<FailureClass>(['timeout', 'transport', 'tls']);

/**
 * How a forwarding attempt counts for the backend's breaker, from the status and the failure class
 * of its coded error (errors.ts). Failure: a connect failure, reset or other transport error, a TLS
 * failure, a connect/headers/body timeout, or a response status >= 500 from the backend. Neutral: an
 * error of any other class: the client (closed, too slow, body too large), a request undici
 * refused to build, or our own defect (or the pool closed under the request by a generation
 * swap). Success: a response < 500 with no error. An error always wins over the status, which is
 * then the proxy's own answer (502, 504...), not the backend's; so a backend's 5xx whose body the
 * client abandons counts neutral.
 */
export function breakerOutcome(status: number | undefined, failure: FailureClass | undefined): BreakerOutcome {
  if (failure !== undefined) return BACKEND_FAILURE_CLASSES.has(failure) ? 'failure' : 'neutral';
  if (status === undefined) return 'neutral';
  return status >= 500 ? 'failure' : 'success';
}
