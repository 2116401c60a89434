// A pool's fail-open budget as the node's (docs/auth.md "When the service fails"): under a
// supervisor, `fail_open_per_second: N` is a token budget of its token ledger, `auth-fo:<pool>`
// (one key, ''), rate N and burst N, leased to the workers like a scoped rate limit's
// (resilience/token-lease.ts). So the node lets at most N + N × t requests of the pool through by
// failure over any time t, whatever the worker count and however the clients spread over workers.
// A failure is decided asynchronously already: with its lease empty, the request waits for the
// supervisor's answer, at most `LEASE_WAIT_MS`; none in time (a slow or frozen supervisor), or
// none granted, and the failure denies, as when the budget is spent: a failure never allows more
// than the node granted.
import type { FailOpenGate } from '@edge-proxy/auth';
import { PENDING } from '../resilience/token-lease.ts';
import type { TokenLeases } from '../resilience/token-lease.ts';

/** The token-ledger budget of pool `pool`'s fail-open (the supervisor's `failOpenBudget`); its one key is ''. */
export function failOpenBudget(pool: string): string {
  return `auth-fo:${pool}`;
}

/** The fail-open gate of one pool, spending the node's tokens through this worker's leases. */
export class LeasedFailOpen implements FailOpenGate {
  private readonly leases: TokenLeases;
  private readonly now: () => number;
  /** `auth-fo:<pool>`. */
  readonly budget: string;

  /** `now`: the leases' clock, ms (monotonic; tests inject a fake one). */
  constructor(leases: TokenLeases, pool: string, now: () => number = () => performance.now()) {
    this.leases = leases;
    this.now = now;
    this.budget = failOpenBudget(pool);
  }

  /** True when a token of the node's budget was spent; false when it has none, or the supervisor did not answer in time. */
  take(): boolean | Promise<boolean> {
    const now = this.now();
    const l = this.leases.lease(this.budget, '', now);
    const v = this.leases.takeOne(l, now);
    if (v !== PENDING) return v === 0;
    return new Promise((resolve) => this.leases.wait([l], (verdict) => resolve(verdict === 0)));
  }
}
