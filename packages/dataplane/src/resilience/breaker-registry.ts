// Circuit breaker state per backend identity, shared by every generation of a worker (a breaker
// outlives a reload that keeps its backend). The policy (resilience/circuit-breaker.ts) is pure;
// this holds the state, reads the clock and reports transitions. The clock is monotonic: `open_ms`
// is a duration, and a wall-clock step (NTP at boot, a VM resumed) must neither hold a breaker open
// for the size of the step nor close it early; only the views convert to unix time. The policy
// values come with each call from the generation serving the request, so a changed
// `resilience.circuit_breaker` is live.
//
// The request path calls, per attempt: `mayTry` as a selection filter, `begin` on the backend
// picked, `record` exactly once when the attempt ends (a probe that never records holds its slot).
// A backend with nothing against it has no entry: the closed/success path reads one map miss and
// allocates nothing.
import { CLOSED, begin, mayTry, record } from './circuit-breaker.ts';
import type { BreakerOutcome, BreakerPolicy, BreakerState } from './circuit-breaker.ts';
import type { BreakerStatus, BreakerView } from './overload-view.ts';

export { breakerOutcome } from './circuit-breaker.ts';
export type { BreakerOutcome, BreakerPolicy } from './circuit-breaker.ts';

/** One breaker changed state (the data plane logs one line and counts it). */
export interface BreakerTransition {
  /** Backend identity (selector key). */
  readonly key: string;
  readonly from: BreakerStatus;
  readonly to: BreakerStatus;
  /** Consecutive failures that opened a closed breaker (0 for other transitions). */
  readonly failures: number;
  /** When, on the registry's monotonic clock (ms; `performance.now()` unless injected). */
  readonly at: number;
}

/** The policy of a `resilience.circuit_breaker` block (build it once per generation, not per request). */
export function breakerPolicy(c: { readonly enabled: boolean; readonly failure_threshold: number; readonly open_ms: number; readonly half_open_max_probes: number }): BreakerPolicy {
  return { enabled: c.enabled, failureThreshold: c.failure_threshold, openMs: c.open_ms, halfOpenMaxProbes: c.half_open_max_probes };
}

/** Where a backend identity belongs, for the views; undefined: not in the active generation. */
export type BreakerResolve = (key: string) => { readonly upstream: string; readonly backend: string } | undefined;

export class BreakerRegistry {
  private readonly states = new Map<string, BreakerState>();
  /** `open_ms` in force when each open breaker opened or was last peeked at (its `openUntilUnixMs`). */
  private readonly openMs = new Map<string, number>();
  /** Backend identities some live generation uses (the last `retain`); the views list them all. */
  private known: ReadonlySet<string> = new Set();
  private readonly onTransition: ((t: BreakerTransition) => void) | undefined;
  private readonly now: () => number;
  private readonly wallNow: () => number;

  /** `now`: the monotonic clock the state machine runs on; `wallNow`: unix ms, for the views only. */
  constructor(onTransition?: (t: BreakerTransition) => void, now: () => number = () => performance.now(), wallNow: () => number = () => Date.now()) {
    this.onTransition = onTransition;
    this.now = now;
    this.wallNow = wallNow;
  }

  /** Whether the backend may be picked now (a peek, nothing counted). Always true when disabled. */
  mayTry(key: string, policy: BreakerPolicy): boolean {
    if (!policy.enabled) return true;
    const s = this.states.get(key);
    if (s === undefined) return true;
    // The views report when an open breaker may probe: with the `open_ms` in force now.
    if (s.status === 'open') this.openMs.set(key, policy.openMs);
    return mayTry(s, policy, this.now());
  }

  /** The picked backend starts an attempt: whether it is a probe (pass it back to `record`). */
  begin(key: string, policy: BreakerPolicy): boolean {
    if (!policy.enabled) return false;
    const s = this.states.get(key);
    if (s === undefined || s.status === 'closed') return false;
    const next = begin(s, policy, this.now());
    if (next === s) return false;
    this.set(key, s, next, policy);
    return true;
  }

  /** How the attempt ended (`breakerOutcome`), with what `begin` answered for it. */
  record(key: string, outcome: BreakerOutcome, probe: boolean, policy: BreakerPolicy): void {
    const s = this.states.get(key);
    if (!policy.enabled) {
      // Off: outcomes eject nothing, and what was counted before is forgotten, so that enabling
      // the breaker again starts every backend closed rather than from a stale streak.
      if (s !== undefined) this.forget(key);
      return;
    }
    if (s === undefined && outcome !== 'failure') return;
    const before = s ?? CLOSED;
    const next = record(before, outcome, probe, policy, this.now());
    if (next !== before) this.set(key, before, next, policy);
  }

  /**
   * Each backend of `resolve`'s generation among the identities in use (the last `retain`) or with
   * a state, closed when it has none. Order: as retained, then any other with a state.
   */
  views(resolve: BreakerResolve): BreakerView[] {
    const out: BreakerView[] = [];
    for (const key of this.known) this.view(key, resolve, out);
    for (const key of this.states.keys()) if (!this.known.has(key)) this.view(key, resolve, out);
    return out;
  }

  /** The status of one backend's breaker (closed when it has no state). */
  status(key: string): BreakerStatus {
    return this.states.get(key)?.status ?? 'closed';
  }

  /** Forgets backends no live generation uses, and remembers `keys` as the ones in use. */
  retain(keys: ReadonlySet<string>): void {
    this.known = new Set(keys);
    for (const key of this.states.keys()) if (!keys.has(key)) this.forget(key);
  }

  private view(key: string, resolve: BreakerResolve, out: BreakerView[]): void {
    const where = resolve(key);
    if (where === undefined) return;
    const s = this.states.get(key) ?? CLOSED;
    // Monotonic → unix at the time of the view: when it may probe, as the wall clock reads now.
    const openUntilUnixMs = s.status === 'open' ? Math.round(this.wallNow() + s.openedAt + (this.openMs.get(key) ?? 0) - this.now()) : null;
    out.push({ upstream: where.upstream, backend: where.backend, state: s.status, failures: s.status === 'closed' ? s.failures : 0, openUntilUnixMs });
  }

  private set(key: string, before: BreakerState, next: BreakerState, policy: BreakerPolicy): void {
    // A closed breaker with no failure is the default: dropping it keeps the map to the backends
    // with something against them.
    if (next.status === 'closed' && next.failures === 0) this.forget(key);
    else this.states.set(key, next);
    if (next.status === 'open') this.openMs.set(key, policy.openMs);
    if (before.status !== next.status) this.onTransition?.({ key, from: before.status, to: next.status, failures: before.status === 'closed' ? before.failures + 1 : 0, at: this.now() });
  }

  private forget(key: string): void {
    this.states.delete(key);
    this.openMs.delete(key);
  }
}
