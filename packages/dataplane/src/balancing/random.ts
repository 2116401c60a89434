// Weighted random: a binary search over cumulative weights. An ineligible draw is retried a few
// times, then the pick falls back to one weighted draw over the usable backends only.
import { usable } from './selector.ts';
import type { BackendRef, PickContext, Selector } from './selector.ts';

const RANDOM_TRIES = 3;

export class RandomSelector implements Selector {
  readonly strategy = 'random';
  private readonly backends: readonly BackendRef[];
  private readonly cumulative: Float64Array;
  private readonly total: number;

  constructor(backends: readonly BackendRef[]) {
    this.backends = backends;
    this.cumulative = new Float64Array(backends.length);
    let sum = 0;
    backends.forEach((b, i) => {
      sum += Math.max(0, b.weight);
      this.cumulative[i] = sum;
    });
    this.total = sum;
  }

  pick(ctx: PickContext): BackendRef | undefined {
    if (this.total === 0) return undefined;
    const random = ctx.random ?? Math.random;
    for (let t = 0; t < RANDOM_TRIES; t++) {
      const b = this.backends[this.index(random() * this.total)] as BackendRef;
      if (usable(b, ctx)) return b;
    }
    return weightedAmong(this.backends.filter((b) => usable(b, ctx)), random);
  }

  private index(x: number): number {
    let lo = 0;
    let hi = this.cumulative.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((this.cumulative[mid] as number) > x) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
}

/** One weighted draw among `candidates`. */
export function weightedAmong(candidates: readonly BackendRef[], random: () => number): BackendRef | undefined {
  const total = candidates.reduce((s, b) => s + b.weight, 0);
  if (total <= 0) return undefined;
  let x = random() * total;
  for (const b of candidates) {
    x -= b.weight;
    if (x < 0) return b;
  }
  return candidates[candidates.length - 1];
}
