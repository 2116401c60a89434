// Per-worker in-flight counters for the global limit and the per-upstream limit (the per-backend
// limit is counted by the backend's own stats, `balancing/backend-stats.ts`). Limits are per
// worker: a node with N workers admits up to N × each limit (docs/overload.md).
//
// Upstream counters are keyed by pool *name* and outlive generation swaps, so that requests still
// in flight on the old generation count against the new generation's limit of the same pool, and
// their release lands on the same counter. A counter is a few bytes per pool name ever
// configured in the worker's life; they are never removed (a removed pool's counter only drains
// to 0).
//
// Releasing exactly once: the caller keeps one small integer per request, the slots it holds as
// bit flags (HOLDS_GLOBAL | HOLDS_UPSTREAM), sets a bit when a `try…` succeeds, and on every exit
// path calls `release(held, counter)` and stores the result (always NONE) back:
//
//   if (!limits.tryGlobal(limit)) return queueOrShed('global');
//   ctx.held |= HOLDS_GLOBAL;
//   if (!limits.tryUpstreamCounter(ctx.upstreamCounter, upstreamLimit)) return queueOrShed('upstream');
//   ctx.held |= HOLDS_UPSTREAM;
//   …
//   finish(): ctx.held = limits.release(ctx.held, ctx.upstreamCounter); // a second call releases nothing
//
// The flags make a double release impossible and a forgotten path visible (held ≠ 0 at the end).

/** No slot held. */
export const NONE = 0;
/** The request holds a global in-flight slot. */
export const HOLDS_GLOBAL = 1;
/** The request holds an in-flight slot of its upstream. */
export const HOLDS_UPSTREAM = 2;

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
   * the caller can look it up once (per request or per provisioned pool) and skip the map after.
   */
  counter(name: string): UpstreamInflight {
    let c = this.upstreams.get(name);
    if (c === undefined) {
      c = new UpstreamInflight(name);
      this.upstreams.set(name, c);
    }
    return c;
  }

  /** Takes a slot of pool `name` if fewer than `limit` are held. */
  tryUpstream(name: string, limit: number): boolean {
    return this.tryUpstreamCounter(this.counter(name), limit);
  }

  /** `tryUpstream` on a counter already looked up. */
  tryUpstreamCounter(c: UpstreamInflight, limit: number): boolean {
    if (c.inflight >= limit) return false;
    c.inflight++;
    return true;
  }

  /** Gives back a slot of pool `name` (never below 0). */
  releaseUpstream(name: string): void {
    const c = this.upstreams.get(name);
    if (c !== undefined && c.inflight > 0) c.inflight--;
  }

  /** `releaseUpstream` on a counter already looked up. */
  releaseUpstreamCounter(c: UpstreamInflight): void {
    if (c.inflight > 0) c.inflight--;
  }

  /** Requests of pool `name` holding a slot in this worker (0 for a pool never seen). */
  upstreamInflight(name: string): number {
    return this.upstreams.get(name)?.inflight ?? 0;
  }

  /**
   * Releases what `held` says the request holds (HOLDS_GLOBAL, HOLDS_UPSTREAM of `upstream`)
   * and returns NONE, to be stored back into the request's flags; a second call with the
   * returned value releases nothing. `upstream` may be undefined when HOLDS_UPSTREAM is not set.
   */
  release(held: number, upstream: UpstreamInflight | undefined): number {
    if ((held & HOLDS_GLOBAL) !== 0) this.releaseGlobal();
    if ((held & HOLDS_UPSTREAM) !== 0 && upstream !== undefined) this.releaseUpstreamCounter(upstream);
    return NONE;
  }

  /** Pool names with at least one request in flight, and their counts (snapshot path; allocates). */
  upstreamCounts(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [name, c] of this.upstreams) if (c.inflight > 0) out[name] = c.inflight;
    return out;
  }
}
