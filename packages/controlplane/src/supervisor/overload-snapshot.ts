// The snapshot's `admission` and `circuit_breakers` blocks (GET /admin/runtime), merged from the
// latest heartbeat of each worker. Limits are per worker, so the node's figures are sums; a
// brownout in any worker is reported. A backend's breaker is the node's (the supervisor holds one
// state per backend: breakers/node-breakers.ts), with how many workers see each state in their
// latest heartbeat; without the node's view (a unit test of the merge alone) it is as bad as the
// worst worker's (open > half_open > closed). Pure: heartbeats, the node breakers' view and the
// active configuration in, plain JSON out.
import type { BreakerStatus, WorkerWindow } from '@edge-proxy/ipc';

/** One worker's latest heartbeat, with its slot and process id. */
export interface ReportingWorker {
  readonly worker: number;
  readonly pid: number;
  readonly window: WorkerWindow;
}

/** What the blocks take from the active configuration. */
export interface OverloadSettings {
  readonly activeGeneration: number;
  readonly adaptiveEnabled: boolean;
  /** `performance.global_inflight_limit` (per worker, as configured). */
  readonly globalInflightLimit: number;
  readonly breakerEnabled: boolean;
  /** Backends of the active generation, in configuration order: the order of `backends`. */
  readonly backends: readonly { readonly upstream: string; readonly backend: string }[];
  /** The node's breaker of a backend: its state and when it may probe (what the snapshot shows). */
  readonly node?: (upstream: string, backend: string) => { readonly state: BreakerStatus; readonly openUntilUnixMs: number | null };
}

/** The `admission` block. */
export interface AdmissionBlock {
  readonly adaptive_enabled: boolean;
  readonly adaptive_limit: number;
  readonly min_limit: number;
  readonly max_limit: number;
  readonly inflight: number;
  readonly queued: number;
  readonly brownout_active: boolean;
  readonly global_inflight_limit: number;
  readonly workers: readonly {
    readonly worker: number;
    readonly pid: number;
    readonly adaptive_limit: number;
    readonly min_limit: number;
    readonly max_limit: number;
    readonly inflight: number;
    readonly queued: number;
    readonly queued_by_route: Readonly<Record<string, number>>;
    readonly brownout_active: boolean;
  }[];
}

/** The `circuit_breakers` block. */
export interface CircuitBreakersBlock {
  readonly enabled: boolean;
  /** `state` and `open_until_unix_ms` (when it may probe; null unless open): the node's; `workers`: how many workers' latest heartbeats see each state. */
  readonly backends: readonly { readonly upstream: string; readonly backend: string; readonly state: BreakerStatus; readonly workers: Readonly<Record<BreakerStatus, number>>; readonly open_until_unix_ms: number | null }[];
}

/** Both blocks from the workers' latest heartbeats (workers without one are left out). */
export function overloadSnapshot(reporting: readonly ReportingWorker[], s: OverloadSettings): { admission: AdmissionBlock; circuit_breakers: CircuitBreakersBlock } {
  const workers = reporting.map(({ worker, pid, window: { admission: a } }) => ({
    worker,
    pid,
    adaptive_limit: a.adaptiveLimit,
    min_limit: a.minLimit,
    max_limit: a.maxLimit,
    inflight: a.inflight,
    queued: a.queued,
    queued_by_route: { ...a.queuedByRoute },
    brownout_active: a.brownoutActive,
  }));
  const sum = (f: (w: (typeof workers)[number]) => number): number => workers.reduce((n, w) => n + f(w), 0);
  const admission: AdmissionBlock = {
    adaptive_enabled: s.adaptiveEnabled,
    adaptive_limit: sum((w) => w.adaptive_limit),
    min_limit: sum((w) => w.min_limit),
    max_limit: sum((w) => w.max_limit),
    inflight: sum((w) => w.inflight),
    queued: sum((w) => w.queued),
    brownout_active: workers.some((w) => w.brownout_active),
    global_inflight_limit: s.globalInflightLimit,
    workers,
  };

  // Breakers: only heartbeats of the active generation speak for its backends.
  const counts = new Map<string, Record<BreakerStatus, number>>();
  const openUntil = new Map<string, number>();
  const id = (upstream: string, backend: string): string => JSON.stringify([upstream, backend]);
  for (const { window } of reporting) {
    if (window.generation !== s.activeGeneration) continue;
    for (const b of window.breakers) {
      const k = id(b.upstream, b.backend);
      const c = counts.get(k) ?? { closed: 0, open: 0, half_open: 0 };
      c[b.state]++;
      counts.set(k, c);
      if (b.state === 'open' && b.openUntilUnixMs !== null) openUntil.set(k, Math.max(openUntil.get(k) ?? 0, b.openUntilUnixMs));
    }
  }
  const backends = s.backends.map(({ upstream, backend }) => {
    const k = id(upstream, backend);
    const c = counts.get(k) ?? { closed: 0, open: 0, half_open: 0 };
    const workers = { closed: c.closed, open: c.open, half_open: c.half_open };
    const node = s.node?.(upstream, backend);
    if (node !== undefined) return { upstream, backend, state: node.state, workers, open_until_unix_ms: node.openUntilUnixMs };
    // The worst state any worker reports: open > half_open > closed.
    const state: BreakerStatus = c.open > 0 ? 'open' : c.half_open > 0 ? 'half_open' : 'closed';
    return { upstream, backend, state, workers, open_until_unix_ms: openUntil.get(k) ?? null };
  });
  return { admission, circuit_breakers: { enabled: s.breakerEnabled, backends } };
}

