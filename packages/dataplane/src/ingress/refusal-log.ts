// One warning line per interval for connections the ingress refuses or cuts (caps, rate, TLS
// handshake deadline, HTTP/2 output stuck). Under an attack these happen thousands of times a
// second: a line each would turn the attack into a logging one, so the metrics count every event
// and this summarizes them, with one example source address per reason.
import type { Logger } from '@edge-proxy/telemetry';
import type { AdmissionVerdict } from './admission.ts';

/** Why connections were refused or cut (the `reason` field of the line). */
export type RefusalReason = 'connection_cap' | 'source_cap' | 'new_connection_rate' | 'tls_handshake_timeout' | 'send_stalled';

/** The reason of a refused admission verdict. */
export function refusalReason(verdict: Exclude<AdmissionVerdict, 'admitted'>): RefusalReason {
  return verdict === 'rate' ? 'new_connection_rate' : verdict === 'source' ? 'source_cap' : 'connection_cap';
}

interface Pending {
  count: number;
  example: string;
}

export class RefusalLog {
  private readonly log: Logger | undefined;
  private readonly intervalMs: number;
  private readonly now: () => number;
  private readonly pending = new Map<RefusalReason, Pending>();
  private lastFlush = -Infinity;
  private timer: NodeJS.Timeout | undefined;

  constructor(log: Logger | undefined, intervalMs = 10_000, now: () => number = () => performance.now()) {
    this.log = log;
    this.intervalMs = intervalMs;
    this.now = now;
  }

  /** Counts one event; the first after a quiet interval is logged at once, later ones at the interval's end. */
  note(reason: RefusalReason, source: string): void {
    if (this.log === undefined) return;
    const p = this.pending.get(reason);
    if (p === undefined) this.pending.set(reason, { count: 1, example: source });
    else p.count++;
    const wait = this.lastFlush + this.intervalMs - this.now();
    if (wait <= 0) this.flush();
    else if (this.timer === undefined) {
      this.timer = setTimeout(() => this.flush(), wait);
      this.timer.unref();
    }
  }

  private flush(): void {
    this.timer = undefined;
    this.lastFlush = this.now();
    for (const [reason, p] of this.pending) {
      this.log?.warn({ reason, connections: p.count, example_source: p.example }, 'downstream connections refused or cut');
    }
    this.pending.clear();
  }
}
