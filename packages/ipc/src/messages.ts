// The supervisor–worker contract: every message that crosses the process boundary, declared once.
// Processes are forked with `serialization: 'advanced'` (structured clone), so bundles carry
// Uint8Array keys and nested data as they are. Knows nothing of routes: bundles are opaque here.
import type { ResolvedConfig } from '@edge-proxy/config';
import type { JwksKeySet } from '@edge-proxy/auth';
import type { AdmissionView, BreakerStatus, BreakerView, QuotaHealthView } from './overload.ts';
import { isLeaseAsks, isLeaseGrants } from './lease.ts';
import type { LeaseAsk, LeaseGrant } from './lease.ts';
import { isTokenAsks, isTokenDeposits, isTokenGrants, isTokenSettles } from './tokens.ts';
import { isAdmissionReport, isNodeAdmissionNotice } from './admission-policy.ts';
import type { AdmissionReport, NodeAdmissionNotice } from './admission-policy.ts';
import type { TokenAsk, TokenDeposit, TokenGrant, TokenSettle } from './tokens.ts';

/** Keys every worker behind one port must share (QUIC connection ids, Retry tokens, tickets). */
export interface SharedKeys {
  readonly cryptoKey: Uint8Array;
  readonly ticketKey: Uint8Array;
}

/** A generation as handed to workers: the resolved configuration and its number. */
export interface GenerationBundle {
  readonly generation: number;
  readonly resolved: ResolvedConfig;
}

/** Supervisor → worker. */
export type ToWorker =
  | { readonly type: 'init'; readonly keys: SharedKeys; readonly workerIndex: number }
  | { readonly type: 'prepare'; readonly id: number; readonly bundle: GenerationBundle }
  | { readonly type: 'commit'; readonly id: number; readonly generation: number }
  | { readonly type: 'abort'; readonly id: number; readonly generation: number }
  | { readonly type: 'reload-certs'; readonly id: number; readonly listeners: ResolvedConfig['material']['listeners'] }
  | { readonly type: 'metrics'; readonly id: number }
  | { readonly type: 'drain'; readonly id: number; readonly graceMs: number }
  /** Answered at once: is the worker's event loop turning (a rolling restart probes before it starts). */
  | { readonly type: 'ping'; readonly id: number }
  /**
   * Not answered: JWKS key sets the supervisor fetched (it fetches once per node), sent when a set
   * or its state changes, after a refresh a worker asked for, and to a new worker after `init`.
   */
  | { readonly type: 'jwks'; readonly sets: readonly JwksKeySet[] }
  /**
   * Not answered: the node's circuit breakers (docs/overload.md "Circuit breakers, per node"), sent
   * to every worker the moment one changes and to a new worker after `init`; `permits` is what this
   * worker may now probe with (0 in a broadcast). `sentAt`: the supervisor's clock when it sent it
   * (`performance.timeOrigin + performance.now()`, ms), so a worker can tell how late it applies it.
   */
  | { readonly type: 'breakers'; readonly states: readonly NodeBreakerNotice[]; readonly sentAt: number }
  /** Not answered: units of node budgets leased to this worker, revoked, or contention changes (ipc lease.ts). */
  | { readonly type: 'lease'; readonly grants: readonly LeaseGrant[] }
  /** Not answered: the token ledger's answers to a worker's `tokens` asks (ipc tokens.ts). */
  | { readonly type: 'token-grants'; readonly grants: readonly TokenGrant[] }
  /** Not answered: the node's adaptive limit and brownout state, on every change and after `init` (admission-policy.ts). */
  | ({ readonly type: 'admission' } & NodeAdmissionNotice);

/** One backend's node-wide breaker, as the supervisor tells the workers. */
export interface NodeBreakerNotice {
  /** Backend identity (the data plane's selector key). */
  readonly key: string;
  readonly status: BreakerStatus;
  /** Closed: consecutive failures counted node-wide (a worker reports its next success when above 0). */
  readonly failures: number;
  /** Closed: held closed at `failure_threshold` by `max_ejection_percent` (it keeps serving). */
  readonly held: boolean;
  /** Open or half-open: which opening this is (a probe reports the epoch it was granted in). */
  readonly epoch: number;
  /** Open: when the node goes half-open (unix ms); otherwise null. */
  readonly openUntilUnixMs: number | null;
  /** Half-open: probe permits granted to the receiving worker by this notice. */
  readonly permits: number;
}

/** One outcome a worker reports for a backend's node-wide breaker. */
export interface BreakerReportEntry {
  readonly key: string;
  readonly upstream: string;
  readonly backend: string;
  /** The backend identities of its pool in the worker's active generation (the ejection bound counts within it). */
  readonly pool: readonly string[];
  readonly outcome: 'success' | 'failure' | 'neutral';
  /** The epoch of the probe permit the attempt used; 0: not a probe. */
  readonly probeEpoch: number;
}

/** Worker → supervisor. */
export type FromWorker =
  | { readonly type: 'ready'; readonly pid: number }
  | { readonly type: 'reply'; readonly id: number; readonly ok: true; readonly value?: unknown }
  | { readonly type: 'reply'; readonly id: number; readonly ok: false; readonly code: string; readonly message: string }
  | { readonly type: 'listening'; readonly generation: number; readonly listeners: readonly { name: string; udp: number; tcp: number }[] }
  | { readonly type: 'heartbeat'; readonly stats: WorkerWindow }
  | { readonly type: 'panic'; readonly message: string }
  /** A token named a `kid` the source's set lacks (or the set was never fetched): fetch again, within the source's cooldown. */
  | { readonly type: 'jwks-refresh'; readonly sourceId: string }
  /**
   * What one event-loop turn of a worker did to the node's breakers: attempt outcomes (failures, and
   * a success only where the node counts failures or a probe ended), probe permits asked for (a
   * request met a half-open breaker without one), and unused permits given back.
   */
  | { readonly type: 'breaker-report'; readonly outcomes: readonly BreakerReportEntry[]; readonly asks: readonly string[]; readonly returns: readonly { readonly key: string; readonly epoch: number }[] }
  /** Lease asks and returns of one event-loop turn, one entry per budget key (ipc lease.ts). */
  | { readonly type: 'lease'; readonly asks: readonly LeaseAsk[] }
  /** Token asks and settles of one event-loop turn (ipc tokens.ts): rate limits per key, connection caps, retry budgets, quota; and the deposits of window budgets (retry budgets' primaries). */
  | { readonly type: 'tokens'; readonly asks: readonly TokenAsk[]; readonly settles: readonly TokenSettle[]; readonly deposits?: readonly TokenDeposit[] }
  /** Response-latency samples and the in-use count of `global`, at a bounded rate (admission-policy.ts). */
  | ({ readonly type: 'admission' } & AdmissionReport);

/** One watchdog window of a worker (SPEC "Watchdog and drain"). */
export interface WorkerWindow {
  /** Longest event-loop delay seen in the window, ms. */
  readonly maxLoopDelayMs: number;
  readonly requests: number;
  /** Requests that ended in a timeout or a 5xx. */
  readonly timeoutsOrErrors: number;
  readonly inflight: number;
  readonly inflightLimit: number;
  readonly generation: number;
  /** Backends of the active generation this worker may pick now, and those it may not. */
  readonly backendsHealthy: number;
  readonly backendsUnhealthy: number;
  /** This worker's admission state now (the snapshot's `admission.workers[]`). */
  readonly admission: AdmissionView;
  /** The breaker of each backend of the active generation, as this worker sees it. */
  readonly breakers: readonly BreakerView[];
  /** This worker's quota store (the snapshot's `quota_backend_health_summary`, merged). */
  readonly quota: QuotaHealthView;
}

const TO_WORKER = new Set(['init', 'prepare', 'commit', 'abort', 'reload-certs', 'metrics', 'drain', 'ping', 'jwks', 'breakers', 'lease', 'token-grants', 'admission']);
const FROM_WORKER = new Set(['ready', 'reply', 'listening', 'heartbeat', 'panic', 'jwks-refresh', 'breaker-report', 'lease', 'tokens', 'admission']);
/** Supervisor → worker messages that are not requests (no `id`, no reply). */
const NOTICES = new Set(['init', 'jwks', 'breakers', 'lease', 'token-grants', 'admission']);

/** Whether `m` is a notice (not answered) rather than a request the worker replies to. */
export function isNotice(m: ToWorker): m is Extract<ToWorker, { type: 'init' | 'jwks' | 'breakers' | 'lease' | 'token-grants' | 'admission' }> {
  return NOTICES.has(m.type);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object';
}

/** Guards the boundary: a message we do not know is dropped, never acted on. */
export function isToWorker(v: unknown): v is ToWorker {
  if (!isObject(v) || typeof v['type'] !== 'string' || !TO_WORKER.has(v['type'])) return false;
  if (v['type'] === 'jwks') return Array.isArray(v['sets']);
  if (v['type'] === 'lease') return isLeaseGrants(v['grants']);
  if (v['type'] === 'token-grants') return isTokenGrants(v['grants']);
  if (v['type'] === 'admission') return isNodeAdmissionNotice(v);
  if (v['type'] === 'breakers') return Array.isArray(v['states']) && typeof v['sentAt'] === 'number';
  return v['type'] === 'init' || typeof v['id'] === 'number';
}

export function isFromWorker(v: unknown): v is FromWorker {
  if (!isObject(v) || typeof v['type'] !== 'string' || !FROM_WORKER.has(v['type'])) return false;
  if (v['type'] === 'jwks-refresh') return typeof v['sourceId'] === 'string' && v['sourceId'].length <= 64;
  if (v['type'] === 'lease') return isLeaseAsks(v['asks']);
  if (v['type'] === 'tokens') return isTokenAsks(v['asks']) && isTokenSettles(v['settles']) && isTokenDeposits(v['deposits']);
  if (v['type'] === 'admission') return isAdmissionReport(v);
  if (v['type'] === 'breaker-report') return Array.isArray(v['outcomes']) && Array.isArray(v['asks']) && Array.isArray(v['returns']);
  return v['type'] !== 'reply' || typeof v['id'] === 'number';
}
