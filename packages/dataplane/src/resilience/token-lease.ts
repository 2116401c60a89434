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
// - a WINDOW budget (a route's retry budget: controlplane limits/window-ledger.ts) grants units
//   that may be spent only within the window bucket they count in (the grant's `from` and `until`,
//   on the host's clock, which every process shares); past it they are given back unspent, to
//   their own bucket. A lease in use asks `RENEW_AHEAD_MS` before its bucket ends for units of
//   the next one, held apart until it begins, so a busy lease is not empty at a bucket's end. Its
//   deposits (`deposit`: the route's primaries) are sent in batches, with the next message or after
//   `DEPOSIT_FLUSH_MS`, dated by the host's clock at the oldest of the batch.
//
// The clock, the timers and the channel are injected: the unit tests drive it with a fake clock.
import { hostClockMs } from '@edge-proxy/ipc';
import type { TokenAsk, TokenDeposit, TokenGrant, TokenSettle } from '@edge-proxy/ipc';
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
/** A window lease in use asks this long before its bucket ends for the next bucket's units, ms. */
export const RENEW_AHEAD_MS = 100;
/**
 * A window lease keeps renewing this long after its last deposit, ms, even unused: a primary that
 * fails after a long timeout (a quiet route) still finds units for its retry. Units renewed and not
 * spent go back to their bucket when it ends.
 */
export const RENEW_WHILE_MS = 10_000;
/** Deposits of window budgets wait at most this long for a message to ride on, ms (later: fewer units, never more). */
export const DEPOSIT_FLUSH_MS = 100;

export type { TokenAsk, TokenDeposit, TokenGrant, TokenSettle } from '@edge-proxy/ipc';

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
  /** A window budget's units may be spent until then, host clock ms; Infinity: no end. */
  expires: number;
  /** Units of the next bucket (asked ahead), spendable in [nextFrom, nextUntil), host clock ms. */
  nextTokens: number;
  nextFrom: number;
  nextUntil: number;
  /** The outstanding ask is for the next bucket. */
  ahead: boolean;
  /** Deposits not sent yet, and when the oldest of them was made (host clock, ms). */
  deposits: number;
  depositAt: number;
  /** A renewal is armed for shortly before the units' bucket ends (window budgets). */
  renewing: boolean;
  /** Deposits and spends so far (a renewal asks only for a lease that saw some since it was armed, or a recent deposit). */
  activity: number;
  /** When the last deposit was made, ms (a route with a primary in flight keeps its lease). */
  depositedAt: number;
  waiters: Waiter[] | undefined;
}

interface Waiter {
  readonly leases: readonly Lease[];
  readonly done: (verdict: number) => void;
}

export interface TokenLeaseOptions {
  /** Sends the asks, settles and deposits of one turn in one message. */
  readonly send: (asks: readonly TokenAsk[], settles: readonly TokenSettle[], deposits: readonly TokenDeposit[]) => void;
  /** A monotonic clock, ms. */
  readonly now?: () => number;
  readonly waitMs?: number;
  readonly idleMs?: number;
  readonly maxEntries?: number;
  /** Timers (unref'd by the default); tests inject fakes. */
  readonly setTimer?: (fn: () => void, ms: number) => unknown;
  readonly clearTimer?: (t: unknown) => void;
  /** The host's monotonic clock, ms (deposits are dated by it); default `hostClockMs`. */
  readonly hostNow?: () => number;
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
  /** Leases with deposits to send, and the timer that sends them if no message does first. */
  private depositing: Lease[] = [];
  private depositTimer: unknown;
  private readonly hostNow: () => number;
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
    this.hostNow = o.hostNow ?? hostClockMs;
    this.onEvict = o.onEvict ?? (() => {});
  }

  /** Now on the leases' clock, ms (the `now` their methods take). */
  now(): number {
    return this.clock();
  }

  /** The lease of (`budget`, `key`), made empty when there is none. */
  lease(budget: string, key: string, now: number, slots = false): Lease {
    const id = `${budget}\u0000${key}`;
    let l = this.leases.get(id);
    if (l === undefined) {
      if (this.leases.size >= this.maxEntries) this.evict();
      l = { budget, key, slots, tokens: 0, inUse: 0, askedAt: -1, wanted: 0, emptyUntil: 0, used: now, block: 1, expires: Infinity, nextTokens: 0, nextFrom: 0, nextUntil: 0, ahead: false, deposits: 0, depositAt: 0, renewing: false, activity: 0, depositedAt: -Infinity, waiters: undefined };
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
    if (l.expires !== Infinity || l.nextTokens > 0) this.roll(l);
    if (l.tokens >= 1) {
      l.tokens -= 1;
      l.activity++;
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
      if (l.expires !== Infinity || l.nextTokens > 0) this.roll(l);
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

  /** Forgets the node's last "empty until" of (`budget`, `key`): its contract may have changed (an activation). */
  reopen(budget: string, key: string): void {
    const l = this.leases.get(`${budget}\u0000${key}`);
    if (l !== undefined) l.emptyUntil = 0;
  }

  /** Whether `l` holds a unit to spend now (a window budget's expired units are given back first). */
  holds(l: Lease): boolean {
    if (l.expires !== Infinity || l.nextTokens > 0) this.roll(l);
    return l.tokens >= 1;
  }

  /**
   * Asks ahead for `l` (a block) when it holds less than a block (and less than 2) and may ask: no
   * ask outstanding, and the node did not say it is empty until later. Nothing waits on the answer
   * (a retry is decided when its failure arrives), so it asks a block ahead, not half of one.
   */
  prefetch(l: Lease, now: number): void {
    if (l.expires !== Infinity || l.nextTokens > 0) this.roll(l);
    if (l.askedAt !== -1 || l.emptyUntil > now || l.tokens >= Math.max(2, l.block)) return;
    this.ask(l, l.block, now);
  }

  /** One deposit of the window budget of `l` (a primary request): sent with the next message, or within `DEPOSIT_FLUSH_MS`. */
  deposit(l: Lease, now: number): void {
    l.activity++;
    l.depositedAt = now;
    if (l.deposits++ > 0) return;
    l.depositAt = this.hostNow();
    this.depositing.push(l);
    if (this.depositTimer === undefined) {
      this.depositTimer = this.setTimer(() => {
        this.depositTimer = undefined;
        this.schedule();
      }, DEPOSIT_FLUSH_MS);
    }
  }

  /**
   * Shortly before the bucket of `l`'s units ends (`until`, host clock), a lease used since (a
   * deposit, a spend) asks for the next bucket's units, so that the first retry after the bucket's
   * end does not find it empty. An idle one lets its units lapse and is forgotten.
   */
  private renewBefore(l: Lease, until: number): void {
    if (l.renewing) return;
    l.renewing = true;
    const activity = l.activity;
    this.setTimer(() => {
      l.renewing = false;
      const now = this.clock();
      if (this.leases.get(`${l.budget}\u0000${l.key}`) !== l || (l.activity === activity && now - l.depositedAt >= RENEW_WHILE_MS) || l.askedAt !== -1 || l.nextTokens > 0) return;
      this.ask(l, l.block, now, true);
    }, Math.max(0, until - RENEW_AHEAD_MS - this.hostNow()));
  }

  /**
   * A window lease at the host clock's now: units whose bucket ended lapse (given back unspent, to
   * their bucket), and the next bucket's units become spendable once it begins.
   */
  private roll(l: Lease): void {
    const h = this.hostNow();
    if (h >= l.expires) {
      const until = l.expires;
      l.expires = Infinity;
      const n = Math.floor(l.tokens);
      l.tokens -= n;
      if (n > 0) this.settle(l.budget, l.key, n, false, until);
    }
    if (l.nextTokens > 0 && h >= l.nextFrom) {
      const n = l.nextTokens;
      l.nextTokens = 0;
      if (h < l.nextUntil) {
        l.tokens += n;
        l.expires = l.nextUntil;
      } else this.settle(l.budget, l.key, n, false, l.nextUntil);
    }
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
      const ahead = l.ahead;
      l.ahead = false;
      if (g.until !== undefined) this.windowGrant(l, g, g.until, g.from ?? g.until, ahead);
      else l.tokens += g.granted;
      l.block = Math.max(1, g.block);
      // Short: refused locally until the node may have a unit; covered: not short any more. (Ahead: says nothing of now.)
      if (!ahead) l.emptyUntil = g.waitMs > 0 ? now + g.waitMs : 0;
      l.askedAt = -1;
      l.wanted = 0;
      const waiters = l.waiters;
      l.waiters = undefined;
      if (waiters !== undefined) for (const w of waiters) this.retry(w, now);
    }
  }

  /** Units of a window budget granted to `l`, spendable in [from, until) of the host clock. */
  private windowGrant(l: Lease, g: TokenGrant, until: number, from: number, ahead: boolean): void {
    if (g.granted <= 0) return;
    this.roll(l);
    const h = this.hostNow();
    if (ahead && from > h) {
      l.nextTokens += g.granted;
      l.nextFrom = from;
      l.nextUntil = until;
    } else if (h < until) {
      l.tokens += g.granted;
      l.expires = until;
    } else {
      // Its bucket is over already (a late answer): given back at once, to that bucket.
      this.settle(l.budget, l.key, g.granted, false, until);
      return;
    }
    this.renewBefore(l, until);
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
      if (l.expires !== Infinity || l.nextTokens > 0) this.roll(l);
      if (l.askedAt !== -1 || l.waiters !== undefined || l.deposits > 0 || l.nextTokens > 0) continue;
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
      if (l.askedAt !== -1 || l.waiters !== undefined || l.inUse > 0 || l.deposits > 0) continue;
      this.leases.delete(id);
      this.settle(l.budget, l.key, l.tokens, true);
    }
  }

  close(): void {
    if (this.sweeper !== undefined) this.clearTimer(this.sweeper);
    this.sweeper = undefined;
    if (this.depositTimer !== undefined) this.clearTimer(this.depositTimer);
    this.depositTimer = undefined;
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

  private ask(l: Lease, want: number, now: number, ahead = false): void {
    l.ahead = ahead;
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

  private settle(budget: string, key: string, unused: number, forget: boolean, until?: number): void {
    this.settles.push(until === undefined ? { budget, key, unused: Math.floor(unused), forget } : { budget, key, unused: Math.floor(unused), forget, until });
    this.schedule();
  }

  private schedule(): void {
    if (this.flushing) return;
    this.flushing = true;
    this.defer(() => {
      this.flushing = false;
      const leases = this.asks;
      const settles = this.settles;
      const depositing = this.depositing;
      if (leases.length === 0 && settles.length === 0 && depositing.length === 0) return;
      this.asks = [];
      this.settles = [];
      this.depositing = [];
      const deposits = depositing.map((l): TokenDeposit => {
        const d = { budget: l.budget, key: l.key, n: l.deposits, at: l.depositAt };
        l.deposits = 0;
        return d;
      });
      // Sized at the end of the turn: every request of the turn that waits on a key is in one ask.
      const asks = leases.map((l): TokenAsk => {
        const waiting = l.waiters?.length ?? 0;
        l.wanted = Math.max(l.wanted, waiting);
        const ask = { budget: l.budget, key: l.key, want: l.wanted, waiting, holding: Math.floor(l.tokens) + l.inUse + l.nextTokens };
        return l.ahead ? { ...ask, ahead: true } : ask;
      });
      this.messages++;
      this.send(asks, settles, deposits);
    });
  }

  /** Past the cap: settles the least recently used tenth that nothing waits on. */
  private evict(): void {
    const pass = Math.max(1, Math.floor(this.maxEntries / 10));
    let n = pass;
    for (const [id, l] of this.leases) {
      if (l.askedAt !== -1 || l.waiters !== undefined || l.inUse > 0 || l.deposits > 0) continue;
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
