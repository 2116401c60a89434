// Builds the selector of a pool from its load-balancing policy.
import type { LoadBalancingConfig } from '@edge-proxy/config';
import { ConsistentHashSelector } from './consistent-hash.ts';
import { LatencyAwareSelector } from './latency-aware.ts';
import { LeastConnectionsSelector } from './least-connections.ts';
import { RandomSelector } from './random.ts';
import { RoundRobinSelector } from './round-robin.ts';
import { StickyCidSelector } from './sticky-cid.ts';
import type { BackendRef, Selector, SelectorDeps } from './selector.ts';

/** A new selector for a backend set and policy. */
export function buildSelector(backends: readonly BackendRef[], policy: LoadBalancingConfig, deps: SelectorDeps): Selector {
  switch (policy.type) {
    case 'round-robin':
      return new RoundRobinSelector(backends);
    case 'random':
      return new RandomSelector(backends);
    case 'consistent-hash':
      return new ConsistentHashSelector(backends);
    case 'least-connections':
      return new LeastConnectionsSelector(backends, deps);
    case 'latency-aware':
      return new LatencyAwareSelector(backends, deps);
    case 'sticky-cid':
      return new StickyCidSelector(backends);
  }
}

export type { BackendRef, PickContext, Selector, SelectorDeps } from './selector.ts';
export { BackendStatsRegistry } from './backend-stats.ts';
export type { BackendStats } from './backend-stats.ts';
export { ConsistentHashSelector } from './consistent-hash.ts';
export { compileKeySpec } from './request-key.ts';
export type { KeyExtractor, KeySource } from './request-key.ts';
