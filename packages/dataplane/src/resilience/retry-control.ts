// The retry state of one worker (docs/retries.md): a retry budget per route, shared by every
// generation that has the route, the request bodies held for replay (bounded per worker), and the
// counters of retries, refusals and hedges. The request path (proxy/handler.ts) decides when an
// attempt is wanted; this decides whether it may be made and counts it.
import type { Metrics } from '@edge-proxy/telemetry';
import type { ResolvedConfig } from '@edge-proxy/config';
import { RetryBudget } from './retry-budget.ts';

/** Why a wanted retry (or hedge) was not made (`svc_retry_denied_total{reason}`). */
export type RetryDenial = 'budget_exhausted' | 'max_attempts' | 'body_not_buffered' | 'no_backend';

/**
 * Request body bytes one worker holds for replay at most, across its requests. Past it, a new body
 * streams unbuffered (and is not retried): with the defaults (64 KiB per body) that is 1,024 bodies
 * at once, and no flood of large uploads can take more of the worker's memory.
 */
export const MAX_BUFFERED_BYTES_PER_WORKER = 64 * 1024 * 1024;

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

  /** Keeps the budgets of the routes in `routes` (a generation was activated) and drops the others'. */
  retain(routes: Iterable<string>): void {
    const keep = new Set(routes);
    for (const name of this.budgets.keys()) if (!keep.has(name)) this.budgets.delete(name);
  }

  private budget(route: string): RetryBudget {
    let b = this.budgets.get(route);
    if (b === undefined) {
      b = new RetryBudget();
      this.budgets.set(route, b);
    }
    return b;
  }

  /** A primary request of `route` was sent at `now`. */
  primary(route: string, now: number): void {
    this.budget(route).deposit(now);
  }

  /** Whether the budget of `route` allows one more attempt (a retry or a hedge) now; nothing is counted. */
  allows(route: string, now: number, ratioPercent: number): boolean {
    return this.budget(route).allows(now, ratioPercent);
  }

  /** Takes one attempt from the budget of `route` (after `allows` said yes, in the same turn). */
  withdraw(route: string, now: number, ratioPercent: number): void {
    this.budget(route).withdraw(now, ratioPercent);
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

  /** Primary requests and retries of `route` in the budget's window ending at `now`. */
  counts(route: string, now: number): { primaries: number; retries: number } {
    return this.budgets.get(route)?.counts(now) ?? { primaries: 0, retries: 0 };
  }
}
