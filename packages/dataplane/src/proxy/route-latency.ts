// Recent latency per route for the `svc_route_latency_ms_p50/p95/p99{route}` gauges: a ring of the
// last `capacity` successful requests within `windowMs`, turned into quantiles only at scrape time.
// The request path does one array write.

interface Ring {
  readonly at: Float64Array;
  readonly ms: Float64Array;
  next: number;
  size: number;
}

export class RouteLatencyWindow {
  private readonly rings = new Map<string, Ring>();
  private readonly capacity: number;
  private readonly windowMs: number;

  constructor(capacity = 2048, windowMs = 60_000) {
    this.capacity = capacity;
    this.windowMs = windowMs;
  }

  /** `now`: `performance.now()` milliseconds, as every time here. */
  observe(route: string, ms: number, now = performance.now()): void {
    let r = this.rings.get(route);
    if (r === undefined) {
      r = { at: new Float64Array(this.capacity), ms: new Float64Array(this.capacity), next: 0, size: 0 };
      this.rings.set(route, r);
    }
    r.at[r.next] = now;
    r.ms[r.next] = ms;
    r.next = (r.next + 1) % this.capacity;
    r.size = Math.min(r.size + 1, this.capacity);
  }

  /** Nearest-rank quantiles of the samples inside the window; routes without samples are omitted. */
  quantiles(now = performance.now()): Map<string, { p50: number; p95: number; p99: number }> {
    const out = new Map<string, { p50: number; p95: number; p99: number }>();
    for (const [route, r] of this.rings) {
      const xs: number[] = [];
      for (let i = 0; i < r.size; i++) if (now - (r.at[i] as number) <= this.windowMs) xs.push(r.ms[i] as number);
      if (xs.length === 0) continue;
      xs.sort((a, b) => a - b);
      const q = (p: number): number => xs[Math.min(xs.length - 1, Math.ceil(p * xs.length) - 1)] as number;
      out.set(route, { p50: q(0.5), p95: q(0.95), p99: q(0.99) });
    }
    return out;
  }

  /** Drops routes that no longer exist. */
  retain(routes: ReadonlySet<string>): void {
    for (const r of this.rings.keys()) if (!routes.has(r)) this.rings.delete(r);
  }
}
