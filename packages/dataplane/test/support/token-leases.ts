// A worker's token leases (resilience/token-lease.ts) on a fake clock, fake timers and a fake
// channel, for the unit tests of the leases and of what is built on them (queue-places.ts).
import { TokenLeases } from '../../src/resilience/token-lease.ts';
import type { TokenAsk, TokenDeposit, TokenSettle } from '@edge-proxy/ipc';

export interface Harness {
  readonly leases: TokenLeases;
  /** Every message sent; `deposits` only when it carries some. */
  readonly sent: { asks: readonly TokenAsk[]; settles: readonly TokenSettle[]; deposits?: readonly TokenDeposit[] }[];
  /** Runs the deferred flush (the end of the turn). */
  turn(): void;
  /** Moves the clock and fires the timers due. */
  advance(ms: number): void;
  now(): number;
}

export function harness(o: { maxEntries?: number; onEvict?: (evicted: number) => void } = {}, start = 1000): Harness {
  let now = start;
  const deferred: (() => void)[] = [];
  let timers: { at: number; fn: () => void; id: number }[] = [];
  let ids = 0;
  const sent: Harness['sent'] = [];
  const leases = new TokenLeases({
    send: (asks, settles, deposits) => sent.push(deposits.length === 0 ? { asks, settles } : { asks, settles, deposits }),
    now: () => now,
    // One fake clock for both: the host's clock of window budgets too.
    hostNow: () => now,
    setTimer: (fn, ms) => {
      const id = ++ids;
      timers.push({ at: now + ms, fn, id });
      return id;
    },
    clearTimer: (id) => {
      timers = timers.filter((x) => x.id !== id);
    },
    defer: (fn) => deferred.push(fn),
    ...o,
  });
  return {
    leases,
    sent,
    turn: () => {
      for (const fn of deferred.splice(0)) fn();
    },
    advance: (ms) => {
      const end = now + ms;
      for (;;) {
        const due = timers.filter((x) => x.at <= end).sort((a, b) => a.at - b.at)[0];
        if (due === undefined) break;
        timers = timers.filter((x) => x !== due);
        now = due.at;
        due.fn();
      }
      now = end;
    },
    now: () => now,
  };
}
