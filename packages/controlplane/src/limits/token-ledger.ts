// The node's TOKEN budgets (docs/overload.md "Token budgets"): budgets that are consumed, not
// returned — a scoped rate limit per request key, the new-connection rate of the node — held by
// the supervisor as one token bucket per (budget, key) and leased to workers in blocks. A worker
// spends its lease synchronously and asks for more when it is empty (resilience/token-lease.ts);
// this ledger is the only place tokens are made, so the node admits at most what one bucket would.
//
// The invariant that makes it exact: for every bucket, tokens + Σ held ≤ burst, where `held[w]` is
// the ledger's upper estimate of the tokens worker w holds unspent. Refill stops at burst − Σ held;
// a grant moves tokens from the bucket to `held`; an ask reports what the worker still holds (held
// can only fall to it); a settle gives the unspent back. So over any interval t the node admits at
// most burst + rate × t: exactly one token bucket's contract, whatever the worker count and however
// requests spread over workers. The error is on one side only: a worker's spent tokens count as
// held until its next ask or settle, which can hold the refill lower for that long, never higher.
//
// Blocks: a grant covers the requests waiting for it (spent on arrival) and, asking ahead, at most
// block = max(1, floor(burst / (2 × workers))) more: a small burst (`burst: 5` on 4 workers) is
// never held unspent by a worker beyond one token, so no worker holds a token another needs — a
// request is refused only when the node has none. A large burst is leased ahead in blocks, so a
// busy key on one worker asks once per half block.
//
// Pure: the clock is an argument. Memory is bounded: at most `maxBuckets` buckets; a bucket full
// and held by nobody is the same as none and is dropped by `sweep`; past the cap the least recently
// used unheld buckets go (an evicted key starts again from a full bucket, as a new key would).

/**
 * A budget's contract: `rate` tokens per second up to `burst`. Rate 0 makes it a budget of SLOTS
 * (connections open per source, on the node): nothing refills, a worker gives a unit back when it
 * frees (a settle of that one unit), and it is granted only to requests waiting for it (block 1), so no
 * worker holds an idle slot another needs.
 */
export interface TokenLimit {
  readonly rate: number;
  readonly burst: number;
}

/** The answer to one ask. */
export interface TokenAnswer {
  /** Tokens granted now (0: none left). */
  readonly granted: number;
  /** When the bucket could not cover the ask: ms until it holds one more token (≥ 1); else 0. */
  readonly waitMs: number;
  /** The most this budget grants at once now (the worker asks ahead only when it is above 1). */
  readonly block: number;
}

/** Buckets the supervisor keeps at most, every budget together. */
export const MAX_LEDGER_BUCKETS = 200_000;

/** A bucket used again after this long moves to the back of the eviction order, ms. */
const TOUCH_MS = 1000;

interface Bucket {
  tokens: number;
  /** When `tokens` was last brought up to date, ms. */
  at: number;
  touched: number;
  /** Per worker: tokens it may still hold unspent (upper estimate); absent: none. */
  held: Map<number, number> | undefined;
  heldTotal: number;
}

/** The block of a budget: max(1, floor(burst / (2 × workers))). */
export function blockSize(limit: TokenLimit, workers: number): number {
  if (limit.rate === 0) return 1;
  return Math.max(1, Math.floor(limit.burst / (2 * Math.max(1, workers))));
}

/** Tokens of `b` at `now` under `limit`: refilled at the rate, never above burst − Σ held; time going back refills nothing. */
export function refilled(tokens: number, at: number, heldTotal: number, limit: TokenLimit, now: number): number {
  const cap = Math.max(0, limit.burst - heldTotal);
  return Math.min(cap, tokens + (Math.max(0, now - at) * limit.rate) / 1000);
}

/** One budget of the token ledger as the snapshot shows it. */
export interface TokenBudgetView {
  readonly budget: string;
  /** Its contract: tokens a second (0: slots, given back) and the bucket's capacity per key. */
  readonly rate: number;
  readonly burst: number;
  /** Keys with a bucket now (a key's bucket is dropped when full and held by nobody). */
  readonly keys: number;
  /** Units held by workers over all its keys, and by each worker that holds any. */
  readonly held: number;
  readonly workers: readonly { readonly worker: number; readonly held: number }[];
}

export class TokenLedger {
  private readonly buckets = new Map<string, Bucket>();
  private limits = new Map<string, TokenLimit>();
  private workers = 1;
  private readonly maxBuckets: number;
  /** Buckets dropped to stay under the cap (a metric). */
  evicted = 0;

  constructor(maxBuckets = MAX_LEDGER_BUCKETS) {
    this.maxBuckets = maxBuckets;
  }

  /**
   * The budgets in force (at a commit) and the worker count. Buckets of a budget no longer
   * configured are dropped; a changed contract applies to existing buckets from their next refill
   * (a lowered burst clamps them at once); a budget of slots takes a changed cap at once.
   */
  configure(limits: ReadonlyMap<string, TokenLimit>, workers: number): void {
    const before = this.limits;
    this.limits = new Map(limits);
    this.workers = Math.max(1, workers);
    for (const [id, b] of this.buckets) {
      const budget = budgetOf(id);
      const limit = this.limits.get(budget);
      if (limit === undefined) this.buckets.delete(id);
      // Slots never refill, so a changed cap moves the free ones with it, at once: free = cap − held
      // (units given back but not yet received count as held until their settle adds them).
      else if (limit.rate === 0 && before.get(budget)?.burst !== limit.burst) b.tokens = Math.max(0, limit.burst - b.heldTotal);
    }
  }

  /** The contract of `budget`, if configured. */
  limit(budget: string): TokenLimit | undefined {
    return this.limits.get(budget);
  }

  /**
   * Worker `worker` asks for `want` tokens of (`budget`, `key`) at `now`, `waiting` of them for
   * requests waiting now, holding `holding` unspent. Tokens for waiting requests are spent on
   * arrival, so they may pass the block; the rest (asking ahead) may not. An unknown budget (a
   * generation changed meanwhile) grants nothing and asks it to wait a second.
   */
  ask(worker: number, budget: string, key: string, want: number, waiting: number, holding: number, now: number): TokenAnswer {
    const limit = this.limits.get(budget);
    if (limit === undefined) return { granted: 0, waitMs: 1000, block: 1 };
    const b = this.bucket(budget, key, limit, now);
    const before = b.held?.get(worker) ?? 0;
    const held = Math.max(0, Math.min(before, holding));
    if (held !== before) this.setHeld(b, worker, held);
    b.tokens = refilled(b.tokens, b.at, b.heldTotal, limit, now);
    b.at = now;
    const block = blockSize(limit, this.workers);
    const granted = Math.max(0, Math.min(Math.floor(b.tokens), Math.max(Math.min(Math.floor(want), block), Math.floor(waiting))));
    if (granted > 0) {
      b.tokens -= granted;
      this.setHeld(b, worker, held + granted);
    }
    // Fewer than wanted because the bucket is short: the time its next token takes. (By the block: 0, ask again.)
    // Slots refill only as units are given back: 1 ms (refused now, asked again after).
    const waitMs = granted >= want || b.tokens >= 1 ? 0 : limit.rate === 0 ? 1 : Math.max(1, Math.ceil(((1 - b.tokens) * 1000) / limit.rate - 1e-9));
    return { granted, waitMs, block };
  }

  /**
   * Worker `worker` gives back `unused` units of (`budget`, `key`). `forget`: it holds none after
   * (the tokens it spent are gone); else `unused` is a delta (a slot freed).
   */
  settle(worker: number, budget: string, key: string, unused: number, forget: boolean, now: number): void {
    const limit = this.limits.get(budget);
    const b = this.buckets.get(idOf(budget, key));
    if (limit === undefined || b === undefined) return;
    const held = b.held?.get(worker) ?? 0;
    if (held === 0) return;
    b.tokens = refilled(b.tokens, b.at, b.heldTotal, limit, now);
    b.at = now;
    const back = Math.max(0, Math.min(unused, held));
    const after = forget ? 0 : held - back;
    this.setHeld(b, worker, after);
    b.tokens = Math.min(limit.burst - b.heldTotal, b.tokens + back);
  }

  /**
   * Worker `worker` is gone (exit, SIGKILL). Tokens it held are dropped, as spent (it may have spent
   * them): the refill is no longer held down by them, so the node gets its full contract back at the
   * rate. Slots it held come back at once: its connections died with it.
   */
  dropWorker(worker: number, now: number): void {
    for (const [id, b] of this.buckets) {
      const held = b.held?.get(worker) ?? 0;
      if (held === 0) continue;
      const limit = this.limits.get(budgetOf(id));
      if (limit !== undefined) b.tokens = refilled(b.tokens, b.at, b.heldTotal, limit, now);
      b.at = now;
      this.setHeld(b, worker, 0);
      if (limit?.rate === 0) b.tokens = Math.min(limit.burst - b.heldTotal, b.tokens + held);
    }
  }

  /** Drops every bucket that is full and held by nobody (the same as none). */
  sweep(now: number): void {
    for (const [id, b] of this.buckets) {
      const limit = this.limits.get(budgetOf(id));
      if (limit === undefined) this.buckets.delete(id);
      else if (b.heldTotal === 0 && refilled(b.tokens, b.at, 0, limit, now) >= limit.burst) this.buckets.delete(id);
    }
  }

  /** Buckets kept now. */
  get size(): number {
    return this.buckets.size;
  }

  /**
   * Every configured budget at a glance (the snapshot's `admission.token_budgets`): its contract,
   * the keys with a bucket now, and the units each worker holds in all of them (tokens unspent or
   * slots in use). O(buckets): for the snapshot, not a hot path.
   */
  views(): TokenBudgetView[] {
    const out = new Map<string, { keys: number; held: Map<number, number> }>();
    for (const budget of this.limits.keys()) out.set(budget, { keys: 0, held: new Map() });
    for (const [id, b] of this.buckets) {
      const v = out.get(budgetOf(id));
      if (v === undefined) continue;
      v.keys++;
      for (const [w, n] of b.held ?? []) v.held.set(w, (v.held.get(w) ?? 0) + n);
    }
    return [...out].map(([budget, v]) => {
      const limit = this.limits.get(budget) as TokenLimit;
      const workers = [...v.held].sort((a, b) => a[0] - b[0]).map(([worker, held]) => ({ worker, held }));
      return { budget, rate: limit.rate, burst: limit.burst, keys: v.keys, held: workers.reduce((n, w) => n + w.held, 0), workers };
    });
  }

  /** The state of one bucket at `now` (tests, views): tokens in the supervisor and held per worker. */
  peek(budget: string, key: string, now: number): { tokens: number; held: Record<number, number> } | undefined {
    const limit = this.limits.get(budget);
    const b = this.buckets.get(idOf(budget, key));
    if (limit === undefined || b === undefined) return undefined;
    return { tokens: refilled(b.tokens, b.at, b.heldTotal, limit, now), held: Object.fromEntries(b.held ?? []) };
  }

  private bucket(budget: string, key: string, limit: TokenLimit, now: number): Bucket {
    const id = idOf(budget, key);
    let b = this.buckets.get(id);
    if (b === undefined) {
      if (this.buckets.size >= this.maxBuckets) this.evict();
      b = { tokens: limit.burst, at: now, touched: now, held: undefined, heldTotal: 0 };
      this.buckets.set(id, b);
      return b;
    }
    if (now - b.touched >= TOUCH_MS) {
      b.touched = now;
      this.buckets.delete(id);
      this.buckets.set(id, b);
    }
    return b;
  }

  private setHeld(b: Bucket, worker: number, n: number): void {
    const before = b.held?.get(worker) ?? 0;
    b.heldTotal += n - before;
    if (n === 0) {
      b.held?.delete(worker);
      if (b.held?.size === 0) b.held = undefined;
    } else (b.held ??= new Map()).set(worker, n);
  }

  /** Drops the least recently used tenth of the cap among buckets nobody holds. */
  private evict(): void {
    let n = Math.max(1, Math.floor(this.maxBuckets / 10));
    for (const [id, b] of this.buckets) {
      if (b.heldTotal > 0) continue;
      this.buckets.delete(id);
      this.evicted++;
      if (--n === 0) break;
    }
  }
}

function idOf(budget: string, key: string): string {
  return `${budget}\u0000${key}`;
}

function budgetOf(id: string): string {
  return id.slice(0, id.indexOf('\u0000'));
}
