// Deadlines of many concurrent requests on one coarse interval timer instead of a Node timer
// each: arming and clearing a `setTimeout` per response cost about 1 µs (1.3 % of busy time
// under load). Items sit in a plain array and carry their own index in it, so adding and
// removing one is an array write and a swap, with no hashing (a Set of objects cost ~0.6 µs per
// request in profiles). A deadline fires within `resolutionMs` after it is due. The interval
// runs only while something is tracked.

export interface Expirable {
  /** `performance.now()` time at which `expire` is due. */
  readonly deadline: number;
  /** Position in the sweep that tracks this item, -1 when none does; owned by `DeadlineSweep`. */
  sweepSlot: number;
  expire(): void;
}

export class DeadlineSweep {
  private readonly live: Expirable[] = [];
  private readonly resolutionMs: number;
  private timer: NodeJS.Timeout | undefined;
  private readonly unref: boolean;

  /** `unref`: the sweep's timer does not keep the process alive (what it tracks must, if it should). */
  constructor(resolutionMs: number, o: { unref?: boolean } = {}) {
    this.resolutionMs = resolutionMs;
    this.unref = o.unref === true;
  }

  /** Tracks `item` until it expires or is deleted; an item already tracked stays as it is. */
  add(item: Expirable): void {
    if (item.sweepSlot !== -1) return;
    item.sweepSlot = this.live.length;
    this.live.push(item);
    if (this.timer === undefined) {
      this.timer = setInterval(this.sweep, this.resolutionMs);
      if (this.unref) this.timer.unref();
    }
  }

  /** Stops tracking `item`; nothing happens if it is not tracked. */
  delete(item: Expirable): void {
    const i = item.sweepSlot;
    if (i === -1 || this.live[i] !== item) return;
    const last = this.live.pop() as Expirable;
    if (last !== item) {
      this.live[i] = last;
      last.sweepSlot = i;
    }
    item.sweepSlot = -1;
  }

  get size(): number {
    return this.live.length;
  }

  private readonly sweep = (): void => {
    const now = performance.now();
    // Backwards, so the swap in `delete` only moves items already looked at; `expire` may delete others.
    for (let i = this.live.length - 1; i >= 0; i--) {
      const item = this.live[i];
      if (item === undefined || item.deadline > now) continue;
      this.delete(item);
      item.expire();
    }
    if (this.live.length === 0 && this.timer !== undefined) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  };
}
