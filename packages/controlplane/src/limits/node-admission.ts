// The node's adaptive admission and brownout (docs/overload.md "Adaptive admission", "Brownout";
// issue 39): one adaptive limit and one brownout state for every worker, owned by the supervisor.
//
// - Adaptive: workers report their completed responses in batches (`admission` messages: samples,
//   and how many were above `high_latency_ms`; at most one per worker per WINDOW_MS). The node's
//   window collects every worker's batches and steps the one limit with the pure policy
//   (@edge-proxy/ipc admission-policy.ts) when it closes; the limit is the `global` budget's limit
//   in the lease ledger (`onLimit`: a lowered limit revokes the excess, a raised one serves the
//   workers waiting). Disabled: the limit is `global_inflight_limit`.
// - Brownout: the node's in-flight count is the sum of every worker's in-use count of `global` as
//   it last reported (with every lease ask, and at most every INUSE_REPORT_MS when it changed while
//   brownout is enabled); a dead worker's count goes at once. Its percent of the limit in force
//   moves the one state with the spec's hysteresis, re-evaluated at each change.
// - Every change of the limit or the state is broadcast to every worker (`admission` notice), and
//   a new worker is told after `init` (`greeting`). A worker keeps what it last heard: a frozen
//   supervisor leaves the limit (the worker's lease) and the state as they were.
import type { ResolvedConfig } from '@edge-proxy/config';
import { AdaptiveLimit, inflightPercent, nextBrownout } from '@edge-proxy/ipc';
import type { AdaptivePolicy, AdmissionReport, BrownoutPolicy, ToWorker } from '@edge-proxy/ipc';
import type { Logger, Metrics } from '@edge-proxy/telemetry';

type Config = ResolvedConfig['config'];
type AdmissionNotice = Extract<ToWorker, { type: 'admission' }>;

/** Clocks of the node admission (injected by tests). */
export interface NodeAdmissionClock {
  /** Monotonic ms: the adaptive windows. */
  now(): number;
  /** The `sentAt` stamp of a notice (`performance.timeOrigin + performance.now()`: comparable across the node's processes). */
  stamp(): number;
}

const CLOCK: NodeAdmissionClock = { now: () => performance.now(), stamp: () => performance.timeOrigin + performance.now() };

export interface NodeAdmissionOptions {
  /** Sends a notice to every worker. */
  readonly broadcast: (notice: AdmissionNotice) => void;
  /** The node's limit moved (adaptive step): the `global` budget's limit from now on. */
  readonly onLimit: (limit: number) => void;
  readonly clock?: NodeAdmissionClock;
  readonly metrics?: Metrics;
  readonly logger?: Logger;
}

/** The node's admission now (the snapshot's `admission` block, node level). */
export interface NodeAdmissionView {
  readonly adaptiveEnabled: boolean;
  /** The limit in force: the adaptive limit, or `global_inflight_limit` while adaptive admission is off. */
  readonly adaptiveLimit: number;
  readonly minLimit: number;
  readonly maxLimit: number;
  /** Requests in flight node-wide: every live worker's in-use count of `global` as it last reported. */
  readonly inflight: number;
  readonly brownoutActive: boolean;
}

const NO_BROWNOUT: BrownoutPolicy = { enabled: false, triggerInflightPercent: 100, recoverInflightPercent: 0 };

export class NodeAdmission {
  private readonly opts: NodeAdmissionOptions;
  private readonly clock: NodeAdmissionClock;
  private readonly adaptive: AdaptiveLimit;
  private policy: AdaptivePolicy | undefined;
  private brownoutPolicy: BrownoutPolicy = NO_BROWNOUT;
  private brownout = false;
  /** Each live worker's in-use count of `global`, as last reported. */
  private readonly inUse = new Map<number, number>();
  private total = 0;
  /** What the workers were last told (-1: nothing yet). */
  private toldLimit = -1;
  private toldBrownout = false;
  /** Notices broadcast since start. */
  notices = 0;

  constructor(opts: NodeAdmissionOptions) {
    this.opts = opts;
    this.clock = opts.clock ?? CLOCK;
    this.adaptive = new AdaptiveLimit(() => this.clock.now());
    const m = opts.metrics;
    if (m !== undefined) {
      m.onCollect('svc_brownout_active', () => m.gauge('svc_brownout_active').set(this.brownout ? 1 : 0));
      m.onCollect('svc_adaptive_admission_limit', () => {
        const g = m.gauge('svc_adaptive_admission_limit');
        g.reset();
        if (this.policy !== undefined) g.set(this.limit);
      });
    }
  }

  /**
   * A generation was committed: its policies hold from now. Adaptive: disabled pins the limit at
   * `global_inflight_limit`; enabled after disabled (or first) starts at `max_limit`; enabled
   * before and after keeps the limit, clamped into the new range. The caller configures the lease
   * ledger after this, with `limit`.
   */
  configure(config: Config): void {
    const a = config.resilience.adaptive_admission;
    const global = config.performance.global_inflight_limit;
    this.policy = { enabled: a.enabled, minLimit: a.min_limit, maxLimit: a.max_limit ?? global, decreaseStep: a.decrease_step, increaseStep: a.increase_step, highLatencyMs: a.high_latency_ms, globalInflightLimit: global };
    this.adaptive.configure(this.policy);
    const b = config.resilience.brownout;
    this.brownoutPolicy = { enabled: b.enabled, triggerInflightPercent: b.trigger_inflight_percent, recoverInflightPercent: b.recover_inflight_percent };
    this.evaluate();
    this.tell();
  }

  /** The node's global in-flight limit in force (`max_limit` is at most `global_inflight_limit`, a config rule): the `global` budget's limit. */
  get limit(): number {
    return this.policy === undefined ? 0 : this.adaptive.limit;
  }

  /** A worker's `admission` report: its samples join the node's window, its in-use count the node's. */
  report(worker: number, r: AdmissionReport): void {
    this.setInUse(worker, r.inUse);
    const before = this.limit;
    if (this.adaptive.add(r.samples, r.high, this.clock.now()) && this.limit !== before) this.opts.onLimit(this.limit);
    this.evaluate();
    this.tell();
  }

  /** A worker's in-use count of `global` as its lease ask carried it. */
  workerInUse(worker: number, used: number): void {
    this.setInUse(worker, used);
    this.evaluate();
    this.tell();
  }

  /** A worker is gone: its in-flight requests stop counting at once. */
  workerGone(worker: number): void {
    const n = this.inUse.get(worker);
    if (n === undefined) return;
    this.total -= n;
    this.inUse.delete(worker);
    this.evaluate();
    this.tell();
  }

  /** What a worker forked after the first commit is told after `init`. */
  greeting(): ToWorker[] {
    return this.policy === undefined ? [] : [{ type: 'admission', limit: this.limit, brownout: this.brownout, sentAt: this.clock.stamp() }];
  }

  view(): NodeAdmissionView {
    const p = this.policy;
    const on = p?.enabled === true;
    return { adaptiveEnabled: on, adaptiveLimit: this.limit, minLimit: on ? p.minLimit : (p?.globalInflightLimit ?? 0), maxLimit: on ? p.maxLimit : (p?.globalInflightLimit ?? 0), inflight: this.total, brownoutActive: this.brownout };
  }

  private setInUse(worker: number, n: number): void {
    this.total += n - (this.inUse.get(worker) ?? 0);
    this.inUse.set(worker, n);
  }

  /** The brownout state after the node's in-flight count or the limit moved. */
  private evaluate(): void {
    const p = this.brownoutPolicy;
    const was = this.brownout;
    this.brownout = p.enabled && nextBrownout(this.brownout, inflightPercent(this.total, this.limit), p.triggerInflightPercent, p.recoverInflightPercent);
    if (this.brownout === was) return;
    const fields = { inflight: this.total, limit: this.limit, trigger_inflight_percent: p.triggerInflightPercent, recover_inflight_percent: p.recoverInflightPercent };
    if (this.brownout) this.opts.logger?.warn(fields, 'brownout active on the node: routes not in core_routes are shed');
    else this.opts.logger?.info(fields, 'brownout ended on the node');
  }

  /** Broadcasts the limit and the state when either changed since the workers were last told. */
  private tell(): void {
    if (this.policy === undefined) return;
    const limit = this.limit;
    if (limit === this.toldLimit && this.brownout === this.toldBrownout) return;
    this.toldLimit = limit;
    this.toldBrownout = this.brownout;
    this.notices++;
    this.opts.broadcast({ type: 'admission', limit, brownout: this.brownout, sentAt: this.clock.stamp() });
  }
}
