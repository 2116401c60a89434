// The circuit breakers of a worker under a supervisor (issue 39 Deliver 3; docs/overload.md
// "Circuit breakers, per node"): the node's state of each backend, as the supervisor broadcast it,
// and what this worker tells the supervisor. The supervisor decides every transition (its
// breakers/node-breakers.ts); a worker never opens, half-opens or closes a breaker on its own.
//
// The request path calls the same methods as on a BreakerRegistry (a worker without a supervisor),
// all synchronous and without a round trip:
// - `mayTry`: closed yes; open no, until the supervisor says half-open, whatever the time (a frozen
//   supervisor keeps an open breaker open: probing without it could exceed `half_open_max_probes`
//   for the node); half-open only with a probe permit of this worker, else it asks for one (once)
//   and the request goes elsewhere or is shed as for an open breaker.
// - `begin`: takes a permit for a probe (the epoch it was granted in travels with its outcome).
// - `record`: an outcome travels only when the node can use it: a failure while closed, the first
//   success while the node counts failures (or after this worker's own failure), and every probe's
//   outcome. A success while the node counts nothing costs one map miss. When the node's count as
//   last told plus this worker's own failures since reach `failure_threshold`, the worker refuses
//   the backend at once (provisionally open) instead of one message later: the node's count is at
//   least that unless a success on another worker came between, and the node's next notice for the
//   backend (open; or its new count; or held by max_ejection_percent) replaces it. So one worker
//   taking all the traffic sends exactly `failure_threshold` failures to a dead backend, and the
//   node as a whole at most one more per worker whose request raced the broadcast.
// What a turn of the event loop produced goes in one `breaker-report` message (setImmediate).
// A permit this worker leaves unused for PERMIT_IDLE_MS goes back, so another worker may probe.
import type { BreakerReportEntry, FromWorker, NodeBreakerNotice } from '@edge-proxy/ipc';
import type { BreakerOutcome, BreakerPolicy } from './circuit-breaker.ts';
import type { BreakerResolve, Breakers } from './breaker-registry.ts';
import type { BreakerStatus, BreakerView } from './overload-view.ts';

/** How long a probe permit may stay unused on this worker before it goes back to the node, ms. */
export const PERMIT_IDLE_MS = 1000;

type Report = Extract<FromWorker, { type: 'breaker-report' }>;

type Mirror =
  /**
   * `failures`: the node's count as last told; `own`: this worker's failures reported since; `owe`:
   * this worker reports its next success (the node counts failures, or this worker just failed);
   * `held`: the node holds it closed (max_ejection_percent); `provisional`: refused here until the
   * node answers, because the node's count and this worker's own failures reach the threshold.
   */
  | { status: 'closed'; failures: number; own: number; owe: boolean; held: boolean; provisional: boolean }
  | { status: 'open'; epoch: number; openUntilUnixMs: number | null }
  | { status: 'half_open'; epoch: number; permits: number; asked: boolean; idle: unknown };

/** One notice applied: the status before and after, and how long after the supervisor sent it (ms). */
export interface BreakerApplied {
  readonly key: string;
  readonly from: BreakerStatus;
  readonly to: BreakerStatus;
  readonly permits: number;
  /** The supervisor's `sentAt` and this worker's clock when applied (`performance.timeOrigin + performance.now()`). */
  readonly sentAt: number;
  readonly appliedAt: number;
}

export interface FollowerOptions {
  /** Sends a report to the supervisor (throws or drops when it is gone: the report is lost, the state kept). */
  readonly send: (r: Report) => void;
  /** Upstream/backend names of an identity in the active generation. */
  readonly where: (key: string) => { readonly upstream: string; readonly backend: string } | undefined;
  readonly onApply?: (a: BreakerApplied) => void;
  /** Injected by tests. */
  readonly timers?: { set(fn: () => void, ms: number): unknown; clear(h: unknown): void };
  readonly defer?: (fn: () => void) => void;
  readonly stamp?: () => number;
}

export class BreakerFollower implements Breakers {
  private readonly states = new Map<string, Mirror>();
  /** Epochs of the probes this worker has in flight, per identity (in the order they began). */
  private readonly probes = new Map<string, number[]>();
  private pool: ReadonlyMap<string, readonly string[]> = new Map();
  private known: ReadonlySet<string> = new Set();
  private outcomes: BreakerReportEntry[] = [];
  private asks: string[] = [];
  private returns: { key: string; epoch: number }[] = [];
  private scheduled = false;
  private closed = false;
  private readonly timers: NonNullable<FollowerOptions['timers']>;
  private readonly defer: (fn: () => void) => void;
  private readonly stamp: () => number;

  private readonly opts: FollowerOptions;

  constructor(opts: FollowerOptions) {
    this.opts = opts;
    this.timers = opts.timers ?? { set: (fn, ms) => setTimeout(fn, ms).unref(), clear: (h) => clearTimeout(h as NodeJS.Timeout) };
    this.defer = opts.defer ?? ((fn) => setImmediate(fn).unref());
    this.stamp = opts.stamp ?? (() => performance.timeOrigin + performance.now());
  }

  pools(groups: Iterable<readonly string[]>): void {
    const pool = new Map<string, readonly string[]>();
    for (const g of groups) for (const key of g) pool.set(key, g);
    this.pool = pool;
  }

  mayTry(key: string, policy: BreakerPolicy): boolean {
    if (!policy.enabled) return true;
    const s = this.states.get(key);
    if (s === undefined) return true;
    if (s.status === 'closed') return !s.provisional;
    if (s.status === 'open') return false;
    if (s.permits > 0) return true;
    if (!s.asked) {
      s.asked = true;
      this.asks.push(key);
      this.schedule();
    }
    return false;
  }

  begin(key: string, policy: BreakerPolicy): boolean {
    if (!policy.enabled) return false;
    const s = this.states.get(key);
    if (s === undefined || s.status !== 'half_open' || s.permits === 0) return false;
    s.permits--;
    if (s.permits === 0) this.stopIdle(s);
    let list = this.probes.get(key);
    if (list === undefined) this.probes.set(key, (list = []));
    list.push(s.epoch);
    return true;
  }

  record(key: string, outcome: BreakerOutcome, probe: boolean, policy: BreakerPolicy): void {
    if (!policy.enabled) {
      if (this.states.has(key)) this.forget(key);
      return;
    }
    if (probe) {
      const list = this.probes.get(key);
      const epoch = list?.shift() ?? 0;
      if (list !== undefined && list.length === 0) this.probes.delete(key);
      if (epoch !== 0) {
        this.report(key, outcome, epoch);
        return;
      }
    }
    if (outcome === 'neutral') return;
    const s = this.states.get(key);
    if (outcome === 'success') {
      if (s === undefined || s.status !== 'closed' || !s.owe) return;
      s.owe = false;
      if (s.failures === 0 && !s.provisional) this.states.delete(key);
      this.report(key, outcome, 0);
      return;
    }
    // A failure: the node counts it only while closed (an open or half-open breaker counts probes alone).
    if (s !== undefined && s.status !== 'closed') return;
    if (!this.report(key, outcome, 0)) return;
    const c = s ?? { status: 'closed', failures: 0, own: 0, owe: true, held: false, provisional: false };
    if (s === undefined) this.states.set(key, c);
    c.owe = true;
    c.own++;
    // The node will count at least this many in a row unless a success elsewhere came between: refuse
    // here now rather than one message later (the node's next notice for the backend decides).
    if (!c.held && c.failures + c.own >= policy.failureThreshold) c.provisional = true;
  }

  /** Applies the supervisor's notice (a broadcast, or this worker's grants). */
  apply(states: readonly NodeBreakerNotice[], sentAt: number): void {
    for (const n of states) {
      const before = this.states.get(n.key);
      // The node's status before (a provisional refusal is this worker's, not the node's: closed).
      const from: BreakerStatus = before?.status ?? 'closed';
      if (n.status === 'closed') {
        if (before?.status === 'half_open') this.stopIdle(before);
        // A held breaker stays at failure_threshold (the node said so: it keeps serving here).
        if (n.failures > 0) this.states.set(n.key, { status: 'closed', failures: n.failures, own: 0, owe: true, held: n.held, provisional: false });
        else this.states.delete(n.key);
      } else if (n.status === 'open') {
        if (before?.status === 'half_open') this.stopIdle(before);
        this.states.set(n.key, { status: 'open', epoch: n.epoch, openUntilUnixMs: n.openUntilUnixMs });
      } else if (before?.status === 'half_open' && before.epoch === n.epoch) {
        before.permits += n.permits;
        if (n.permits > 0) {
          before.asked = false;
          this.startIdle(n.key, before);
        }
      } else {
        if (before?.status === 'half_open') this.stopIdle(before);
        const s: Mirror = { status: 'half_open', epoch: n.epoch, permits: n.permits, asked: false, idle: undefined };
        this.states.set(n.key, s);
        if (n.permits > 0) this.startIdle(n.key, s);
      }
      this.opts.onApply?.({ key: n.key, from, to: n.status, permits: n.permits, sentAt, appliedAt: this.stamp() });
    }
  }

  views(resolve: BreakerResolve): BreakerView[] {
    const out: BreakerView[] = [];
    for (const key of this.known) this.view(key, resolve, out);
    for (const key of this.states.keys()) if (!this.known.has(key)) this.view(key, resolve, out);
    return out;
  }

  status(key: string): BreakerStatus {
    const s = this.states.get(key);
    if (s === undefined) return 'closed';
    return s.status === 'closed' && s.provisional ? 'open' : s.status;
  }

  retain(keys: ReadonlySet<string>): void {
    this.known = new Set(keys);
    for (const key of this.states.keys()) if (!keys.has(key)) this.forget(key);
  }

  /** Stops the idle timers and sends nothing more (the worker is stopping). */
  close(): void {
    this.closed = true;
    for (const s of this.states.values()) if (s.status === 'half_open') this.stopIdle(s);
  }

  private view(key: string, resolve: BreakerResolve, out: BreakerView[]): void {
    const where = resolve(key);
    if (where === undefined) return;
    const s = this.states.get(key);
    const state = this.status(key);
    out.push({ upstream: where.upstream, backend: where.backend, state, failures: s?.status === 'closed' && state === 'closed' ? s.failures : 0, openUntilUnixMs: s?.status === 'open' ? s.openUntilUnixMs : null });
  }

  /** Queues an outcome for the supervisor; false when the identity is not in the active generation (not sent). */
  private report(key: string, outcome: BreakerOutcome, probeEpoch: number): boolean {
    const where = this.opts.where(key);
    if (where === undefined) return false;
    this.outcomes.push({ key, upstream: where.upstream, backend: where.backend, pool: this.pool.get(key) ?? [], outcome, probeEpoch });
    this.schedule();
    return true;
  }

  private schedule(): void {
    if (this.scheduled || this.closed) return;
    this.scheduled = true;
    this.defer(() => this.flush());
  }

  /** Sends what this turn produced, in one message. */
  private flush(): void {
    this.scheduled = false;
    if (this.outcomes.length === 0 && this.asks.length === 0 && this.returns.length === 0) return;
    const r: Report = { type: 'breaker-report', outcomes: this.outcomes, asks: this.asks, returns: this.returns };
    this.outcomes = [];
    this.asks = [];
    this.returns = [];
    try {
      this.opts.send(r);
    } catch {
      /* the supervisor is gone: the node's state stays as last told */
    }
  }

  private startIdle(key: string, s: Extract<Mirror, { status: 'half_open' }>): void {
    this.stopIdle(s);
    if (this.closed) return;
    s.idle = this.timers.set(() => {
      s.idle = undefined;
      if (this.states.get(key) !== s || s.permits === 0) return;
      // Unused: back to the node, one entry per permit, so that a worker with traffic may probe.
      for (let i = 0; i < s.permits; i++) this.returns.push({ key, epoch: s.epoch });
      s.permits = 0;
      this.schedule();
    }, PERMIT_IDLE_MS);
  }

  private stopIdle(s: Extract<Mirror, { status: 'half_open' }>): void {
    if (s.idle === undefined) return;
    this.timers.clear(s.idle);
    s.idle = undefined;
  }

  private forget(key: string): void {
    const s = this.states.get(key);
    if (s?.status === 'half_open') this.stopIdle(s);
    this.states.delete(key);
    this.probes.delete(key);
  }
}
