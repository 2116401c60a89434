// Timers owned by the session layer, counted so tests can check that nothing is left armed
// after the clients are gone. Library-internal timers (QUIC idle and loss timers) are not here;
// they end with their connections, which the server also counts.

/** A set of one-shot timers that can be counted and cleared together. */
export class TimerSet {
  private readonly live = new Set<NodeJS.Timeout>();

  /** Timers currently armed. */
  get size(): number {
    return this.live.size;
  }

  /** Arms `fn` after `ms` milliseconds; the timer does not keep the process alive. */
  set(fn: () => void, ms: number): NodeJS.Timeout {
    const t = setTimeout(() => {
      this.live.delete(t);
      fn();
    }, ms);
    t.unref();
    this.live.add(t);
    return t;
  }

  /** Disarms a timer (no-op when it already fired or was cleared). */
  clear(t: NodeJS.Timeout | undefined): void {
    if (t === undefined) return;
    clearTimeout(t);
    this.live.delete(t);
  }

  /** Disarms every timer. */
  clearAll(): void {
    for (const t of this.live) clearTimeout(t);
    this.live.clear();
  }
}
