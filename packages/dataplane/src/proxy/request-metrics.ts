// The metrics every proxied request records, as series handles (telemetry's `counterSeries` and
// histogram series). Handles are cached per upstream and backend object of a runtime and per
// label value, so a request does array and WeakMap lookups and plain arithmetic, no label
// hashing. A new generation's objects find the same series again through `Metrics`.
import { OUTCOMES, STATUS_CLASSES } from '@edge-proxy/telemetry';
import type { CounterSeries, HistogramSeries, Metrics } from '@edge-proxy/telemetry';

/**
 * HTTP status class label, one of the catalogue's `STATUS_CLASSES` (its first five are the
 * hundreds, in order: constant strings, none built per request).
 */
export function statusClass(status: number | undefined): string {
  if (status === undefined) return 'unknown';
  if (status >= 100 && status < 600) return STATUS_CLASSES[Math.floor(status / 100) - 1] as string;
  return 'other';
}

interface Named {
  readonly name: string;
}

interface Identified {
  readonly id: string;
}

/** Slot of a (status_class, outcome) pair, or -1 for a value outside the SPEC lists. */
function slot(statusClass: string, outcome: string): number {
  const s = (STATUS_CLASSES as readonly string[]).indexOf(statusClass);
  const o = (OUTCOMES as readonly string[]).indexOf(outcome);
  return s === -1 || o === -1 ? -1 : s * OUTCOMES.length + o;
}

interface UpstreamSeries {
  readonly requests: (CounterSeries | undefined)[];
  readonly latency: (HistogramSeries | undefined)[];
}

export class RequestMetrics {
  /** `svc_requests_total`, `svc_requests_success`, `svc_requests_failure`. */
  readonly requests: CounterSeries;
  readonly success: CounterSeries;
  readonly failure: CounterSeries;
  private readonly metrics: Metrics;
  private readonly upstreams = new WeakMap<Named, UpstreamSeries>();
  private readonly backends = new WeakMap<Identified, (CounterSeries | undefined)[]>();

  constructor(metrics: Metrics) {
    this.metrics = metrics;
    this.requests = metrics.counterSeries('svc_requests_total');
    this.success = metrics.counterSeries('svc_requests_success');
    this.failure = metrics.counterSeries('svc_requests_failure');
  }

  /** `svc_upstream_requests_total{upstream,status_class,outcome}`. */
  upstream(u: Named, statusClass: string, outcome: string): CounterSeries {
    const i = slot(statusClass, outcome);
    const list = this.upstreamSeries(u).requests;
    const hit = i === -1 ? undefined : list[i];
    if (hit !== undefined) return hit;
    const s = this.metrics.counterSeries('svc_upstream_requests_total', { upstream: u.name, status_class: statusClass, outcome });
    if (i !== -1) list[i] = s;
    return s;
  }

  /** `svc_backend_requests_total{upstream,backend,status_class,outcome}`. */
  backend(u: Named, b: Identified, statusClass: string, outcome: string): CounterSeries {
    const i = slot(statusClass, outcome);
    let list = this.backends.get(b);
    if (list === undefined) {
      list = [];
      this.backends.set(b, list);
    }
    const hit = i === -1 ? undefined : list[i];
    if (hit !== undefined) return hit;
    const s = this.metrics.counterSeries('svc_backend_requests_total', { upstream: u.name, backend: b.id, status_class: statusClass, outcome });
    if (i !== -1) list[i] = s;
    return s;
  }

  /** `svc_upstream_request_latency_ms{upstream,outcome}`. */
  latency(u: Named, outcome: string): HistogramSeries {
    const o = (OUTCOMES as readonly string[]).indexOf(outcome);
    const list = this.upstreamSeries(u).latency;
    const hit = o === -1 ? undefined : list[o];
    if (hit !== undefined) return hit;
    const s = this.metrics.histogram('svc_upstream_request_latency_ms').series({ upstream: u.name, outcome });
    if (o !== -1) list[o] = s;
    return s;
  }

  private upstreamSeries(u: Named): UpstreamSeries {
    let s = this.upstreams.get(u);
    if (s === undefined) {
      s = { requests: [], latency: [] };
      this.upstreams.set(u, s);
    }
    return s;
  }
}

const BY_METRICS = new WeakMap<Metrics, RequestMetrics>();

/** The request metrics of a worker's registry. */
export function requestMetrics(metrics: Metrics): RequestMetrics {
  let r = BY_METRICS.get(metrics);
  if (r === undefined) {
    r = new RequestMetrics(metrics);
    BY_METRICS.set(metrics, r);
  }
  return r;
}
