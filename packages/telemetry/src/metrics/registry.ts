// prom-client registries built from the catalogue: one per worker (merged by the supervisor) and
// one in the supervisor. Nothing creates a metric outside the catalogue.
import { Counter, Gauge, Registry } from './prom-client-core.ts';
import { METRIC_CATALOGUE } from './catalogue.ts';
import type { MetricDef, MetricScope } from './catalogue.ts';
import { BucketHistogram, CounterSeries, checkLabelNames, seriesKey } from './series.ts';
import type { Labels } from './series.ts';

/** The metrics of one process, looked up by catalogue name. */
export class Metrics {
  readonly registry: Registry;
  private readonly counters = new Map<string, Counter>();
  private readonly gauges = new Map<string, Gauge>();
  private readonly histograms = new Map<string, BucketHistogram>();
  private readonly collectors = new Map<string, (() => void)[]>();
  /** Counter series handed out by `counterSeries`, by counter name then series key. */
  private readonly counterSeriesByName = new Map<string, Map<string, CounterSeries>>();
  /** Label names of every counter, as the catalogue declares them. */
  private readonly counterLabels = new Map<string, readonly string[]>();

  constructor(scope: MetricScope, defs: readonly MetricDef[] = METRIC_CATALOGUE) {
    this.registry = new Registry();
    for (const def of defs.filter((d) => d.scope === scope)) {
      const common = { name: def.name, help: def.help, labelNames: [...def.labels], registers: [this.registry], aggregator: def.aggregate };
      const hooks = this.collectors;
      const collect = (): void => {
        this.flushSeries(def.name);
        hooks.get(def.name)?.forEach((fn) => fn());
      };
      if (def.type === 'counter') {
        this.counters.set(def.name, new Counter({ ...common, collect }));
        this.counterLabels.set(def.name, def.labels);
      }
      else if (def.type === 'gauge') this.gauges.set(def.name, new Gauge({ ...common, collect }));
      else this.histograms.set(def.name, new BucketHistogram({ name: def.name, help: def.help, labelNames: def.labels, buckets: def.buckets ?? [], aggregator: def.aggregate, registry: this.registry }));
    }
  }

  /** A counter of the catalogue; throws for an unknown name or a wrong type (a programming error). */
  counter(name: string): Counter {
    return Metrics.get(this.counters, name, 'counter');
  }

  /**
   * A handle on one series of counter `name` for a hot path: `inc` adds to a plain number, which
   * is added to the counter whenever it is collected (a scrape, or `get()`). The labels are
   * validated here, once; the same labels give the same handle.
   */
  counterSeries(name: string, labels: Labels = {}): CounterSeries {
    const counter = this.counter(name);
    const labelNames = this.counterLabels.get(name) ?? [];
    checkLabelNames(name, labelNames, labels);
    let byKey = this.counterSeriesByName.get(name);
    if (byKey === undefined) {
      byKey = new Map();
      this.counterSeriesByName.set(name, byKey);
    }
    const key = seriesKey(labelNames, labels);
    let s = byKey.get(key);
    if (s === undefined) {
      counter.inc({ ...labels }, 0); // the series shows from now on
      s = new CounterSeries({ ...labels });
      byKey.set(key, s);
    }
    return s;
  }

  gauge(name: string): Gauge {
    return Metrics.get(this.gauges, name, 'gauge');
  }

  /**
   * Runs `fn` whenever gauge or counter `name` is collected (a scrape), to set values computed on
   * demand (a counter then gets `inc(delta)` from a source that counts on its own).
   */
  onCollect(name: string, fn: () => void): void {
    if (!this.gauges.has(name)) Metrics.get(this.counters, name, 'gauge or counter');
    this.collectors.set(name, [...(this.collectors.get(name) ?? []), fn]);
  }

  histogram(name: string): BucketHistogram {
    return Metrics.get(this.histograms, name, 'histogram');
  }

  private flushSeries(name: string): void {
    const byKey = this.counterSeriesByName.get(name);
    if (byKey === undefined) return;
    const counter = this.counter(name);
    for (const s of byKey.values()) {
      if (s.pending === 0) continue;
      counter.inc(s.labels, s.pending);
      s.pending = 0;
    }
  }

  private static get<T>(map: Map<string, T>, name: string, type: string): T {
    const m = map.get(name);
    if (m === undefined) throw new Error(`${name} is not a ${type} of this registry`);
    return m;
  }
}
