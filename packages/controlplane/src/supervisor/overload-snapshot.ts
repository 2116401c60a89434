// The snapshot's `admission` and `circuit_breakers` blocks (GET /admin/runtime), merged from the
// latest heartbeat of each worker, and the node's leased in-flight budgets (`leases`, from the
// supervisor's ledger: limits/lease-service.ts). The adaptive limit, its range, the brownout state
// and `node_inflight` at the top are the node's (limits/node-admission.ts: one limit, one state,
// the in-flight count it decides on), next to each worker's figures as its latest heartbeat gave
// them (the limit and state it last heard); `inflight` and `queued` are sums over the workers'
// heartbeats. A backend's breaker is the node's (the supervisor holds one
// state per backend: breakers/node-breakers.ts), with how many workers see each state in their
// latest heartbeat; without the node's view (a unit test of the merge alone) it is as bad as the
// worst worker's (open > half_open > closed). Pure: heartbeats, the node breakers' view and the
// active configuration in, plain JSON out.
import type { BreakerStatus, WorkerWindow } from '@edge-proxy/ipc';
import type { BudgetView } from '../limits/lease-ledger.ts';
import type { NodeAdmissionView } from '../limits/node-admission.ts';
import type { TokenBudgetView } from '../limits/token-ledger.ts';
import type { WindowBudgetView } from '../limits/window-ledger.ts';

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
  /** `performance.global_inflight_limit` (the node's). */
  readonly globalInflightLimit: number;
  /**
   * The node's adaptive limit, in-flight count and brownout state (limits/node-admission.ts): the
   * block's top-level figures. Absent (a unit test of the merge alone): sums over the workers.
   */
  readonly nodeAdmission?: NodeAdmissionView;
  /** The node's leased budgets now (limits/lease-service.ts); absent: none shown. */
  readonly leases?: readonly BudgetView[];
  /** Lease messages since start, each way (lease traffic). */
  readonly leaseTraffic?: { readonly asksIn: number; readonly grantsOut: number };
  /** The node's token budgets now (limits/token-service.ts); absent: none shown. */
  readonly tokenBudgets?: readonly TokenBudgetView[];
  /** Token messages since start, each way. */
  readonly tokenTraffic?: { readonly asksIn: number; readonly grantsOut: number };
  /** The node's window budgets now (each route's retry budget, the quota's local counters); absent: none shown. */
  readonly windowBudgets?: readonly WindowBudgetView[];
  readonly breakerEnabled: boolean;
  /** Backends of the active generation, in configuration order: the order of `backends`. */
  readonly backends: readonly { readonly upstream: string; readonly backend: string }[];
  /** The node's breaker of a backend: its state and when it may probe (what the snapshot shows). */
  readonly node?: (upstream: string, backend: string) => { readonly state: BreakerStatus; readonly openUntilUnixMs: number | null };
}

/** The `admission` block. */
export interface AdmissionBlock {
  readonly adaptive_enabled: boolean;
  /** The node's limit in force (`global` budget's limit) and its range. */
  readonly adaptive_limit: number;
  readonly min_limit: number;
  readonly max_limit: number;
  /** Requests in flight: the sum of the workers' latest heartbeats. */
  readonly inflight: number;
  /**
   * Requests in flight node-wide as the node's brownout counts them: every live worker's in-use
   * count of `global` as it last told the supervisor (within 10 ms while brownout is enabled).
   */
  readonly node_inflight: number;
  readonly queued: number;
  /** The node's brownout state. */
  readonly brownout_active: boolean;
  readonly global_inflight_limit: number;
  /**
   * The node's leased budgets (`global`, `upstream:<pool>`): the limit, the units granted to
   * workers and free, whether a worker is starved (contended), the block, and each worker's lease
   * (granted; in use and waiting requests as it last reported).
   */
  readonly leases: readonly LeaseBlock[];
  /** Lease messages since the supervisor started: `from_workers` (asks and gives), `to_workers` (grants). */
  readonly lease_messages: { readonly from_workers: number; readonly to_workers: number };
  /**
   * The node's token budgets (`rl:<name>` per scoped rate limit, `conn`, `conn-src`, `conn-rate`,
   * ...): the contract, the keys with a bucket, and the units each worker holds (unspent tokens,
   * or slots in use for a rate-0 budget).
   */
  readonly token_budgets: readonly TokenBudgetView[];
  /** Token messages since the supervisor started: `from_workers` (asks and settles), `to_workers` (grants). */
  readonly token_messages: { readonly from_workers: number; readonly to_workers: number };
  /**
   * The node's window budgets (`retry:<route>`, `quota:<policy>:<contract>`): the contract, the
   * keys with a window, deposits and units spent in the windows now, units held per worker.
   */
  readonly window_budgets: readonly WindowBudgetView[];
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

/** One leased budget of the node (the snapshot's `admission.leases[]`). */
export interface LeaseBlock {
  readonly key: string;
  readonly limit: number;
  readonly granted: number;
  readonly free: number;
  readonly contended: boolean;
  readonly block: number;
  readonly workers: readonly { readonly worker: number; readonly granted: number; readonly in_use: number; readonly waiting: number }[];
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
  const n = s.nodeAdmission;
  const admission: AdmissionBlock = {
    adaptive_enabled: s.adaptiveEnabled,
    adaptive_limit: n?.adaptiveLimit ?? sum((w) => w.adaptive_limit),
    min_limit: n?.minLimit ?? sum((w) => w.min_limit),
    max_limit: n?.maxLimit ?? sum((w) => w.max_limit),
    inflight: sum((w) => w.inflight),
    node_inflight: n?.inflight ?? sum((w) => w.inflight),
    queued: sum((w) => w.queued),
    brownout_active: n?.brownoutActive ?? workers.some((w) => w.brownout_active),
    global_inflight_limit: s.globalInflightLimit,
    leases: (s.leases ?? [])
      .map((b) => ({ key: b.key, limit: b.limit, granted: b.granted, free: b.free, contended: b.contended, block: b.block, workers: b.holders.map((h) => ({ worker: h.worker, granted: h.granted, in_use: h.used, waiting: h.need })) })),
    lease_messages: { from_workers: s.leaseTraffic?.asksIn ?? 0, to_workers: s.leaseTraffic?.grantsOut ?? 0 },
    token_budgets: (s.tokenBudgets ?? []).map((b) => ({ ...b, workers: b.workers.map((w) => ({ ...w })) })),
    token_messages: { from_workers: s.tokenTraffic?.asksIn ?? 0, to_workers: s.tokenTraffic?.grantsOut ?? 0 },
    window_budgets: (s.windowBudgets ?? []).map((b) => ({ ...b, workers: b.workers.map((w) => ({ ...w })) })),
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

