// Scoped rate limits (`resilience.rate_limits`, docs/rate-limits.md): a token bucket per (limit,
// request key), refilled at `requests_per_second` up to `burst`. A request takes one token or is
// refused 429 (`EDGE_RATE_LIMITED`) with `Retry-After` = seconds until its next token.
//
// Across workers: a limit is the node's. Under a supervisor (`edge-proxy serve`) the bucket of each
// (limit, key) lives in the supervisor's token ledger (controlplane limits/token-ledger.ts) and
// this worker spends tokens leased from it (resilience/token-lease.ts): synchronously while its
// lease of the key holds one, else after one round trip to the supervisor, at most
// `LEASE_WAIT_MS` (past it: `UNAVAILABLE`, shed `lease_unavailable`). The node admits exactly what
// one bucket admits, whatever the worker count and however clients spread over workers
// (docs/rate-limits.md "Across workers"). Alone (no supervisor: tests, one process), the buckets
// below are this process's own, with the whole contract.
//
// Memory (alone): at most `MAX_BUCKETS` buckets across every limit. A full bucket is the same as
// none and is dropped by a sweep every `SWEEP_MS`; past the cap the least recently used go first
// (a bucket moves to the back of the map at most once a second, so a busy key is not evicted by
// a flood of new ones and a hot key costs no map write per request). Leased: the lease table's
// bound (`MAX_LEASES`, idle leases settled after `LEASE_IDLE_MS`) and the ledger's.
//
// Keys: the tagged selector values of balancing/request-key.ts (`compileSelector`): a header's
// value and a client address never share a bucket, a value over 64 characters is kept as its
// digest, and a request without the value is keyed by its client address (`key_fallback:
// client_ip`, the default) or not limited by that limit at all (`key_fallback: none`).
import type { KeySource, SelectorExtractor } from '../balancing/request-key.ts';
import { compileSelector } from '../balancing/request-key.ts';
import type { ResolvedConfig } from '@edge-proxy/config';
import type { Lease, TokenLeases } from './token-lease.ts';
/** Buckets one worker keeps at most, every limit together. */
export const MAX_BUCKETS = 100_000;
/** How often full buckets are dropped, ms. */
const SWEEP_MS = 10_000;
/** A bucket used again after this long moves to the back of the eviction order. */
const TOUCH_MS = 1000;

/** One configured limit as a route applies it. */
export interface CompiledLimit {
  readonly name: string;
  /** Its budget in the supervisor's token ledger: `rl:<name>` (`rateLimitBudget`). */
  readonly budget: string;
  /** The request's tagged key; `undefined`: the limit does not apply to it (`key_fallback: none`). */
  readonly key: SelectorExtractor;
  /** Tokens per ms and bucket size: the limit's whole contract (the node's). */
  readonly perMs: number;
  readonly burst: number;
}

interface Bucket {
  tokens: number;
  /** When `tokens` was last brought up to date, ms. */
  at: number;
  /** When it last moved to the back of the eviction order, ms. */
  touched: number;
  readonly limit: CompiledLimit;
}

/** Whole seconds until bucket `b` of `limit` holds a token, at least 1. */
function waitSeconds(b: Bucket, limit: CompiledLimit): number {
  return Math.max(1, Math.ceil((1 - b.tokens) / limit.perMs / 1000));
}

/** The token-ledger budget of rate limit `name`. */
export function rateLimitBudget(name: string): string {
  return `rl:${name}`;
}

/** The limits of a generation, per route (routes with none are absent). */
export function compileLimits(config: ResolvedConfig['config']): ReadonlyMap<string, readonly CompiledLimit[]> {
  const byRoute = new Map<string, CompiledLimit[]>();
  const routes = Object.keys(config.upstream);
  for (const rl of config.resilience.rate_limits) {
    const limit: CompiledLimit = { name: rl.name, budget: rateLimitBudget(rl.name), key: compileSelector(rl.key, rl.key_fallback), perMs: rl.requests_per_second / 1000, burst: rl.burst };
    for (const route of rl.routes.length === 0 ? routes : rl.routes) {
      const list = byRoute.get(route) ?? [];
      list.push(limit);
      byRoute.set(route, list);
    }
  }
  return byRoute;
}

/** The token buckets of one worker, shared by every generation (a bucket is keyed by limit name and request key). */
export class RateLimiter {
  private readonly buckets = new Map<string, Bucket>();
  private readonly max: number;
  private readonly onEvict: (evicted: number) => void;
  private sweeper: NodeJS.Timeout | undefined;
  private leases: TokenLeases | undefined;

  /** `onEvict` hears how many buckets each eviction pass dropped to stay under `max`. */
  constructor(max = MAX_BUCKETS, onEvict: (evicted: number) => void = () => {}) {
    this.max = max;
    this.onEvict = onEvict;
  }

  /** From now on the buckets are the node's, leased through `leases` (the worker joined a supervisor). */
  lease(leases: TokenLeases): void {
    this.leases = leases;
    this.close();
  }

  /**
   * Takes a token from every limit in `limits` for the request `src`, at `now` (ms). Returns 0 when
   * allowed (a token taken from each), else the seconds until the refusing bucket has a token
   * (≥ 1). A refused request takes no token from any limit. A limit whose key the request lacks
   * under `key_fallback: none` is skipped. Leased: also `PENDING` (call `wait`: the lease of a key
   * is empty and the supervisor may grant) or `UNAVAILABLE` (the supervisor did not answer in time).
   */
  take(limits: readonly CompiledLimit[], src: KeySource, now: number): number {
    if (this.leases !== undefined) return this.takeLeased(this.leases, limits, src, now);
    if (limits.length === 1) {
      const limit = limits[0] as CompiledLimit;
      const key = limit.key(src);
      if (key === undefined) return 0;
      const b = this.bucket(limit, key, now);
      if (b.tokens < 1) return waitSeconds(b, limit);
      b.tokens -= 1;
      return 0;
    }
    // Every limit is checked first, so a request refused by the second does not spend the first's token.
    let wait = 0;
    const found: Bucket[] = [];
    for (const limit of limits) {
      const key = limit.key(src);
      if (key === undefined) continue;
      const b = this.bucket(limit, key, now);
      found.push(b);
      if (b.tokens < 1) wait = Math.max(wait, waitSeconds(b, limit));
    }
    if (wait > 0) return wait;
    for (const b of found) b.tokens -= 1;
    return 0;
  }

  /**
   * After `take` said `PENDING`: waits for the supervisor's answer (at most `LEASE_WAIT_MS` per
   * limit the request needs a token from); `done` hears 0, the seconds of a refusal, or `UNAVAILABLE`.
   */
  wait(limits: readonly CompiledLimit[], src: KeySource, done: (verdict: number) => void): void {
    const leases = this.leases as TokenLeases;
    const now = performance.now();
    leases.wait(this.leasesOf(leases, limits, src, now), done);
  }

  private takeLeased(leases: TokenLeases, limits: readonly CompiledLimit[], src: KeySource, now: number): number {
    if (limits.length === 1) {
      const limit = limits[0] as CompiledLimit;
      const key = limit.key(src);
      if (key === undefined) return 0;
      return leases.takeOne(leases.lease(limit.budget, key, now), now);
    }
    const found = this.leasesOf(leases, limits, src, now);
    return found.length === 0 ? 0 : leases.takeAll(found, now);
  }

  private leasesOf(leases: TokenLeases, limits: readonly CompiledLimit[], src: KeySource, now: number): Lease[] {
    const found: Lease[] = [];
    for (const limit of limits) {
      const key = limit.key(src);
      if (key !== undefined) found.push(leases.lease(limit.budget, key, now));
    }
    return found;
  }

  /** Buckets (alone) or leases kept now. */
  get size(): number {
    return this.leases?.size ?? this.buckets.size;
  }

  private bucket(limit: CompiledLimit, key: string, now: number): Bucket {
    // `key` is tagged and bounded (a long value is already its digest): a bucket weighs the same whatever the client sends.
    const id = `${limit.name}\u0000${key}`;
    let b = this.buckets.get(id);
    if (b === undefined) {
      if (this.buckets.size >= this.max) this.evict();
      b = { tokens: limit.burst, at: now, touched: now, limit };
      this.buckets.set(id, b);
      this.arm();
      return b;
    }
    // A new generation may have changed the limit: refill by the one in force.
    if (b.limit !== limit) (b as { limit: CompiledLimit }).limit = limit;
    b.tokens = Math.min(limit.burst, b.tokens + (now - b.at) * limit.perMs);
    b.at = now;
    if (now - b.touched >= TOUCH_MS) {
      b.touched = now;
      this.buckets.delete(id);
      this.buckets.set(id, b);
    }
    return b;
  }

  /** Drops the least recently used tenth of the cap (one pass, amortised). */
  private evict(): void {
    const pass = Math.max(1, Math.floor(this.max / 10));
    let n = pass;
    for (const id of this.buckets.keys()) {
      this.buckets.delete(id);
      if (--n === 0) break;
    }
    this.onEvict(pass - n);
  }

  /** Drops every bucket that has refilled (it is the same as none). */
  sweep(now: number): void {
    for (const [id, b] of this.buckets) {
      if (b.tokens + (now - b.at) * b.limit.perMs >= b.limit.burst) this.buckets.delete(id);
    }
  }

  private arm(): void {
    if (this.sweeper !== undefined) return;
    this.sweeper = setInterval(() => {
      this.sweep(performance.now());
      if (this.buckets.size === 0 && this.sweeper !== undefined) {
        clearInterval(this.sweeper);
        this.sweeper = undefined;
      }
    }, SWEEP_MS);
    this.sweeper.unref();
  }

  close(): void {
    if (this.sweeper !== undefined) clearInterval(this.sweeper);
    this.sweeper = undefined;
    this.buckets.clear();
  }
}
