// The watchdog as a pure policy (SPEC "Watchdog and drain"): each check window is judged from the
// workers' heartbeats; `unhealthy_consecutive_windows` bad windows in a row, with the restart
// cooldown elapsed, request a restart. The supervisor owns the timer and the restart itself.
import type { RawConfig } from '@edge-proxy/config';
import type { WorkerWindow } from '@edge-proxy/ipc';

export type WatchdogConfig = RawConfig['resilience']['watchdog'];

/** Why a window was unhealthy. */
export type UnhealthyReason = 'poll_stall' | 'timeout_error_rate' | 'overload' | 'worker_silent';

/** Judges one window. `windows` holds one heartbeat per worker; `undefined` marks a silent worker. */
export function judgeWindow(cfg: WatchdogConfig, windows: readonly (WorkerWindow | undefined)[]): UnhealthyReason[] {
  const reasons: UnhealthyReason[] = [];
  const seen = windows.filter((w): w is WorkerWindow => w !== undefined);
  if (seen.length < windows.length) reasons.push('worker_silent');
  if (seen.some((w) => w.maxLoopDelayMs >= cfg.poll_stall_timeout_ms)) reasons.push('poll_stall');
  const requests = seen.reduce((s, w) => s + w.requests, 0);
  const failures = seen.reduce((s, w) => s + w.timeoutsOrErrors, 0);
  if (requests >= cfg.min_requests_per_window && requests > 0 && (failures * 100) / requests >= cfg.timeout_error_rate_percent) reasons.push('timeout_error_rate');
  const limit = seen.reduce((s, w) => s + w.inflightLimit, 0);
  const inflight = seen.reduce((s, w) => s + w.inflight, 0);
  if (limit > 0 && (inflight * 100) / limit >= cfg.overload_inflight_percent) reasons.push('overload');
  return reasons;
}

export interface WatchdogState {
  readonly consecutive: number;
  readonly degradedWindows: number;
  readonly lastRestartAt: number | undefined;
}

export const WATCHDOG_INITIAL: WatchdogState = { consecutive: 0, degradedWindows: 0, lastRestartAt: undefined };

/** Advances the watchdog by one judged window; says whether to restart now. */
export function stepWatchdog(cfg: WatchdogConfig, s: WatchdogState, reasons: readonly UnhealthyReason[], now: number): { state: WatchdogState; restart: boolean } {
  if (reasons.length === 0) return { state: { ...s, consecutive: 0 }, restart: false };
  const consecutive = s.consecutive + 1;
  const cooled = s.lastRestartAt === undefined || now - s.lastRestartAt >= cfg.restart_cooldown_ms;
  const restart = cfg.enabled && consecutive >= cfg.unhealthy_consecutive_windows && cooled;
  return { state: { consecutive: restart ? 0 : consecutive, degradedWindows: s.degradedWindows + 1, lastRestartAt: restart ? now : s.lastRestartAt }, restart };
}

/**
 * The watchdog state of a process that starts again, from the last restart time the state
 * directory kept (`saved`, Unix ms): a restart the watchdog asked for still holds the cooldown, so
 * a restart loop cannot bypass it. A time in the future (the clock was set back) counts from `now`.
 */
export function resumeWatchdog(saved: number | undefined, now: number): WatchdogState {
  return { ...WATCHDOG_INITIAL, lastRestartAt: saved === undefined ? undefined : Math.min(saved, now) };
}
