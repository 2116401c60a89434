// Adaptive admission (SPEC `resilience.adaptive_admission`; docs/overload.md "Adaptive admission"):
// the pure policy and its holder are declared once in @edge-proxy/ipc (admission-policy.ts), since
// the supervisor steps the node's one limit with them and a standalone worker decides alone with
// the same. A worker led by a supervisor only reports its responses' windows (admission-report.ts).
export { AdaptiveLimit, HIGH_SHARE_PERCENT, WINDOW_MS, isHighWindow, stepLimit } from '@edge-proxy/ipc';
export type { AdaptivePolicy, AdaptiveWindow } from '@edge-proxy/ipc';
