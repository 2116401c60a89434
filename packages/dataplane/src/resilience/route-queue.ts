// Route queues (SPEC `resilience.route_queue`, docs/overload.md): a request that finds an
// in-flight limit full waits FIFO in its route's queue, up to `max_wait_ms`, within the route's
// cap and the global cap. When a slot frees, the caller calls `drain`, which serves the queues
// round-robin across routes, head first.
//
// Cost model (the queue sits on the request path):
// - no allocation per request unless it queues: the links live in a `QueueSlot` the queue
//   creates once for a waiter, on its first enqueue, and reuses after;
// - enqueue, cancel, admission of a head: O(1) (doubly linked lists); enqueue is O(k) only when
//   `max_wait_ms` was lowered while k later deadlines are queued (the deadline list stays sorted);
// - one timer for the whole queue set, armed at the earliest deadline, unref'd; a waiter is
//   expired at most ~1 ms after its deadline plus whatever the event loop is late by.
//
// Waiter callbacks are called after the waiter has left the queue, so the queue is consistent
// whatever they do: enqueue, cancel others, call `drain` (a nested drain is folded into the
// running one). They must not throw (the request's own entry points catch its defects); if one
// does, the queue stays consistent and the timer stays armed for the remaining waiters.

/** The links of one waiter, owned by `RouteQueues` (the waiter only declares the field). */
export class QueueSlot {
  /** The waiter this slot belongs to. */
  readonly waiter: Waiter;
  /** The route FIFO the waiter sits in, or null when not queued. */
  fifo: RouteFifo | null = null;
  /** Neighbours in the route FIFO (toward the head, toward the tail). */
  prev: QueueSlot | null = null;
  next: QueueSlot | null = null;
  /** Neighbours in the queue set's deadline order. */
  dPrev: QueueSlot | null = null;
  dNext: QueueSlot | null = null;
  /** When the waiter expires (`now()` clock, ms). */
  deadline = 0;

  constructor(waiter: Waiter) {
    this.waiter = waiter;
  }
}

/** A request that can wait in a route queue (implemented by the request's own object). */
export interface Waiter {
  /** The route (upstream pool name) whose queue the waiter joins. */
  readonly route: string;
  /** When the waiter was queued (`now()` clock, ms); written by `enqueue`. */
  queuedAt: number;
  /** Owned by `RouteQueues`: initialise to null and never touch it. */
  queueSlot: QueueSlot | null;
  /** Called when `drain`'s `tryAdmit` accepted the waiter (it holds its slots now); it has left the queue. */
  onAdmit(): void;
  /** Called when the waiter waited `max_wait_ms` (shed `queue_timeout`); it has left the queue. */
  onExpire(): void;
}

/** One route's FIFO, and its place in the ring of routes with waiters. Internal to this module. */
class RouteFifo {
  readonly route: string;
  head: QueueSlot | null = null;
  tail: QueueSlot | null = null;
  size = 0;
  /** Neighbours in the ring of non-empty FIFOs (null when not in it). */
  ringPrev: RouteFifo | null = null;
  ringNext: RouteFifo | null = null;
  /** The drain pass in which this route's head was refused (skip it for the rest of that pass). */
  refusedIn = 0;

  constructor(route: string) {
    this.route = route;
  }
}

export type { RouteFifo };

/** The one timer of a queue set (injectable so that tests can check when it is armed). */
export interface QueueTimer {
  /** Calls `fn` once after `delayMs`, without keeping the process alive. */
  set(fn: () => void, delayMs: number): unknown;
  clear(handle: unknown): void;
}

/** Node's timers, unref'd: a worker's sockets keep it alive, not its queues. */
export const nodeQueueTimer: QueueTimer = {
  set(fn, delayMs) {
    return setTimeout(fn, delayMs).unref();
  },
  clear(handle) {
    clearTimeout(handle as NodeJS.Timeout);
  },
};

/** Decides whether a waiter can be admitted now (and takes its slots if so). */
export type TryAdmit = (waiter: Waiter) => boolean;

/** The route queues of one worker. */
export class RouteQueues {
  private readonly now: () => number;
  private readonly fifos = new Map<string, RouteFifo>();
  /** The ring of non-empty FIFOs; `cursor` is the next one `drain` serves. */
  private cursor: RouteFifo | null = null;
  /** During a drain: the FIFO after the last one served (where the next drain starts). */
  private resume: RouteFifo | null = null;
  private ringSize = 0;
  /** All queued waiters in deadline order (earliest first). */
  private dHead: QueueSlot | null = null;
  private dTail: QueueSlot | null = null;
  private queued = 0;
  private readonly timers: QueueTimer;
  private timer: unknown = undefined;
  private timerAt = Infinity;
  private draining = false;
  private nestedDrain = false;
  private pass = 0;
  private closed = false;
  /** The FIFO a waiter joins (default its route), read once as it is queued. */
  private readonly fifoOf: (w: Waiter) => string;

  /**
   * `now` is the clock of `queuedAt` and deadlines (default `performance.now`), in ms. `fifoOf`
   * names the FIFO a waiter joins (default its route; the lease waits: what it waits for).
   */
  constructor(now: () => number = () => performance.now(), timers: QueueTimer = nodeQueueTimer, fifoOf: (w: Waiter) => string = (w) => w.route) {
    this.now = now;
    this.timers = timers;
    this.fifoOf = fifoOf;
  }

  /** Waiting requests across all routes (snapshot `queued`). */
  get total(): number {
    return this.queued;
  }

  /** Waiting requests of `route`. */
  depth(route: string): number {
    return this.fifos.get(route)?.size ?? 0;
  }

  /** Whether `route` has waiters: a new request of it must queue behind them, never overtake. */
  hasWaiters(route: string): boolean {
    const f = this.fifos.get(route);
    return f !== undefined && f.size > 0;
  }

  /** Depth per route, routes with none left out (snapshot `queued_by_route`, `svc_route_queue_depth`). Allocates. */
  depths(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [route, f] of this.fifos) if (f.size > 0) out[route] = f.size;
    return out;
  }

  /**
   * Queues `w` at the tail of its route's FIFO for at most `maxWaitMs`, if its route holds fewer
   * than `cap` and all routes fewer than `globalCap` (all three read from the live config per
   * call). Returns false when full (the caller sheds `queue_full`); a cap of 0 is always full.
   * A waiter already queued stays where it is (true). After `close`, always false.
   */
  enqueue(w: Waiter, cap: number, globalCap: number, maxWaitMs: number): boolean {
    if (this.closed) return false;
    let s = w.queueSlot;
    if (s !== null && s.fifo !== null) return true;
    const name = this.fifoOf(w);
    let f = this.fifos.get(name);
    if (f === undefined) {
      // Once per name for the worker's life (route names and backends are bounded by the config).
      f = new RouteFifo(name);
      this.fifos.set(name, f);
    }
    if (f.size >= cap || this.queued >= globalCap) return false;
    if (s === null) s = w.queueSlot = new QueueSlot(w);
    const now = this.now();
    w.queuedAt = now;
    s.deadline = now + maxWaitMs;
    // Route FIFO: append.
    s.fifo = f;
    s.next = null;
    s.prev = f.tail;
    if (f.tail !== null) f.tail.next = s;
    else f.head = s;
    f.tail = s;
    if (f.size++ === 0) this.ringInsert(f);
    this.queued++;
    this.deadlineInsert(s);
    if (s.deadline < this.timerAt) this.arm(now);
    return true;
  }

  /** Removes `w` without calling it back (the client went away). False if it was not queued. O(1). */
  cancel(w: Waiter): boolean {
    const s = w.queueSlot;
    if (s === null || s.fifo === null) return false;
    this.unlink(s);
    return true;
  }

  /**
   * Serves the queues after slots freed: round-robin across routes from where the last drain
   * stopped, one head per route per round. `tryAdmit(head)` takes the head's slots and returns
   * true, or returns false; on true the head leaves the queue and gets `onAdmit()`. A route whose
   * head was refused is not tried again in this drain (its head keeps its place: no overtaking).
   * Stops when a full round admits nothing. O(1) when nobody waits, else O(routes with waiters
   * + admitted). Pass a function made once (not a closure per call). `tryAdmit` must not call
   * `drain`; a drain started from a waiter callback is folded into this one (the refused routes
   * get another chance, since slots may have been freed).
   */
  drain(tryAdmit: TryAdmit): void {
    // The common case: a slot freed and nobody waits.
    if (this.queued === 0) return;
    if (this.draining) {
      this.nestedDrain = true;
      return;
    }
    this.draining = true;
    // Where the next drain starts: just after the route served last, so that routes take turns
    // across drains too (one release usually admits one waiter).
    this.resume = this.cursor;
    try {
      let pass = ++this.pass;
      for (;;) {
        let admitted = false;
        let n = this.ringSize;
        while (n-- > 0 && this.cursor !== null) {
          const f = this.cursor;
          this.cursor = f.ringNext;
          if (f.refusedIn === pass) continue;
          const head = f.head as QueueSlot; // a FIFO in the ring is not empty
          const w = head.waiter;
          if (!tryAdmit(w)) {
            f.refusedIn = pass;
            continue;
          }
          admitted = true;
          // `tryAdmit` should not cancel the waiter it is asked about; if it did, the waiter
          // has left already but took its slots, so it is still told.
          if (head.fifo !== null) this.unlink(head);
          this.resume = this.cursor;
          w.onAdmit();
        }
        if (this.nestedDrain) {
          // A callback released slots: every route may try again.
          this.nestedDrain = false;
          pass = ++this.pass;
          admitted = true;
        }
        if (!admitted || this.ringSize === 0) break;
      }
    } finally {
      this.cursor = this.resume;
      this.resume = null;
      this.draining = false;
      this.nestedDrain = false;
    }
  }

  /**
   * Expires every waiter whose deadline is at or before `now()`, earliest first, calling
   * `onExpire()` after each has left its queue. The timer calls this; tests with a fake clock
   * may call it directly.
   */
  expireDue(): void {
    const now = this.now();
    try {
      for (let s = this.dHead; s !== null && s.deadline <= now; s = this.dHead) {
        this.unlink(s);
        s.waiter.onExpire();
      }
    } finally {
      this.timerAt = Infinity;
      if (this.dHead !== null && !this.closed) this.arm(this.now());
    }
  }

  /** Stops the timer and refuses new waiters; waiters still queued stay (nobody is expired). */
  close(): void {
    this.closed = true;
    if (this.timer !== undefined) this.timers.clear(this.timer);
    this.timer = undefined;
    this.timerAt = Infinity;
  }

  private readonly onTimer = (): void => {
    this.timer = undefined;
    this.expireDue();
  };

  // Arms the one timer at the earliest deadline (the head of the deadline list).
  private arm(now: number): void {
    const head = this.dHead;
    if (head === null || this.closed) return;
    if (this.timer !== undefined) this.timers.clear(this.timer);
    // A timer never fires before its delay on Node's clock, but that clock is whole ms: round up,
    // and `expireDue` re-arms if it still finds the head not due.
    const delay = Math.max(1, Math.ceil(head.deadline - now));
    this.timerAt = head.deadline;
    this.timer = this.timers.set(this.onTimer, delay);
  }

  // Takes `s` out of its route FIFO, the ring (when the FIFO empties) and the deadline list.
  private unlink(s: QueueSlot): void {
    const f = s.fifo as RouteFifo;
    if (s.prev !== null) s.prev.next = s.next;
    else f.head = s.next;
    if (s.next !== null) s.next.prev = s.prev;
    else f.tail = s.prev;
    s.prev = s.next = null;
    s.fifo = null;
    if (--f.size === 0) this.ringRemove(f);
    if (s.dPrev !== null) s.dPrev.dNext = s.dNext;
    else this.dHead = s.dNext;
    if (s.dNext !== null) s.dNext.dPrev = s.dPrev;
    else this.dTail = s.dPrev;
    s.dPrev = s.dNext = null;
    this.queued--;
    // The timer is left armed when the earliest waiter leaves: it fires, finds nothing due and
    // re-arms, which is cheaper than re-arming on every admission.
  }

  // Inserts into the deadline list from the tail: O(1) while `max_wait_ms` is unchanged, because
  // deadlines then grow with enqueue time. Equal deadlines keep enqueue order.
  private deadlineInsert(s: QueueSlot): void {
    let after = this.dTail;
    while (after !== null && after.deadline > s.deadline) after = after.dPrev;
    s.dPrev = after;
    s.dNext = after === null ? this.dHead : after.dNext;
    if (s.dNext !== null) s.dNext.dPrev = s;
    else this.dTail = s;
    if (after !== null) after.dNext = s;
    else this.dHead = s;
  }

  // A FIFO that becomes non-empty joins the ring just before the cursor, i.e. last in the
  // current round order.
  private ringInsert(f: RouteFifo): void {
    const c = this.cursor;
    if (c === null) {
      f.ringNext = f.ringPrev = f;
      this.cursor = f;
      // A drain in progress ends by restoring the cursor from `resume`, which must not be null.
      if (this.draining) this.resume = f;
    } else {
      const last = c.ringPrev as RouteFifo;
      f.ringPrev = last;
      f.ringNext = c;
      last.ringNext = f;
      c.ringPrev = f;
    }
    this.ringSize++;
  }

  private ringRemove(f: RouteFifo): void {
    if (--this.ringSize === 0) {
      this.cursor = this.resume = null;
    } else {
      const p = f.ringPrev as RouteFifo;
      const n = f.ringNext as RouteFifo;
      p.ringNext = n;
      n.ringPrev = p;
      if (this.cursor === f) this.cursor = n;
      if (this.resume === f) this.resume = n;
    }
    f.ringPrev = f.ringNext = null;
  }
}
