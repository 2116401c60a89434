// Per-backend circuit breaker as a pure policy (SPEC "Circuit breaker"): closed → open after
// `failure_threshold` consecutive failures; open → half-open after `open_ms`, admitting at most
// `half_open_max_probes` probes. (Not shown in the spec, decided here:) a successful probe closes
// the breaker; a failed probe re-opens it for another `open_ms`.
// Nothing wires it into selection or forwarding yet (issue 13): `resilience.circuit_breaker` is
// reported "not active yet" (packages/config/src/features.ts).

export interface BreakerPolicy {
  readonly failureThreshold: number;
  readonly openMs: number;
  readonly halfOpenMaxProbes: number;
}

export type BreakerState =
  | { readonly status: 'closed'; readonly failures: number }
  | { readonly status: 'open'; readonly until: number }
  | { readonly status: 'half_open'; readonly probesInFlight: number };

export const CLOSED: BreakerState = { status: 'closed', failures: 0 };

/** Asks to send a request at `now`: the decision and the state to keep (a probe is counted). */
export function admit(s: BreakerState, p: BreakerPolicy, now: number): { allowed: boolean; probe: boolean; state: BreakerState } {
  if (s.status === 'closed') return { allowed: true, probe: false, state: s };
  if (s.status === 'open') {
    if (now < s.until) return { allowed: false, probe: false, state: s };
    return { allowed: true, probe: true, state: { status: 'half_open', probesInFlight: 1 } };
  }
  if (s.probesInFlight >= p.halfOpenMaxProbes) return { allowed: false, probe: false, state: s };
  return { allowed: true, probe: true, state: { status: 'half_open', probesInFlight: s.probesInFlight + 1 } };
}

/** Records the outcome of an admitted request. */
export function record(s: BreakerState, ok: boolean, p: BreakerPolicy, now: number): BreakerState {
  switch (s.status) {
    case 'closed': {
      if (ok) return s.failures === 0 ? s : CLOSED;
      const failures = s.failures + 1;
      return failures >= p.failureThreshold ? { status: 'open', until: now + p.openMs } : { status: 'closed', failures };
    }
    case 'half_open':
      return ok ? CLOSED : { status: 'open', until: now + p.openMs };
    case 'open':
      // An outcome of a request admitted before the breaker opened: it does not change the decision.
      return s;
  }
}
