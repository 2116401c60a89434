// Connection admission, shared by every ingress of every listener: at most
// `performance.max_connections` open downstream connections and at most
// `max_connections_per_source` from one source (excess refused: svc_connection_cap_rejects),
// and new connections limited by a token bucket of `new_connections_per_sec` with
// `new_connections_burst` (excess refused: svc_ingress_rate_limited_total). Limits are read from
// the active generation (live). TCP connections are decided at accept; QUIC ones when the session
// starts.
//
// Node-wide (docs/overload.md "Connection caps"): under a supervisor the three are budgets of its
// token ledger — `conn` and `conn-src:<source>` slots, `conn-rate` tokens — leased through the
// worker's token leases (`lease`). The slots are granted to the connection that waits for them and
// go back to the node when it closes, so the caps hold for the node exactly however the kernel
// spreads connections over workers; a connection waits one round trip for them (the handshake
// goes on meanwhile, a refused one is closed when the answer comes). No answer within
// `LEASE_WAIT_MS`: refused `unavailable`. Alone (no supervisor) the counters below are the process's.
import { unmapIpv4 } from '../proxy/handler.ts';
import { PENDING, UNAVAILABLE } from '../resilience/token-lease.ts';
import type { Lease, TokenLeases } from '../resilience/token-lease.ts';

/** The token-ledger budgets of the connection caps (slots: `conn`, `conn-src`; tokens: `conn-rate`). */
export const CONNECTION_BUDGETS = { cap: 'conn', source: 'conn-src', rate: 'conn-rate' } as const;

/** A token bucket as plain data: refill `rate` per second up to `burst`. */
export interface Bucket {
  readonly tokens: number;
  readonly at: number;
}

/**
 * Takes one token if there is one. Pure: (bucket, limits, now) → decision and new bucket. `now` is
 * monotonic ms; time going backwards refills nothing and takes nothing away (an hour of negative
 * refill would refuse every new connection for an hour).
 */
export function takeToken(b: Bucket, rate: number, burst: number, now: number): { ok: boolean; bucket: Bucket } {
  const tokens = Math.min(burst, b.tokens + (Math.max(0, now - b.at) / 1000) * rate);
  if (tokens < 1) return { ok: false, bucket: { tokens, at: now } };
  return { ok: true, bucket: { tokens: tokens - 1, at: now } };
}

/**
 * The source a connection is counted under: an IPv4 address (IPv4-mapped IPv6 unmapped), or the
 * /64 prefix of an IPv6 address. One subscriber usually gets a /64 or more (RFC 6177), so counting
 * single IPv6 addresses would let one client open 2^64 "sources".
 */
export function sourceKey(address: string): string {
  const a = unmapIpv4(address).toLowerCase();
  if (!a.includes(':')) return a;
  const zone = a.indexOf('%');
  const bare = zone === -1 ? a : a.slice(0, zone);
  const cut = bare.indexOf('::');
  const head = (cut === -1 ? bare : bare.slice(0, cut)).split(':').filter((g) => g.length > 0);
  const tail = cut === -1 ? [] : bare.slice(cut + 2).split(':').filter((g) => g.length > 0);
  // A dotted IPv4 tail (64:ff9b::192.0.2.1) stands for two groups.
  const tailGroups = tail.reduce((n, g) => n + (g.includes('.') ? 2 : 1), 0);
  const groups = cut === -1 ? head : [...head, ...Array<string>(Math.max(0, 8 - head.length - tailGroups)).fill('0'), ...tail];
  const prefix: string[] = [];
  for (let i = 0; i < 4; i++) prefix.push((Number.parseInt(groups[i] ?? '0', 16) || 0).toString(16));
  return `${prefix.join(':')}::/64`;
}

export interface AdmissionLimits {
  readonly maxConnections: number;
  readonly perSource: number;
  readonly perSecond: number;
  readonly burst: number;
}

/**
 * `source`: the per-source cap refused it; `cap`: the connection cap; `rate`: the new-connection
 * rate; `unavailable`: the supervisor did not answer within `LEASE_WAIT_MS`.
 */
export type AdmissionVerdict = 'admitted' | 'cap' | 'source' | 'rate' | 'unavailable';

export class ConnectionAdmission {
  private open = 0;
  /** Open admitted connections per `sourceKey`; a source with none has no entry. */
  private readonly bySource = new Map<string, number>();
  private bucket: Bucket;
  private readonly limits: () => AdmissionLimits;
  private readonly now: () => number;
  private leases: TokenLeases | undefined;
  /** Leased: the slot leases each open connection holds, by source (one entry per open connection's source). */
  private readonly held = new Map<string, { readonly cap: Lease; readonly source: Lease }>();

  /** `now`: a monotonic clock, ms (a wall-clock step must not refill or drain the bucket). */
  constructor(limits: () => AdmissionLimits, now: () => number = () => performance.now()) {
    this.limits = limits;
    this.now = now;
    this.bucket = { tokens: limits().burst, at: now() };
  }

  /**
   * Admits a new connection from `source` (a `sourceKey`) or says why not. An admitted one must
   * be `release`d once with the same key. A source at its cap spends no token of the bucket, so
   * one address cannot drain the new-connection rate of every other either.
   */
  admit(source: string): AdmissionVerdict {
    const l = this.limits();
    if (this.open >= l.maxConnections) return 'cap';
    const held = this.bySource.get(source) ?? 0;
    if (held >= l.perSource) return 'source';
    const r = takeToken(this.bucket, l.perSecond, l.burst, this.now());
    this.bucket = r.bucket;
    if (!r.ok) return 'rate';
    this.open++;
    this.bySource.set(source, held + 1);
    return 'admitted';
  }

  /** From now on the caps are the node's, leased through `leases` (the worker joined a supervisor). */
  lease(leases: TokenLeases): void {
    this.leases = leases;
  }

  /**
   * Decides a new connection from `source`: `done` hears the verdict, at once when this worker
   * can decide alone, else when the supervisor answers. An admitted connection must be `release`d
   * once with the same key (also when it closed while waiting: `done` still hears `admitted`).
   */
  admitThen(source: string, done: (v: AdmissionVerdict) => void): void {
    const leases = this.leases;
    if (leases === undefined) {
      done(this.admit(source));
      return;
    }
    const now = this.now();
    const cap = leases.lease(CONNECTION_BUDGETS.cap, '', now, true);
    const src = leases.lease(CONNECTION_BUDGETS.source, source, now, true);
    const rate = leases.lease(CONNECTION_BUDGETS.rate, '', now);
    const list = [cap, src, rate];
    const v = leases.takeAll(list, now);
    if (v === PENDING) leases.wait(list, (x) => done(this.leased(x, source, cap, src)));
    else done(this.leased(v, source, cap, src));
  }

  /** A leased verdict as an admission verdict; an admitted connection is counted open. */
  private leased(v: number, source: string, cap: Lease, src: Lease): AdmissionVerdict {
    if (v === UNAVAILABLE) return 'unavailable';
    if (v !== 0) {
      // The first lease the node refused, in the order of the checks (cap, source, rate): the one
      // holding no unit that the ledger last answered short.
      return cap.tokens < 1 && cap.emptyUntil > 0 ? 'cap' : src.tokens < 1 && src.emptyUntil > 0 ? 'source' : 'rate';
    }
    this.open++;
    this.bySource.set(source, (this.bySource.get(source) ?? 0) + 1);
    if (!this.held.has(source)) this.held.set(source, { cap, source: src });
    return 'admitted';
  }

  release(source: string): void {
    const leases = this.leases;
    const h = this.held.get(source);
    if (leases !== undefined && h !== undefined) {
      const now = this.now();
      leases.release(h.cap, now);
      leases.release(h.source, now);
      if ((this.bySource.get(source) ?? 0) <= 1) this.held.delete(source);
    }
    if (this.open > 0) this.open--;
    const held = this.bySource.get(source);
    if (held === undefined) return;
    if (held <= 1) this.bySource.delete(source);
    else this.bySource.set(source, held - 1);
  }

  /** Open admitted connections (svc_active_connections). */
  get active(): number {
    return this.open;
  }

  /** Open admitted connections from `source` (a `sourceKey`). */
  heldBy(source: string): number {
    return this.bySource.get(source) ?? 0;
  }
}
