// Least connections by the power of two choices (Mitzenmacher): draw two usable backends, weighted,
// and take the one with fewer in-flight requests per unit of weight. O(1) per pick, and it avoids
// the herd that exact least-connections sends to one backend after it frees up.
import { RandomSelector } from './random.ts';
import type { BackendRef, PickContext, Selector, SelectorDeps } from './selector.ts';

export class LeastConnectionsSelector implements Selector {
  readonly strategy: string = 'least-connections';
  private readonly draw: RandomSelector;
  protected readonly deps: SelectorDeps;

  constructor(backends: readonly BackendRef[], deps: SelectorDeps) {
    this.draw = new RandomSelector(backends);
    this.deps = deps;
  }

  pick(ctx: PickContext): BackendRef | undefined {
    const a = this.draw.pick(ctx);
    if (a === undefined) return undefined;
    const exclude = new Set(ctx.exclude ?? []);
    exclude.add(a.key);
    const b = this.draw.pick({ ...ctx, exclude });
    if (b === undefined) return a;
    return this.cost(b) < this.cost(a) ? b : a;
  }

  protected cost(b: BackendRef): number {
    return (this.deps.stats.inflight(b.key) + 1) / b.weight;
  }
}
