// How many requests a failing authorization service may let through (`failure_mode: allow` with
// `fail_open_per_second`). Under `allow` a timeout, an error or a full call queue forwards the
// request unchecked, and a client can cause each of those itself: a flood (or requests the service
// is slow to decide) fills the `max_pending` calls of a worker, and every request beyond is
// decided by the failure mode at once. The budget bounds what such a flood buys: at most
// `perSecond` requests a second are allowed by failure (a token bucket, burst `perSecond`), the
// rest are answered 503 as under `deny`.
//
// The budget is one per pool for the whole node: the authorizer asks a `FailOpenGate` its caller
// hands it. Under a supervisor the data plane's gate spends tokens of the node's bucket
// (`auth-fo:<pool>`, leased from the supervisor's token ledger: dataplane auth/fail-open-lease.ts);
// a process alone (no supervisor) uses the `FailOpenBudget` below, its own bucket.

/** Decides whether one more failure may allow its request: true takes a token; false (spent, or unknown) denies. */
export interface FailOpenGate {
  take(): boolean | Promise<boolean>;
}

/** A token bucket of fail-open decisions; the clock is injected (milliseconds, monotonic). */
export class FailOpenBudget implements FailOpenGate {
  private tokens: number;
  private last: number;
  private readonly perSecond: number;
  private readonly now: () => number;

  /** `perSecond`: requests allowed by failure per second, and the burst (a whole second's worth). */
  constructor(perSecond: number, now: () => number = () => performance.now()) {
    this.perSecond = perSecond;
    this.now = now;
    this.tokens = perSecond;
    this.last = now();
  }

  /** Whether one more request may be allowed by failure now (takes a token when it may). */
  take(): boolean {
    const now = this.now();
    // A clock that went back refills nothing (performance.now() does not, an injected one might).
    this.tokens = Math.min(this.perSecond, this.tokens + (Math.max(0, now - this.last) * this.perSecond) / 1000);
    this.last = now;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
