// Brownout (SPEC "Brownout" state table): sampled after each request is routed, the global
// in-flight percent turns brownout on at `trigger_inflight_percent` or more and off again at
// `recover_inflight_percent` or less; in between the state stays as it is (hysteresis, so that
// a load hovering at the trigger does not flap). While active, every route (upstream pool) not
// in `core_routes` is shed with 503 `EDGE_SHED_BROWNOUT`; empty `core_routes` sheds all.
//
// The percent is of the global limit *in force*: the adaptive limit while adaptive admission is
// on, else `performance.global_inflight_limit` (docs/decisions.md, "Brownout: percent of the limit
// in force"). Against the configured global limit brownout could never trigger once adaptive
// admission had lowered the limit below 90 % of it: admission refuses before in-flight gets there.

import { inflightPercent, nextBrownout } from '@edge-proxy/ipc';
import type { BrownoutPolicy } from '@edge-proxy/ipc';

// The pure transition is declared once in @edge-proxy/ipc (admission-policy.ts): the supervisor
// decides the node's state with it (controlplane limits/node-admission.ts); a standalone worker
// decides alone with the same.
export { inflightPercent, nextBrownout };
export type { BrownoutPolicy };

/** A standalone worker's brownout state (led by a supervisor, the node's state applies). O(1) per sample, no allocation. */
export class Brownout {
  private on = false;

  /** Whether brownout is active now (`svc_brownout_active`). */
  get active(): boolean {
    return this.on;
  }

  /**
   * Samples the worker's global in-flight count against the limit in force and returns whether
   * brownout is active afterwards. Called once per routed request, before the request takes its
   * own global slot (so `inflight` counts the requests already admitted). A disabled policy
   * turns brownout off at once.
   */
  sample(inflight: number, limit: number, p: BrownoutPolicy): boolean {
    if (!p.enabled) return (this.on = false);
    return (this.on = nextBrownout(this.on, inflightPercent(inflight, limit), p.triggerInflightPercent, p.recoverInflightPercent));
  }

  /** Forgets the state (brownout inactive), e.g. when the policy is disabled by an activation. */
  reset(): void {
    this.on = false;
  }
}

/**
 * Whether a request of `route` is shed while brownout is active: every route not in
 * `coreRoutes`; all of them when `coreRoutes` is empty (SPEC). Build the set once per
 * generation; the lookup is O(1).
 */
export function shedByBrownout(route: string, coreRoutes: ReadonlySet<string>): boolean {
  return coreRoutes.size === 0 || !coreRoutes.has(route);
}
