// A worker's leases of the node's TOKEN budgets (docs/overload.md "Token budgets"): per (budget,
// key), the tokens the supervisor's ledger (controlplane limits/token-ledger.ts) granted this
// worker and it has not spent. A request spends from the lease synchronously; only when the lease
// of its key is empty does it wait for the supervisor, at most `waitMs`:
//
// - one ask per key outstanding at a time; the asks (and the settles) of one event-loop turn
//   travel in one message;
// - the answer serves the waiters first come, first served; those it does not cover are refused
//   with the ledger's wait (Retry-After), and so is every request of the key on this worker until
//   that wait has passed (a flood of refused requests costs no message);
// - no answer within `waitMs` (a slow or frozen supervisor): the waiters, and every request of the
//   key while the ask is still unanswered, are refused `UNAVAILABLE` (the caller's coded
//   `lease_unavailable`). A late answer is still credited: the ledger counts those tokens as this
//   worker's. Never admits past what was granted (never fails open);
// - a lease unused for `idleMs` is settled (its unspent tokens go back to the node) and forgotten,
//   so memory follows the active keys; at most `maxEntries` leases, the least recently used
//   settled first past it;
// - when the ledger grants in blocks (`block` > 1), a busy lease asks ahead at half a block, so a
//   hot key seldom waits.
//
// - a budget of SLOTS (connections per source, on the node: `slots` leases) is granted only to
//   waiting requests; a slot freed (`release`) goes straight back to the node, so no worker holds
//   an idle slot another worker needs.
//
// The clock, the timers and the channel are injected: the unit tests drive it with a fake clock.
import type { TokenAsk, TokenGrant, TokenSettle } from '@edge-proxy/ipc';
import { LEASE_WAIT_MS } from './lease.ts';

/** `take`: the lease of some key is empty and an ask may answer: call `wait`. */
export const PENDING = -1;
/** `take` / `wait`: the supervisor did not answer in time (the caller sheds `lease_unavailable`). */
export const UNAVAILABLE = -2;

/** How long a request waits for the supervisor's answer at most, ms: the slot leases' bound (lease.ts). */
export { LEASE_WAIT_MS };
/** A lease unused this long is settled and forgotten, ms. */
export const LEASE_IDLE_MS = 1000;
/** Leases one worker keeps at most. */
export const MAX_LEASES = 100_000;

export type { TokenAsk, TokenGrant, TokenSettle } from '@edge-proxy/ipc';

/** One (budget, key) lease. */
export interface Lease {
  readonly budget: string;
  readonly key: string;
  /** A budget of slots: spent units are in use until `release`. */
  readonly slots: boolean;
  /** Units held unspent (slots: idle). */
  tokens: number;
  /** Slots: units in use. */
  inUse: number;
  /** When the outstanding ask was sent, ms; -1: none. */
  askedAt: number;
  /** What the outstanding ask wanted. */
  wanted: number;
  /** Refused locally until then, ms (the ledger said its bucket was empty). */
  emptyUntil: number;
  /** Last spend or ask, ms. */
  used: number;
  /** The ledger's block for the budget, from its last answer. */
  block: number;
  waiters: Waiter[] | undefined;
}

interface Waiter {
  readonly leases: readonly Lease[];
  readonly done: (verdict: number) => void;
}

export interface TokenLeaseOptions {
  /** Sends the asks and settles of one turn in one message. */
  readonly send: (asks: readonly TokenAsk[], settles: readonly TokenSettle[]) => void;
  /** A monotonic clock, ms. */
  readonly now?: () => number;
  readonly waitMs?: number;
  readonly idleMs?: number;
  readonly maxEntries?: number;
  /** Timers (unref'd by the default); tests inject fakes. */
  readonly setTimer?: (fn: () => void, ms: number) => unknown;
  readonly clearTimer?: (t: unknown) => void;
  /** Defers the flush of a turn's messages (default `setImmediate`). */
  readonly defer?: (fn: () => void) => void;
  /** Hears how many leases each eviction pass settled to stay under `maxEntries`. */
  readonly onEvict?: (evicted: number) => void;
}

const defaultSetTimer = (fn: () => void, ms: number): unknown => setTimeout(fn, ms).unref();
const defaultClearTimer = (t: unknown): void => clearTimeout(t as NodeJS.Timeout);

export class TokenLeases {
  private readonly leases = new Map<string, Lease>();
  private readonly send: TokenLeaseOptions['send'];
  private readonly clock: () => number;
  readonly waitMs: number;
  private readonly idleMs: number;
  private readonly maxEntries: number;
  private readonly setTimer: (fn: () => void, ms: number) => unknown;
  private readonly clearTimer: (t: unknown) => void;
  private readonly defer: (fn: () => void) => void;
  private readonly onEvict: (evicted: number) => void;
  /** Leases with an ask to send this turn. */
  private asks: Lease[] = [];
  private settles: TokenSettle[] = [];
  private flushing = false;
  private sweeper: unknown;
  /** Messages sent to the supervisor (the lease traffic), and requests refused unavailable. */
  messages = 0;
  unavailable = 0;

  constructor(o: TokenLeaseOptions) {
    this.send = o.send;
    this.clock = o.now ?? (() => performance.now());
    this.waitMs = o.waitMs ?? LEASE_WAIT_MS;
    this.idleMs = o.idleMs ?? LEASE_IDLE_MS;
    this.maxEntries = o.maxEntries ?? MAX_LEASES;
    this.setTimer = o.setTimer ?? defaultSetTimer;
    this.clearTimer = o.clearTimer ?? defaultClearTimer;
    this.defer = o.defer ?? ((fn) => setImmediate(fn));
    this.onEvict = o.onEvict ?? (() => {});
  }

  /** The lease of (`budget`, `key`), made empty when there is none. */
  lease(budget: string, key: string, now: number, slots = false): Lease {
    const id = `${budget}\u0000${key}`;
    let l = this.leases.get(id);
    if (l === undefined) {
      if (this.leases.size >= this.maxEntries) this.evict();
      l = { budget, key, slots, tokens: 0, inUse: 0, askedAt: -1, wanted: 0, emptyUntil: 0, used: now, block: 1, waiters: undefined };
      this.leases.set(id, l);
      this.arm();
    } else if (now - l.used >= this.idleMs / 2) {
      // Back of the eviction order, at most twice per idle period.
      this.leases.delete(id);
      this.leases.set(id, l);
    }
    return l;
  }

  /**
   * Spends one token of `l` if it holds one: 0. Else the verdict without waiting when there is one
   * (seconds until the node has a token, ≥ 1; `UNAVAILABLE`), or `PENDING`.
   */
  takeOne(l: Lease, now: number): number {
    l.used = now;
    if (l.tokens >= 1) {
      l.tokens -= 1;
      if (l.slots) l.inUse++;
      if (l.block > 1 && l.askedAt === -1 && l.tokens < l.block / 2) this.ask(l, l.block, now);
      return 0;
    }
    return this.blocked(l, now);
  }

  /** The verdict for a request needing a token of the empty lease `l`, without waiting; `PENDING` if an answer may come. */
  blocked(l: Lease, now: number): number {
    if (l.askedAt !== -1 && now - l.askedAt >= this.waitMs) {
      this.unavailable++;
      return UNAVAILABLE;
    }
    // Whole ms first: `(now + 1000) - now` is 1000.0000000000009 for some `now`, which ceil made 2 s.
    if (l.emptyUntil > now && l.askedAt === -1) return Math.max(1, Math.ceil(Math.round(l.emptyUntil - now) / 1000));
    return PENDING;
  }

  /**
   * Spends one token of each of `leases` when all hold one (0), else none: the first verdict that
   * refuses (the longest wait), or `PENDING`.
   */
  takeAll(leases: readonly Lease[], now: number): number {
    let wait = 0;
    let pending = false;
    for (const l of leases) {
      l.used = now;
      if (l.tokens >= 1) continue;
      const v = this.blocked(l, now);
      if (v === UNAVAILABLE) return UNAVAILABLE;
      if (v === PENDING) pending = true;
      else wait = Math.max(wait, v);
    }
    // A lease whose node bucket is empty refuses the request whatever the others would answer.
    if (wait > 0) return wait;
    if (pending) return PENDING;
    for (const l of leases) this.takeOne(l, now);
    return 0;
  }

  /**
   * Waits for the supervisor for a request that needs a token of each of `leases` (after `takeAll`
   * said `PENDING`): `done` hears 0 (tokens spent), seconds (refused: the node has none), or
   * `UNAVAILABLE`. Called once, never synchronously.
   */
  wait(leases: readonly Lease[], done: (verdict: number) => void): void {
    this.enqueue({ leases, done }, this.clock());
  }

  /** The ledger's answers (an IPC message from the supervisor). */
  granted(grants: readonly TokenGrant[]): void {
    const now = this.clock();
    for (const g of grants) {
      const l = this.leases.get(`${g.budget}\u0000${g.key}`);
      if (l === undefined) {
        // Forgotten meanwhile (a settle crossed it, or an eviction): give the grant straight back.
        if (g.granted > 0) this.settle(g.budget, g.key, g.granted, true);
        continue;
      }
      l.tokens += g.granted;
      l.block = Math.max(1, g.block);
      // Short: refused locally until the node may have a unit; covered: not short any more.
      l.emptyUntil = g.waitMs > 0 ? now + g.waitMs : 0;
      l.askedAt = -1;
      l.wanted = 0;
      const waiters = l.waiters;
      l.waiters = undefined;
      if (waiters !== undefined) for (const w of waiters) this.retry(w, now);
    }
  }

  /**
   * A slot lease holds units no request waits for (a waiter refused by another budget, a late
   * grant): they go back to the node, so no worker keeps a slot another worker's connection needs.
   */
  private returnIdle(l: Lease): void {
    if (!l.slots || l.tokens < 1 || l.waiters !== undefined) return;
    const n = Math.floor(l.tokens);
    l.tokens -= n;
    this.settle(l.budget, l.key, n, false);
  }

  /** A slot of `l` taken earlier is free again: it goes back to the node (with this turn's message). */
  release(l: Lease, now: number): void {
    if (l.inUse === 0) return;
    l.inUse--;
    l.used = now;
    this.settle(l.budget, l.key, 1, false);
  }

  /** Leases kept now. */
  get size(): number {
    return this.leases.size;
  }

  /** Tokens this worker holds unspent, every lease together (the snapshot's lease). */
  get held(): number {
    let n = 0;
    for (const l of this.leases.values()) n += l.tokens;
    return n;
  }

  /** Settles and forgets every lease unused for `idleMs` (nothing waiting on it). */
  sweep(now: number): void {
    for (const [id, l] of this.leases) {
      if (l.askedAt !== -1 || l.waiters !== undefined) continue;
      // Idle slots (a late grant) go back even while others are in use.
      if (l.inUse > 0) {
        this.returnIdle(l);
        continue;
      }
      // A lease refusing locally is kept until its wait is over: its refusals cost no message.
      if (now - l.used < this.idleMs || l.emptyUntil > now) continue;
      this.leases.delete(id);
      this.settle(l.budget, l.key, l.tokens, true);
    }
  }

  /** Settles every lease (a worker draining, a generation dropping its budgets). */
  settleAll(budgets?: ReadonlySet<string>): void {
    for (const [id, l] of this.leases) {
      if (budgets !== undefined && budgets.has(l.budget)) continue;
      if (l.askedAt !== -1 || l.waiters !== undefined || l.inUse > 0) continue;
      this.leases.delete(id);
      this.settle(l.budget, l.key, l.tokens, true);
    }
  }

  close(): void {
    if (this.sweeper !== undefined) this.clearTimer(this.sweeper);
    this.sweeper = undefined;
  }

  private retry(w: Waiter, now: number): void {
    const v = this.takeAll(w.leases, now);
    if (v === PENDING) this.enqueue(w, now);
    else {
      if (v !== 0) for (const l of w.leases) this.returnIdle(l);
      w.done(v);
    }
  }

  /** Queues `w` on the first empty lease it needs and asks for it. */
  private enqueue(w: Waiter, now: number): void {
    const l = w.leases.find((x) => x.tokens < 1) as Lease;
    (l.waiters ??= []).push(w);
    // One ask per key out at a time: waiters past what it asked for are asked for on its answer.
    if (l.askedAt === -1) this.ask(l, l.block, now);
  }

  private ask(l: Lease, want: number, now: number): void {
    l.askedAt = now;
    l.wanted = want;
    l.used = now;
    this.asks.push(l);
    this.setTimer(() => this.expire(l), this.waitMs);
    this.schedule();
  }

  /**
   * `waitMs` after an ask of `l`: its waiters are refused unavailable if it is still unanswered.
   * Checked after the event loop's poll phase (deferred), so an answer that arrived in time but
   * waits behind a busy turn's I/O is applied first rather than discarded.
   */
  private expire(l: Lease): void {
    this.defer(() => this.expireNow(l));
  }

  private expireNow(l: Lease): void {
    if (l.askedAt === -1 || l.waiters === undefined) return;
    const left = l.askedAt + this.waitMs - this.clock();
    if (left > 0) {
      // A timer may fire a little early by this clock (or this is an older ask's timer): check again when due.
      this.setTimer(() => this.expire(l), Math.ceil(left));
      return;
    }
    const waiters = l.waiters;
    l.waiters = undefined;
    for (const w of waiters) {
      this.unavailable++;
      w.done(UNAVAILABLE);
    }
  }

  private settle(budget: string, key: string, unused: number, forget: boolean): void {
    this.settles.push({ budget, key, unused: Math.floor(unused), forget });
    this.schedule();
  }

  private schedule(): void {
    if (this.flushing) return;
    this.flushing = true;
    this.defer(() => {
      this.flushing = false;
      const leases = this.asks;
      const settles = this.settles;
      if (leases.length === 0 && settles.length === 0) return;
      this.asks = [];
      this.settles = [];
      // Sized at the end of the turn: every request of the turn that waits on a key is in one ask.
      const asks = leases.map((l): TokenAsk => {
        const waiting = l.waiters?.length ?? 0;
        l.wanted = Math.max(l.wanted, waiting);
        return { budget: l.budget, key: l.key, want: l.wanted, waiting, holding: Math.floor(l.tokens) + l.inUse };
      });
      this.messages++;
      this.send(asks, settles);
    });
  }

  /** Past the cap: settles the least recently used tenth that nothing waits on. */
  private evict(): void {
    const pass = Math.max(1, Math.floor(this.maxEntries / 10));
    let n = pass;
    for (const [id, l] of this.leases) {
      if (l.askedAt !== -1 || l.waiters !== undefined || l.inUse > 0) continue;
      this.leases.delete(id);
      this.settle(l.budget, l.key, l.tokens, true);
      if (--n === 0) break;
    }
    this.onEvict(pass - n);
  }

  private arm(): void {
    if (this.sweeper !== undefined) return;
    const tick = (): void => {
      this.sweep(this.clock());
      this.sweeper = this.leases.size === 0 ? undefined : this.setTimer(tick, this.idleMs);
    };
    this.sweeper = this.setTimer(tick, this.idleMs);
  }
}
