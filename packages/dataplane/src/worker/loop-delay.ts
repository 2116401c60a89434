// The worker's event-loop delay over one heartbeat window, from a `monitorEventLoopDelay`
// histogram. Node records the whole interval between two of its timer's ticks (an idle loop
// records ≈ the resolution, 20 ms, not 0), so the delay is that interval minus the resolution.
import type { IntervalHistogram } from 'node:perf_hooks';

/** Sampling resolution of the worker's event-loop delay histogram, ms. */
export const LOOP_DELAY_RESOLUTION_MS = 20;

/**
 * p99 of the event-loop delay recorded since the histogram's last reset, in seconds: the p99
 * interval minus the resolution, never negative; 0 when nothing was recorded (a window shorter
 * than one tick).
 */
export function loopDelayP99Seconds(h: Pick<IntervalHistogram, 'count' | 'percentile'>, resolutionMs = LOOP_DELAY_RESOLUTION_MS): number {
  if (h.count === 0) return 0;
  return Math.max(0, h.percentile(99) / 1e9 - resolutionMs / 1e3);
}
