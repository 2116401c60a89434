// Worker liveness as pure policy: which workers have been silent too long, and how long to wait
// before the next re-fork of a slot whose last attempts failed. This is process supervision, not
// the watchdog: it runs whether or not `resilience.watchdog.enabled` is set (a stopped or frozen
// worker keeps its listening sockets, so the kernel goes on handing it new connections that hang).
// The pool owns the timers and the signals.

/** Liveness settings (from `performance.worker_heartbeat_ms` and `worker_unresponsive_heartbeats`). */
export interface LivenessConfig {
  readonly heartbeatMs: number;
  readonly unresponsiveHeartbeats: number;
}

/** One watched worker: its slot and when the supervisor last heard from it (any message). */
export interface Heard {
  readonly index: number;
  readonly lastSeen: number;
}

/** Longest silence a worker may keep before it counts as unresponsive, ms. */
export function silenceLimitMs(cfg: LivenessConfig): number {
  return cfg.heartbeatMs * cfg.unresponsiveHeartbeats;
}

/** The slots whose worker has been silent longer than the limit at `now`, with the silence in ms. */
export function unresponsive(cfg: LivenessConfig, workers: readonly Heard[], now: number): { index: number; silentMs: number }[] {
  const limit = silenceLimitMs(cfg);
  return workers.filter((w) => now - w.lastSeen > limit).map((w) => ({ index: w.index, silentMs: now - w.lastSeen }));
}

/** Re-fork backoff after failed attempts: 250 ms, doubling, at most 10 s. */
export const REFORK_BACKOFF = { firstMs: 250, maxMs: 10_000 } as const;

/**
 * Delay before re-forking a slot whose previous `failures` attempts in a row died before serving
 * (a fork that never said ready, a handover that failed: a port taken, a commit that throws). A
 * crash of a worker that was serving is not a failure of the re-fork: it is re-forked at once.
 */
export function reforkDelayMs(failures: number): number {
  if (failures <= 0) return 0;
  return Math.min(REFORK_BACKOFF.maxMs, REFORK_BACKOFF.firstMs * 2 ** Math.min(failures - 1, 16));
}
