// @edge-proxy/telemetry: the metric catalogue and the registries built from it.
export { DECLARED_EXTENSIONS, METRIC_CATALOGUE, LATENCY_BUCKETS_MS, OUTCOMES, STATUS_CLASSES, metricDef } from './metrics/catalogue.ts';
export type { Aggregation, MetricDef, MetricScope, MetricType } from './metrics/catalogue.ts';
export { Metrics } from './metrics/registry.ts';
export { BucketHistogram, CounterSeries, HistogramSeries } from './metrics/series.ts';
export { AUDIT_ACTIONS, AUDIT_EVENT_TYPES, AUDIT_FIELDS, AUDIT_SCHEMA_VERSION, auditEvent, logAuditSink } from './audit.ts';
export type { AuditAction, AuditActor, AuditEvent, AuditEventType, AuditInput, AuditResult, AuditSink } from './audit.ts';
export { createLogger, createLogging } from './logger.ts';
export type { Logger, LoggerOptions, LogLevel, Logging } from './logger.ts';
export { isJournalStream, syslogPrefix } from './journal.ts';
export { parseTraceparent } from './trace-context.ts';
export type { TraceContext } from './trace-context.ts';
export { SLO_SERIES, SLO_SERIES_NAMES } from './metrics/slo.ts';
export type { AttemptFacts, AttemptSpan, AttemptStart, RequestFacts, RequestSpan, RequestStart, RequestTracer, TraceHeaders } from './request-tracer.ts';
// The SDK is loaded by `createRequestTracer` only (dynamic import): importing this is free.
export { DEFAULT_OTLP_TRACES_ENDPOINT, EXPORT_WARN_INTERVAL_MS, createRequestTracer, endpointHostPort } from './tracing.ts';
export { UntrustedParentSampler, sampleIncoming } from './trace-sampler.ts';
export type { TracingLimits, TracingOptions } from './tracing.ts';
export { memoryReducingCollector, trimAfterStartup, trimFields, trimMemoryNow } from './memory.ts';
export type { MemoryTrimmed } from './memory.ts';
