// The admission policies both processes run (docs/overload.md "Adaptive admission", "Brownout"):
// pure, declared once here because the supervisor steps the node's one adaptive limit and decides
// the node's brownout state (controlplane limits/node-admission.ts), while a worker run without a
// supervisor (a standalone data plane) decides alone with the same functions.
//
// Adaptive admission (SPEC `resilience.adaptive_admission`): the node's global in-flight limit
// moves between `min_limit` and `max_limit` by fixed steps, one step per observation.
//
// The observation is a short window of completed upstream responses (docs/decisions.md,
// "Adaptive admission: the observation"): a window opens, collects the latency samples of the
// responses that complete, and closes at the first sample at least WINDOW_MS after it opened
// (that sample included). It is *high* when more than 10 % of its samples exceed
// `high_latency_ms`, i.e. its p90 is above it: the limit drops by `decrease_step`; otherwise it
// rises by `increase_step`. Per window rather than per response, so that the rate of change
// does not scale with traffic: at 10,000 responses/s a per-response rule would move the limit
// by thousands a second. p90 rather than the mean, so that a handful of very slow requests
// moves it and one pathological request alone does not.
//
// `stepLimit` is the pure policy; `AdaptiveLimit` holds a window and a limit (the supervisor's for
// the node; a standalone worker's). Neither allocates per sample.

/** How long a window lasts at least (ms): it closes at the first sample this long after it opened. */
export const WINDOW_MS = 100;

/**
 * A window is high when more than HIGH_SHARE_PERCENT % of its samples exceed `high_latency_ms`
 * (SPEC: "high-latency observation"; decided here: the window's p90 is above the threshold).
 */
export const HIGH_SHARE_PERCENT = 10;

/** The adaptive admission settings in force (from the active generation). */
export interface AdaptivePolicy {
  /** `resilience.adaptive_admission.enabled` (default true). Off: the limit is `globalInflightLimit`. */
  readonly enabled: boolean;
  /** `min_limit` (default 64): the lowest limit, requests. */
  readonly minLimit: number;
  /** `max_limit` (default `performance.global_inflight_limit`): the highest limit and the start, requests. */
  readonly maxLimit: number;
  /** `decrease_step` (default 16): requests taken off after a high window. */
  readonly decreaseStep: number;
  /** `increase_step` (default 16): requests added after a healthy window. */
  readonly increaseStep: number;
  /** `high_latency_ms` (default 500): a sample above it is a slow response, ms. */
  readonly highLatencyMs: number;
  /** `performance.global_inflight_limit` (default 4096): the limit while adaptive admission is off. */
  readonly globalInflightLimit: number;
}

/** One closed window: how many samples, and how many of them exceeded `high_latency_ms`. */
export interface AdaptiveWindow {
  readonly samples: number;
  readonly high: number;
}

/** Whether a window counts as high: strictly more than 10 % of its samples are slow. */
export function isHighWindow(w: AdaptiveWindow): boolean {
  // Integer comparison, no division: 1 slow of 10 is not high, 2 of 19 is.
  return w.high * 100 > w.samples * HIGH_SHARE_PERCENT;
}

/**
 * The pure policy: the limit after one window. A window with no sample is no observation (the
 * limit stays as it is); otherwise one step down (not below `minLimit`) or up (not above
 * `maxLimit`). A limit outside [min, max] is clamped into it first.
 */
export function stepLimit(limit: number, w: AdaptiveWindow, p: AdaptivePolicy): number {
  return stepCounts(limit, w.samples, w.high, p);
}

// `stepLimit` on plain numbers, so that `AdaptiveLimit` builds no window object per window.
function stepCounts(limit: number, samples: number, high: number, p: AdaptivePolicy): number {
  if (samples <= 0) return clamp(limit, p);
  const slow = high * 100 > samples * HIGH_SHARE_PERCENT;
  return clamp(slow ? limit - p.decreaseStep : limit + p.increaseStep, p);
}

function clamp(limit: number, p: AdaptivePolicy): number {
  if (limit < p.minLimit) return p.minLimit;
  if (limit > p.maxLimit) return p.maxLimit;
  return limit;
}

/**
 * An adaptive limit and its open window: the node's (the supervisor feeds it the workers' batches
 * with `add`) or a standalone worker's (`sample`, once per completed upstream response: the time
 * from the start of the upstream attempt to the response headers; a timeout counts with its
 * elapsed time; transport failures and client aborts are not samples). `configure` once per
 * activated generation. Times are in ms on one monotonic clock.
 */
export class AdaptiveLimit {
  private readonly now: () => number;
  private policy: AdaptivePolicy | undefined;
  private current: number;
  private windowStart: number;
  private samples = 0;
  private high = 0;
  private closed = 0;

  /**
   * `now` is read only when a window must be restarted outside `sample` (construction,
   * `configure`). Until a policy is configured the limit is 0 and samples are ignored.
   */
  constructor(now: () => number, policy?: AdaptivePolicy) {
    this.now = now;
    this.current = 0;
    this.windowStart = now();
    if (policy !== undefined) this.configure(policy);
  }

  /** The global in-flight limit in force: the adaptive limit, or `globalInflightLimit` while disabled. */
  get limit(): number {
    return this.current;
  }

  /** Windows closed (observations made) since construction. */
  get windows(): number {
    return this.closed;
  }

  /** Whether the limit adapts (the policy in force has `enabled`). */
  get enabled(): boolean {
    return this.policy !== undefined && this.policy.enabled;
  }

  /**
   * Applies a newly activated policy. Disabled: the limit is pinned at `globalInflightLimit` and
   * samples are ignored. Enabled after being disabled (or first configured): the limit starts at
   * `maxLimit` (SPEC). Enabled before and after: the limit keeps its value, clamped into the new
   * [min, max]. The open window is discarded either way: its samples were judged against the
   * old threshold.
   */
  configure(p: AdaptivePolicy): void {
    const wasEnabled = this.enabled;
    this.policy = p;
    if (!p.enabled) this.current = p.globalInflightLimit;
    else if (!wasEnabled) this.current = p.maxLimit;
    else this.current = clamp(this.current, p);
    this.restartWindow(this.now());
  }

  /**
   * Records one completed upstream response that took `latencyMs`, at `now`. Closes the window
   * (and moves the limit) when it is at least WINDOW_MS old. O(1), no allocation.
   */
  sample(latencyMs: number, now: number): void {
    const p = this.policy;
    if (p === undefined || !p.enabled) return;
    this.add(1, latencyMs > p.highLatencyMs ? 1 : 0, now);
  }

  /**
   * Records `samples` responses, `high` of them slow (a worker's batch), at `now`; closes the
   * window when it is at least WINDOW_MS old (this batch included). True when the limit moved.
   */
  add(samples: number, high: number, now: number): boolean {
    const p = this.policy;
    if (p === undefined || !p.enabled || samples <= 0) return false;
    this.samples += samples;
    this.high += Math.min(high, samples);
    if (now - this.windowStart < WINDOW_MS) return false;
    this.closed++;
    const before = this.current;
    this.current = stepCounts(this.current, this.samples, this.high, p);
    this.restartWindow(now);
    return this.current !== before;
  }

  private restartWindow(now: number): void {
    this.windowStart = now;
    this.samples = 0;
    this.high = 0;
  }
}

// Brownout (SPEC "Brownout" state table): inactive -> active at `trigger_inflight_percent` or more,
// active -> inactive at `recover_inflight_percent` or less; in between the state stays (hysteresis).
// The percent is of the global limit *in force* (the adaptive limit while adaptive admission is on).

/** The brownout settings in force (from the active generation). */
export interface BrownoutPolicy {
  /** `resilience.brownout.enabled` (default true). Off: never active. */
  readonly enabled: boolean;
  /** `trigger_inflight_percent` (default 90, 0-100): at or above it, brownout turns on. */
  readonly triggerInflightPercent: number;
  /** `recover_inflight_percent` (default 60, below the trigger): at or below it, brownout turns off. */
  readonly recoverInflightPercent: number;
}

/**
 * The pure transition: the state after one sample of `percent` (in-flight as a percentage of the
 * limit in force). inactive → active when percent ≥ trigger; active → inactive when percent ≤
 * recover; otherwise unchanged.
 */
export function nextBrownout(active: boolean, percent: number, trigger: number, recover: number): boolean {
  return active ? percent > recover : percent >= trigger;
}

/** The in-flight percent of `limit`; a limit of 0 or less counts as fully used. */
export function inflightPercent(inflight: number, limit: number): number {
  // Exact at the boundaries: 100 × inflight is an exact integer and IEEE division is correctly
  // rounded, so a ratio that is exactly 90 comes out as 90, never 89.99….
  return limit > 0 ? (100 * inflight) / limit : 100;
}


// --- the messages (docs/overload.md "Adaptive admission", "Brownout") ----------------------------

/**
 * Worker → supervisor (`admission`): the latency samples of its completed upstream responses
 * since its last report (`samples`, `high` of them above `high_latency_ms`) and its in-use count
 * of the `global` budget now. Sent at most once per WINDOW_MS for samples (only when there were
 * some) and, while brownout is enabled, at most once per INUSE_REPORT_MS when the in-use count
 * changed.
 */
export interface AdmissionReport {
  readonly samples: number;
  readonly high: number;
  readonly inUse: number;
}

/** A worker reports a changed in-use count at most this often (ms) while brownout is enabled: the bound of the node's view of it. */
export const INUSE_REPORT_MS = 10;

/**
 * Supervisor → every worker (`admission`): the node's adaptive limit in force (its `global`
 * budget's limit) and brownout state, sent on every change and to a new worker after `init`.
 * `sentAt`: the supervisor's clock (`performance.timeOrigin + performance.now()`, ms).
 */
export interface NodeAdmissionNotice {
  readonly limit: number;
  readonly brownout: boolean;
  readonly sentAt: number;
}

function count(v: unknown): boolean {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

/** Whether `v` carries a well-formed report (a worker's `admission` message). */
export function isAdmissionReport(v: Record<string, unknown>): boolean {
  return count(v['samples']) && count(v['high']) && count(v['inUse']);
}

/** Whether `v` carries a well-formed node notice (the supervisor's `admission` notice). */
export function isNodeAdmissionNotice(v: Record<string, unknown>): boolean {
  return count(v['limit']) && typeof v['brownout'] === 'boolean' && typeof v['sentAt'] === 'number';
}
