// The selector contract. A selector is built once per backend set and policy (a new set builds a
// new selector); `pick` applies health at pick time through `eligible`, never by mutating weights,
// and tries a bounded number of candidates.
import type { BackendStats } from './backend-stats.ts';

/** A backend as selectors see it. `key` is its stable identity across generations. */
export interface BackendRef {
  readonly key: string;
  readonly id: string;
  readonly weight: number;
}

/** Per-request input of a pick. */
export interface PickContext {
  /** Whether a backend may be chosen now (healthy, under its in-flight limit; no breaker is wired yet, issue 13). */
  readonly eligible: (b: BackendRef) => boolean;
  /** Backends already tried by this request (retries and hedges pick another one). */
  readonly exclude?: ReadonlySet<string>;
  /** Hash input for consistent-hash (the value of the pool's key spec). */
  readonly hashKey?: string;
  /** Affinity input for sticky-cid: the QUIC connection id, or the TCP peer on the bootstrap path. */
  readonly affinityKey?: string;
  /** Random source in [0, 1); tests pass a seeded one. */
  readonly random?: () => number;
}

/** Picks backends for one pool. */
export interface Selector {
  readonly strategy: string;
  /**
   * True when the pick is a function of the request's key (consistent-hash, sticky-cid): the
   * key's owner is picked whenever it is usable, and a key moves to its fallback only while the
   * owner is not. A caller must then not narrow `eligible` for a passing reason (a worker's lease
   * momentarily empty while the node has slots), or keys would move for it.
   */
  readonly keyed?: boolean;
  /** The chosen backend, or undefined when no backend is eligible. */
  pick(ctx: PickContext): BackendRef | undefined;
}

/** Whether `b` may be picked in `ctx`: positive weight, not excluded, eligible. */
export function usable(b: BackendRef, ctx: PickContext): boolean {
  return b.weight > 0 && ctx.exclude?.has(b.key) !== true && ctx.eligible(b);
}

/** Shared read access to live per-backend state (in-flight counts, latency). */
export interface SelectorDeps {
  readonly stats: BackendStats;
}
