// When the supervisor may tell systemd "WATCHDOG=1", as a pure policy. A ping is a claim that the
// node works, so it is sent only while the supervisor's own checks pass:
// - its event loop turns (the ping timer itself runs on it: a blocked loop sends nothing);
// - the worker pool is ready (every worker serves the active generation and was heard from
//   recently, nothing draining), or it is on its way back: a worker re-forked and serving again, a
//   rolling-restart step, within `stallLimitMs` of each other.
// A pool that stays not ready with nothing coming back (workers drained by a restart whose
// `restart_command` never restarted the service, a slot whose re-forks all fail, workers the
// supervisor no longer hears from) withholds the pings, and `WatchdogSec=` restarts the service.
import { REFORK_BACKOFF } from '../supervisor/liveness.ts';

/**
 * How long a restart step may take before the pool counts as wedged: the pool's own deadline for
 * a re-forked slot to serve again (2 × its 30 s phase timeout), after the drain grace of the
 * worker it replaces, plus the longest re-fork backoff.
 */
export function stallLimitMs(drainGraceMs: number): number {
  return drainGraceMs + 2 * 30_000 + REFORK_BACKOFF.maxMs;
}

export interface GateState {
  /** When the pool was last ready or last made progress (ms since the epoch). */
  readonly lastGoodAt: number;
  /** Why pings are withheld now; undefined while they are sent. */
  readonly withheld: string | undefined;
}

/** What the supervisor sees at one tick of the ping timer. */
export interface GateObservation {
  readonly now: number;
  /** Every worker serves the active generation, was heard from recently; no restart under way. */
  readonly ready: boolean;
  /** Latest progress of a pool on its way back (a worker serving again, a restart step), if any. */
  readonly progressAt: number | undefined;
  readonly stallLimitMs: number;
}

export interface GateStep {
  readonly state: GateState;
  readonly ping: boolean;
  /** Pings stop (`withheld`) or start again (`resumed`) at this tick: the caller logs it once. */
  readonly transition: 'withheld' | 'resumed' | undefined;
}

export function initialGate(now: number): GateState {
  return { lastGoodAt: now, withheld: undefined };
}

/** One tick: ping or not, and whether that changed. */
export function stepGate(s: GateState, o: GateObservation): GateStep {
  const lastGoodAt = Math.max(s.lastGoodAt, o.ready ? o.now : -Infinity, o.progressAt ?? -Infinity);
  const stalledMs = o.now - lastGoodAt;
  const withheld = stalledMs > o.stallLimitMs ? `worker pool not ready for ${Math.round(stalledMs)} ms with no worker coming back (limit ${o.stallLimitMs} ms)` : undefined;
  const transition = withheld !== undefined && s.withheld === undefined ? 'withheld' : withheld === undefined && s.withheld !== undefined ? 'resumed' : undefined;
  return { state: { lastGoodAt, withheld }, ping: withheld === undefined, transition };
}
