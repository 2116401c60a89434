// A worker's overload protection, one object shared by every generation (its state outlives
// swaps; its policy is read from the generation of each request, so every key is live): in-flight
// slots (global, per upstream and per backend), the route queues,
// adaptive admission, brownout and the circuit breaker of each backend. The request phases of
// proxy/pipeline.ts call it in the SPEC's order: brownout, admission (global slot, adaptive limit),
// per-upstream and per-backend limits, breaker. docs/overload.md explains the policies.
//
// The in-flight limits are the node's: slots leased from the supervisor (lease.ts, docs/overload.md
// "One node, one set of limits"). A request takes a slot from its worker's lease synchronously;
// when the lease holds none it waits for the supervisor's answer (a lease wait, at most
// LEASE_WAIT_MS), and is queued or refused only once the node has no slot free. Without a
// supervisor (a standalone worker) the leases hold the whole limits (solo).
//
// Adaptive admission and brownout are the node's too (docs/overload.md "Adaptive admission",
// "Brownout"): the supervisor steps one adaptive limit, which is its `global` budget's limit, from
// the windows every worker reports (admission-report.ts), and decides one brownout state from the
// node's in-flight count; a worker admits from its lease only and sheds non-core routes while the
// node's state it last heard says active. Solo, the worker decides both alone with the same policy.
import type { Metrics, CounterSeries } from '@edge-proxy/telemetry';
import type { ResolvedConfig } from '@edge-proxy/config';
import { AdaptiveLimit } from './adaptive-limit.ts';
import { Brownout } from './brownout.ts';
import type { BrownoutPolicy } from './brownout.ts';
import type { AdmissionReport, LeaseAsk, LeaseGrant, NodeAdmissionNotice } from '@edge-proxy/ipc';
import { AdmissionReporter } from './admission-report.ts';
import { backendBudgetKey, backendLimitBinds } from '@edge-proxy/ipc';
import { LEASE_WAIT_MS, LeaseTable } from './lease.ts';
import type { Lease } from './lease.ts';
import { RouteQueues } from './route-queue.ts';
import { QueuePlaces } from './queue-places.ts';
import type { PlaceVerdict, Places } from './queue-places.ts';
import type { TokenLeases } from './token-lease.ts';
import type { Waiter as QueueWaiter } from './route-queue.ts';
import { breakerOutcome, breakerPolicy } from './breaker-registry.ts';
import type { BreakerPolicy, Breakers } from './breaker-registry.ts';
import type { AdmissionView, BreakerView, OverloadSource } from './overload-view.ts';
import type { ForwardResult } from '../proxy/forward.ts';
import { ERR } from '../errors.ts';
import type { RequestError } from '../errors.ts';

type Config = ResolvedConfig['config'];

/** A generation's overload policies, built once when it is provisioned (not per request). */
export interface OverloadPolicies {
  readonly breaker: BreakerPolicy;
  readonly brownout: BrownoutPolicy;
}

/** The policies of a configuration. */
export function overloadPolicies(config: Config): OverloadPolicies {
  const b = config.resilience.brownout;
  return { breaker: breakerPolicy(config.resilience.circuit_breaker), brownout: { enabled: b.enabled, triggerInflightPercent: b.trigger_inflight_percent, recoverInflightPercent: b.recover_inflight_percent } };
}

/** What the control reads of a request's generation. */
interface Gen {
  readonly config: Config;
  readonly policies: OverloadPolicies;
}

/** What a queued request waited for (`svc_inflight_wait_admit_total{scope}`). */
export type QueueScope = 'global' | 'upstream' | 'backend';

/** The `svc_overload_shed_by_reason_total` reason of each shed error. */
const SHED_REASONS = {
  EDGE_SHED_BROWNOUT: 'brownout',
  EDGE_SHED_QUEUE_FULL: 'queue_full',
  EDGE_SHED_QUEUE_TIMEOUT: 'queue_timeout',
  EDGE_SHED_CIRCUIT_OPEN: 'circuit_open',
  EDGE_SHED_LEASE_UNAVAILABLE: 'lease_unavailable',
} as const;

/** The shed reason of an error (`brownout`, `queue_full`, ...), or undefined when it is no shed. */
export function shedReason(err: RequestError): string | undefined {
  return (SHED_REASONS as Record<string, string>)[err.code];
}

/** The budget key of pool `name`'s in-flight limit (the supervisor's limits/lease-service.ts names it the same). */
export function upstreamLeaseKey(name: string): string {
  return `upstream:${name}`;
}

/** The prefix of the per-backend budget keys (`backendBudgetKey`). */
const BACKEND_PREFIX = backendBudgetKey('', '').slice(0, -1);

/** A request waiting in a route queue or for its lease (proxy/pipeline.ts `RequestContext`). */
export interface Waiter extends QueueWaiter {
  /** True when the waiter's fate is decided (admitted, or refused for a reason waiting cannot change). */
  tryAdmit(): boolean;
  /** A lease wait: true when decided (admitted, or its lease said the node has no slot: `leaseDenied`). */
  tryAdmitLease(): boolean;
  /** The lease-wait FIFO the waiter joins: its route, or the backend whose slot it waits for. */
  readonly leaseFifo: string;
  /** The node's queue places the waiter holds (set and cleared by OverloadControl only; initialise to undefined). */
  queuePlaces: Places | undefined;
  /**
   * The node answered the request's ask for queue places (`enqueue` said `pending`); `since`: when
   * it started waiting. Granted: it holds them (`queuePlaces`) and calls `enqueueHolding`.
   */
  placesDecided(v: PlaceVerdict, since: number): void;
}

/**
 * How `enqueue` went: queued; waiting for the node's places (`Waiter.placesDecided` hears the
 * answer); refused, the queue full; refused, no answer from the supervisor in time.
 */
export type QueueEntry = 'queued' | 'pending' | 'full' | 'unavailable';

/** What the control reads of the active generation. */
interface ActiveView {
  readonly config: Config;
  /** Backend identity → its upstream and id (breaker views). */
  readonly backends: ReadonlyMap<string, { readonly upstream: string; readonly backend: string }>;
}

export class OverloadControl implements OverloadSource {
  private readonly nowMs: () => number;
  private leases: LeaseTable;
  private global: Lease;
  /** Requests waiting for their worker's lease to be topped up (one FIFO per route, deadline LEASE_WAIT_MS). */
  private readonly leaseWaits: RouteQueues;
  /** Solo only: the worker's own adaptive limit and brownout state (led, the node's apply). */
  private readonly adaptive: AdaptiveLimit;
  private readonly brownout = new Brownout();
  /** Led: what this worker reports for the node's adaptive limit and brownout. */
  private reporter: AdmissionReporter | undefined;
  /** Led: the node's adaptive limit and brownout state as last told (undefined until the first notice). */
  private node: NodeAdmissionNotice | undefined;
  private readonly queues: RouteQueues;
  /** The node's queue places (docs/overload.md "Queue caps"); asks waiting for them, in all and per route. */
  private readonly places = new QueuePlaces();
  private placeAsks = 0;
  private readonly placeAsksBy = new Map<string, number>();
  private readonly breakers: Breakers;
  private active: ActiveView | undefined;
  private readonly shedTotal: CounterSeries;
  /** `svc_overload_shed_by_reason_total` series of each shed error (errors.ts). */
  private readonly shedBy: ReadonlyMap<RequestError, CounterSeries>;
  private readonly waitAdmit: Record<QueueScope, CounterSeries>;
  private readonly breakerRejected: CounterSeries;

  /** `breakers`: the worker's registry (the data plane logs its transitions). */
  constructor(metrics: Metrics, breakers: Breakers, now: () => number = () => performance.now()) {
    this.nowMs = now;
    this.adaptive = new AdaptiveLimit(now);
    this.queues = new RouteQueues(now);
    // FIFO per what a waiter waits for (its route's global or upstream slot, or one backend's), so
    // that a wait for one backend never holds up the waits for another.
    this.leaseWaits = new RouteQueues(now, undefined, leaseFifo);
    this.leases = this.newTable(undefined);
    this.global = this.leases.lease('global');
    this.breakers = breakers;
    this.shedTotal = metrics.counterSeries('svc_overload_shed');
    this.shedBy = new Map(Object.entries(SHED_REASONS).map(([code, reason]) => [ERR[code as keyof typeof SHED_REASONS], metrics.counterSeries('svc_overload_shed_by_reason_total', { reason })]));
    this.waitAdmit = {
      global: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'global' }),
      upstream: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'upstream' }),
      backend: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'backend' }),
    };
    this.breakerRejected = metrics.counterSeries('svc_circuit_breaker_rejected_total');
  }

  /**
   * Joins the node: from now on the in-flight slots are leased from the supervisor through `send`
   * (a `lease` message per turn; its answers go to `leaseGrants`). Called once, before the first
   * generation is provisioned. `report`: this worker's `admission` reports (response windows, its
   * in-use count of `global`); absent, the node hears neither (tests of the leases alone).
   */
  joinNode(send: (asks: LeaseAsk[]) => void, report?: (r: AdmissionReport) => void): LeaseTable {
    // The node also takes this worker's in-use count of `global` from its lease asks: the reporter
    // hears each one, so a change after it is reported even when it brings the count back to the
    // last report's (admission-report.ts).
    this.leases = this.newTable((asks) => {
      send(asks);
      for (const a of asks) if (a.key === 'global') this.reporter?.heard(a.used);
    });
    this.global = this.leases.lease('global');
    if (report !== undefined) {
      const global = this.global;
      this.reporter = new AdmissionReporter(report, () => global.inUse);
    }
    return this.leases;
  }

  /** The supervisor's `admission` notice: the node's adaptive limit and brownout state from now on; true when the brownout state changed. */
  nodeAdmission(n: NodeAdmissionNotice): boolean {
    const changed = (this.node?.brownout ?? false) !== n.brownout;
    this.node = n;
    return changed;
  }

  /** The supervisor's `lease` notice. */
  leaseGrants(grants: readonly LeaseGrant[]): void {
    this.leases.receive(grants);
  }

  /** From now on the queue caps are the node's: places leased through the worker's token leases. */
  leaseQueuePlaces(leases: TokenLeases): void {
    this.places.join(leases);
  }

  /** This worker's leases (views, lease traffic). */
  get leaseTable(): LeaseTable {
    return this.leases;
  }

  private newTable(send: ((asks: LeaseAsk[]) => void) | undefined): LeaseTable {
    // A grant may admit waiters: route queues first (they waited longer), then lease waits.
    return new LeaseTable({ waitMs: LEASE_WAIT_MS, now: this.nowMs, ...(send === undefined ? {} : { send }), onGrant: () => this.wake() });
  }

  /** A generation became active: its policies apply from now on (every overload key is live). */
  configure(config: Config, backends: ActiveView['backends']): void {
    this.active = { config, backends };
    // The ejection bound counts within each pool of the active generation.
    const pools = new Map<string, string[]>();
    for (const [key, where] of backends) {
      const members = pools.get(where.upstream);
      if (members === undefined) pools.set(where.upstream, [key]);
      else members.push(key);
    }
    this.breakers.pools(pools.values());
    const a = config.resilience.adaptive_admission;
    const global = config.performance.global_inflight_limit;
    this.adaptive.configure({ enabled: a.enabled, minLimit: a.min_limit, maxLimit: a.max_limit ?? global, decreaseStep: a.decrease_step, increaseStep: a.increase_step, highLatencyMs: a.high_latency_ms, globalInflightLimit: global });
    if (!config.resilience.brownout.enabled) this.brownout.reset();
    // The node's brownout needs this worker's in-flight count while it is enabled.
    this.reporter?.track(config.resilience.brownout.enabled);
    // Solo: each lease holds its whole limit (led by the supervisor otherwise, configured at the same commit).
    if (this.leases.solo) this.leases.setSolo((key) => (key === 'global' ? global : key.startsWith(BACKEND_PREFIX) ? config.performance.per_backend_inflight_limit : config.performance.per_upstream_inflight_limit));
    // A raised limit may admit waiters at once.
    this.wake();
  }

  /**
   * The global in-flight limit in force: the adaptive limit, or `global_inflight_limit` when adaptive
   * admission is off. Led: the node's, as last told (before the first notice, `global_inflight_limit`).
   */
  globalLimit(config: Config): number {
    if (!this.leases.solo) return config.resilience.adaptive_admission.enabled ? (this.node?.limit ?? config.performance.global_inflight_limit) : config.performance.global_inflight_limit;
    return config.resilience.adaptive_admission.enabled ? this.adaptive.limit : config.performance.global_inflight_limit;
  }

  // --- brownout -----------------------------------------------------------------------------

  /**
   * Whether brownout is active for a routed request (SPEC "Brownout"): led, the node's state as last
   * told (the supervisor decides it from the node's in-flight count); solo, this worker samples its
   * own in-flight count against the limit in force.
   */
  brownoutSample(rt: Gen): boolean {
    if (!this.leases.solo) return rt.policies.brownout.enabled && this.node?.brownout === true;
    return this.brownout.sample(this.global.inUse, this.globalLimit(rt.config), rt.policies.brownout);
  }

  // --- slots ----------------------------------------------------------------------------------

  /**
   * A global slot, synchronous. Led: from the lease alone (the node's adaptive limit is the
   * budget's limit). Solo: within this worker's adaptive limit while adaptive admission is on.
   */
  tryGlobal(rt: { readonly config: Config }): boolean {
    if (this.leases.solo && rt.config.resilience.adaptive_admission.enabled && this.global.inUse >= this.adaptive.limit) return false;
    if (!this.global.tryTake()) return false;
    this.reporter?.changed();
    return true;
  }

  releaseGlobal(): void {
    this.global.release();
    this.reporter?.changed();
  }

  /** The lease of pool `name`'s in-flight limit (one object for the worker's life; kept on the pool's runtime). */
  upstreamCounter(name: string): Lease {
    return this.leases.lease(upstreamLeaseKey(name));
  }

  /**
   * The lease of backend `id` of pool `pool` (budget `backend:<pool>/<id>`; one object for the
   * worker's life, kept on the backend's runtime), or undefined when `per_backend_inflight_limit`
   * cannot bind (`backendLimitBinds`, by which the supervisor defines the budget: no budget, no slot).
   */
  backendCounter(config: Config, pool: string, id: string): Lease | undefined {
    return backendLimitBinds(config.performance) ? this.leases.lease(backendBudgetKey(pool, id)) : undefined;
  }

  /**
   * Whether `per_upstream_inflight_limit` can bind: below `global_inflight_limit`. At or above it
   * the global limit already bounds every pool, so the upstream slot is not leased (no budget, no
   * second contention on the same requests; the supervisor defines none either).
   */
  upstreamBinds(rt: { readonly config: Config }): boolean {
    const p = rt.config.performance;
    return p.per_upstream_inflight_limit < p.global_inflight_limit;
  }

  tryUpstream(_rt: { readonly config: Config }, c: Lease): boolean {
    return c.tryTake();
  }

  releaseUpstream(c: Lease): void {
    c.release();
  }

  /**
   * The lease a refusal of `scope` came from when it was for want of a leased slot (the request
   * then waits for the supervisor's answer), or undefined (solo, the adaptive limit: the route
   * queue decides; a backend's lease is waited for by the select phase itself).
   */
  leaseShort(rt: { readonly config: Config }, scope: QueueScope, upstream: Lease): Lease | undefined {
    if (this.leases.solo || scope === 'backend') return undefined;
    const l = scope === 'global' ? this.global : upstream;
    if (l.idle > 0) return undefined;
    return l;
  }

  /** The global lease (a waiter counts itself on it while it waits for a global slot). */
  get globalLease(): Lease {
    return this.global;
  }

  /** Whether `l` has no slot for a waiter that started waiting when `l.asked` was `since`: an ask sent after that was answered `exhausted`. */
  leaseDenied(l: Lease, since: number): boolean {
    return l.exhaustedAt > since;
  }

  /** Whether the supervisor has left `l`'s ask unanswered past the wait. */
  leaseUnavailable(l: Lease): boolean {
    return l.unavailable(this.nowMs());
  }

  /** Starts or stops counting a waiter on a lease (its standing need); the change goes out at the end of the turn. */
  countWaiting(from: Lease | undefined, to: Lease | undefined): void {
    if (from === to) return;
    if (from !== undefined) {
      if (from.waiting > 0) from.waiting--;
      this.leases.mark(from);
    }
    if (to !== undefined) {
      to.waiting++;
      this.leases.mark(to);
    }
  }

  /** Waits for the worker's lease (no cap: bounded by LEASE_WAIT_MS and by the requests the worker holds). */
  enqueueLease(w: Waiter): void {
    this.leaseWaits.enqueue(w, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, LEASE_WAIT_MS);
  }

  cancelLease(w: Waiter): void {
    this.leaseWaits.cancel(w);
  }

  hasLeaseWaiters(route: string): boolean {
    return this.leaseWaits.total > 0 && this.leaseWaits.hasWaiters(route);
  }

  // --- queues -------------------------------------------------------------------------------

  /** Whether `route` has waiters, queued or asking for their places: a new request of it queues behind them. */
  hasWaiters(route: string): boolean {
    return (this.queues.total > 0 && this.queues.hasWaiters(route)) || (this.placeAsks > 0 && this.placeAsksBy.has(route));
  }

  /**
   * Queues `w` on its route within the route's cap and the global cap. Under a supervisor the caps
   * are the node's: `w` first takes a place of each (queue-places.ts), at once when its worker
   * holds them, else it waits for the supervisor's answer (`pending`). A cap of 0 refuses at once.
   */
  enqueue(rt: { readonly config: Config }, w: Waiter): QueueEntry {
    const q = rt.config.resilience.route_queue;
    const cap = q.caps[w.route] ?? q.default_cap;
    if (!this.places.leased || cap === 0 || q.global_cap === 0) return this.queues.enqueue(w, cap, q.global_cap, q.max_wait_ms) ? 'queued' : 'full';
    const now = this.nowMs();
    const got = this.places.take(w.route, now, (v, places) => {
      this.countPlaceAsk(w.route, -1);
      if (v === 'granted') w.queuePlaces = places;
      w.placesDecided(v, now);
    });
    if (got === undefined) {
      this.countPlaceAsk(w.route, 1);
      return 'pending';
    }
    if (typeof got === 'string') return got;
    w.queuePlaces = got;
    if (this.enqueueHolding(rt, w, now)) return 'queued';
    this.releasePlaces(w);
    return 'full';
  }

  /**
   * Queues `w`, which holds its node places, for what is left of `max_wait_ms` since `since` (none
   * left: it expires at the queue's next tick, `queue_timeout`); false when the queues are closed.
   * The node's places are the caps: the worker's queues count none of their own.
   */
  enqueueHolding(rt: { readonly config: Config }, w: Waiter, since: number): boolean {
    const left = rt.config.resilience.route_queue.max_wait_ms - (this.nowMs() - since);
    return this.queues.enqueue(w, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, Math.max(0, left));
  }

  /** Gives the node back the queue places `w` holds, once (it left its queue, or never joined it). */
  releasePlaces(w: Waiter): void {
    const p = w.queuePlaces;
    if (p === undefined) return;
    w.queuePlaces = undefined;
    this.places.release(p, this.nowMs());
  }

  private countPlaceAsk(route: string, d: number): void {
    this.placeAsks += d;
    const n = (this.placeAsksBy.get(route) ?? 0) + d;
    if (n > 0) this.placeAsksBy.set(route, n);
    else this.placeAsksBy.delete(route);
  }

  cancel(w: Waiter): void {
    this.queues.cancel(w);
  }

  /** A slot was released: waiters that can now be admitted are (head of each route, round-robin). */
  wake(): void {
    if (this.queues.total > 0) this.queues.drain(tryAdmit);
    if (this.leaseWaits.total > 0) this.leaseWaits.drain(tryAdmitLease);
  }

  countWaitAdmit(scope: QueueScope): void {
    this.waitAdmit[scope].inc();
  }

  // --- breakers -----------------------------------------------------------------------------

  breakerMayTry(policy: BreakerPolicy, key: string): boolean {
    return this.breakers.mayTry(key, policy);
  }

  breakerBegin(policy: BreakerPolicy, key: string): boolean {
    return this.breakers.begin(key, policy);
  }

  // --- an attempt ended ---------------------------------------------------------------------

  /** Records an attempt's end: the breaker's outcome and the adaptive limit's latency sample. */
  attemptEnded(rt: Gen, key: string, probe: boolean, result: ForwardResult, t0: number, t1: number): void {
    this.breakers.record(key, breakerOutcome(result.status, result.error, rt.policies.breaker.failureStatuses), probe, rt.policies.breaker);
    const latency = result.headersAt > 0 ? result.headersAt - t0 : result.error?.class === 'timeout' ? t1 - t0 : -1;
    if (latency < 0) return;
    const r = this.reporter;
    if (r === undefined) this.adaptive.sample(latency, result.headersAt > 0 ? result.headersAt : t1);
    else {
      const a = rt.config.resilience.adaptive_admission;
      if (a.enabled) r.sample(latency > a.high_latency_ms);
    }
  }

  // --- sheds --------------------------------------------------------------------------------

  /** A shed answer (an error of class `overload`): counted in total, by reason, and as a breaker rejection when it is one. */
  countShed(err: RequestError): void {
    this.shedTotal.inc();
    this.shedBy.get(err)?.inc();
    if (err === ERR.EDGE_SHED_CIRCUIT_OPEN) this.breakerRejected.inc();
  }

  // --- views (heartbeat, snapshot, gauges) --------------------------------------------------

  admissionView(): AdmissionView {
    const c = this.active?.config;
    const a = c?.resilience.adaptive_admission;
    const global = c?.performance.global_inflight_limit ?? 0;
    return {
      adaptiveEnabled: a?.enabled ?? false,
      adaptiveLimit: c === undefined ? 0 : this.globalLimit(c),
      minLimit: a?.enabled === true ? a.min_limit : global,
      maxLimit: a?.enabled === true ? (a.max_limit ?? global) : global,
      inflight: this.global.inUse,
      queued: this.queues.total,
      queuedByRoute: this.queues.depths(),
      brownoutActive: this.leases.solo ? this.brownout.active : c?.resilience.brownout.enabled === true && this.node?.brownout === true,
    };
  }

  breakerViews(): BreakerView[] {
    const a = this.active;
    if (a === undefined) return [];
    return this.breakers.views((key) => a.backends.get(key));
  }

  close(): void {
    this.queues.close();
    this.leaseWaits.close();
    this.reporter?.close();
  }
}

/** The FIFO of a lease wait (lease waits hold only `Waiter`s of this module). */
function leaseFifo(w: QueueWaiter): string {
  return (w as Waiter).leaseFifo;
}

/** The lease waits hold only `Waiter`s of this module. */
function tryAdmitLease(w: QueueWaiter): boolean {
  return (w as Waiter).tryAdmitLease();
}

/** The queue holds only `Waiter`s of this module (enqueue takes nothing else). */
function tryAdmit(w: QueueWaiter): boolean {
  return (w as Waiter).tryAdmit();
}
