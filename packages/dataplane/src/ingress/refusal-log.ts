// One warning line per interval for connections the ingress refuses or cuts (caps, rate, TLS
// handshake deadline, HTTP/2 output stuck), and for requests it refuses at the door whatever the
// configuration says (CONNECT: tunnelling is not built). Under an attack these happen thousands of
// times a second: a line each would turn the attack into a logging one, so the metrics count every
// event and this summarizes them, with one example source address per reason.
import type { Logger } from '@edge-proxy/telemetry';
import type { AdmissionVerdict } from './admission.ts';

/** Why connections were refused or cut (the `reason` field of the line). */
export type ConnectionRefusalReason = 'connection_cap' | 'source_cap' | 'new_connection_rate' | 'lease_unavailable' | 'tls_handshake_timeout' | 'send_stalled' | 'h2_refused_blocks';

/**
 * Why requests were refused at the ingress: `connect_refused`, a CONNECT (HTTP/1.1, HTTP/2 or
 * HTTP/3), answered 405 by the protocol policy (the access log, when on, has each one).
 */
export type RequestRefusalReason = 'connect_refused';

export type RefusalReason = ConnectionRefusalReason | RequestRefusalReason;

/** The reasons counted in requests (`requests` in the line) rather than connections. */
const REQUEST_REASONS: ReadonlySet<RefusalReason> = new Set<RefusalReason>(['connect_refused']);

/** The reason of a refused admission verdict. */
export function refusalReason(verdict: Exclude<AdmissionVerdict, 'admitted'>): RefusalReason {
  return verdict === 'rate' ? 'new_connection_rate' : verdict === 'source' ? 'source_cap' : verdict === 'unavailable' ? 'lease_unavailable' : 'connection_cap';
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
      if (REQUEST_REASONS.has(reason)) this.log?.warn({ reason, requests: p.count, example_source: p.example }, 'downstream requests refused');
      else this.log?.warn({ reason, connections: p.count, example_source: p.example }, 'downstream connections refused or cut');
    }
    this.pending.clear();
  }
}
