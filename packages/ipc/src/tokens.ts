// The token-lease messages (docs/overload.md "Token budgets"): budgets leased per request key,
// created on first use — scoped rate limits per client, connection caps per source — between the
// supervisor's token ledger (controlplane limits/token-ledger.ts) and a worker's token leases
// (dataplane resilience/token-lease.ts). The in-flight budgets, a few keys fixed by the
// configuration, have their own protocol (lease.ts). Plain data, declared once at the boundary.

/** Worker → supervisor: `want` units of (`budget`, `key`), `waiting` of them for requests waiting now, `holding` still held. */
export interface TokenAsk {
  readonly budget: string;
  readonly key: string;
  readonly want: number;
  readonly waiting: number;
  readonly holding: number;
  /** A window budget's units of the NEXT bucket, asked shortly before the current one ends (a busy lease renewing). */
  readonly ahead?: boolean;
}

/**
 * Worker → supervisor: `unused` units of (`budget`, `key`) given back. `forget`: the worker holds
 * nothing of it after (its lease is gone; sent only with no ask of the key outstanding); else a
 * delta (a slot freed), which stays right whatever grants are on their way.
 */
export interface TokenSettle {
  readonly budget: string;
  readonly key: string;
  readonly unused: number;
  readonly forget: boolean;
  /** A window budget's units of the bucket ending then (host clock ms, the grant's `until`) only; absent: newest grants first. */
  readonly until?: number;
}

/**
 * Worker → supervisor: `n` events that earn units of a WINDOW budget (`budget`, `key`) — the
 * primary requests of a route's retry budget — the oldest of them at `at`, ms of the host's
 * monotonic clock (`process.hrtime`, the same in every process of the host). Sent in batches;
 * dated at the oldest, a batch leaves the window no later than its events would.
 */
export interface TokenDeposit {
  readonly budget: string;
  readonly key: string;
  readonly n: number;
  readonly at: number;
}

/** Supervisor → worker: the answer to one ask. */
export interface TokenGrant {
  readonly budget: string;
  readonly key: string;
  readonly granted: number;
  /** When the node's bucket could not cover the ask: ms until it holds another unit (≥ 1); else 0. */
  readonly waitMs: number;
  /** The most the budget grants ahead of need (the worker asks ahead only above 1). */
  readonly block: number;
  /**
   * A window budget's units may be spent only from `from` until `until`, ms of the host's clock
   * (`hostClockMs`): the window bucket they count in. Absent: no bounds.
   */
  readonly from?: number;
  readonly until?: number;
}

/**
 * The host's monotonic clock, ms: `process.hrtime` is one clock for every process of the host
 * (`performance.now()` counts from each process's start), so a worker can date a deposit in the
 * supervisor's time. The time base of window budgets.
 */
export function hostClockMs(): number {
  return Number(process.hrtime.bigint() / 1000n) / 1000;
}

/** Longest batch in one message. */
export const MAX_TOKEN_ENTRIES = 65_536;
/** Longest budget name or key (request keys are bounded at 64 characters plus their tag; budgets by the config). */
export const MAX_TOKEN_KEY = 512;

function count(v: unknown): boolean {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

function optionalTime(v: unknown): boolean {
  return v === undefined || (typeof v === 'number' && Number.isFinite(v));
}

function named(e: unknown): e is Record<string, unknown> {
  if (e === null || typeof e !== 'object') return false;
  const r = e as Record<string, unknown>;
  return typeof r['budget'] === 'string' && r['budget'].length <= MAX_TOKEN_KEY && typeof r['key'] === 'string' && r['key'].length <= MAX_TOKEN_KEY;
}

function batch(v: unknown, each: (e: Record<string, unknown>) => boolean): boolean {
  return Array.isArray(v) && v.length <= MAX_TOKEN_ENTRIES && v.every((e) => named(e) && each(e));
}

/** Whether `v` is a well-formed batch of asks. */
export function isTokenAsks(v: unknown): v is TokenAsk[] {
  return batch(v, (e) => count(e['want']) && count(e['waiting']) && count(e['holding']) && (e['ahead'] === undefined || typeof e['ahead'] === 'boolean'));
}

/** Whether `v` is a well-formed batch of settles. */
export function isTokenSettles(v: unknown): v is TokenSettle[] {
  return batch(v, (e) => count(e['unused']) && typeof e['forget'] === 'boolean' && optionalTime(e['until']));
}

/** Whether `v` is a well-formed batch of grants. */
export function isTokenGrants(v: unknown): v is TokenGrant[] {
  return batch(v, (e) => count(e['granted']) && count(e['waitMs']) && count(e['block']) && optionalTime(e['from']) && optionalTime(e['until']));
}

/** Whether `v` is absent or a well-formed batch of deposits. */
export function isTokenDeposits(v: unknown): v is TokenDeposit[] | undefined {
  return v === undefined || batch(v, (e) => count(e['n']) && typeof e['at'] === 'number' && Number.isFinite(e['at']));
}
