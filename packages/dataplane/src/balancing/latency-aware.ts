// Latency-aware: power of two choices on decayed EWMA latency × (in-flight + 1) ("peak EWMA").
// Cold start: a backend without samples costs as little as the fastest known one, so new or
// recovered backends get traffic and earn a latency figure instead of being starved.
import { LeastConnectionsSelector } from './least-connections.ts';
import type { BackendRef, PickContext, SelectorDeps } from './selector.ts';

export class LatencyAwareSelector extends LeastConnectionsSelector {
  override readonly strategy = 'latency-aware';
  private readonly backendsForColdStart: readonly BackendRef[];
  private now = 0;

  constructor(backends: readonly BackendRef[], deps: SelectorDeps) {
    super(backends, deps);
    this.backendsForColdStart = backends;
  }

  override pick(ctx: PickContext): BackendRef | undefined {
    this.now = performance.now();
    return super.pick(ctx);
  }

  protected override cost(b: BackendRef): number {
    const stats = this.deps.stats;
    let latency = stats.latencyMs(b.key, this.now);
    if (latency === undefined) {
      // Cold start: as cheap as the fastest measured backend (bounded: one pass over the pool).
      let fastest = Number.POSITIVE_INFINITY;
      for (const o of this.backendsForColdStart) fastest = Math.min(fastest, stats.latencyMs(o.key, this.now) ?? Number.POSITIVE_INFINITY);
      latency = Number.isFinite(fastest) ? fastest : 1;
    }
    return (latency * (stats.inflight(b.key) + 1)) / b.weight;
  }
}
