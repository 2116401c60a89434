// prom-client registries built from the catalogue: one per worker (merged by the supervisor) and
// one in the supervisor. Nothing creates a metric outside the catalogue.
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { METRIC_CATALOGUE } from './catalogue.ts';
import type { MetricDef, MetricScope } from './catalogue.ts';

/** The metrics of one process, looked up by catalogue name. */
export class Metrics {
  readonly registry: Registry;
  private readonly counters = new Map<string, Counter>();
  private readonly gauges = new Map<string, Gauge>();
  private readonly histograms = new Map<string, Histogram>();
  private readonly collectors = new Map<string, (() => void)[]>();

  constructor(scope: MetricScope, defs: readonly MetricDef[] = METRIC_CATALOGUE) {
    this.registry = new Registry();
    for (const def of defs.filter((d) => d.scope === scope)) {
      const common = { name: def.name, help: def.help, labelNames: [...def.labels], registers: [this.registry], aggregator: def.aggregate };
      const hooks = this.collectors;
      const collect = (): void => hooks.get(def.name)?.forEach((fn) => fn());
      if (def.type === 'counter') this.counters.set(def.name, new Counter({ ...common, collect }));
      else if (def.type === 'gauge') this.gauges.set(def.name, new Gauge({ ...common, collect }));
      else this.histograms.set(def.name, new Histogram({ ...common, buckets: [...(def.buckets ?? [])] }));
    }
  }

  /** A counter of the catalogue; throws for an unknown name or a wrong type (a programming error). */
  counter(name: string): Counter {
    return Metrics.get(this.counters, name, 'counter');
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

  histogram(name: string): Histogram {
    return Metrics.get(this.histograms, name, 'histogram');
  }

  private static get<T>(map: Map<string, T>, name: string, type: string): T {
    const m = map.get(name);
    if (m === undefined) throw new Error(`${name} is not a ${type} of this registry`);
    return m;
  }
}
