// Connection admission of a worker, shared by every ingress of every listener: at most
// `performance.max_connections` open downstream connections (excess refused:
// svc_connection_cap_rejects) and new connections limited by a token bucket of
// `new_connections_per_sec` with `new_connections_burst` (excess refused:
// svc_ingress_rate_limited_total). Limits are read from the active generation (live).
// TCP connections are decided at accept, before any TLS work; QUIC ones when the session starts.

/** A token bucket as plain data: refill `rate` per second up to `burst`. */
export interface Bucket {
  readonly tokens: number;
  readonly at: number;
}

/** Takes one token if there is one. Pure: (bucket, limits, now) → decision and new bucket. */
export function takeToken(b: Bucket, rate: number, burst: number, now: number): { ok: boolean; bucket: Bucket } {
  const tokens = Math.min(burst, b.tokens + ((now - b.at) / 1000) * rate);
  if (tokens < 1) return { ok: false, bucket: { tokens, at: now } };
  return { ok: true, bucket: { tokens: tokens - 1, at: now } };
}

export interface AdmissionLimits {
  readonly maxConnections: number;
  readonly perSecond: number;
  readonly burst: number;
}

export type AdmissionVerdict = 'admitted' | 'cap' | 'rate';

export class ConnectionAdmission {
  private open = 0;
  private bucket: Bucket;
  private readonly limits: () => AdmissionLimits;
  private readonly now: () => number;

  constructor(limits: () => AdmissionLimits, now: () => number = Date.now) {
    this.limits = limits;
    this.now = now;
    this.bucket = { tokens: limits().burst, at: now() };
  }

  /** Admits a new connection or says why not. An admitted one must be `release`d once. */
  admit(): AdmissionVerdict {
    const l = this.limits();
    if (this.open >= l.maxConnections) return 'cap';
    const r = takeToken(this.bucket, l.perSecond, l.burst, this.now());
    this.bucket = r.bucket;
    if (!r.ok) return 'rate';
    this.open++;
    return 'admitted';
  }

  release(): void {
    if (this.open > 0) this.open--;
  }

  /** Open admitted connections (svc_active_connections). */
  get active(): number {
    return this.open;
  }
}
