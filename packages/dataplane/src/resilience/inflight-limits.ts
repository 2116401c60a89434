// Per-worker in-flight counters for the global limit and the per-upstream limit (the per-backend
// limit is counted by the backend's own stats, `balancing/backend-stats.ts`). Limits are per
// worker: a node with N workers admits up to N × each limit (docs/overload.md).
//
// Upstream counters are keyed by pool *name* and outlive generation swaps, so that requests still
// in flight on the old generation count against the new generation's limit of the same pool, and
// their release lands on the same counter. A counter is a few bytes per pool name ever
// configured in the worker's life; they are never removed (a removed pool's counter only drains
// to 0). A provisioned pool keeps its counter (`UpstreamRuntime.inflight`), so a request never
// looks it up by name.
//
// Releasing exactly once is the caller's: the request context (proxy/pipeline.ts) keeps a flag
// per slot it holds and gives back what the flags say in its one finishing path.

/** The in-flight count of one upstream pool, a stable object the caller may keep per request or per pool. */
export class UpstreamInflight {
  /** The pool name. */
  readonly name: string;
  /** Requests of this pool holding a slot in this worker. */
  inflight = 0;

  constructor(name: string) {
    this.name = name;
  }
}

/** A worker's global and per-upstream in-flight counters. All operations O(1), no allocation after a pool's first use. */
export class InflightLimits {
  private global = 0;
  private readonly upstreams = new Map<string, UpstreamInflight>();

  /** Proxied requests holding a global slot in this worker (`svc_inflight_requests`, snapshot `inflight`). */
  get inflight(): number {
    return this.global;
  }

  /** Takes a global slot if fewer than `limit` are held. */
  tryGlobal(limit: number): boolean {
    if (this.global >= limit) return false;
    this.global++;
    return true;
  }

  /** Gives back a global slot (never below 0). */
  releaseGlobal(): void {
    if (this.global > 0) this.global--;
  }

  /**
   * The counter of pool `name`, created on first use and the same object for the worker's life:
   * the caller looks it up once per provisioned pool and skips the map after.
   */
  counter(name: string): UpstreamInflight {
    let c = this.upstreams.get(name);
    if (c === undefined) {
      c = new UpstreamInflight(name);
      this.upstreams.set(name, c);
    }
    return c;
  }

  /** Takes a slot of the pool counted by `c` if fewer than `limit` are held. */
  tryUpstreamCounter(c: UpstreamInflight, limit: number): boolean {
    if (c.inflight >= limit) return false;
    c.inflight++;
    return true;
  }

  /** Gives back a slot of the pool counted by `c` (never below 0). */
  releaseUpstreamCounter(c: UpstreamInflight): void {
    if (c.inflight > 0) c.inflight--;
  }
}
