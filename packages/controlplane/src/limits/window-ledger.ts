// The node's WINDOW budgets (docs/overload.md "Token budgets", docs/retries.md "The retry
// budget"): units allowed per time window rather than refilled at a rate — a route's retry budget
// (retries in a sliding 10 s window ≤ floor + ratio % × the primaries in it) and a quota
// contract counted locally (requests per fixed window ≤ limit). The supervisor counts each
// (budget, key)'s window here and leases units to the workers through the token messages (the
// token ledger's asks, settles and grants, plus deposits); a worker spends its lease synchronously
// (dataplane resilience/token-lease.ts).
//
// Why it is exact. A window is `buckets` buckets of `bucketMs` (a fixed window: one bucket), dated
// by the host's monotonic clock (ipc `hostClockMs`, the same in every process). A grant counts its
// units as spent in one bucket at once — the current one, or the next when a busy worker renews
// ahead of the bucket's end — and the worker may spend them only within that bucket (the grant's
// `from` and `until`, on the same clock). So every unit spent in a window was granted in it, and a
// grant is made only while
//   spent(window) + granted ≤ base + ratio % × deposits(window):
// the node spends at most what one counter of the window would allow, whatever the worker count.
// The error is on the safe side only: a deposit counts from when the supervisor hears of it
// (batched by the worker: fewer units meanwhile, never more; dated at the oldest event of its
// batch, it leaves the window no later than its events), units a worker let lapse or gave back
// return to their own bucket (never to a later one), and a dead worker's units count as spent.
//
// Pure: the clock is an argument. Memory is bounded like the token ledger's: at most `maxWindows`
// windows; an empty one nobody holds is dropped by `sweep`; past the cap the least recently used
// unheld windows go (an evicted key starts from an empty window, as a new key would).

/** A window budget's contract. */
export interface WindowLimit {
  /** Units every window allows whatever was deposited (the retry floor; a quota contract's limit). */
  readonly base: number;
  /** Units earned per 100 deposits (a route's retry ratio, percent; 0 for a quota contract). */
  readonly ratioPercent: number;
  /** Buckets of the sliding window (1: a fixed window) and their length, ms. */
  readonly buckets: number;
  readonly bucketMs: number;
  /** Added to the clock before bucketing, ms: windows on multiples of `bucketMs` since the epoch (a quota's fixed windows, as Redis counts them); default 0. */
  readonly alignMs?: number;
}

/** The bucket index of `now` under `limit`. */
function epochOf(limit: WindowLimit, now: number): number {
  return Math.floor((now + (limit.alignMs ?? 0)) / limit.bucketMs);
}

/** The answer to one ask (the token ledger's `TokenAnswer` with the units' bucket). */
export interface WindowAnswer {
  readonly granted: number;
  /** Fewer granted than wanted and none left: ms until the next bucket begins, or `RATIO_RECHECK_MS` with a ratio (≥ 1); else 0. */
  readonly waitMs: number;
  readonly block: number;
  /** The bucket the granted units count in, and may be spent in: [from, until), host clock ms. */
  readonly from: number;
  readonly until: number;
}

/**
 * A window with a ratio that is empty is asked again after this long at most, ms: the workers'
 * deposits arrive in batches about this far apart (the data plane's `DEPOSIT_FLUSH_MS`).
 */
export const RATIO_RECHECK_MS = 100;

/** Windows the supervisor keeps at most, every budget together. */
export const MAX_LEDGER_WINDOWS = 200_000;

/** A window used again after this long moves to the back of the eviction order, ms. */
const TOUCH_MS = 1000;

/** Units a worker holds from one grant, and the bucket they count in. */
interface Holding {
  readonly epoch: number;
  n: number;
}

/**
 * One key's window: a ring of `buckets + 1` slots (the window, and the next bucket for units
 * granted ahead), each tagged with its bucket index; a slot whose tag is stale counts nothing.
 */
interface Window {
  readonly epochs: number[];
  readonly deposits: number[];
  readonly spent: number[];
  /** Per worker, what it may still hold unspent, oldest grant first; absent: nothing. */
  held: Map<number, Holding[]> | undefined;
  touched: number;
}

/** Units a window of `limit` allows in all with `deposits` deposited: base + floor(ratio % × deposits). */
export function allowance(limit: WindowLimit, deposits: number): number {
  return limit.base + Math.floor((limit.ratioPercent * deposits) / 100);
}

/** One budget of the window ledger as the snapshot shows it. */
export interface WindowBudgetView {
  readonly budget: string;
  /** Its contract: units every window allows, plus `ratio_percent` % of the window's deposits; the window's length. */
  readonly base: number;
  readonly ratio_percent: number;
  readonly window_ms: number;
  /** Keys with a window now; deposits (a route's primaries) and units spent (granted) in their windows now, summed over keys. */
  readonly keys: number;
  readonly deposits: number;
  readonly spent: number;
  /** Units held unspent by workers, in all and by each worker that holds any. */
  readonly held: number;
  readonly workers: readonly { readonly worker: number; readonly held: number }[];
}

export class WindowLedger {
  private readonly windows = new Map<string, Window>();
  private limits = new Map<string, WindowLimit>();
  private workers = 1;
  private readonly maxWindows: number;
  /** Windows dropped to stay under the cap (a metric). */
  evicted = 0;

  constructor(maxWindows = MAX_LEDGER_WINDOWS) {
    this.maxWindows = maxWindows;
  }

  /**
   * The budgets in force (at a commit) and the worker count. Windows of a budget no longer
   * configured, or whose buckets changed, are dropped; a changed base or ratio applies at once.
   */
  configure(limits: ReadonlyMap<string, WindowLimit>, workers: number): void {
    const before = this.limits;
    this.limits = new Map(limits);
    this.workers = Math.max(1, workers);
    for (const id of this.windows.keys()) {
      const budget = budgetOf(id);
      const now = this.limits.get(budget);
      const was = before.get(budget);
      if (now === undefined || was === undefined || now.buckets !== was.buckets || now.bucketMs !== was.bucketMs || now.alignMs !== was.alignMs) this.windows.delete(id);
    }
  }

  /** Whether `budget` is one of this ledger's. */
  has(budget: string): boolean {
    return this.limits.has(budget);
  }

  /** The contract of `budget`, if configured. */
  limit(budget: string): WindowLimit | undefined {
    return this.limits.get(budget);
  }

  /** `n` deposits of (`budget`, `key`), the oldest at `at`, heard at `now`: counted in the bucket of `at` while it is in the window. */
  deposit(budget: string, key: string, n: number, at: number, now: number): void {
    const limit = this.limits.get(budget);
    if (limit === undefined || n <= 0) return;
    const w = this.window(budget, key, limit, now);
    const e = epochOf(limit, now);
    const d = Math.min(e, epochOf(limit, at));
    if (d <= e - limit.buckets) return;
    const i = slot(w, d);
    w.deposits[i] = (w.deposits[i] as number) + n;
  }

  /**
   * Worker `worker` asks for `want` units of (`budget`, `key`) at `now`, `waiting` of them for
   * requests waiting now, holding `holding` unspent (what it held beyond that it spent: those stay
   * counted); `ahead`: units of the next bucket (a renewal shortly before this one ends). Units for
   * waiting requests may pass the block; asking ahead may not. An unknown budget grants nothing
   * and asks it to wait a second.
   */
  ask(worker: number, budget: string, key: string, want: number, waiting: number, holding: number, now: number, ahead = false): WindowAnswer {
    const limit = this.limits.get(budget);
    if (limit === undefined) return { granted: 0, waitMs: 1000, block: 1, from: now, until: now };
    const w = this.window(budget, key, limit, now);
    this.spentDownTo(w, worker, Math.max(0, holding));
    const e = epochOf(limit, now) + (ahead ? 1 : 0);
    const { deposits, spent } = totals(w, limit, e);
    let left = Math.max(0, allowance(limit, deposits) - spent);
    if (!ahead) {
      // Units granted ahead for the next bucket count in the next window, which holds this bucket
      // too: what this bucket may still grant is bounded by that window as well.
      const next = totals(w, limit, e + 1);
      left = Math.min(left, Math.max(0, allowance(limit, next.deposits) - next.spent));
    }
    // Blocks shrink with what is left, so the units other workers hold unspent when one finds the
    // window empty are few: about a quarter of what was left when they asked, at most.
    const block = Math.max(1, Math.floor(left / (2 * this.workers)));
    const granted = Math.max(0, Math.min(left, Math.max(Math.min(Math.floor(want), block), Math.floor(waiting))));
    if (granted > 0) {
      const i = slot(w, e);
      w.spent[i] = (w.spent[i] as number) + granted;
      const list = (w.held ??= new Map()).get(worker);
      if (list === undefined) w.held.set(worker, [{ epoch: e, n: granted }]);
      else list.push({ epoch: e, n: granted });
    }
    const from = e * limit.bucketMs - (limit.alignMs ?? 0);
    const until = from + limit.bucketMs;
    // Empty: nothing frees before the next bucket, unless deposits earn units (a ratio): ask again then.
    const next = limit.ratioPercent > 0 ? Math.min(until - now, RATIO_RECHECK_MS) : until - now;
    const waitMs = granted >= want || left - granted >= 1 ? 0 : Math.max(1, Math.ceil(next));
    return { granted, waitMs, block, from, until };
  }

  /**
   * Worker `worker` gives back `unused` units of (`budget`, `key`) (unspent, or lapsed unspent):
   * they leave the buckets they were counted in, newest grant first, while those are in the
   * window; `until` (a bucket's end): units of that bucket only. `forget`: it holds none after (the
   * rest it spent).
   */
  settle(worker: number, budget: string, key: string, unused: number, forget: boolean, now: number, until?: number): void {
    const limit = this.limits.get(budget);
    const w = this.windows.get(idOf(budget, key));
    if (limit === undefined || w === undefined) return;
    const list = w.held?.get(worker);
    if (list === undefined) return;
    const oldest = epochOf(limit, now) - limit.buckets + 1;
    const only = until === undefined ? undefined : epochOf(limit, until) - 1;
    let back = Math.max(0, Math.floor(unused));
    for (let j = list.length - 1; j >= 0 && back > 0; j--) {
      const h = list[j] as Holding;
      if (only !== undefined && h.epoch !== only) continue;
      const m = Math.min(h.n, back);
      h.n -= m;
      back -= m;
      const i = h.epoch % (limit.buckets + 1);
      if (h.epoch >= oldest && w.epochs[i] === h.epoch) w.spent[i] = (w.spent[i] as number) - m;
      if (h.n === 0) list.splice(j, 1);
    }
    if (forget) this.spentDownTo(w, worker, 0);
    else if (list.length === 0) dropHeld(w, worker);
  }

  /** Worker `worker` is gone (exit, SIGKILL): what it held counts as spent (it may have spent it). */
  dropWorker(worker: number): void {
    for (const w of this.windows.values()) dropHeld(w, worker);
  }

  /** Drops every window that counts nothing now and is held by nobody (the same as none). */
  sweep(now: number): void {
    for (const [id, w] of this.windows) {
      const limit = this.limits.get(budgetOf(id));
      if (limit === undefined) {
        this.windows.delete(id);
        continue;
      }
      const t = totals(w, limit, epochOf(limit, now) + 1);
      const counted = totals(w, limit, epochOf(limit, now));
      if (w.held === undefined && t.deposits + t.spent + counted.deposits + counted.spent === 0) this.windows.delete(id);
    }
  }

  /** Windows kept now. */
  get size(): number {
    return this.windows.size;
  }

  /**
   * Every configured budget at `now` (the snapshot's `admission.window_budgets`): its contract,
   * the keys with a window, the deposits and units spent in their windows now, and the units each
   * worker holds unspent. O(windows): for the snapshot, not a hot path.
   */
  views(now: number): WindowBudgetView[] {
    const out = new Map<string, { keys: number; deposits: number; spent: number; held: Map<number, number> }>();
    for (const budget of this.limits.keys()) out.set(budget, { keys: 0, deposits: 0, spent: 0, held: new Map() });
    for (const [id, w] of this.windows) {
      const budget = budgetOf(id);
      const v = out.get(budget);
      const limit = this.limits.get(budget);
      if (v === undefined || limit === undefined) continue;
      v.keys++;
      const t = totals(w, limit, epochOf(limit, now));
      v.deposits += t.deposits;
      v.spent += t.spent;
      for (const [worker, list] of w.held ?? []) v.held.set(worker, (v.held.get(worker) ?? 0) + list.reduce((n, h) => n + h.n, 0));
    }
    return [...out].map(([budget, v]) => {
      const limit = this.limits.get(budget) as WindowLimit;
      const workers = [...v.held].sort((a, b) => a[0] - b[0]).map(([worker, held]) => ({ worker, held }));
      return { budget, base: limit.base, ratio_percent: limit.ratioPercent, window_ms: limit.buckets * limit.bucketMs, keys: v.keys, deposits: v.deposits, spent: v.spent, held: workers.reduce((n, w) => n + w.held, 0), workers };
    });
  }

  /** One window at `now` (tests, views): deposits and units spent in it, units left, held per worker. */
  peek(budget: string, key: string, now: number): { deposits: number; spent: number; left: number; held: Record<number, number> } | undefined {
    const limit = this.limits.get(budget);
    const w = this.windows.get(idOf(budget, key));
    if (limit === undefined || w === undefined) return undefined;
    const { deposits, spent } = totals(w, limit, epochOf(limit, now));
    const held = Object.fromEntries([...(w.held ?? [])].map(([worker, list]) => [worker, list.reduce((n, h) => n + h.n, 0)]));
    return { deposits, spent, left: Math.max(0, allowance(limit, deposits) - spent), held };
  }

  /** Worker `worker` holds at most `n` of `w` now: the oldest grants beyond it were spent (they stay counted). */
  private spentDownTo(w: Window, worker: number, n: number): void {
    const list = w.held?.get(worker);
    if (list === undefined) return;
    let held = list.reduce((s, h) => s + h.n, 0);
    while (held > n && list.length > 0) {
      const h = list[0] as Holding;
      const m = Math.min(h.n, held - n);
      h.n -= m;
      held -= m;
      if (h.n === 0) list.shift();
    }
    if (list.length === 0) dropHeld(w, worker);
  }

  private window(budget: string, key: string, limit: WindowLimit, now: number): Window {
    const id = idOf(budget, key);
    let w = this.windows.get(id);
    if (w === undefined) {
      if (this.windows.size >= this.maxWindows) this.evict();
      const n = limit.buckets + 1;
      w = { epochs: new Array<number>(n).fill(-1), deposits: new Array<number>(n).fill(0), spent: new Array<number>(n).fill(0), held: undefined, touched: now };
      this.windows.set(id, w);
      return w;
    }
    if (now - w.touched >= TOUCH_MS) {
      w.touched = now;
      this.windows.delete(id);
      this.windows.set(id, w);
    }
    return w;
  }

  /** Drops the least recently used tenth of the cap among windows nobody holds. */
  private evict(): void {
    let n = Math.max(1, Math.floor(this.maxWindows / 10));
    for (const [id, w] of this.windows) {
      if (w.held !== undefined) continue;
      this.windows.delete(id);
      this.evicted++;
      if (--n === 0) break;
    }
  }
}

/** The slot of bucket `epoch` in `w`, emptied first when it still holds an older bucket. */
function slot(w: Window, epoch: number): number {
  const i = epoch % w.epochs.length;
  if (w.epochs[i] !== epoch) {
    w.epochs[i] = epoch;
    w.deposits[i] = 0;
    w.spent[i] = 0;
  }
  return i;
}

/** Deposits and units spent in the window whose newest bucket is `e`. */
function totals(w: Window, limit: WindowLimit, e: number): { deposits: number; spent: number } {
  let deposits = 0;
  let spent = 0;
  for (let x = e - limit.buckets + 1; x <= e; x++) {
    const i = ((x % w.epochs.length) + w.epochs.length) % w.epochs.length;
    if (w.epochs[i] !== x) continue;
    deposits += w.deposits[i] as number;
    spent += w.spent[i] as number;
  }
  return { deposits, spent };
}

function dropHeld(w: Window, worker: number): void {
  w.held?.delete(worker);
  if (w.held?.size === 0) w.held = undefined;
}

function idOf(budget: string, key: string): string {
  return `${budget}\u0000${key}`;
}

function budgetOf(id: string): string {
  return id.slice(0, id.indexOf('\u0000'));
}
