// Live per-backend state that outlives generation swaps: in-flight counts and a decaying latency
// average, keyed by the backend's stable identity (pool + id + address + TLS material).

/** What `BackendStatsRegistry.begin` returns, for `end`; opaque to callers. */
export type InflightToken = object;

/** Read side used by selectors. */
export interface BackendStats {
  inflight(key: string): number;
  /** Decayed latency average in ms, undefined before the first sample (`now`: `performance.now()`). */
  latencyMs(key: string, now?: number): number | undefined;
}

/** One backend's live state; `begin` hands it out as the token `end` takes back. */
interface Entry {
  inflight: number;
  ewmaMs: number | undefined;
  lastSampleAt: number;
}

/**
 * In-flight counts and peak-sensitive EWMA latency per backend. The average decays with time
 * constant `tauMs`, so a backend that was slow long ago recovers without new samples dominating.
 */
export class BackendStatsRegistry implements BackendStats {
  private readonly entries = new Map<string, Entry>();
  private readonly tauMs: number;

  constructor(tauMs = 10_000) {
    this.tauMs = tauMs;
  }

  private entry(key: string): Entry {
    let e = this.entries.get(key);
    if (e === undefined) {
      e = { inflight: 0, ewmaMs: undefined, lastSampleAt: 0 };
      this.entries.set(key, e);
    }
    return e;
  }

  /**
   * A request to `key` started; give the returned token to `end` exactly once when it is over (a
   * token rather than a closure: nothing allocated per request).
   */
  begin(key: string): InflightToken {
    const e = this.entry(key);
    e.inflight++;
    return e;
  }

  /** The request that `begin` returned `token` for is over. */
  end(token: InflightToken): void {
    const e = token as Entry;
    if (e.inflight > 0) e.inflight--;
  }

  inflight(key: string): number {
    return this.entries.get(key)?.inflight ?? 0;
  }

  /** Records an observed latency. */
  observe(key: string, latencyMs: number, now = performance.now()): void {
    const e = this.entry(key);
    if (e.ewmaMs === undefined) {
      e.ewmaMs = latencyMs;
    } else {
      const w = Math.exp(-Math.max(0, now - e.lastSampleAt) / this.tauMs);
      e.ewmaMs = e.ewmaMs * w + latencyMs * (1 - w);
    }
    e.lastSampleAt = now;
  }

  latencyMs(key: string, now = performance.now()): number | undefined {
    const e = this.entries.get(key);
    if (e?.ewmaMs === undefined) return undefined;
    // Without new samples the average decays toward 0 over a few tau: a slow backend gets probed again.
    return e.ewmaMs * Math.exp(-Math.max(0, now - e.lastSampleAt) / (4 * this.tauMs));
  }

  /** Drops state of identities no longer in any generation. */
  retain(keys: ReadonlySet<string>): void {
    for (const k of this.entries.keys()) if (!keys.has(k) && (this.entries.get(k)?.inflight ?? 0) === 0) this.entries.delete(k);
  }
}
