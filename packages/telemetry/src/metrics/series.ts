// Series handles for the request path: a labelled series is looked up (labels validated, key
// built) once, and each increment or observation is then arithmetic on plain numbers. prom-client
// validates and hashes the label set and allocates a result object on every call, five times
// per proxied request.
import type { Registry } from './prom-client-core.ts';

export type Labels = Readonly<Record<string, string>>;

/** One series of a counter; `Metrics` adds what it counted to the prom-client counter at each collect. */
export class CounterSeries {
  readonly labels: Labels;
  /** Counted since the last collect. */
  pending = 0;

  constructor(labels: Labels) {
    this.labels = labels;
  }

  inc(n = 1): void {
    this.pending += n;
  }
}

/** One series of a `BucketHistogram`: a count per bucket, the sum and the count. */
export class HistogramSeries {
  readonly labels: Labels;
  private readonly bounds: readonly number[];
  /** Observations per bucket, not cumulative; the last slot holds those above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(labels: Labels, bounds: readonly number[]) {
    this.labels = labels;
    this.bounds = bounds;
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(value: number): void {
    if (!Number.isFinite(value)) throw new TypeError(`not a finite number: ${value}`);
    const b = this.bounds;
    let i = 0;
    while (i < b.length && value > (b[i] as number)) i++;
    (this.counts[i] as number)++;
    this.sum += value;
    this.count++;
  }
}

interface HistogramConfig {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  /** Ascending upper bounds (`le`). */
  readonly buckets: readonly number[];
  readonly aggregator: string;
  readonly registry: Registry;
}

/** A value in prom-client's metric JSON (what `Registry` renders and `AggregatorRegistry` merges). */
interface ValueOut {
  value: number;
  labels: Record<string, string | number>;
  metricName: string;
}

/**
 * A histogram with the exposition and JSON of prom-client's (`_bucket` cumulative with `le`,
 * then `_sum` and `_count`), registered in a prom-client `Registry`, whose series are
 * `HistogramSeries` handles.
 */
export class BucketHistogram {
  readonly name: string;
  readonly help: string;
  readonly type = 'histogram';
  readonly aggregator: string;
  private readonly labelNames: readonly string[];
  private readonly bounds: readonly number[];
  private readonly bySeries = new Map<string, HistogramSeries>();

  constructor(cfg: HistogramConfig) {
    this.name = cfg.name;
    this.help = cfg.help;
    this.labelNames = [...cfg.labelNames];
    this.bounds = [...cfg.buckets].sort((a, b) => a - b);
    this.aggregator = cfg.aggregator;
    if (this.labelNames.includes('le')) throw new Error('le is a reserved label name');
    cfg.registry.registerMetric(this as unknown as Parameters<Registry['registerMetric']>[0]);
  }

  /** The series of `labels`, created on first use. Throws for a label outside the metric's names. */
  series(labels: Labels = {}): HistogramSeries {
    checkLabelNames(this.name, this.labelNames, labels);
    const key = seriesKey(this.labelNames, labels);
    let s = this.bySeries.get(key);
    if (s === undefined) {
      s = new HistogramSeries({ ...labels }, this.bounds);
      this.bySeries.set(key, s);
    }
    return s;
  }

  observe(labels: Labels, value: number): void {
    this.series(labels).observe(value);
  }

  reset(): void {
    this.bySeries.clear();
  }

  async get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: ValueOut[] }> {
    const values: ValueOut[] = [];
    const bucket = `${this.name}_bucket`;
    for (const s of this.bySeries.values()) {
      let acc = 0;
      this.bounds.forEach((le, i) => {
        acc += s.counts[i] as number;
        values.push({ value: acc, labels: { le, ...s.labels }, metricName: bucket });
      });
      values.push({ value: s.count, labels: { le: '+Inf', ...s.labels }, metricName: bucket });
      values.push({ value: s.sum, labels: { ...s.labels }, metricName: `${this.name}_sum` });
      values.push({ value: s.count, labels: { ...s.labels }, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }
}

/** Throws unless every label in `labels` is one of the metric's `labelNames`. */
export function checkLabelNames(metric: string, labelNames: readonly string[], labels: Labels): void {
  for (const k of Object.keys(labels)) {
    if (!labelNames.includes(k)) throw new Error(`${metric} has no label ${k}`);
  }
}

/**
 * A key unique to a series of a metric with `labelNames` (its values in label-name order, absent
 * ones null); `labels` must hold no other names (`checkLabelNames`).
 */
export function seriesKey(labelNames: readonly string[], labels: Labels): string {
  return JSON.stringify(labelNames.map((n) => labels[n] ?? null));
}
