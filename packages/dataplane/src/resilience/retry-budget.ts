// Retry budget (SPEC `resilience.retry_budget`; the model is Finagle's RetryBudget and Envoy's
// retry budgets): retries are allowed as a share of primary requests over a sliding window, plus
// a small floor so that a quiet route can still retry, so retries can never multiply the load on
// a failing pool beyond `ratio_percent` (plus the floor). Pure state and O(1) per call; the caller
// owns the clock. A worker run without a supervisor keeps one per route (resilience/retry-control.ts);
// under a supervisor the budget is the node's (controlplane limits/window-ledger.ts, the same rule).

/** Length of the sliding window, ms: ten buckets of one second. */
export const WINDOW_MS = 10_000;
const BUCKETS = 10;
const BUCKET_MS = WINDOW_MS / BUCKETS;

/**
 * Retries every route may make per window whatever its traffic (3 a second): with a ratio alone a
 * route with 5 requests a minute could never retry at all.
 */
export const MIN_RETRIES_PER_WINDOW = 30;

/** One route's deposits (primary requests) and withdrawals (retries) over the last window. */
export class RetryBudget {
  private readonly primaries = new Int32Array(BUCKETS);
  private readonly retries = new Int32Array(BUCKETS);
  /** Index of the bucket of `epoch` (whole seconds of the clock); older buckets are cleared on the way. */
  private epoch = -1;
  private primaryTotal = 0;
  private retryTotal = 0;

  /** Moves the window to `now`: buckets older than the window are emptied. */
  private advance(now: number): number {
    const e = Math.floor(now / BUCKET_MS);
    if (this.epoch === -1) {
      this.epoch = e;
      return e % BUCKETS;
    }
    if (e <= this.epoch) return this.epoch % BUCKETS;
    const steps = Math.min(BUCKETS, e - this.epoch);
    for (let i = 1; i <= steps; i++) {
      const b = (this.epoch + i) % BUCKETS;
      this.primaryTotal -= this.primaries[b] as number;
      this.retryTotal -= this.retries[b] as number;
      this.primaries[b] = 0;
      this.retries[b] = 0;
    }
    this.epoch = e;
    return e % BUCKETS;
  }

  /** A primary request (not a retry, not a hedge) was sent at `now`. */
  deposit(now: number): void {
    const b = this.advance(now);
    this.primaries[b] = (this.primaries[b] as number) + 1;
    this.primaryTotal++;
  }

  /**
   * Asks for one retry at `now` under `ratioPercent` (0-100): allowed while the retries of the
   * window stay within `MIN_RETRIES_PER_WINDOW` + `ratioPercent` % of its primary requests. An
   * allowed retry is counted; a refused one is not.
   */
  withdraw(now: number, ratioPercent: number): boolean {
    if (!this.allows(now, ratioPercent)) return false;
    const b = this.epoch % BUCKETS;
    this.retries[b] = (this.retries[b] as number) + 1;
    this.retryTotal++;
    return true;
  }

  /** Whether `withdraw(now, ratioPercent)` would allow one retry now (nothing is counted). */
  allows(now: number, ratioPercent: number): boolean {
    this.advance(now);
    // Integer arithmetic: 100 × retries against 100 × floor + ratio × primaries.
    return (this.retryTotal + 1) * 100 <= MIN_RETRIES_PER_WINDOW * 100 + ratioPercent * this.primaryTotal;
  }

  /** Primary requests and retries counted in the window ending at `now` (views and tests). */
  counts(now: number): { primaries: number; retries: number } {
    this.advance(now);
    return { primaries: this.primaryTotal, retries: this.retryTotal };
  }
}
