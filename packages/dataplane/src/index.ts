// @edge-proxy/dataplane: the worker. So far: route resolution and the load-balancing selectors.
export { Router, normalizeHost, normalizePrefix } from './routing/router.ts';
export type { RouteResult, RouteReason } from './routing/router.ts';
export { buildSelector, BackendStatsRegistry, compileKeySpec } from './balancing/index.ts';
export type { BackendRef, BackendStats, KeyExtractor, KeySource, PickContext, Selector, SelectorDeps } from './balancing/index.ts';
