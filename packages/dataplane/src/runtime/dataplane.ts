// The worker's data plane: the registries shared by all generations and the active runtime.
// Activation is two-phase (DESIGN "Generations"): `prepare` builds a runtime off to the side and may
// fail without touching what serves; `commit` swaps one reference. A runtime is counted while
// requests hold it; pools and health state are released once no live runtime refers to them.
import { EventEmitter } from 'node:events';
import type { ResolvedConfig } from '@edge-proxy/config';
import { trimAfterStartup, trimFields } from '@edge-proxy/telemetry';
import type { Logger, Metrics, RequestTracer } from '@edge-proxy/telemetry';
import { BackendStatsRegistry } from '../balancing/index.ts';
import { HealthRegistry } from '../health/health-registry.ts';
import { BreakerRegistry } from '../resilience/breaker-registry.ts';
import type { BreakerTransition, Breakers } from '../resilience/breaker-registry.ts';
import { BreakerFollower } from '../resilience/breaker-follower.ts';
import type { BreakerApplied } from '../resilience/breaker-follower.ts';
import type { FromWorker } from '@edge-proxy/ipc';
import type { BreakerView } from '../resilience/overload-view.ts';
import { UpstreamPools } from '../upstream/pools.ts';
import { DnsRefresher } from '../upstream/dns-refresh.ts';
import { ConnectionAdmission } from '../ingress/admission.ts';
import { TokenLeases } from '../resilience/token-lease.ts';
import type { TokenAsk, TokenDeposit, TokenSettle } from '@edge-proxy/ipc';
import { QuicIngressCounters } from '../ingress/quic-counters.ts';
import { provision } from './provision.ts';
import { RouteLatencyWindow } from '../proxy/route-latency.ts';
import { UpstreamFailureLog } from '../proxy/failure-log.ts';
import { OverloadControl } from '../resilience/overload-control.ts';
import { RetryControl } from '../resilience/retry-control.ts';
import { MAX_BUCKETS, RateLimiter } from '../resilience/rate-limit.ts';
import { availableParallelism } from 'node:os';
import { QuotaControl } from '../resilience/quota/index.ts';
import { RequestAuthControl } from '../auth/request-auth.ts';
import type { OverloadSource } from '../resilience/overload-view.ts';
import type { Runtime, RuntimeDeps } from './provision.ts';
import { AccessLog } from '../proxy/access-log.ts';
import type { RuntimeSource } from '../proxy/handler.ts';
import { MemoryTrim } from './memory-trim.ts';

/**
 * Longest `close` waits for the tracer's buffered spans to be exported, ms: the supervisor kills a
 * worker 2 s after its SIGTERM, and closing has more to do.
 */
export const TRACER_SHUTDOWN_MS = 1000;

export class Dataplane implements RuntimeSource {
  readonly deps: RuntimeDeps;
  /**
   * `health` (backendKey, eligible) when a backend becomes eligible or ineligible; `breaker`
   * (BreakerTransition) when a backend's circuit breaker changes state.
   */
  readonly events = new EventEmitter();
  /**
   * Circuit breaker per backend identity, shared by every generation (also `deps.breakers`): the
   * node's, as the supervisor tells it, under a supervisor (`nodeBreakers`); this worker's own otherwise.
   */
  readonly breakers: Breakers;
  /** The node's breakers as this worker follows them (undefined without a supervisor): `apply` takes the supervisor's notices. */
  readonly nodeBreakers: BreakerFollower | undefined;
  /** Admission and breaker views of this worker, for heartbeats, the snapshot and the gauges (worker/overload-report.ts). */
  readonly overload: OverloadSource;
  private active: Runtime | undefined;
  private readonly holds = new Map<Runtime, number>();
  /** Replaced runtimes that still had requests in flight, and since when (their drain is logged). */
  private readonly draining = new Map<Runtime, number>();

  private readonly dns: DnsRefresher;
  /** Connection caps and rate of this worker (every listener, both ingresses). */
  readonly connections: ConnectionAdmission;
  /** This worker's leases of the node's token budgets (rate limits, connection caps); undefined alone (no supervisor). */
  tokens: TokenLeases | undefined;
  /** Datagram counters of this worker's QUIC ingresses. */
  readonly quicCounters: QuicIngressCounters;
  /** Requests (and upgrades) started on any generation: what `memory_trim` counts quiet seconds by. */
  private started = 0;
  /** `performance.memory_trim`: the heap's load peak handed back once the worker is quiet. */
  readonly memoryTrim: MemoryTrim;

  /**
   * @param workers the node's worker processes (`performance.worker_threads`, restart-required):
   *   rate limits and local quota counters enforce a share of each limit per worker.
   * @param askJwksRefresh asks whoever fetches the JWKS key sets (the supervisor) for a fresh set
   *   of a source; the answer arrives as `deps.auth.keys.update`.
   * @param tracer the worker's tracer (`observability.tracing`, restart-required), absent when
   *   tracing is off; shut down (its buffered spans exported) by `close`.
   * @param breakerReports sends this worker's breaker reports to the supervisor, which decides the
   *   node's breakers (resilience/breaker-follower.ts); absent: the worker decides alone.
   */
  constructor(metrics: Metrics, onPanic?: (err: unknown) => void, log?: Logger, workers = availableParallelism(), askJwksRefresh: (sourceId: string) => void = () => {}, tracer?: RequestTracer, breakerReports?: (r: Extract<FromWorker, { type: 'breaker-report' }>) => void) {
    const health = new HealthRegistry({
      probe: (ok) => {
        metrics.counter('svc_health_checks_total').inc();
        metrics.counter(ok ? 'svc_health_checks_success' : 'svc_health_checks_failure').inc();
      },
      passiveFailure: (reason) => metrics.counter('svc_health_failures_total').inc({ reason }),
      transition: (key, eligible) => this.events.emit('health', key, eligible),
    });
    this.nodeBreakers = breakerReports === undefined ? undefined : new BreakerFollower({ send: breakerReports, where: (key) => this.active?.backendNames.get(key), onApply: (a) => this.breakerApplied(a) });
    this.breakers =
      this.nodeBreakers ??
      new BreakerRegistry((tr) => this.breakerTransition(tr), undefined, undefined, {
        onHold: (h) => {
          // One line when a backend is first held, not one per failure while it stays held (the
          // count, svc_circuit_breaker_ejections_capped_total, is the node's: the supervisor's).
          const where = this.active?.backendNames.get(h.key);
          if (h.first) this.deps.log?.warn({ upstream: where?.upstream ?? null, backend: where?.backend ?? null, ejected: h.ejected, pool_size: h.poolSize, max_ejection_percent: this.active?.config.resilience.circuit_breaker.max_ejection_percent ?? null }, 'circuit breaker held closed: max_ejection_percent of the pool is already ejected, the failing backend keeps serving');
        },
      });
    const routeLatency = new RouteLatencyWindow();
    for (const q of ['p50', 'p95', 'p99'] as const) {
      const name = `svc_route_latency_ms_${q}`;
      metrics.onCollect(name, () => {
        const gauge = metrics.gauge(name);
        gauge.reset();
        for (const [route, v] of routeLatency.quantiles()) gauge.set({ route }, v[q]);
      });
    }
    const overload = new OverloadControl(metrics, this.breakers);
    this.overload = overload;
    const limiter = new RateLimiter(MAX_BUCKETS, (n) => metrics.counter('svc_rate_limit_evictions_total').inc(n));
    metrics.onCollect('svc_rate_limit_buckets', () => metrics.gauge('svc_rate_limit_buckets').set(limiter.size));
    this.deps = { pools: new UpstreamPools(), stats: new BackendStatsRegistry(), health, breakers: this.breakers, metrics, routeLatency, overload, retries: new RetryControl(metrics), workers, limiter, quota: new QuotaControl(metrics, workers, log), auth: new RequestAuthControl(metrics, askJwksRefresh, log), ...(onPanic === undefined ? {} : { onPanic }), ...(log === undefined ? {} : { log, failures: new UpstreamFailureLog(log), accessLog: new AccessLog(log) }), ...(tracer === undefined ? {} : { tracer }) };
    this.dns = new DnsRefresher(this.deps.pools, metrics);
    const fallback = { maxConnections: Number.MAX_SAFE_INTEGER, perSource: Number.MAX_SAFE_INTEGER, perSecond: Number.MAX_SAFE_INTEGER, burst: Number.MAX_SAFE_INTEGER };
    this.connections = new ConnectionAdmission(() => {
      const p = this.active?.config.performance;
      return p === undefined ? fallback : { maxConnections: p.max_connections, perSource: p.max_connections_per_source, perSecond: p.new_connections_per_sec, burst: p.new_connections_burst };
    });
    metrics.onCollect('svc_active_connections', () => metrics.gauge('svc_active_connections').set(this.connections.active));
    this.quicCounters = new QuicIngressCounters(metrics);
    this.memoryTrim = new MemoryTrim({
      settings: () => this.active?.config.performance.memory_trim,
      requests: () => this.started,
      onTrim: (r) => {
        metrics.counter('svc_worker_memory_trims_total').inc();
        log?.info(trimFields(r), 'memory trimmed: the worker was quiet, its heap peak went back to the kernel');
      },
      onUnavailable: (reason) => log?.warn({ reason }, 'memory trim unavailable in this process: the worker keeps its heap peak (performance.memory_trim)'),
    });
  }

  /** Builds the runtime of a candidate generation; throws (coded) if it cannot be provisioned. */
  prepare(resolved: ResolvedConfig, generation: number): Runtime {
    return provision(resolved, generation, this.deps);
  }

  /** Makes a prepared runtime the active one; new requests use it at once. */
  commit(rt: Runtime): void {
    const previous = this.active;
    // log.level is live: every worker follows the active generation.
    if (this.deps.log !== undefined) this.deps.log.level = rt.config.log.level;
    this.active = rt;
    this.deps.overload.configure(rt.config, rt.backendNames);
    this.deps.retries.retain(rt.upstreams.keys());
    this.deps.quota.configure(rt.config, rt.quotaAuth);
    this.deps.health.reconcile(rt.probes);
    this.dns.reconcile([...rt.upstreams.values()].flatMap((u) => u.backends.map((b) => b.pool)), rt.config.performance.timeouts.backend_dns_refresh_ms);
    if (previous !== undefined && (this.holds.get(previous) ?? 0) === 0) this.release(previous);
    else if (previous !== undefined) this.drainStarted(previous, rt);
    this.collect();
  }

  /**
   * Once, after the first commit and before the listeners bind (no request can wait on it, and no
   * code is hot yet): the garbage of the start-up (the code, the tracer, the first generation)
   * handed back to the kernel, about 25 MiB of a fresh worker's 140. Whatever
   * `performance.memory_trim` says: its cost is the load after a trim, and there is none yet.
   */
  trimAtStart(): void {
    const r = trimAfterStartup(this.deps.log, 'worker');
    if (r !== undefined) this.memoryTrim.rebase(r.rssAfter);
  }

  get current(): Runtime | undefined {
    return this.active;
  }

  acquire(): Runtime {
    const rt = this.active;
    if (rt === undefined) throw new Error('no active generation');
    this.started++;
    this.holds.set(rt, (this.holds.get(rt) ?? 0) + 1);
    return rt;
  }

  release(rt: Runtime): void {
    const n = (this.holds.get(rt) ?? 0) - 1;
    if (n > 0) {
      this.holds.set(rt, n);
      return;
    }
    this.holds.delete(rt);
    if (rt !== this.active) {
      this.collect();
      if (this.draining.has(rt)) this.drainEnded(rt);
    }
  }

  /** A replaced generation keeps its requests in flight until they finish (one line at each end). */
  private drainStarted(previous: Runtime, next: Runtime): void {
    if (this.draining.has(previous)) return;
    this.draining.set(previous, performance.now());
    this.deps.log?.info({ generation: previous.generation, replaced_by: next.generation, requests_in_flight: this.holds.get(previous) ?? 0 }, 'generation draining: its requests in flight finish on it');
  }

  private drainEnded(rt: Runtime): void {
    const since = this.draining.get(rt) ?? performance.now();
    this.draining.delete(rt);
    this.deps.log?.info({ generation: rt.generation, duration_ms: Math.round(performance.now() - since) }, 'generation drained: its last request finished');
  }

  /** Requests in flight per generation (tests, and the drain logic). */
  inflight(): Map<number, number> {
    const out = new Map<number, number>();
    for (const [rt, n] of this.holds) out.set(rt.generation, (out.get(rt.generation) ?? 0) + n);
    return out;
  }

  /** Keeps pools and backend state used by the active runtime or any runtime still holding requests. */
  private collect(): void {
    const live = [...this.holds.keys(), ...(this.active === undefined ? [] : [this.active])];
    const poolKeys = new Set<string>();
    const backendKeys = new Set<string>();
    for (const rt of live) {
      for (const k of rt.poolKeys) poolKeys.add(k);
      for (const k of rt.backendKeys) backendKeys.add(k);
    }
    void this.deps.pools.retain(poolKeys);
    this.deps.stats.retain(backendKeys);
    this.deps.health.retain(backendKeys);
    this.breakers.retain(backendKeys);
    this.deps.routeLatency.retain(new Set(live.flatMap((rt) => [...rt.upstreams.keys()])));
    this.deps.auth.retain(live.flatMap((rt) => [...rt.upstreams.values()].flatMap((u) => (u.auth === undefined ? [] : [u.auth]))));
  }

  /** The breaker of each backend of the active generation (none before the first commit). */
  breakerViews(): BreakerView[] {
    return this.overload.breakerViews();
  }

  /** One line per breaker transition (warn when it opens), and the `breaker` event. */
  private breakerTransition(tr: BreakerTransition): void {
    const rt = this.active;
    const where = rt?.backendNames.get(tr.key);
    const fields = { upstream: where?.upstream ?? null, backend: where?.backend ?? null, from: tr.from, to: tr.to, ...(tr.to === 'open' && tr.from === 'closed' ? { consecutive_failures: tr.failures } : {}), ...(tr.to === 'open' && rt !== undefined ? { open_ms: rt.config.resilience.circuit_breaker.open_ms } : {}) };
    if (tr.to === 'open') this.deps.log?.warn(fields, tr.from === 'closed' ? 'circuit breaker opened: backend failing, not picked until open_ms elapsed' : 'circuit breaker re-opened: the half-open probe failed');
    else if (tr.to === 'half_open') this.deps.log?.info(fields, 'circuit breaker half-open: open_ms elapsed, the next request probes the backend');
    else this.deps.log?.info(fields, 'circuit breaker closed: the probe succeeded');
    this.events.emit('breaker', tr);
  }

  /**
   * A node breaker notice applied (the supervisor logs the transition, once for the node): a status
   * change is one info line per worker with how long after the supervisor sent it (`lag_ms`: what
   * "every worker stops within 5 ms" is measured by) and the `breaker` event; a permit, a debug line.
   */
  private breakerApplied(a: BreakerApplied): void {
    const where = this.active?.backendNames.get(a.key);
    const fields = { upstream: where?.upstream ?? null, backend: where?.backend ?? null, from: a.from, to: a.to, permits: a.permits, sent_at: a.sentAt, applied_at: a.appliedAt, lag_ms: Math.round((a.appliedAt - a.sentAt) * 1000) / 1000 };
    if (a.from === a.to) {
      this.deps.log?.debug(fields, 'circuit breaker probe permit from the node');
      return;
    }
    this.deps.log?.info(fields, 'circuit breaker state applied from the node');
    this.events.emit('breaker', { key: a.key, from: a.from, to: a.to, failures: 0, at: performance.now() } satisfies BreakerTransition);
  }

  /**
   * Joins the supervisor's token ledger: from now on the scoped rate limits, the connection caps and
   * the route queues' caps are the node's (docs/overload.md "Token budgets"), and so are the retry
   * budgets (docs/retries.md), the quota's local counters (docs/rate-limits.md) and the pools' fail-open budgets (docs/auth.md), leased through `send` (a `tokens` message per
   * turn); the supervisor's answers go to `tokens.granted`. Called once, before any listener opens.
   */
  leaseTokens(send: (asks: readonly TokenAsk[], settles: readonly TokenSettle[], deposits: readonly TokenDeposit[]) => void): TokenLeases {
    const evictions = this.deps.metrics.counter('svc_rate_limit_evictions_total');
    const leases = new TokenLeases({ send, onEvict: (n) => evictions.inc(n) });
    this.tokens = leases;
    this.deps.limiter.lease(leases);
    this.connections.lease(leases);
    this.deps.retries.lease(leases);
    this.deps.quota.lease(leases);
    this.deps.overload.leaseQueuePlaces(leases);
    this.deps.auth.lease(leases);
    return leases;
  }

  async close(): Promise<void> {
    this.tokens?.close();
    this.memoryTrim.close();
    this.breakers.close();
    this.deps.failures?.close();
    this.deps.overload.close();
    this.deps.limiter.close();
    await this.deps.quota.close();
    await this.deps.auth.close();
    this.dns.close();
    this.deps.health.close();
    await this.deps.pools.destroy();
    // Last: the spans of requests that ended while closing are exported too (bounded).
    await this.deps.tracer?.shutdown(TRACER_SHUTDOWN_MS);
  }
}

