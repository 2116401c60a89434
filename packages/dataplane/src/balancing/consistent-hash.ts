// Consistent hashing over a Maglev table. When the owner of a key is not usable (unhealthy,
// excluded), the next slots are walked, so the fallback is deterministic per key and other keys
// keep their backend. Keys come from the pool's key spec (see request-key.ts).
import { hash32 } from './hash.ts';
import { buildMaglevTable } from './maglev.ts';
import { usable } from './selector.ts';
import type { BackendRef, PickContext, Selector } from './selector.ts';

export class ConsistentHashSelector implements Selector {
  readonly strategy: string = 'consistent-hash';
  readonly keyed = true;
  private readonly backends: readonly BackendRef[];
  private readonly table: Int32Array;

  constructor(backends: readonly BackendRef[]) {
    this.backends = backends;
    this.table = buildMaglevTable(backends);
  }

  /** The backend owning `key` when every backend is usable (tests and diagnostics). */
  owner(key: string): BackendRef | undefined {
    const i = this.table[hash32(key) % this.table.length] as number;
    return i === -1 ? undefined : this.backends[i];
  }

  pick(ctx: PickContext): BackendRef | undefined {
    return this.pickByKey(ctx.hashKey ?? '', ctx);
  }

  protected pickByKey(key: string, ctx: PickContext): BackendRef | undefined {
    const size = this.table.length;
    const start = hash32(key) % size;
    const seen = new Set<number>();
    // Bounded: stop after every distinct backend was considered once.
    for (let step = 0; step < size && seen.size < this.backends.length; step++) {
      const i = this.table[(start + step) % size] as number;
      if (i === -1) return undefined;
      if (seen.has(i)) continue;
      seen.add(i);
      const b = this.backends[i] as BackendRef;
      if (usable(b, ctx)) return b;
    }
    return undefined;
  }
}
