// What a worker tells the supervisor for the node's adaptive limit and brownout (docs/overload.md
// "Adaptive admission", "Brownout"; the message: @edge-proxy/ipc admission-policy.ts). The node
// steps one limit from every worker's responses and decides one brownout state from every
// worker's in-flight count, so a worker reports:
// - its completed responses in batches: the first sample of a batch arms a WINDOW_MS timer, and
//   the batch (`samples`, `high`) goes out when it fires: at most 10 messages a second, none idle;
// - while brownout is enabled, its in-use count of `global` when it changed, at most once per
//   INUSE_REPORT_MS: the node sees a worker's in-flight at most that late (plus the pipe).
//   "Changed" is against what the node last heard from the worker by either way: its lease asks
//   carry the count too (`heard`), and the node takes the latest message of the two. A count
//   that a lease ask carried and a change undid before the timer fired must still be reported,
//   or the node keeps the ask's count until the worker's next change.
// Every report carries both: the in-use count now and the samples not sent yet. The hot path
// (`sample`, `changed`) is O(1) and allocates nothing; the timers are unref'd.
import { INUSE_REPORT_MS, WINDOW_MS } from '@edge-proxy/ipc';
import type { AdmissionReport } from '@edge-proxy/ipc';

/** Timers and clock of the reporter (injected by tests). */
export interface ReporterClock {
  now(): number;
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const CLOCK: ReporterClock = {
  now: () => performance.now(),
  set: (fn, ms) => setTimeout(fn, ms).unref(),
  clear: (h) => clearTimeout(h as NodeJS.Timeout),
};

export class AdmissionReporter {
  private readonly send: (r: AdmissionReport) => void;
  private readonly inUse: () => number;
  private readonly clock: ReporterClock;
  private samples = 0;
  private high = 0;
  private batchTimer: unknown;
  private inUseTimer: unknown;
  /** The in-use count the node last heard (a report, or a lease ask: `heard`). */
  private sentInUse = 0;
  /** When the last report was sent (-Infinity: never). */
  private sentAt = -Infinity;
  /** Whether in-use changes are reported (the active generation's `brownout.enabled`). */
  private tracking = false;
  /** Reports sent since start. */
  messages = 0;

  /** `inUse`: the worker's in-use count of the `global` budget now. */
  constructor(send: (r: AdmissionReport) => void, inUse: () => number, clock: ReporterClock = CLOCK) {
    this.send = send;
    this.inUse = inUse;
    this.clock = clock;
  }

  /** Whether in-use changes are reported (brownout enabled in the active generation); turning it on reports the count now. */
  track(on: boolean): void {
    if (on === this.tracking) return;
    this.tracking = on;
    if (on) this.changed();
    else if (this.inUseTimer !== undefined) {
      this.clock.clear(this.inUseTimer);
      this.inUseTimer = undefined;
    }
  }

  /** One completed upstream response, slow (`high`) or not. */
  sample(high: boolean): void {
    this.samples++;
    if (high) this.high++;
    if (this.batchTimer === undefined) this.batchTimer = this.clock.set(() => this.fireBatch(), WINDOW_MS);
  }

  /** The in-use count changed (a slot taken or given back). */
  changed(): void {
    if (!this.tracking || this.inUseTimer !== undefined) return;
    const wait = Math.max(0, this.sentAt + INUSE_REPORT_MS - this.clock.now());
    this.inUseTimer = this.clock.set(() => this.fireInUse(), wait);
  }

  /** A lease ask carrying the in-use count `n` was sent: the node's count of this worker is `n` from now on. */
  heard(n: number): void {
    this.sentInUse = n;
  }

  close(): void {
    if (this.batchTimer !== undefined) this.clock.clear(this.batchTimer);
    if (this.inUseTimer !== undefined) this.clock.clear(this.inUseTimer);
    this.batchTimer = this.inUseTimer = undefined;
  }

  private fireBatch(): void {
    this.batchTimer = undefined;
    if (this.samples > 0) this.report();
  }

  private fireInUse(): void {
    this.inUseTimer = undefined;
    if (this.inUse() !== this.sentInUse) this.report();
  }

  private report(): void {
    const r: AdmissionReport = { samples: this.samples, high: this.high, inUse: this.inUse() };
    this.samples = 0;
    this.high = 0;
    this.sentInUse = r.inUse;
    this.sentAt = this.clock.now();
    this.messages++;
    try {
      this.send(r);
    } catch {
      /* the supervisor is gone: the worker keeps what it last heard */
    }
  }
}
