// The node's budgets, owned by the supervisor and leased to workers (docs/overload.md "One node,
// one set of limits"; the messages: @edge-proxy/ipc lease.ts). A pure state machine: every method
// takes the observation and `now` (ms, any monotonic clock) and returns the grants to send; the
// caller (lease-service.ts) owns the IPC and the one timer (`nextDue`).
//
// Its budgets are *slots* (the in-flight limits): a unit is held while a request is in flight and
// comes back. The ledger never counts more than `limit` units granted in all (Σ granted ≤ limit
// whenever no revocation is outstanding; a lowered limit stops all granting until the excess came
// back). Budgets that are consumed (rate limits, connection caps) have their own ledger, keyed per
// request key: token-ledger.ts.
//
// Contention: a worker whose standing need the free units cannot meet makes the budget
// *contended*: every holder is told to give back its idle units now and each unit as it frees
// (unless a waiter of its own takes it), and the starved worker's answer waits until every holder
// told has answered (or `ackMs` passed). So a worker is told `exhausted` only when, node-wide,
// every unit is held by a request in flight or is on its way back. Contention ends `relaxMs`
// after the last standing need was met or withdrawn.
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';

/** A node budget's definition (from the active configuration). */
export interface BudgetSpec {
  readonly kind: 'slots';
  readonly limit: number;
}

export interface LedgerOptions {
  /** Workers of the node: blocks are sized from it (`block`). */
  readonly workers: number;
  /** How long holders newly told of contention have to answer before a starved worker is answered anyway, ms (default 50). */
  readonly ackMs?: number;
  /** Contention ends this long after the last standing need was met or withdrawn, ms (default 200). */
  readonly relaxMs?: number;
}

/** Grants for one worker, at most one entry per key. */
export interface Outgoing {
  readonly worker: number;
  readonly grants: LeaseGrant[];
}

/** One worker's part of a budget (the snapshot's `admission.leases`). */
export interface HolderView {
  readonly worker: number;
  /** Slots the ledger counts as this worker's (in use and idle). */
  readonly granted: number;
  /** Slots in use as last reported. */
  readonly used: number;
  /** Requests of the worker waiting for a unit, as last reported. */
  readonly need: number;
}

export interface BudgetView {
  readonly key: string;
  readonly limit: number;
  readonly granted: number;
  /** Slots the ledger may grant now: limit − granted (0 while a lowered limit's excess is out). */
  readonly free: number;
  readonly contended: boolean;
  readonly block: number;
  readonly holders: readonly HolderView[];
}

interface Holder {
  granted: number;
  used: number;
  need: number;
  extra: number;
  /** FIFO position of the standing need (set when it goes from 0 to more). */
  needSeq: number;
  /** Told the budget is contended (and not told since that it is not). */
  told: boolean;
  /** An ask with `asks: true` is waiting for its answer. */
  awaiting: boolean;
  /** Units revoked (a lowered limit) and not yet given back. */
  debt: number;
}

interface Budget {
  readonly key: string;
  spec: BudgetSpec;
  readonly holders: Map<number, Holder>;
  /** Σ holders' granted. */
  granted: number;
  contended: boolean;
  /** While contended with no standing need: when contention ends. */
  relaxAt: number;
  /** Holders told of contention that have not answered yet. */
  readonly acks: Set<number>;
  ackDeadline: number;
}

interface Pending {
  add: number;
  revoke: number;
  reply: boolean;
  exhausted: boolean;
}

const DEFAULT_ACK_MS = 50;
const DEFAULT_RELAX_MS = 200;

export class LeaseLedger {
  private readonly budgets = new Map<string, Budget>();
  private workers: number;
  private readonly ackMs: number;
  private readonly relaxMs: number;
  private seq = 0;
  /** The grants being built by the current call: worker → key → entry. */
  private out = new Map<number, Map<string, Pending>>();

  constructor(opts: LedgerOptions) {
    this.workers = Math.max(1, opts.workers);
    this.ackMs = opts.ackMs ?? DEFAULT_ACK_MS;
    this.relaxMs = opts.relaxMs ?? DEFAULT_RELAX_MS;
  }

  /** The block of a budget: a quarter of an even share per worker, at least 1 (small limits lease one unit at a time). */
  blockOf(spec: BudgetSpec): number {
    return Math.max(1, Math.floor(capacity(spec) / (4 * this.workers)));
  }

  /**
   * The budgets of a committed generation. New keys start with nothing granted; a key
   * left out is retired (limit 0) and forgotten once no worker holds any of it; a lowered limit
   * revokes the excess (idle units first), a raised one serves standing needs at once.
   */
  configure(specs: ReadonlyMap<string, BudgetSpec>, now: number): Outgoing[] {
    for (const [key, spec] of specs) {
      const b = this.budgets.get(key);
      if (b === undefined) {
        this.budgets.set(key, { key, spec, holders: new Map(), granted: 0, contended: false, relaxAt: Infinity, acks: new Set(), ackDeadline: 0 });
      } else b.spec = spec;
    }
    for (const b of this.budgets.values()) if (!specs.has(b.key)) b.spec = { kind: 'slots', limit: 0 };
    for (const b of [...this.budgets.values()]) {
      this.revokeExcess(b);
      this.allocate(b, now);
      this.forget(b);
    }
    return this.flush();
  }

  /**
   * One slots budget's limit moves between commits (the node's adaptive limit of `global`): a
   * lowered limit revokes the excess (idle units first), a raised one serves standing needs at once.
   */
  setLimit(key: string, limit: number, now: number): Outgoing[] {
    const b = this.budgets.get(key);
    if (b === undefined || b.spec.kind !== 'slots' || b.spec.limit === limit) return [];
    b.spec = { kind: 'slots', limit };
    this.revokeExcess(b);
    this.allocate(b, now);
    return this.flush();
  }

  /** A worker's asks of one turn (its `lease` message): gives, consumption, needs; answers and any grants they allow. */
  ask(worker: number, asks: readonly LeaseAsk[], now: number): Outgoing[] {
    for (const a of asks) {
      const b = this.budgets.get(a.key);
      if (b === undefined) {
        // Not a budget of the active generation: nothing to lease.
        if (a.asks) this.entry(worker, a.key).reply = true;
        continue;
      }
      let h = b.holders.get(worker);
      if (h === undefined) {
        h = { granted: 0, used: 0, need: 0, extra: 0, needSeq: 0, told: false, awaiting: false, debt: 0 };
        b.holders.set(worker, h);
      }
      const given = Math.min(a.give, h.granted);
      h.granted -= given;
      b.granted -= given;
      h.debt = Math.max(0, h.debt - given);
      h.used = Math.min(a.used, h.granted);
      if (a.need > 0 && h.need === 0) h.needSeq = ++this.seq;
      h.need = a.need;
      h.extra = a.extra;
      if (a.asks) h.awaiting = true;
      b.acks.delete(worker);
      this.allocate(b, now);
      this.forget(b);
    }
    return this.flush();
  }

  /** A worker is gone (exited, killed): its slots come back to the node and serve standing needs. */
  drop(worker: number, now: number): Outgoing[] {
    for (const b of [...this.budgets.values()]) {
      const h = b.holders.get(worker);
      if (h === undefined) continue;
      b.holders.delete(worker);
      b.acks.delete(worker);
      b.granted -= h.granted;
      this.allocate(b, now);
      this.forget(b);
    }
    this.out.delete(worker);
    return this.flush();
  }

  /** Time passed: overdue acks answer their starved workers, contention ends. */
  tick(now: number): Outgoing[] {
    for (const b of [...this.budgets.values()]) {
      if (b.acks.size > 0 && now >= b.ackDeadline) b.acks.clear();
      this.allocate(b, now);
      this.forget(b);
    }
    return this.flush();
  }

  /** When `tick` has something to do (ms, same clock), or undefined when nothing is due. */
  nextDue(): number | undefined {
    let due = Infinity;
    for (const b of this.budgets.values()) {
      if (b.acks.size > 0) due = Math.min(due, b.ackDeadline);
      if (b.contended && b.relaxAt < Infinity) due = Math.min(due, b.relaxAt);
    }
    return due === Infinity ? undefined : due;
  }

  /** Every budget and its holders now (the snapshot). */
  view(): BudgetView[] {
    const views: BudgetView[] = [];
    for (const b of this.budgets.values()) {
      views.push({
        key: b.key,
        limit: capacity(b.spec),
        granted: b.granted,
        free: this.free(b),
        contended: b.contended,
        block: this.blockOf(b.spec),
        holders: [...b.holders].map(([worker, h]) => ({ worker, granted: h.granted, used: h.used, need: h.need })).sort((x, y) => x.worker - y.worker),
      });
    }
    return views.sort((x, y) => (x.key < y.key ? -1 : x.key > y.key ? 1 : 0));
  }

  // --- internals ------------------------------------------------------------------------------

  /** Units grantable now. */
  private free(b: Budget): number {
    // While revoked units are outstanding, granted may exceed the limit: nothing is free then.
    return Math.max(0, b.spec.limit - b.granted);
  }

  /** Slots in use node-wide as the workers last reported. */
  private held(b: Budget): number {
    let n = 0;
    for (const h of b.holders.values()) n += h.used;
    return n;
  }

  private standing(b: Budget): number {
    let n = 0;
    for (const h of b.holders.values()) n += h.need;
    return n;
  }

  /** Serves standing needs (FIFO across workers), then extras, contends or relaxes, and answers asks. */
  private allocate(b: Budget, now: number): void {
    let free = this.free(b);
    const needy = [...b.holders].filter(([, h]) => h.need > 0).sort((x, y) => x[1].needSeq - y[1].needSeq);
    for (const [worker, h] of needy) {
      const n = Math.min(h.need, free);
      if (n === 0) break;
      this.give(b, worker, h, n);
      h.need -= n;
      free -= n;
    }
    const unmet = this.standing(b);
    if (unmet > 0) this.contend(b, now);
    else if (b.contended) {
      if (b.relaxAt === Infinity) b.relaxAt = now + this.relaxMs;
      if (now >= b.relaxAt && b.acks.size === 0) this.relax(b);
    }
    const block = this.blockOf(b.spec);
    for (const [worker, h] of b.holders) {
      if (h.extra > 0 && !b.contended && free > 0) {
        const n = Math.min(h.extra, block, free);
        this.give(b, worker, h, n);
        free -= n;
      }
      h.extra = 0;
      if (!h.awaiting) continue;
      // A starved worker waits for the holders told of contention (their idle units may come back).
      if (h.need > 0 && b.acks.size > 0) continue;
      h.awaiting = false;
      const e = this.entry(worker, b.key);
      e.reply = true;
      e.exhausted = h.need > 0;
    }
  }

  private give(b: Budget, worker: number, h: Holder, n: number): void {
    h.granted += n;
    b.granted += n;
    this.entry(worker, b.key).add += n;
    if (b.contended) h.told = true;
  }

  /** Tells every holder not told yet to give back idle units (and each as it frees); a starved worker's answer waits for them. */
  private contend(b: Budget, now: number): void {
    b.contended = true;
    b.relaxAt = Infinity;
    for (const [worker, h] of b.holders) {
      if (h.told || h.granted === 0) continue;
      h.told = true;
      this.entry(worker, b.key);
      if (h.need === 0) {
        if (b.acks.size === 0) b.ackDeadline = now + this.ackMs;
        b.acks.add(worker);
      }
    }
  }

  private relax(b: Budget): void {
    b.contended = false;
    b.relaxAt = Infinity;
    for (const [worker, h] of b.holders) {
      if (!h.told) continue;
      h.told = false;
      this.entry(worker, b.key);
    }
  }

  /** A lowered limit: the units granted beyond it (and not already revoked) are revoked, idle units first. */
  private revokeExcess(b: Budget): void {
    let debt = 0;
    for (const h of b.holders.values()) debt += h.debt;
    let excess = b.granted - debt - capacity(b.spec);
    if (excess <= 0) return;
    // Idle units first (as last reported), then the largest grants: a worker owes in proportion to what it holds.
    for (const [worker, h] of b.holders) excess -= this.owe(b, worker, h, h.granted - h.used - h.debt, excess);
    const byLargest = [...b.holders].sort((x, y) => y[1].granted - y[1].debt - (x[1].granted - x[1].debt));
    for (const [worker, h] of byLargest) excess -= this.owe(b, worker, h, h.granted - h.debt, excess);
  }

  /** Revokes up to `room` units (at most `excess`) of a holder; returns how many. */
  private owe(b: Budget, worker: number, h: Holder, room: number, excess: number): number {
    const r = Math.min(Math.max(0, room), excess);
    if (r === 0) return 0;
    h.debt += r;
    this.entry(worker, b.key).revoke += r;
    return r;
  }

  /** A retired budget nobody holds any more is forgotten; so is a holder with nothing granted, needed or owed. */
  private forget(b: Budget): void {
    for (const [worker, h] of b.holders) if (h.granted === 0 && h.need === 0 && !h.awaiting && h.debt === 0 && !b.acks.has(worker)) b.holders.delete(worker);
    if (capacity(b.spec) === 0 && b.holders.size === 0) this.budgets.delete(b.key);
  }

  private entry(worker: number, key: string): Pending {
    let m = this.out.get(worker);
    if (m === undefined) {
      m = new Map();
      this.out.set(worker, m);
    }
    let e = m.get(key);
    if (e === undefined) {
      e = { add: 0, revoke: 0, reply: false, exhausted: false };
      m.set(key, e);
    }
    return e;
  }

  private flush(): Outgoing[] {
    const result: Outgoing[] = [];
    for (const [worker, m] of this.out) {
      const grants: LeaseGrant[] = [];
      for (const [key, e] of m) {
        const b = this.budgets.get(key);
        grants.push({
          key,
          add: e.add,
          revoke: e.revoke,
          reply: e.reply,
          exhausted: e.exhausted || (e.reply && b === undefined),
          contended: b?.contended ?? false,
          block: b === undefined ? 1 : this.blockOf(b.spec),
          limit: b === undefined ? 0 : capacity(b.spec),
          nodeHeld: b === undefined ? 0 : this.held(b),
        });
      }
      result.push({ worker, grants });
    }
    this.out = new Map();
    return result.sort((x, y) => x.worker - y.worker);
  }
}

function capacity(spec: BudgetSpec): number {
  return spec.limit;
}
