// Which per-backend in-flight budgets a configuration defines (docs/overload.md "One node, one set
// of limits"), decided by one function that both processes call: the supervisor defines the
// budget `backend:<pool>/<id>` in its lease ledger exactly where a worker takes that backend's
// slot from its lease, so the two sides cannot drift.

/** The in-flight limits of `performance` that decide the per-backend budgets. */
export interface InflightLimits {
  /** `global_inflight_limit` (default 4096): requests in flight on the node. */
  readonly global_inflight_limit: number;
  /** `per_upstream_inflight_limit` (default 2048): requests in flight per pool on the node. */
  readonly per_upstream_inflight_limit: number;
  /** `per_backend_inflight_limit` (default 512): requests in flight per backend on the node. */
  readonly per_backend_inflight_limit: number;
}

/**
 * Whether `per_backend_inflight_limit` can bind: below the pool's effective limit, the lower of
 * `global_inflight_limit` and `per_upstream_inflight_limit`. At or above it a backend never has
 * more in flight than its pool may, so no backend budget is defined and no worker takes a
 * backend slot (the same reasoning as the upstream budget against the global one).
 */
export function backendLimitBinds(p: InflightLimits): boolean {
  return p.per_backend_inflight_limit < Math.min(p.global_inflight_limit, p.per_upstream_inflight_limit);
}

/** The budget key of backend `id` of pool `pool` (its in-flight limit; the same key across generations). */
export function backendBudgetKey(pool: string, id: string): string {
  return `backend:${pool}/${id}`;
}
