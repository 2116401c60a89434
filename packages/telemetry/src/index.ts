// @edge-proxy/telemetry: the metric catalogue and the registries built from it.
export { METRIC_CATALOGUE, LATENCY_BUCKETS_MS, OUTCOMES, STATUS_CLASSES, metricDef } from './metrics/catalogue.ts';
export type { Aggregation, MetricDef, MetricScope, MetricType } from './metrics/catalogue.ts';
export { Metrics } from './metrics/registry.ts';
