// The node's circuit breaker of one backend, as a pure policy (SPEC "Circuit breaker (per
// backend)", issue 39 "Circuit breakers per backend, per node"; docs/overload.md "Circuit breakers,
// per node"). The supervisor holds one state per backend identity for every worker: outcomes
// reported by any worker count in the order they reach it, so `failure_threshold` consecutive
// failures are the node's, and `half_open_max_probes` bounds the probes of the node.
//
//   closed ──failure_threshold consecutive failures (within max_ejection_percent)──▶ open
//   open ──open_ms──▶ half_open (no permit out; the worker whose failure opened it waits first)
//   half_open ──a probe succeeds──▶ closed      half_open ──a probe fails──▶ open (a new epoch)
//
// Half-open probes are permits: the supervisor grants one to a worker that asks (a request met the
// half-open breaker there and found no permit), at most `half_open_max_probes` outstanding; a
// worker without one treats the breaker as open. A permit is outstanding until its probe's outcome
// arrives, the worker gives it back unused, or the worker is gone. `epoch` numbers the openings, so
// the outcome of a probe granted in an earlier half-open period decides nothing in this one.
//
// Every function returns the state it was given, the same object, when nothing changes.

/** `resilience.circuit_breaker` of the active generation, as the node applies it. */
export interface NodeBreakerPolicy {
  readonly enabled: boolean;
  readonly failureThreshold: number;
  readonly openMs: number;
  readonly halfOpenMaxProbes: number;
  readonly maxEjectionPercent: number;
}

export type NodeBreakerState =
  | { readonly status: 'closed'; readonly failures: number; readonly epoch: number }
  /** `lastWorker`: the worker whose failure opened it (the first to be offered a probe permit). */
  | { readonly status: 'open'; readonly openedAt: number; readonly epoch: number; readonly lastWorker: number }
  /** `granted`: one worker index per outstanding permit; `waiting`: workers that asked, in order, none twice. */
  | { readonly status: 'half_open'; readonly epoch: number; readonly granted: readonly number[]; readonly waiting: readonly number[] };

export type NodeOutcome = 'success' | 'failure' | 'neutral';

/** A backend never seen failing. */
export const NODE_CLOSED: NodeBreakerState = { status: 'closed', failures: 0, epoch: 0 };

/**
 * An attempt's outcome reported by `worker` at `now`. `probeEpoch`: the epoch of the permit the
 * attempt used (0: none). Closed: a failure counts (opening at the threshold when `mayOpen`, else
 * held closed at the threshold), a success clears the count, neutral changes nothing. Open: nothing
 * counts (attempts begun before it opened report on a backend state that is gone). Half-open: only
 * a probe of this epoch whose worker holds a permit decides: success closes, failure re-opens,
 * neutral gives the permit back (and the next waiting worker gets it).
 */
export function outcome(s: NodeBreakerState, worker: number, o: NodeOutcome, probeEpoch: number, p: NodeBreakerPolicy, now: number, mayOpen = true): NodeBreakerState {
  if (!p.enabled) return s;
  switch (s.status) {
    case 'closed': {
      if (o === 'neutral') return s;
      if (o === 'success') return s.failures === 0 ? s : { status: 'closed', failures: 0, epoch: s.epoch };
      const failures = s.failures + 1;
      if (failures < p.failureThreshold) return { status: 'closed', failures, epoch: s.epoch };
      if (mayOpen) return { status: 'open', openedAt: now, epoch: s.epoch + 1, lastWorker: worker };
      return s.failures === p.failureThreshold ? s : { status: 'closed', failures: p.failureThreshold, epoch: s.epoch };
    }
    case 'open':
      return s;
    case 'half_open': {
      if (probeEpoch !== s.epoch || !s.granted.includes(worker)) return s;
      if (o === 'success') return { status: 'closed', failures: 0, epoch: s.epoch };
      if (o === 'failure') return { status: 'open', openedAt: now, epoch: s.epoch + 1, lastWorker: worker };
      return fill(release(s, worker), p);
    }
  }
}

/** `worker` asks for a probe permit: granted while fewer than `half_open_max_probes` are out, else it waits (once). */
export function ask(s: NodeBreakerState, worker: number, p: NodeBreakerPolicy): NodeBreakerState {
  if (!p.enabled || s.status !== 'half_open') return s;
  if (s.waiting.includes(worker)) return s;
  return fill({ status: 'half_open', epoch: s.epoch, granted: s.granted, waiting: [...s.waiting, worker] }, p);
}

/** `worker` gives back an unused permit of `epoch` (one it held idle): the next waiting worker gets it. */
export function giveBack(s: NodeBreakerState, worker: number, epoch: number, p: NodeBreakerPolicy): NodeBreakerState {
  if (s.status !== 'half_open' || s.epoch !== epoch || !s.granted.includes(worker)) return s;
  return fill(release(s, worker), p);
}

/** `worker` is gone (exited, killed): its permits return to the node and it waits no more. */
export function workerGone(s: NodeBreakerState, worker: number, p: NodeBreakerPolicy): NodeBreakerState {
  if (s.status === 'open') return s.lastWorker === worker ? { status: 'open', openedAt: s.openedAt, epoch: s.epoch, lastWorker: -1 } : s;
  if (s.status !== 'half_open' || (!s.granted.includes(worker) && !s.waiting.includes(worker))) return s;
  return fill({ status: 'half_open', epoch: s.epoch, granted: s.granted.filter((w) => w !== worker), waiting: s.waiting.filter((w) => w !== worker) }, p);
}

/**
 * What time did at `now`: an open breaker whose `open_ms` elapsed is half-open, with the worker
 * whose failure opened it offered the first permit (it is where the backend's traffic was).
 */
export function due(s: NodeBreakerState, p: NodeBreakerPolicy, now: number): NodeBreakerState {
  if (!p.enabled || s.status !== 'open' || now - s.openedAt < p.openMs) return s;
  return fill({ status: 'half_open', epoch: s.epoch, granted: [], waiting: s.lastWorker < 0 ? [] : [s.lastWorker] }, p);
}

/** Moves waiting workers to permits while fewer than `half_open_max_probes` are out. */
export function fill(s: NodeBreakerState, p: NodeBreakerPolicy): NodeBreakerState {
  if (s.status !== 'half_open' || s.waiting.length === 0 || s.granted.length >= p.halfOpenMaxProbes) return s;
  const room = p.halfOpenMaxProbes - s.granted.length;
  return { status: 'half_open', epoch: s.epoch, granted: [...s.granted, ...s.waiting.slice(0, room)], waiting: s.waiting.slice(room) };
}

function release(s: Extract<NodeBreakerState, { status: 'half_open' }>, worker: number): Extract<NodeBreakerState, { status: 'half_open' }> {
  const i = s.granted.indexOf(worker);
  return { status: 'half_open', epoch: s.epoch, granted: [...s.granted.slice(0, i), ...s.granted.slice(i + 1)], waiting: s.waiting };
}

/** Permits each worker gained from `before` to `after` (the grants to send): worker → count. */
export function grants(before: NodeBreakerState, after: NodeBreakerState): Map<number, number> {
  const out = new Map<number, number>();
  if (after.status !== 'half_open') return out;
  const had = before.status === 'half_open' && before.epoch === after.epoch ? before.granted : [];
  const count = (xs: readonly number[], w: number): number => xs.reduce((n, x) => n + (x === w ? 1 : 0), 0);
  for (const w of new Set(after.granted)) {
    const gained = count(after.granted, w) - count(had, w);
    if (gained > 0) out.set(w, gained);
  }
  return out;
}

/** Whether a closed breaker is held closed by the ejection bound (failures never stay at the threshold otherwise). */
export function held(s: NodeBreakerState, p: NodeBreakerPolicy): boolean {
  return s.status === 'closed' && s.failures >= p.failureThreshold;
}

/**
 * Whether one more backend of a pool of `poolSize` may be ejected while `ejected` of them are (open
 * or half-open) node-wide: at most `max_ejection_percent`, rounded down, at least one above 0.
 */
export function ejectionAllowed(ejected: number, poolSize: number, p: NodeBreakerPolicy): boolean {
  if (p.maxEjectionPercent <= 0) return false;
  return ejected < Math.max(1, Math.floor((poolSize * p.maxEjectionPercent) / 100));
}
