// Smooth weighted round-robin (the interleaving nginx uses): every pick adds each usable backend's
// weight to its running score, takes the highest, and subtracts the total. Weights 5,1,1 give
// a a b a c a a rather than a a a a a b c. One pass over the pool per pick.
import { usable } from './selector.ts';
import type { BackendRef, PickContext, Selector } from './selector.ts';

export class RoundRobinSelector implements Selector {
  readonly strategy = 'round-robin';
  private readonly backends: readonly BackendRef[];
  private readonly current: Float64Array;

  constructor(backends: readonly BackendRef[]) {
    this.backends = backends;
    this.current = new Float64Array(backends.length);
  }

  pick(ctx: PickContext): BackendRef | undefined {
    let total = 0;
    let best = -1;
    for (let i = 0; i < this.backends.length; i++) {
      const b = this.backends[i] as BackendRef;
      if (!usable(b, ctx)) continue;
      this.current[i] = (this.current[i] as number) + b.weight;
      total += b.weight;
      if (best === -1 || (this.current[i] as number) > (this.current[best] as number)) best = i;
    }
    if (best === -1) return undefined;
    this.current[best] = (this.current[best] as number) - total;
    return this.backends[best];
  }
}
