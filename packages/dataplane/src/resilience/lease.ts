// A worker's leases of node budgets (docs/overload.md "One node, one set of limits"; the
// messages: @edge-proxy/ipc lease.ts; the supervisor's side: controlplane limits/lease-ledger.ts).
//
// The hot path is `Lease.tryTake()` / `Lease.release()`: synchronous, O(1), no allocation, no
// IPC. A request never takes a unit the worker does not hold, so the node never admits past its
// limit, whatever the supervisor does (slow, frozen, gone). A release goes back to the worker's
// lease, not to the supervisor. What crosses the pipe is decided once per event-loop turn by
// `LeaseTable.flush`: per key that changed, one ask carrying the units given back, the units in
// use, the standing need (the requests waiting for a unit) and the headroom wanted; at most one
// ask expecting an answer is outstanding per key.
//
// Give-back policy (hysteresis): a worker keeps up to 2 blocks idle and gives back the rest down
// to one block; while the budget is contended (another worker starved) it gives back every idle
// unit, at once and as each frees, unless a waiter of its own takes it first; units revoked by a
// lowered limit are paid back first, as they free.
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';

/**
 * How long a request waits for the supervisor's answer when its worker's lease holds no unit, ms:
 * past it, 503 `EDGE_SHED_LEASE_UNAVAILABLE`. A healthy supervisor answers in well under 1 ms, but a
 * saturated node can leave it off the CPU for hundreds of ms (250 ms shed first requests on a
 * loaded 2-core machine): a second separates "busy" from "stopped or swapping". Shared by the slot
 * leases and the token leases (token-lease.ts).
 */
export const LEASE_WAIT_MS = 1000;

/**
 * The least time between two `lease` messages of a worker, ms. A loaded worker turns its event
 * loop thousands of times a second and, at the limit, changes some lease on most turns (a slot
 * given back while contended, a standing need that moved): one message per turn would make the
 * lease traffic grow with the loop's turn rate. A flush due sooner than this after the last
 * message waits for the rest of the gap, carrying every change made meanwhile: at most 1,000
 * messages a second per worker, and a slot given back (or an ask) at most 1 ms later than it
 * could have gone.
 */
export const LEASE_FLUSH_GAP_MS = 1;

/** One key's lease in this worker. */
export class Lease {
  readonly key: string;
  /** Slots this worker holds (in use and idle). */
  granted = 0;
  /** Slots held by requests in flight. */
  inUse = 0;
  /** Units revoked and not yet given back (paid from idle units first, then as they free). */
  debt = 0;
  /** The block the supervisor sizes this lease by (headroom kept). */
  block = 1;
  /** Another worker is starved: idle units go back at once. */
  contended = false;
  /** The node's limit (or burst), as of the last grant. */
  limit = 0;
  /** Slots in use on the other workers as of the last grant (the node's count less this worker's last report). */
  othersInUse = 0;
  /** The `used` last sent. */
  sentUsed = 0;
  /** Requests of this worker waiting for a unit of this key (maintained by the owner of the waiters). */
  waiting = 0;
  /** Asks sent that expect an answer; `answered` of them answered (one outstanding at most). */
  asked = 0;
  answered = 0;
  /** When the outstanding ask was sent (clock of the table), or -1. */
  askedAt = -1;
  /** The number of the last answered ask that said `exhausted` (0: none since a unit came). */
  exhaustedAt = 0;
  /** Units given back since the last flush, not sent yet. */
  toGive = 0;
  /** The need last sent. */
  sentNeed = 0;
  /**
   * The last headroom ask was answered with nothing (no unit free on the node): headroom is not
   * asked again until a unit comes, or an idle worker and the supervisor would trade an ask and an
   * empty answer every turn while the budget is fully leased. A request that finds the lease empty
   * still asks (its need).
   */
  headroomRefused = false;
  /** A contention notice must be answered (an ask, even one that gives nothing). */
  mustAck = false;
  /** Queued for the next flush. */
  dirty = false;
  private readonly table: LeaseTable;

  constructor(key: string, table: LeaseTable) {
    this.key = key;
    this.table = table;
  }

  /** Units this worker may take now without asking. */
  get idle(): number {
    return this.granted - this.inUse;
  }

  /** Takes a unit if the lease holds an idle one; otherwise false (and the table will ask). Synchronous, O(1). */
  tryTake(): boolean {
    if (this.inUse >= this.granted) return this.short();
    this.inUse++;
    // Running low: top up ahead of need (one block), unless an ask is out or the node is contended.
    if (!this.dirty && this.askedAt < 0 && !this.contended && !this.headroomRefused && this.granted - this.inUse <= this.block >> 1 && !this.table.solo) this.table.mark(this);
    return true;
  }

  /** Gives a slot back to this worker's lease (never below 0). Synchronous, O(1); the give-back to the node waits for the flush. */
  release(): void {
    if (this.inUse > 0) this.inUse--;
    if (!this.dirty && (this.debt > 0 || this.contended || this.granted - this.inUse > 2 * this.block)) this.table.mark(this);
  }

  /** The supervisor did not answer this lease's ask within the table's wait: the worker sheds what its lease cannot hold (`lease_unavailable`). */
  unavailable(now: number): boolean {
    return this.askedAt >= 0 && now - this.askedAt >= this.table.waitMs;
  }

  private short(): false {
    if (!this.dirty && !this.table.solo) this.table.mark(this);
    return false;
  }
}

export interface LeaseTableOptions {
  /** Sends one turn's asks to the supervisor (`lease` message). Absent: solo (no supervisor; `setSolo` limits apply locally). */
  readonly send?: (asks: LeaseAsk[]) => void;
  /** How long an ask may go unanswered before the lease counts as unavailable, ms. */
  readonly waitMs: number;
  /** The clock, ms (default `performance.now`). */
  readonly now?: () => number;
  /** Runs the flush once after the current turn (default `setImmediate`). */
  readonly schedule?: (fn: () => void) => void;
  /** Runs the flush after `ms` (default an unref'd `setTimeout`): the rest of LEASE_FLUSH_GAP_MS since the last message. */
  readonly delay?: (fn: () => void, ms: number) => void;
  /** The requests waiting for a unit of a lease, beyond those it counts itself (default: `lease.waiting`). */
  readonly needOf?: (lease: Lease) => number;
  /** A grant changed a lease (units came, an answer arrived): waiters may be served. */
  readonly onGrant?: (lease: Lease, grant: LeaseGrant) => void;
}

/** All leases of a worker, and what crosses the pipe. */
export class LeaseTable {
  readonly waitMs: number;
  readonly solo: boolean;
  private readonly send: ((asks: LeaseAsk[]) => void) | undefined;
  private readonly now: () => number;
  private readonly schedule: (fn: () => void) => void;
  private readonly delay: (fn: () => void, ms: number) => void;
  /** When the last message went (clock of the table). */
  private lastSent = -Infinity;
  private readonly needOf: (lease: Lease) => number;
  private readonly onGrant: ((lease: Lease, grant: LeaseGrant) => void) | undefined;
  private readonly leases = new Map<string, Lease>();
  private readonly dirty: Lease[] = [];
  private scheduled = false;
  private soloLimit: (key: string) => number = () => 0;
  /** Lease messages sent since start (lease traffic). */
  messages = 0;

  constructor(opts: LeaseTableOptions) {
    this.send = opts.send;
    this.solo = opts.send === undefined;
    this.waitMs = opts.waitMs;
    this.now = opts.now ?? (() => performance.now());
    this.schedule = opts.schedule ?? ((fn) => void setImmediate(fn));
    this.delay = opts.delay ?? ((fn, ms) => void setTimeout(fn, ms).unref());
    this.needOf = opts.needOf ?? ((l) => l.waiting);
    this.onGrant = opts.onGrant;
  }

  /** The lease of `key`, created empty on first use (a re-forked worker starts with nothing); the same object after. */
  lease(key: string): Lease {
    let l = this.leases.get(key);
    if (l === undefined) {
      l = new Lease(key, this);
      this.leases.set(key, l);
      // Solo: the whole limit. Led: a block of headroom asked at once, so the first request of a
      // budget (a pool provisioned by an activation) rarely waits for the supervisor.
      if (this.solo) l.granted = l.limit = this.soloLimit(key);
      else this.mark(l);
    }
    return l;
  }

  /** Every lease (views). */
  all(): IterableIterator<Lease> {
    return this.leases.values();
  }

  /** Solo (no supervisor): each lease holds its whole limit, from `limitOf` (applied to existing leases now). */
  setSolo(limitOf: (key: string) => number): void {
    this.soloLimit = limitOf;
    for (const l of this.leases.values()) l.granted = l.limit = limitOf(l.key);
  }

  /** Queues `lease` for the flush after this turn (or, within LEASE_FLUSH_GAP_MS of the last message, at the end of the gap). */
  mark(lease: Lease): void {
    if (lease.dirty || this.solo) return;
    lease.dirty = true;
    this.dirty.push(lease);
    if (this.scheduled) return;
    this.scheduled = true;
    const wait = this.lastSent + LEASE_FLUSH_GAP_MS - this.now();
    if (wait > 0) this.delay(this.flushDue, wait);
    else this.schedule(this.flushDue);
  }

  private readonly flushDue = (): void => {
    this.scheduled = false;
    this.flush();
  };

  /** The asks of this turn: one entry per lease that changed, in one message. */
  flush(): void {
    if (this.dirty.length === 0 || this.send === undefined) return;
    const now = this.now();
    const asks: LeaseAsk[] = [];
    for (const l of this.dirty.splice(0)) {
      l.dirty = false;
      const a = this.askOf(l, now);
      if (a !== undefined) asks.push(a);
    }
    if (asks.length === 0) return;
    this.messages++;
    this.lastSent = now;
    this.send(asks);
  }

  /** What one lease says this turn, or undefined when it has nothing to say. */
  private askOf(l: Lease, now: number): LeaseAsk | undefined {
    // Debt first, then contention (every idle unit), then hysteresis (keep one block of 2).
    const pay = Math.min(l.debt, l.idle);
    l.granted -= pay;
    l.debt -= pay;
    l.toGive += pay;
    const idle = l.idle;
    const back = l.debt > 0 || l.contended ? idle : idle > 2 * l.block ? idle - l.block : 0;
    l.granted -= back;
    l.toGive += back;
    const need = this.needOf(l);
    const outstanding = l.askedAt >= 0;
    const extra = !l.contended && !l.headroomRefused && l.debt === 0 && need === 0 && l.idle <= l.block >> 1 ? l.block : 0;
    const asks = !outstanding && (need > 0 || extra > 0);
    if (!asks && !l.mustAck && l.toGive === 0 && need === l.sentNeed) return undefined;
    const a: LeaseAsk = { key: l.key, need, extra: asks ? extra : 0, give: l.toGive, used: l.inUse, asks };
    l.toGive = 0;
    l.sentNeed = need;
    l.sentUsed = a.used;
    l.mustAck = false;
    if (asks) {
      l.asked++;
      l.askedAt = now;
    }
    return a;
  }

  /** The supervisor's `lease` notice: applied entry by entry, then the owner of the waiters hears of each. */
  receive(grants: readonly LeaseGrant[]): void {
    for (const g of grants) {
      const l = this.lease(g.key);
      // The budget changed (a unit came, a new limit, contention over): headroom may be free again.
      const changed = g.add > 0 || g.revoke > 0 || (l.limit !== 0 && g.limit !== l.limit) || (l.contended && !g.contended);
      l.granted += g.add;
      l.block = Math.max(1, g.block);
      l.limit = g.limit;
      l.othersInUse = Math.max(0, g.nodeHeld - l.sentUsed);
      if (g.revoke > 0) l.debt += g.revoke;
      if (g.contended && !l.contended) l.mustAck = true;
      l.contended = g.contended;
      if (g.add > 0) l.exhaustedAt = 0;
      if (g.reply && l.askedAt >= 0) {
        l.answered = l.asked;
        l.askedAt = -1;
        if (g.exhausted) l.exhaustedAt = l.answered;
      }
      // An answer that gave nothing and said no need went unmet: no headroom free on the node.
      l.headroomRefused = changed ? false : l.headroomRefused || (g.reply && g.add === 0 && !g.exhausted);
      this.onGrant?.(l, g);
      // Whatever changed may have something to say (an ack, debt, headroom, a need not sent while an ask was out).
      this.mark(l);
    }
  }

}
