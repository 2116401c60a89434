// The retry state of one worker (docs/retries.md): the retry budget per route, the request bodies
// held for replay (bounded per worker), and the counters of retries, refusals and hedges. The
// request path (proxy/handler.ts) decides when an attempt is wanted; this decides whether it may
// be made and counts it.
//
// The budget is the node's (`lease`, from the worker's start under a supervisor): each route's
// window lives in the supervisor (controlplane limits/window-ledger.ts), primaries are deposited
// to it in batches and retries are taken from this worker's lease of it (token-lease.ts),
// synchronously: a retry that finds the lease empty is refused `budget_exhausted` at once (the
// 502/503 it follows is forwarded as sent, a decision made when its head arrives) and the lease
// asks for more. A worker run alone (no supervisor) keeps a local `RetryBudget` per route.
import type { Metrics } from '@edge-proxy/telemetry';
import type { ResolvedConfig } from '@edge-proxy/config';
import { RetryBudget } from './retry-budget.ts';
import type { TokenLeases } from './token-lease.ts';
import { PENDING } from './token-lease.ts';

/** Why a wanted retry (or hedge) was not made (`svc_retry_denied_total{reason}`). */
export type RetryDenial = 'budget_exhausted' | 'max_attempts' | 'body_not_buffered' | 'no_backend';

/**
 * Request body bytes one worker holds for replay at most, across its requests. Past it, a new body
 * streams unbuffered (and is not retried): with the defaults (64 KiB per body) that is 1,024 bodies
 * at once, and no flood of large uploads can take more of the worker's memory.
 */
export const MAX_BUFFERED_BYTES_PER_WORKER = 64 * 1024 * 1024;

/** The token-ledger budget of route `route`'s retries (the supervisor's `retryBudget`, controlplane limits/token-service.ts); its one key is ''. */
export function retryBudget(route: string): string {
  return `retry:${route}`;
}

/** Methods that may be retried (RFC 9110 §9.2.2 idempotent methods the issue names; never POST or PATCH). */
export const RETRY_METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE']);

/** A route's retry and hedging policy, built once per generation (`retryPolicy`). */
export interface RetryPolicy {
  /** Attempts per retryable request, the first included; 1: no retry (retry budget disabled). */
  readonly maxAttempts: number;
  /** Retries allowed as a percentage of the route's primary requests (per-route override applied). */
  readonly ratioPercent: number;
  /** Request bodies kept for replay up to this size; 0: never (a request with a body is not retried). */
  readonly bufferBytes: number;
  /** Responses held before they are committed, up to this size; 0: never. */
  readonly prebufferBytes: number;
  /** Delay before a hedge, ms; 0: the route is not hedged. */
  readonly hedgeDelayMs: number;
  /** Methods that may be hedged. */
  readonly hedgeMethods: ReadonlySet<string>;
}

/** The retry policy of route `route` under `config`. */
export function retryPolicy(route: string, config: ResolvedConfig['config']): RetryPolicy {
  const r = config.resilience;
  const h = r.hedging;
  const hedged = r.retry_budget.enabled && h.enabled && (h.route_allowlist.length === 0 || h.route_allowlist.includes(route));
  return {
    maxAttempts: r.retry_budget.enabled ? r.retry_budget.max_attempts : 1,
    ratioPercent: r.retry_budget.per_route_ratio_percent[route] ?? r.retry_budget.ratio_percent,
    bufferBytes: config.performance.body.request_buffer_bytes,
    prebufferBytes: config.performance.body.response_prebuffer_bytes,
    hedgeDelayMs: hedged ? h.delay_ms : 0,
    hedgeMethods: new Set(h.safe_methods),
  };
}

export class RetryControl {
  private readonly metrics: Metrics;
  private readonly budgets = new Map<string, RetryBudget>();
  /** The node's budgets, leased (from `lease`); undefined: this worker's own `budgets`. */
  private leases: TokenLeases | undefined;
  /** Route name → its budget's name (no string built per request). */
  private readonly names = new Map<string, string>();
  /** Request body bytes held for replay now, and the most held at once. */
  private held = 0;
  private highWatermark = 0;
  private readonly maxHeld: number;

  constructor(metrics: Metrics, maxHeld = MAX_BUFFERED_BYTES_PER_WORKER) {
    this.metrics = metrics;
    this.maxHeld = maxHeld;
    metrics.onCollect('svc_request_buffered_bytes', () => metrics.gauge('svc_request_buffered_bytes').set(this.held));
    metrics.onCollect('svc_request_buffered_high_watermark_bytes', () => metrics.gauge('svc_request_buffered_high_watermark_bytes').set(this.highWatermark));
  }

  /** From now on the budgets are the node's, leased through `leases` (a worker under a supervisor). */
  lease(leases: TokenLeases): void {
    this.leases = leases;
    this.budgets.clear();
  }

  /** Keeps the budgets of the routes in `routes` (a generation was activated) and drops the others'. */
  retain(routes: Iterable<string>): void {
    const keep = new Set(routes);
    for (const name of this.budgets.keys()) if (!keep.has(name)) this.budgets.delete(name);
    for (const name of this.names.keys()) if (!keep.has(name)) this.names.delete(name);
    // A route's ratio may have changed: a lease refusing until the next bucket asks again at once.
    if (this.leases !== undefined) for (const route of keep) this.leases.reopen(retryBudget(route), '');
  }

  private nodeLease(leases: TokenLeases, route: string, now: number): ReturnType<TokenLeases['lease']> {
    let name = this.names.get(route);
    if (name === undefined) {
      name = retryBudget(route);
      this.names.set(route, name);
    }
    return leases.lease(name, '', now);
  }

  private budget(route: string): RetryBudget {
    let b = this.budgets.get(route);
    if (b === undefined) {
      b = new RetryBudget();
      this.budgets.set(route, b);
    }
    return b;
  }

  /** A primary request of `route` was sent at `now` (node: deposited with the next batch, and the lease asked ahead if low). */
  primary(route: string, now: number): void {
    const leases = this.leases;
    if (leases === undefined) {
      this.budget(route).deposit(now);
      return;
    }
    const l = this.nodeLease(leases, route, now);
    leases.deposit(l, now);
    leases.prefetch(l, now);
  }

  /**
   * Whether the budget of `route` allows one more attempt (a retry or a hedge) now; nothing is
   * counted. Node: whether this worker's lease holds a retry (when not, it asks for more;
   * `ratioPercent` is the supervisor's, from the active generation).
   */
  allows(route: string, now: number, ratioPercent: number): boolean {
    const leases = this.leases;
    if (leases === undefined) return this.budget(route).allows(now, ratioPercent);
    const l = this.nodeLease(leases, route, now);
    if (leases.holds(l)) return true;
    leases.prefetch(l, now);
    return false;
  }

  /**
   * Node only: when the lease of `route` holds no unit but may be topped up (an ask is out or can
   * be sent), waits for the supervisor's answer and calls `done(true)` with one unit taken, or
   * `done(false)` (the node has none, or no answer within the lease wait). False, without a call,
   * when there is nothing to wait for (no node lease, or a unit or a refusal known now): the caller
   * decides at once. For a retry after a transport error, where nothing has been answered yet and a
   * round trip to the supervisor is cheaper than failing the request.
   */
  waitForUnit(route: string, now: number, done: (taken: boolean) => void): boolean {
    const leases = this.leases;
    if (leases === undefined) return false;
    const l = this.nodeLease(leases, route, now);
    const v = leases.takeAll([l], now);
    if (v === 0) {
      queueMicrotask(() => done(true));
      return true;
    }
    if (v !== PENDING) return false;
    leases.wait([l], (verdict) => done(verdict === 0));
    return true;
  }

  /** Takes one attempt from the budget of `route` (after `allows` said yes, in the same turn). */
  withdraw(route: string, now: number, ratioPercent: number): void {
    const leases = this.leases;
    if (leases === undefined) this.budget(route).withdraw(now, ratioPercent);
    else {
      const l = this.nodeLease(leases, route, now);
      leases.takeOne(l, now);
      leases.prefetch(l, now);
    }
  }

  /** A retry that was wanted was not made, for `reason`. */
  denied(reason: RetryDenial): void {
    this.metrics.counter('svc_retry_denied_total').inc({ reason });
    if (reason === 'body_not_buffered') this.metrics.counter('svc_request_buffer_limit_rejects').inc();
  }

  /** A retry is being sent after a failure for `reason` (`connect_timeout`, `transport`, `status_503`, ...). */
  retried(reason: string): void {
    this.metrics.counter('svc_retries_total').inc();
    this.metrics.counter('svc_retry_attempts_total').inc({ reason });
  }

  /** Reserves `bytes` of the worker's replay memory; false when that would pass its bound (nothing reserved). */
  reserve(bytes: number): boolean {
    if (this.held + bytes > this.maxHeld) return false;
    this.held += bytes;
    if (this.held > this.highWatermark) this.highWatermark = this.held;
    return true;
  }

  /** Gives back `bytes` reserved earlier. */
  free(bytes: number): void {
    this.held -= bytes;
  }

  /** Request body bytes held now (tests, the snapshot). */
  get bufferedBytes(): number {
    return this.held;
  }

  /** Primary requests and retries of `route` in this worker's own budget's window ending at `now` (none when the budget is the node's). */
  counts(route: string, now: number): { primaries: number; retries: number } {
    return this.budgets.get(route)?.counts(now) ?? { primaries: 0, retries: 0 };
  }
}
