// A worker's overload protection, one object shared by every generation (its state outlives
// swaps; its policy is read from the generation of each request, so every key is live): in-flight
// slots (global and per upstream; per backend in balancing/backend-stats.ts), the route queues,
// adaptive admission, brownout and the circuit breaker of each backend. The request phases of
// proxy/pipeline.ts call it in the SPEC's order: brownout, admission (global slot, adaptive limit),
// per-upstream and per-backend limits, breaker. docs/overload.md explains the policies.
//
// Every limit is per worker: a node with N workers admits up to N times each limit.
import type { Metrics, CounterSeries } from '@edge-proxy/telemetry';
import type { ResolvedConfig } from '@edge-proxy/config';
import { AdaptiveLimit } from './adaptive-limit.ts';
import { Brownout } from './brownout.ts';
import type { BrownoutPolicy } from './brownout.ts';
import { InflightLimits } from './inflight-limits.ts';
import type { UpstreamInflight } from './inflight-limits.ts';
import { RouteQueues } from './route-queue.ts';
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

/** A request waiting in a route queue (proxy/pipeline.ts `RequestContext`). */
export interface Waiter extends QueueWaiter {
  /** True when the waiter's fate is decided (admitted, or refused for a reason waiting cannot change). */
  tryAdmit(): boolean;
}

/** What the control reads of the active generation. */
interface ActiveView {
  readonly config: Config;
  /** Backend identity → its upstream and id (breaker views). */
  readonly backends: ReadonlyMap<string, { readonly upstream: string; readonly backend: string }>;
}

export class OverloadControl implements OverloadSource {
  private readonly limits = new InflightLimits();
  private readonly adaptive: AdaptiveLimit;
  private readonly brownout = new Brownout();
  private readonly queues: RouteQueues;
  private readonly breakers: Breakers;
  private active: ActiveView | undefined;
  private readonly shedTotal: CounterSeries;
  /** `svc_overload_shed_by_reason_total` series of each shed error (errors.ts). */
  private readonly shedBy: ReadonlyMap<RequestError, CounterSeries>;
  private readonly waitAdmit: Record<QueueScope, CounterSeries>;
  private readonly breakerRejected: CounterSeries;

  /** `breakers`: the worker's registry (the data plane logs its transitions). */
  constructor(metrics: Metrics, breakers: Breakers, now: () => number = () => performance.now()) {
    this.adaptive = new AdaptiveLimit(now);
    this.queues = new RouteQueues(now);
    this.breakers = breakers;
    this.shedTotal = metrics.counterSeries('svc_overload_shed');
    this.shedBy = new Map(Object.entries(SHED_REASONS).map(([code, reason]) => [ERR[code as keyof typeof SHED_REASONS], metrics.counterSeries('svc_overload_shed_by_reason_total', { reason })]));
    this.waitAdmit = {
      global: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'global' }),
      upstream: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'upstream' }),
      backend: metrics.counterSeries('svc_inflight_wait_admit_total', { scope: 'backend' }),
    };
    this.breakerRejected = metrics.counterSeries('svc_circuit_breaker_rejected_total');
    metrics.onCollect('svc_brownout_active', () => metrics.gauge('svc_brownout_active').set(this.brownout.active ? 1 : 0));
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
    // A raised limit may admit waiters at once.
    this.wake();
  }

  /** The global in-flight limit in force: the adaptive limit, or `global_inflight_limit` when adaptive admission is off. */
  globalLimit(config: Config): number {
    return config.resilience.adaptive_admission.enabled ? this.adaptive.limit : config.performance.global_inflight_limit;
  }

  // --- brownout -----------------------------------------------------------------------------

  /** Samples the brownout state for a routed request (SPEC "Brownout"); true while active. */
  brownoutSample(rt: Gen): boolean {
    return this.brownout.sample(this.limits.inflight, this.globalLimit(rt.config), rt.policies.brownout);
  }

  // --- slots ----------------------------------------------------------------------------------

  tryGlobal(rt: { readonly config: Config }): boolean {
    return this.limits.tryGlobal(this.globalLimit(rt.config));
  }

  releaseGlobal(): void {
    this.limits.releaseGlobal();
  }

  /** The in-flight counter of pool `name` (one object for the worker's life; kept on the pool's runtime). */
  upstreamCounter(name: string): UpstreamInflight {
    return this.limits.counter(name);
  }

  tryUpstream(rt: { readonly config: Config }, c: UpstreamInflight): boolean {
    return this.limits.tryUpstreamCounter(c, rt.config.performance.per_upstream_inflight_limit);
  }

  releaseUpstream(c: UpstreamInflight): void {
    this.limits.releaseUpstreamCounter(c);
  }

  // --- queues -------------------------------------------------------------------------------

  hasWaiters(route: string): boolean {
    return this.queues.total > 0 && this.queues.hasWaiters(route);
  }

  /** Queues `w` on its route; false when the route's cap or the global cap is reached. */
  enqueue(rt: { readonly config: Config }, w: Waiter): boolean {
    const q = rt.config.resilience.route_queue;
    return this.queues.enqueue(w, q.caps[w.route] ?? q.default_cap, q.global_cap, q.max_wait_ms);
  }

  cancel(w: Waiter): void {
    this.queues.cancel(w);
  }

  /** A slot was released: waiters that can now be admitted are (head of each route, round-robin). */
  wake(): void {
    if (this.queues.total > 0) this.queues.drain(tryAdmit);
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
    if (result.headersAt > 0) this.adaptive.sample(result.headersAt - t0, result.headersAt);
    else if (result.error?.class === 'timeout') this.adaptive.sample(t1 - t0, t1);
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
      inflight: this.limits.inflight,
      queued: this.queues.total,
      queuedByRoute: this.queues.depths(),
      brownoutActive: this.brownout.active,
    };
  }

  breakerViews(): BreakerView[] {
    const a = this.active;
    if (a === undefined) return [];
    return this.breakers.views((key) => a.backends.get(key));
  }

  close(): void {
    this.queues.close();
  }
}

/** The queue holds only `Waiter`s of this module (enqueue takes nothing else). */
function tryAdmit(w: QueueWaiter): boolean {
  return (w as Waiter).tryAdmit();
}
