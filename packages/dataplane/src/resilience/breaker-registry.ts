// Circuit breaker state per backend identity of a worker that decides alone (no supervisor: the
// standalone data plane, unit tests; under a supervisor the node decides, resilience/breaker-
// follower.ts), shared by every generation of the worker (a breaker
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
//
// Time moves a breaker too: each open breaker has a timer (unref'd: it never keeps a worker alive)
// that makes it half-open when its `open_ms` elapses, and every view first applies what time did,
// so the gauge, the heartbeat and the snapshot show half-open without waiting for a request. The
// ejection bound (`max_ejection_percent`) is applied per pool of the active generation (`pools`):
// a breaker that would open past it is held closed, and reported (`onHold`).
import { CLOSED, begin, due, ejectionAllowed, held, mayTry, record } from './circuit-breaker.ts';
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

/** A breaker that would have opened was held closed by the ejection bound (the data plane counts it, and logs the first). */
export interface BreakerHold {
  /** Backend identity (selector key). */
  readonly key: string;
  /** Backends of its pool ejected (open or half-open) when it was held. */
  readonly ejected: number;
  /** Backends in its pool. */
  readonly poolSize: number;
  /** True for the failure that first reached `failure_threshold`; false for the failures after it while held. */
  readonly first: boolean;
}

/** Timers of the registry (injected by tests; by default `setTimeout`, unref'd). */
export interface BreakerTimers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const NODE_TIMERS: BreakerTimers = {
  set: (fn, ms) => setTimeout(fn, ms).unref(),
  clear: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** The policy of a `resilience.circuit_breaker` block (build it once per generation, not per request). */
export function breakerPolicy(c: {
  readonly enabled: boolean;
  readonly failure_threshold: number;
  readonly open_ms: number;
  readonly half_open_max_probes: number;
  readonly failure_statuses: readonly number[];
  readonly max_ejection_percent: number;
}): BreakerPolicy {
  return { enabled: c.enabled, failureThreshold: c.failure_threshold, openMs: c.open_ms, halfOpenMaxProbes: c.half_open_max_probes, failureStatuses: new Set(c.failure_statuses), maxEjectionPercent: c.max_ejection_percent };
}

/** Where a backend identity belongs, for the views; undefined: not in the active generation. */
export type BreakerResolve = (key: string) => { readonly upstream: string; readonly backend: string } | undefined;

/**
 * What the request path and the views use of a worker's breakers: a BreakerRegistry (the worker
 * decides alone: no supervisor) or a BreakerFollower (resilience/breaker-follower.ts: the node's
 * state, decided by the supervisor).
 */
export interface Breakers {
  pools(groups: Iterable<readonly string[]>): void;
  mayTry(key: string, policy: BreakerPolicy): boolean;
  begin(key: string, policy: BreakerPolicy): boolean;
  record(key: string, outcome: BreakerOutcome, probe: boolean, policy: BreakerPolicy): void;
  views(resolve: BreakerResolve): BreakerView[];
  status(key: string): BreakerStatus;
  retain(keys: ReadonlySet<string>): void;
  close(): void;
}

export class BreakerRegistry implements Breakers {
  private readonly states = new Map<string, BreakerState>();
  /**
   * The policy in force when each open breaker opened or was last peeked at: its `open_ms` gives
   * its `openUntilUnixMs` and when its timer makes it half-open.
   */
  private readonly openPolicy = new Map<string, BreakerPolicy>();
  /** The half-open timer of each open breaker. */
  private readonly timers = new Map<string, unknown>();
  /** Backend identity → every identity of its pool in the active generation (the ejection bound's pool). */
  private pool: ReadonlyMap<string, readonly string[]> = new Map();
  /** Backend identities some live generation uses (the last `retain`); the views list them all. */
  private known: ReadonlySet<string> = new Set();
  private readonly onTransition: ((t: BreakerTransition) => void) | undefined;
  private readonly onHold: ((h: BreakerHold) => void) | undefined;
  private readonly now: () => number;
  private readonly wallNow: () => number;
  private readonly clock: BreakerTimers;
  private closed = false;

  /**
   * `now`: the monotonic clock the state machine runs on; `wallNow`: unix ms, for the views only;
   * `onHold`: a breaker held closed by the ejection bound; `timers`: what arms the half-open timers.
   */
  constructor(
    onTransition?: (t: BreakerTransition) => void,
    now: () => number = () => performance.now(),
    wallNow: () => number = () => Date.now(),
    options: { readonly onHold?: (h: BreakerHold) => void; readonly timers?: BreakerTimers } = {},
  ) {
    this.onTransition = onTransition;
    this.onHold = options.onHold;
    this.now = now;
    this.wallNow = wallNow;
    this.clock = options.timers ?? NODE_TIMERS;
  }

  /**
   * The pools of the active generation, each as the identities of its backends: the ejection bound
   * counts within them. An identity in no pool (one only a draining generation still uses) is
   * bounded by nothing.
   */
  pools(groups: Iterable<readonly string[]>): void {
    const pool = new Map<string, readonly string[]>();
    for (const g of groups) for (const key of g) pool.set(key, g);
    this.pool = pool;
  }

  /** Whether the backend may be picked now (a peek, nothing counted). Always true when disabled. */
  mayTry(key: string, policy: BreakerPolicy): boolean {
    if (!policy.enabled) return true;
    const s = this.states.get(key);
    if (s === undefined) return true;
    // The views report when an open breaker may probe: with the `open_ms` in force now.
    if (s.status === 'open') this.openPolicy.set(key, policy);
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
    const now = this.now();
    let next = record(before, outcome, probe, policy, now);
    if (next.status === 'open' && before.status === 'closed') {
      // Opening ejects one more backend of the pool: only within max_ejection_percent.
      const members = this.pool.get(key);
      const ejected = members === undefined ? 0 : this.ejected(members);
      if (members !== undefined && !ejectionAllowed(ejected, members.length, policy)) {
        next = record(before, outcome, probe, policy, now, false);
        this.onHold?.({ key, ejected, poolSize: members.length, first: !held(before, policy) });
      }
    }
    if (next !== before) this.set(key, before, next, policy);
  }

  /** Backends of `members` whose breaker is open or half-open. */
  private ejected(members: readonly string[]): number {
    let n = 0;
    for (const k of members) {
      const st = this.states.get(k)?.status;
      if (st === 'open' || st === 'half_open') n++;
    }
    return n;
  }

  /**
   * Applies what time did to one open breaker: half-open once its `open_ms` elapsed (with the
   * policy last in force for it), else its timer is armed again for the rest.
   */
  private advance(key: string): void {
    const s = this.states.get(key);
    const policy = this.openPolicy.get(key);
    if (s === undefined || s.status !== 'open' || policy === undefined) return;
    const now = this.now();
    const next = due(s, policy, now);
    if (next !== s) this.set(key, s, next, policy);
    else this.arm(key, s.openedAt + policy.openMs - now);
  }

  private arm(key: string, ms: number): void {
    this.disarm(key);
    if (this.closed) return;
    this.timers.set(
      key,
      this.clock.set(() => {
        this.timers.delete(key);
        this.advance(key);
      }, Math.max(0, Math.ceil(ms))),
    );
  }

  private disarm(key: string): void {
    const h = this.timers.get(key);
    if (h === undefined) return;
    this.timers.delete(key);
    this.clock.clear(h);
  }

  /**
   * Each backend of `resolve`'s generation among the identities in use (the last `retain`) or with
   * a state, closed when it has none. Order: as retained, then any other with a state.
   */
  views(resolve: BreakerResolve): BreakerView[] {
    // What time did first (a timer may lag behind an `open_ms` shortened since it was armed).
    for (const [key, s] of this.states) if (s.status === 'open') this.advance(key);
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
    const openUntilUnixMs = s.status === 'open' ? Math.round(this.wallNow() + s.openedAt + (this.openPolicy.get(key)?.openMs ?? 0) - this.now()) : null;
    out.push({ upstream: where.upstream, backend: where.backend, state: s.status, failures: s.status === 'closed' ? s.failures : 0, openUntilUnixMs });
  }

  private set(key: string, before: BreakerState, next: BreakerState, policy: BreakerPolicy): void {
    // A closed breaker with no failure is the default: dropping it keeps the map to the backends
    // with something against them.
    if (next.status === 'closed' && next.failures === 0) this.forget(key);
    else this.states.set(key, next);
    if (next.status === 'open') {
      this.openPolicy.set(key, policy);
      this.arm(key, next.openedAt + policy.openMs - this.now());
    } else if (before.status === 'open') {
      this.openPolicy.delete(key);
      this.disarm(key);
    }
    if (before.status !== next.status) this.onTransition?.({ key, from: before.status, to: next.status, failures: before.status === 'closed' ? before.failures + 1 : 0, at: this.now() });
  }

  private forget(key: string): void {
    this.states.delete(key);
    this.openPolicy.delete(key);
    this.disarm(key);
  }

  /** Clears every timer; the registry arms no more (the worker is stopping). */
  close(): void {
    this.closed = true;
    for (const h of this.timers.values()) this.clock.clear(h);
    this.timers.clear();
  }
}
