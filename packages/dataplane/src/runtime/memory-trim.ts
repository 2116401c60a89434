// Memory trim after load (`performance.memory_trim`, docs/performance.md "Worker memory").
//
// Under load V8 grows the old generation up to a limit set from the live heap (up to 4× it), and a
// full collection frees that garbage into a page pool it keeps mapped. Only a memory-reducing
// collection gives those pages back to the kernel, and V8 schedules one (its "memory reducer")
// when it sees the allocation rate fall. Node 24's V8 never sees it fall in a process that
// allocates nothing on the C++ heap (a zero rate there counts as maximal: V8 issue 570738027,
// nodejs/node#66564), so a worker that served a load peak keeps its peak RSS (about 300 MiB here)
// while it idles. This does what the memory reducer would: once the worker has been quiet for
// `idle_ms` and its RSS has grown by `min_growth_bytes` since the last trim, one `last-resort` collection (the same as V8's
// low-memory notification) returns the pool and shrinks the young generation. The idea is Java
// G1's periodic collection when idle (JEP 346). The collection blocks the event loop (50-200 ms),
// which is why it waits for a quiet worker, runs once per quiet period, and needs new growth.
import { memoryReducingCollector, trimMemoryNow } from '@edge-proxy/telemetry';
import type { MemoryTrimmed } from '@edge-proxy/telemetry';

/** How often the worker looks at its request count, ms. */
export const TRIM_TICK_MS = 1000;

export interface MemoryTrimSettings {
  readonly enabled: boolean;
  readonly idle_ms: number;
  readonly quiet_rps: number;
  readonly min_growth_bytes: number;
}

export interface MemoryTrimOptions {
  /** The active generation's `performance.memory_trim` (live), undefined before the first commit. */
  readonly settings: () => MemoryTrimSettings | undefined;
  /** Requests (and upgrades) this worker has started since it began: the tick takes the difference. */
  readonly requests: () => number;
  readonly onTrim: (r: MemoryTrimmed) => void;
  /** Called once if the collector cannot be reached (trims are then off for the process). */
  readonly onUnavailable: (reason: string) => void;
  /** Tests: the clock, the RSS and the collection. */
  readonly now?: () => number;
  readonly rss?: () => number;
  readonly collect?: () => void;
  /** Tests: no timer; `tick()` is called by hand. */
  readonly manual?: boolean;
}

export class MemoryTrim {
  private readonly opts: MemoryTrimOptions;
  private readonly now: () => number;
  private readonly rss: () => number;
  private collect: (() => void) | undefined;
  private unavailable = false;
  private timer: NodeJS.Timeout | undefined;
  private lastRequests: number | undefined;
  private lastTick: number | undefined;
  /** Start of the current run of quiet ticks, undefined while the worker is busy. */
  private quietSince: number | undefined;
  /** RSS after the last trim, or at the first look: growth is measured from it. */
  private baseline: number | undefined;
  /** This quiet period has had its trim: the next one needs a busy second first. */
  private spent = false;

  constructor(opts: MemoryTrimOptions) {
    this.opts = opts;
    this.now = opts.now ?? (() => performance.now());
    this.rss = opts.rss ?? (() => process.memoryUsage.rss());
    this.collect = opts.collect;
    if (opts.manual !== true) {
      this.timer = setInterval(() => this.tick(), TRIM_TICK_MS);
      this.timer.unref();
    }
  }

  /** One look: counts the requests since the last one, and trims when the worker qualifies. */
  tick(): void {
    const s = this.opts.settings();
    const now = this.now();
    const requests = this.opts.requests();
    const previous = this.lastRequests;
    const elapsed = this.lastTick === undefined ? 0 : now - this.lastTick;
    this.lastRequests = requests;
    this.lastTick = now;
    // The worker's footprint at its first second: the first trim needs growth over it.
    this.baseline ??= this.rss();
    if (s === undefined || !s.enabled || this.unavailable) {
      this.quietSince = undefined;
      return;
    }
    if (previous === undefined || elapsed <= 0) return;
    const quiet = requests - previous <= (s.quiet_rps * elapsed) / 1000;
    if (!quiet) {
      this.quietSince = undefined;
      this.spent = false;
      return;
    }
    if (this.spent) return;
    // The run of quiet starts where the last busy tick ended.
    this.quietSince ??= now - elapsed;
    if (now - this.quietSince < s.idle_ms) return;
    if (s.min_growth_bytes > 0 && this.rss() - this.baseline < s.min_growth_bytes) return;
    this.trim();
  }

  private trim(): void {
    let r: MemoryTrimmed;
    try {
      this.collect ??= memoryReducingCollector();
      r = trimMemoryNow(this.collect, this.rss);
    } catch (err) {
      // The collector unreachable, or a collection that throws (from a timer, a throw would end
      // the worker): the trim is off for the process instead, reported once.
      this.unavailable = true;
      this.opts.onUnavailable(err instanceof Error ? err.message : String(err));
      return;
    }
    this.baseline = r.rssAfter;
    this.spent = true;
    this.opts.onTrim(r);
  }

  /** Growth is measured from `rss` from now on (after a trim made elsewhere: the start-up one). */
  rebase(rss: number): void {
    this.baseline = rss;
  }

  close(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }
}
