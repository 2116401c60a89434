// The lease protocol between the supervisor (which owns every node budget: in-flight slots per
// scope, tokens of rate limits and budgets) and the workers (which admit from their local lease
// synchronously). docs/overload.md "One node, one set of limits" explains it. Plain data, declared
// once at the process boundary: the supervisor's ledger (controlplane limits/lease-ledger.ts) and
// the worker's lease table (dataplane resilience/lease.ts) both speak it.
//
// Every count is a delta or a standing demand, never an absolute grant, so that messages crossing
// each other on the pipe can never make either side believe in slots the other has not given:
// - the supervisor counts a worker's grant as (slots it sent) − (slots it received back);
// - the worker counts it as (slots it received) − (slots it sent back);
// so the worker's count is never above the supervisor's, and the sum of the supervisor's counts
// never exceeds the limit.

/** Worker → supervisor, one entry per budget key that changed in one event-loop turn. */
export interface LeaseAsk {
  /** The budget key: `global`, `upstream:<pool>`, `backend:<pool>/<id>`, or another kind's. */
  readonly key: string;
  /**
   * Standing demand: requests of this worker waiting now for a unit of this budget (beyond what
   * its lease holds). Replaces the previous value; 0 withdraws it.
   */
  readonly need: number;
  /** Headroom wanted beyond `need` (best effort, from free units only, never while contended). */
  readonly extra: number;
  /** Units given back with this message (idle slots, unused tokens). */
  readonly give: number;
  /**
   * Slots: units in use now (held by requests in flight). Tokens: units consumed since the last
   * ask (they do not come back).
   */
  readonly used: number;
  /** True when this ask expects an answer (`need` or `extra` above 0): at most one outstanding per key. */
  readonly asks: boolean;
}

/** Supervisor → worker, one entry per budget key. */
export interface LeaseGrant {
  readonly key: string;
  /** Units added to the worker's lease. */
  readonly add: number;
  /** Units the worker must give back: idle ones now, the rest as they free (a lowered limit). */
  readonly revoke: number;
  /**
   * Another worker is starved: give back every idle unit now and each unit as it frees (unless a
   * local waiter takes it) until a grant says otherwise. The worker answers with an ask (an ack).
   */
  readonly contended: boolean;
  /** This entry answers the worker's outstanding ask (`asks: true`). */
  readonly reply: boolean;
  /** With `reply`: the standing need could not be met in full (no unit free node-wide). */
  readonly exhausted: boolean;
  /** The block the worker should keep as headroom (units). */
  readonly block: number;
  /** The budget's node limit now (slots) or burst (tokens): views and percentages. */
  readonly limit: number;
  /** Slots in use node-wide as the workers last reported them (tokens: units held by workers): brownout, views. */
  readonly nodeHeld: number;
}

/** Longest batch accepted in one message (a node has far fewer keys than this). */
export const MAX_LEASE_ENTRIES = 4096;
/** Longest budget key. */
export const MAX_LEASE_KEY = 512;

function count(v: unknown): boolean {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

function entries(v: unknown): v is Record<string, unknown>[] {
  return Array.isArray(v) && v.length <= MAX_LEASE_ENTRIES && v.every((e) => e !== null && typeof e === 'object' && typeof (e as { key?: unknown }).key === 'string' && ((e as { key: string }).key.length <= MAX_LEASE_KEY));
}

/** Whether `v` is a well-formed batch of asks (a worker's `lease` message). */
export function isLeaseAsks(v: unknown): v is LeaseAsk[] {
  return entries(v) && v.every((e) => count(e['need']) && count(e['extra']) && count(e['give']) && count(e['used']) && typeof e['asks'] === 'boolean');
}

/** Whether `v` is a well-formed batch of grants (the supervisor's `lease` notice). */
export function isLeaseGrants(v: unknown): v is LeaseGrant[] {
  return entries(v) && v.every((e) => count(e['add']) && count(e['revoke']) && count(e['block']) && count(e['limit']) && count(e['nodeHeld']) && typeof e['contended'] === 'boolean' && typeof e['reply'] === 'boolean' && typeof e['exhausted'] === 'boolean');
}
