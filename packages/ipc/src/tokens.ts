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
}

/** Longest batch in one message. */
export const MAX_TOKEN_ENTRIES = 65_536;
/** Longest budget name or key (request keys are bounded at 64 characters plus their tag; budgets by the config). */
export const MAX_TOKEN_KEY = 512;

function count(v: unknown): boolean {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
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
  return batch(v, (e) => count(e['want']) && count(e['waiting']) && count(e['holding']));
}

/** Whether `v` is a well-formed batch of settles. */
export function isTokenSettles(v: unknown): v is TokenSettle[] {
  return batch(v, (e) => count(e['unused']) && typeof e['forget'] === 'boolean');
}

/** Whether `v` is a well-formed batch of grants. */
export function isTokenGrants(v: unknown): v is TokenGrant[] {
  return batch(v, (e) => count(e['granted']) && count(e['waitMs']) && count(e['block']));
}
