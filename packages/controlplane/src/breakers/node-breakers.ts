// The node's circuit breakers (issue 39 Deliver 3; docs/overload.md "Circuit breakers, per node"):
// the supervisor owns the one state of each backend's breaker (breakers/node-breaker.ts, pure),
// driven by the outcomes workers report (`breaker-report`, coalesced per event-loop turn) and by
// time (an unref'd timer per open breaker). Every change a worker must act on is broadcast to every
// worker at once (`breakers`): open, half-open, closed, and a closed breaker's node-wide count
// (a worker reports its next success only while the node counts failures, and refuses the backend
// at once when that count and its own failures since reach the threshold; a held breaker is
// told to the worker that failed).
// Probe permits go to the worker that asked (or, on half-open, to the worker whose failure opened
// it); a worker gone gives its permits back to the node. The supervisor logs each transition once
// for the node, counts the openings the ejection bound refused, and serves
// `svc_circuit_breaker_state` (one series per backend, the node's state).
import type { ResolvedConfig } from '@edge-proxy/config';
import type { BreakerReportEntry, BreakerStatus, FromWorker, NodeBreakerNotice, ToWorker } from '@edge-proxy/ipc';
import type { Logger, Metrics } from '@edge-proxy/telemetry';
import { NODE_CLOSED, ask, due, ejectionAllowed, giveBack, grants, held, outcome, workerGone } from './node-breaker.ts';
import type { NodeBreakerPolicy, NodeBreakerState } from './node-breaker.ts';

type BreakersNotice = Extract<ToWorker, { type: 'breakers' }>;
type Report = Extract<FromWorker, { type: 'breaker-report' }>;

/** Where the notices go: every worker, or one (a grant). */
export interface BreakerSink {
  broadcast(notice: BreakersNotice): void;
  send(worker: number, notice: BreakersNotice): void;
}

/** Timers and clocks of the node breakers (injected by tests). */
export interface NodeBreakerClock {
  /** Monotonic ms: what `open_ms` is measured on. */
  now(): number;
  /** Unix ms, for the views. */
  wallNow(): number;
  /** The `sentAt` stamp of a notice (`performance.timeOrigin + performance.now()`: comparable across the node's processes). */
  stamp(): number;
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const NODE_CLOCK: NodeBreakerClock = {
  now: () => performance.now(),
  wallNow: () => Date.now(),
  stamp: () => performance.timeOrigin + performance.now(),
  set: (fn, ms) => setTimeout(fn, ms).unref(),
  clear: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** `svc_circuit_breaker_state` values: the higher, the less the backend is used. */
export const BREAKER_STATE_VALUE: Readonly<Record<BreakerStatus, number>> = { closed: 0, half_open: 1, open: 2 };

/** One backend's node breaker, for the snapshot and the gauge. */
export interface NodeBreakerView {
  readonly state: BreakerStatus;
  readonly failures: number;
  readonly openUntilUnixMs: number | null;
}

const OFF: NodeBreakerPolicy = { enabled: false, failureThreshold: 3, openMs: 30_000, halfOpenMaxProbes: 1, maxEjectionPercent: 50 };

/** The node policy of a generation's `resilience.circuit_breaker`. */
export function nodeBreakerPolicy(c: ResolvedConfig['config']['resilience']['circuit_breaker']): NodeBreakerPolicy {
  return { enabled: c.enabled, failureThreshold: c.failure_threshold, openMs: c.open_ms, halfOpenMaxProbes: c.half_open_max_probes, maxEjectionPercent: c.max_ejection_percent };
}

const nameId = (upstream: string, backend: string): string => `${upstream}\u0000${backend}`;

export class NodeBreakers {
  private readonly states = new Map<string, NodeBreakerState>();
  /** Backend identity → its names (from the reports). */
  private readonly where = new Map<string, { readonly upstream: string; readonly backend: string }>();
  /** upstream/backend names → the identity last reported under them (the views'). */
  private readonly byName = new Map<string, string>();
  /** Backend identity → the identities of its pool (from the reports: the ejection bound's pool). */
  private readonly pools = new Map<string, readonly string[]>();
  /** The half-open timer of each open breaker. */
  private readonly timers = new Map<string, unknown>();
  private readonly capped = new Map<string, ReturnType<Metrics['counterSeries']>>();
  private policy: NodeBreakerPolicy = OFF;
  private backends: readonly { readonly upstream: string; readonly backend: string }[] = [];
  /** What the turn being processed changed: broadcast, and granted per worker. */
  private readonly changed = new Set<string>();
  private readonly granted = new Map<number, Map<string, number>>();
  /** Held breakers a worker reported a failure for, to tell it (not broadcast). */
  private readonly direct = new Map<number, Set<string>>();
  private closed = false;

  private readonly sink: BreakerSink;
  private readonly metrics: Metrics;
  private readonly log: Pick<Logger, 'info' | 'warn'>;
  private readonly clock: NodeBreakerClock;

  constructor(sink: BreakerSink, metrics: Metrics, log: Pick<Logger, 'info' | 'warn'>, clock: NodeBreakerClock = NODE_CLOCK) {
    this.sink = sink;
    this.metrics = metrics;
    this.log = log;
    this.clock = clock;
    metrics.onCollect('svc_circuit_breaker_state', () => {
      const g = metrics.gauge('svc_circuit_breaker_state');
      g.reset();
      for (const { upstream, backend } of this.backends) g.set({ upstream, backend }, BREAKER_STATE_VALUE[this.view(upstream, backend).state]);
    });
  }

  /**
   * The active generation's policy and backends. Disabled: every breaker is forgotten (closed for
   * every worker); a changed `open_ms` applies to breakers already open; a backend no longer
   * configured is forgotten.
   */
  configure(resolved: ResolvedConfig): void {
    const c = resolved.config;
    this.policy = nodeBreakerPolicy(c.resilience.circuit_breaker);
    this.backends = Object.values(c.upstream).flatMap((u) => u.backends.map((b) => ({ upstream: u.name, backend: b.id })));
    const names = new Set(this.backends.map((b) => nameId(b.upstream, b.backend)));
    for (const [key, s] of this.states) {
      const w = this.where.get(key);
      if (!this.policy.enabled || w === undefined || !names.has(nameId(w.upstream, w.backend))) {
        this.forget(key);
        if (s.status !== 'closed' || s.failures > 0) this.changed.add(key);
      } else if (s.status === 'open') this.advance(key);
    }
    for (const [n, key] of this.byName) if (!names.has(n) || !this.states.has(key)) this.byName.delete(n);
    this.flush();
  }

  /** One worker's turn of outcomes, permit asks and permits given back. */
  report(worker: number, r: Report): void {
    if (this.closed) return;
    const now = this.clock.now();
    for (const e of r.outcomes) this.outcome(worker, e, now);
    if (this.policy.enabled) {
      for (const key of r.asks) {
        const s = this.states.get(key);
        if (s !== undefined) this.update(key, s, ask(s, worker, this.policy));
      }
      for (const { key, epoch } of r.returns) {
        const s = this.states.get(key);
        if (s !== undefined) this.update(key, s, giveBack(s, worker, epoch, this.policy));
      }
    }
    this.flush();
  }

  /** A worker exited or was killed: its permits return to the node (granted to the next waiting worker). */
  workerGone(worker: number): void {
    for (const [key, s] of this.states) this.update(key, s, workerGone(s, worker, this.policy));
    this.flush();
  }

  /** What a new worker is told after `init`: every breaker the node holds that is not plainly closed. */
  greeting(): ToWorker[] {
    const states: NodeBreakerNotice[] = [];
    for (const [key, s] of this.states) if (s.status !== 'closed' || s.failures > 0) states.push(this.notice(key, s, 0));
    return states.length === 0 ? [] : [{ type: 'breakers', states, sentAt: this.clock.stamp() }];
  }

  /** The node's breaker of a configured backend (closed when nothing is held against it). */
  view(upstream: string, backend: string): NodeBreakerView {
    const key = this.byName.get(nameId(upstream, backend));
    const s = key === undefined ? undefined : this.states.get(key);
    if (s === undefined) return { state: 'closed', failures: 0, openUntilUnixMs: null };
    return { state: s.status, failures: s.status === 'closed' ? s.failures : 0, openUntilUnixMs: s.status === 'open' ? this.openUntil(s) : null };
  }

  /** Clears every timer; no more are armed (the supervisor is stopping). */
  close(): void {
    this.closed = true;
    for (const h of this.timers.values()) this.clock.clear(h);
    this.timers.clear();
  }

  private outcome(worker: number, e: BreakerReportEntry, now: number): void {
    if (!this.policy.enabled) return;
    this.where.set(e.key, { upstream: e.upstream, backend: e.backend });
    this.byName.set(nameId(e.upstream, e.backend), e.key);
    if (e.pool.length > 0) this.pools.set(e.key, e.pool);
    const before = this.states.get(e.key) ?? NODE_CLOSED;
    let next = outcome(before, worker, e.outcome, e.probeEpoch, this.policy, now);
    if (next.status === 'open' && before.status === 'closed') {
      // Opening ejects one more backend of the pool: only within max_ejection_percent, node-wide.
      const members = this.pools.get(e.key);
      const ejected = members === undefined ? 0 : this.ejected(members);
      if (members !== undefined && !ejectionAllowed(ejected, members.length, this.policy)) {
        next = outcome(before, worker, e.outcome, e.probeEpoch, this.policy, now, false);
        this.hold(e.upstream, e.backend, ejected, members.length, !held(before, this.policy));
      }
    }
    this.update(e.key, before, next);
    // Held closed: the worker that failed is told (it refused provisionally until the node answered).
    if (e.outcome === 'failure' && held(next, this.policy) && !this.changed.has(e.key)) {
      let m = this.direct.get(worker);
      if (m === undefined) this.direct.set(worker, (m = new Set()));
      m.add(e.key);
    }
  }

  private ejected(members: readonly string[]): number {
    let n = 0;
    for (const k of members) {
      const st = this.states.get(k)?.status;
      if (st === 'open' || st === 'half_open') n++;
    }
    return n;
  }

  private hold(upstream: string, backend: string, ejected: number, poolSize: number, first: boolean): void {
    let series = this.capped.get(upstream);
    if (series === undefined) this.capped.set(upstream, (series = this.metrics.counterSeries('svc_circuit_breaker_ejections_capped_total', { upstream })));
    series.inc();
    // One line when a backend is first held, not one per failure while it stays held.
    if (first) this.log.warn({ upstream, backend, ejected, pool_size: poolSize, max_ejection_percent: this.policy.maxEjectionPercent }, 'circuit breaker held closed: max_ejection_percent of the pool is already ejected, the failing backend keeps serving');
  }

  /** Keeps `next`, arms or clears the timer, logs a transition, and notes what to send. */
  private update(key: string, before: NodeBreakerState, next: NodeBreakerState): void {
    if (next === before) return;
    this.states.set(key, next);
    if (next.status === 'open') this.arm(key, next.openedAt + this.policy.openMs - this.clock.now());
    else if (before.status === 'open') this.disarm(key);
    if (before.status !== next.status) this.transition(key, before, next);
    // Workers act on the status, on a new epoch, and on the node's count (a worker refuses at once
    // when that count and its own failures since reach the threshold).
    if (before.status !== next.status || before.epoch !== next.epoch || (before.status === 'closed' && next.status === 'closed' && before.failures !== next.failures)) this.changed.add(key);
    for (const [w, n] of grants(before, next)) {
      let m = this.granted.get(w);
      if (m === undefined) this.granted.set(w, (m = new Map()));
      m.set(key, (m.get(key) ?? 0) + n);
    }
  }

  private transition(key: string, before: NodeBreakerState, next: NodeBreakerState): void {
    const w = this.where.get(key);
    const fields = { upstream: w?.upstream ?? null, backend: w?.backend ?? null, from: before.status, to: next.status, ...(next.status === 'open' && before.status === 'closed' ? { consecutive_failures: before.failures + 1 } : {}), ...(next.status === 'open' ? { open_ms: this.policy.openMs } : {}) };
    if (next.status === 'open') this.log.warn(fields, before.status === 'closed' ? 'circuit breaker opened: backend failing, not picked until open_ms elapsed' : 'circuit breaker re-opened: the half-open probe failed');
    else if (next.status === 'half_open') this.log.info(fields, 'circuit breaker half-open: open_ms elapsed, the next request probes the backend');
    else this.log.info(fields, 'circuit breaker closed: the probe succeeded');
  }

  /** Sends what the turn changed: one broadcast of every changed breaker, then each worker's grants. */
  private flush(): void {
    if (this.changed.size > 0) {
      const states = [...this.changed].map((key) => this.notice(key, this.states.get(key) ?? NODE_CLOSED, 0));
      this.changed.clear();
      this.sink.broadcast({ type: 'breakers', states, sentAt: this.clock.stamp() });
    }
    if (this.direct.size > 0) {
      const all = [...this.direct];
      this.direct.clear();
      for (const [w, keys] of all) this.sink.send(w, { type: 'breakers', states: [...keys].map((key) => this.notice(key, this.states.get(key) ?? NODE_CLOSED, 0)), sentAt: this.clock.stamp() });
    }
    if (this.granted.size > 0) {
      const all = [...this.granted];
      this.granted.clear();
      for (const [w, keys] of all) this.sink.send(w, { type: 'breakers', states: [...keys].map(([key, n]) => this.notice(key, this.states.get(key) ?? NODE_CLOSED, n)), sentAt: this.clock.stamp() });
    }
  }

  private notice(key: string, s: NodeBreakerState, permits: number): NodeBreakerNotice {
    return { key, status: s.status, failures: s.status === 'closed' ? s.failures : 0, held: held(s, this.policy), epoch: s.epoch, openUntilUnixMs: s.status === 'open' ? this.openUntil(s) : null, permits };
  }

  private openUntil(s: Extract<NodeBreakerState, { status: 'open' }>): number {
    return Math.round(this.clock.wallNow() + s.openedAt + this.policy.openMs - this.clock.now());
  }

  /** Applies what time did to an open breaker (half-open once `open_ms` elapsed), else re-arms its timer. */
  private advance(key: string): void {
    const s = this.states.get(key);
    if (s === undefined || s.status !== 'open') return;
    const next = due(s, this.policy, this.clock.now());
    if (next !== s) this.update(key, s, next);
    else this.arm(key, s.openedAt + this.policy.openMs - this.clock.now());
  }

  private arm(key: string, ms: number): void {
    this.disarm(key);
    if (this.closed) return;
    this.timers.set(
      key,
      this.clock.set(() => {
        this.timers.delete(key);
        this.advance(key);
        this.flush();
      }, Math.max(0, Math.ceil(ms))),
    );
  }

  private disarm(key: string): void {
    const h = this.timers.get(key);
    if (h === undefined) return;
    this.timers.delete(key);
    this.clock.clear(h);
  }

  private forget(key: string): void {
    this.states.delete(key);
    this.pools.delete(key);
    this.disarm(key);
  }
}
