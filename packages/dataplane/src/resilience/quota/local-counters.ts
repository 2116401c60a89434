// Quota contracts counted in this worker's memory, for a worker run without a supervisor (under
// one the local counters are the node's: quota-control.ts leases them): backend `local`, and
// `failure_mode: local_fallback` while the store does not answer. Same algorithm as the Redis script
// (redis-store.ts): fixed windows aligned on multiples of `window_ms` since the epoch, a request
// admitted only if every contract of every matching policy is under its limit, then counted in all
// of them. A worker counts against its share of each limit, ceil(limit / workers), so a node of N
// workers admits about the limit in total (at most N - 1 more, from the rounding), not N times it.
//
// Memory is bounded: at most `maxKeys` counters (100,000 by default), kept in a Map in least
// recently used order (a counted or denied key moves to the end). Inserting past the bound evicts the least
// recently used counter; each insert also drops up to two expired counters from the old end, so
// idle keys go away without a sweep timer. An evicted counter restarts at zero if its key comes
// back: a flood of distinct keys can make the limit of an old key forgiving, never memory grow.
import type { CompiledPolicy, ContractKind } from './policy.ts';

/** Counters one worker keeps at most. */
export const MAX_LOCAL_KEYS = 100_000;

/** A decision of the quota contracts. */
export interface ContractDecision {
  readonly allowed: boolean;
  /** The denying policy (the one whose window ends last, when several deny). */
  readonly policy: CompiledPolicy | undefined;
  readonly contract: ContractKind | undefined;
  /** Milliseconds until the denying window ends; 0 when allowed. */
  readonly retryAfterMs: number;
}

/** The decision "allowed". */
export const ALLOWED: ContractDecision = Object.freeze({ allowed: true, policy: undefined, contract: undefined, retryAfterMs: 0 });

interface Counter {
  /** Window index: floor(now / windowMs). */
  index: number;
  windowMs: number;
  count: number;
}

/** The share of `limit` one of `workers` workers may admit: ceil(limit / workers), at least 1. */
export function workerShare(limit: number, workers: number): number {
  return Math.max(1, Math.ceil(limit / Math.max(1, workers)));
}

export class LocalCounters {
  private readonly counters = new Map<string, Counter>();
  private readonly maxKeys: number;

  constructor(maxKeys = MAX_LOCAL_KEYS) {
    this.maxKeys = maxKeys;
  }

  /** Counters held now (tests, the bound). */
  get size(): number {
    return this.counters.size;
  }

  /**
   * Decides for one request at `now` (ms since the epoch): `keys[i]` is the selector key of
   * `policies[i]`. Counts in every contract only when all allow.
   */
  decide(policies: readonly CompiledPolicy[], keys: readonly string[], workers: number, now: number): ContractDecision {
    let deny: ContractDecision | undefined;
    for (let i = 0; i < policies.length; i++) {
      const p = policies[i] as CompiledPolicy;
      for (const c of p.contracts) {
        const index = Math.floor(now / c.windowMs);
        const key = (keys[i] as string) + c.suffix;
        const counter = this.counters.get(key);
        const count = counter !== undefined && counter.index === index && counter.windowMs === c.windowMs ? counter.count : 0;
        if (count < workerShare(c.limit, workers)) continue;
        // A denied key is in use too: moved to the recent end, so a flood of new keys cannot evict it and reset its count.
        this.counters.delete(key);
        this.counters.set(key, counter as Counter);
        const left = (index + 1) * c.windowMs - now;
        if (deny === undefined || left > deny.retryAfterMs) deny = { allowed: false, policy: p, contract: c.kind, retryAfterMs: left };
      }
    }
    if (deny !== undefined) return deny;
    for (let i = 0; i < policies.length; i++) {
      for (const c of (policies[i] as CompiledPolicy).contracts) this.count((keys[i] as string) + c.suffix, Math.floor(now / c.windowMs), c.windowMs, now);
    }
    return ALLOWED;
  }

  private count(key: string, index: number, windowMs: number, now: number): void {
    const counter = this.counters.get(key);
    if (counter !== undefined) {
      this.counters.delete(key); // re-inserted below: most recently used
      if (counter.index === index && counter.windowMs === windowMs) counter.count++;
      else {
        counter.index = index;
        counter.windowMs = windowMs;
        counter.count = 1;
      }
      this.counters.set(key, counter);
      return;
    }
    this.dropExpired(now, 2);
    if (this.counters.size >= this.maxKeys) {
      const oldest = this.counters.keys().next();
      if (oldest.done !== true) this.counters.delete(oldest.value);
    }
    this.counters.set(key, { index, windowMs, count: 1 });
  }

  /** Drops up to `n` counters from the least recently used end whose window has ended. */
  private dropExpired(now: number, n: number): void {
    for (const [key, c] of this.counters) {
      if (n-- <= 0 || (c.index + 1) * c.windowMs > now) return;
      this.counters.delete(key);
    }
  }
}
