// Aggregated counters never go back. Each worker counts in its own registry and the supervisor sums
// them at a scrape, so a worker that dies would take its counts out of every sum with it (a counter
// reset for Prometheus, and a `rate()` spike exactly when something went wrong). The pool keeps
// the last counter and histogram values it read from each worker (at a scrape, or just before it
// stops one on purpose) and, when that worker is gone, adds them here for good. Gauges are not
// kept: a dead worker's connections, queues and buffers are gone with it.
//
// What a worker counted after its last read is lost (a crash between two scrapes): the sums stay
// monotonic, they are only short by that much (docs/metrics.md).

/** One metric of prom-client's `getMetricsAsJSON()`. */
export interface MetricJson {
  readonly name: string;
  readonly help: string;
  readonly type: string;
  readonly aggregator: string;
  readonly values: readonly MetricValueJson[];
}

export interface MetricValueJson {
  readonly value: number;
  readonly labels: Readonly<Record<string, string | number>>;
  /** Histograms: `<name>_bucket`, `_sum`, `_count`. */
  readonly metricName?: string;
}

const MONOTONIC = new Set(['counter', 'histogram']);

const isMetricJson = (m: unknown): m is MetricJson => typeof m === 'object' && m !== null && typeof (m as MetricJson).name === 'string' && Array.isArray((m as MetricJson).values);

/** The counters and histograms of one registry's JSON (a worker's answer to `metrics`). */
export function countersOf(json: unknown): MetricJson[] {
  if (!Array.isArray(json)) return [];
  return json.filter(isMetricJson).filter((m) => MONOTONIC.has(m.type) && m.aggregator === 'sum');
}

const seriesKey = (v: MetricValueJson): string =>
  `${v.metricName ?? ''}\u0000${Object.keys(v.labels)
    .sort()
    .map((k) => `${k}=${String(v.labels[k])}`)
    .join('\u0000')}`;

/** The summed final counts of every worker process that is gone. */
export class RetiredCounters {
  private readonly metrics = new Map<string, { head: Omit<MetricJson, 'values'>; values: Map<string, MetricValueJson> }>();
  /** Worker processes whose counts were added. */
  retired = 0;

  /** Adds a gone worker's last counter values (`countersOf` output). */
  add(counters: readonly MetricJson[]): void {
    this.retired++;
    for (const m of counters) {
      let entry = this.metrics.get(m.name);
      if (entry === undefined) {
        entry = { head: { name: m.name, help: m.help, type: m.type, aggregator: m.aggregator }, values: new Map() };
        this.metrics.set(m.name, entry);
      }
      for (const v of m.values) {
        const key = seriesKey(v);
        const prev = entry.values.get(key);
        entry.values.set(key, { ...v, value: (prev?.value ?? 0) + v.value });
      }
    }
  }

  /** The retired counts as one more registry to merge (empty while no gone worker had counts). */
  toJson(): MetricJson[] {
    return [...this.metrics.values()].map((e) => ({ ...e.head, values: [...e.values.values()] }));
  }
}
