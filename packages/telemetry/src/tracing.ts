// Span export through the OpenTelemetry SDK (`observability.tracing`): the `RequestTracer` of
// request-tracer.ts built on `BasicTracerProvider`, a parent-based ratio sampler that trusts a
// caller's sampled flag only when told to (trace-sampler.ts), a bounded
// `BatchSpanProcessor` and the OTLP/HTTP exporter (JSON encoding, no compression).
//
// - The SDK is loaded with `import()` by `createRequestTracer` only: with tracing off no module of
//   the SDK is ever loaded, and in a worker not the API either (a worker takes prom-client's core
//   alone: metrics/prom-client-core.ts; the package entry's default metrics load the API, as they
//   do in the supervisor).
// - Nothing global is registered (no tracer provider, no context manager, no propagator): the
//   request path passes contexts explicitly, so there is no AsyncLocalStorage on the hot path and
//   nothing else in the process (a library that also speaks OpenTelemetry) picks our tracer up.
// - A server span per request (kind SERVER, named after the method as the OTel HTTP semantic
//   conventions ask when there is no route template), a client span per upstream attempt (kind
//   CLIENT, child of the server span) whose context goes upstream as `traceparent`, with the
//   caller's `tracestate` unchanged. An unsampled request still has ids (a non-recording span):
//   the access log shows its trace id and `traceparent` propagates with flags 00.
// - Bounded and observable: at most `maxQueueSize` ended spans wait for export; beyond that a span
//   is dropped and counted (`svc_tracing_spans_dropped_total{reason="queue_full"}`); a failed
//   export counts its spans (`reason="export_failed"`) and `svc_tracing_export_failures_total`,
//   and logs one warning a minute naming the endpoint's host:port only.
// - Never throws into the request path: an error of the SDK is caught and counted
//   (`reason="error"`), the request goes on with a span that records nothing.
//
// The attributes are listed in docs/tracing.md.
import { randomBytes } from 'node:crypto';
import type * as OtelApi from '@opentelemetry/api';
import type { Attributes, Context, Span, SpanContext, TextMapGetter, TextMapPropagator, TextMapSetter, Tracer } from '@opentelemetry/api';
import type { ExportResult } from '@opentelemetry/core';
import type { ReadableSpan, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { Metrics } from './metrics/registry.ts';
import type { CounterSeries } from './metrics/series.ts';
import { UntrustedParentSampler } from './trace-sampler.ts';
import type { AttemptFacts, AttemptSpan, AttemptStart, RequestFacts, RequestSpan, RequestStart, RequestTracer, TraceHeaders } from './request-tracer.ts';

/** The OTLP/HTTP traces endpoint of a local collector (the OTLP specification's default). */
export const DEFAULT_OTLP_TRACES_ENDPOINT = 'http://localhost:4318/v1/traces';

/** Bounds of the export pipeline; the defaults are the SDK's (OTel `OTEL_BSP_*` defaults). */
export interface TracingLimits {
  /** Ended spans waiting for export at most; more are dropped and counted. Default 2048. */
  readonly maxQueueSize?: number;
  /** Spans per export request at most. Default 512. */
  readonly maxExportBatchSize?: number;
  /** Delay before a batch smaller than `maxExportBatchSize` is sent, ms. Default: `OTEL_BSP_SCHEDULE_DELAY` of the environment, else 5000. */
  readonly scheduledDelayMs?: number;
  /** One export request (its retries included) at most, ms. Default 10000. */
  readonly exportTimeoutMs?: number;
}

/** What `createRequestTracer` needs. */
export interface TracingOptions {
  /** OTLP/HTTP traces URL (`http(s)://host[:port]/v1/traces`); never logged whole. Default `DEFAULT_OTLP_TRACES_ENDPOINT`. */
  readonly endpoint?: string;
  /** `service.name` resource attribute. */
  readonly serviceName: string;
  /** Share of requests sampled, 0..1: of new traces, and of a caller's unless `trustIncomingSampling`. */
  readonly sampleRatio: number;
  /** A caller's `traceparent` sampled flag decides for its trace (else `sampleRatio` does, by a draw of ours). Default false. */
  readonly trustIncomingSampling?: boolean;
  /** More resource attributes: `service.instance.id`, `process.pid`, the worker index. */
  readonly resourceAttributes?: Readonly<Record<string, string | number | boolean>>;
  /** Where the export warnings go. */
  readonly log?: { warn(fields: object, msg: string): void };
  /** The worker's registry: `svc_tracing_*` counters. */
  readonly metrics?: Metrics;
  readonly limits?: TracingLimits;
}

/** Longest attribute value exported, in characters (longer values are cut by the SDK). */
export const ATTRIBUTE_VALUE_MAX = 1024;

/** Export failures are logged at most once per this many milliseconds. */
export const EXPORT_WARN_INTERVAL_MS = 60_000;

/** Methods the OTel HTTP conventions name spans after; any other is `_OTHER` (low cardinality). */
const KNOWN_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH', 'QUERY']);

/** `host:port` of an endpoint URL: what a log line may say of it (no credentials, path or query). */
export function endpointHostPort(endpoint: string): string {
  try {
    const u = new URL(endpoint);
    return `${u.hostname}:${u.port !== '' ? u.port : u.protocol === 'https:' ? '443' : '80'}`;
  } catch {
    return 'invalid-endpoint';
  }
}

/** Counters of the tracer; each a no-op without a registry. */
class TracingCounters {
  readonly exported: CounterSeries | undefined;
  readonly failures: CounterSeries | undefined;
  readonly queueFull: CounterSeries | undefined;
  readonly exportFailed: CounterSeries | undefined;
  readonly error: CounterSeries | undefined;

  constructor(metrics: Metrics | undefined) {
    this.exported = metrics?.counterSeries('svc_tracing_spans_exported_total');
    this.failures = metrics?.counterSeries('svc_tracing_export_failures_total');
    this.queueFull = metrics?.counterSeries('svc_tracing_spans_dropped_total', { reason: 'queue_full' });
    this.exportFailed = metrics?.counterSeries('svc_tracing_spans_dropped_total', { reason: 'export_failed' });
    this.error = metrics?.counterSeries('svc_tracing_spans_dropped_total', { reason: 'error' });
  }
}

/**
 * The exporter as the batch processor sees it: counts what was exported and what failed, logs a
 * failure once a minute, and keeps the count of spans handed to it so that the queue bound is
 * enforced (and its drops counted) before the batch processor drops silently.
 */
class CountingExporter implements SpanExporter {
  /** Spans handed to the batch processor and not yet taken into an export. */
  queued = 0;
  /** Exports sent and not answered yet. */
  private readonly inflight = new Set<Promise<void>>();
  private lastWarn = -Infinity;
  private suppressed = 0;

  private readonly inner: SpanExporter;
  private readonly counters: TracingCounters;
  /** The endpoint's `host:port`, all a log line says of it. */
  private readonly where: string;
  private readonly log: TracingOptions['log'];

  constructor(inner: SpanExporter, counters: TracingCounters, where: string, log: TracingOptions['log']) {
    this.inner = inner;
    this.counters = counters;
    this.where = where;
    this.log = log;
  }

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.queued = Math.max(0, this.queued - spans.length);
    let settle = (): void => {};
    const settled = new Promise<void>((resolve) => (settle = resolve));
    this.inflight.add(settled);
    this.inner.export(spans, (result) => {
      // ExportResultCode.SUCCESS is 0 (a const enum of @opentelemetry/core).
      if (result.code === 0) this.counters.exported?.inc(spans.length);
      else this.failed(spans.length, result.error);
      this.inflight.delete(settled);
      settle();
      done(result);
    });
  }

  /**
   * Resolves when every export started so far has ended (the batch processor's flush gives up at
   * the first failure while other batches are still out).
   */
  async settled(): Promise<void> {
    await Promise.all([...this.inflight]);
  }

  private failed(spans: number, error: Error | undefined): void {
    this.counters.failures?.inc();
    this.counters.exportFailed?.inc(spans);
    const now = performance.now();
    if (now - this.lastWarn < EXPORT_WARN_INTERVAL_MS) {
      this.suppressed++;
      return;
    }
    this.lastWarn = now;
    // The error's message may quote the URL: only its class of failure is logged.
    const cause = (error as { code?: unknown } | undefined)?.code;
    this.log?.warn({ endpoint: this.where, spans, failures_suppressed: this.suppressed, ...(typeof cause === 'string' || typeof cause === 'number' ? { cause } : {}) }, 'span export failed: spans dropped (one line a minute at most)');
    this.suppressed = 0;
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

/** Hands ended sampled spans to the batch processor while fewer than `maxQueueSize` wait; counts the rest. */
class BoundedProcessor implements SpanProcessor {
  private readonly inner: SpanProcessor;
  private readonly exporter: CountingExporter;
  private readonly maxQueueSize: number;
  private readonly counters: TracingCounters;

  constructor(inner: SpanProcessor, exporter: CountingExporter, maxQueueSize: number, counters: TracingCounters) {
    this.inner = inner;
    this.exporter = exporter;
    this.maxQueueSize = maxQueueSize;
    this.counters = counters;
  }

  onStart(): void {}

  onEnd(span: ReadableSpan): void {
    // Only sampled spans reach a batch processor's queue (TraceFlags.SAMPLED is 1).
    if ((span.spanContext().traceFlags & 1) === 0) return;
    if (this.exporter.queued >= this.maxQueueSize) {
      this.counters.queueFull?.inc();
      return;
    }
    this.exporter.queued++;
    this.inner.onEnd(span);
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush();
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }
}

const getter: TextMapGetter<TraceHeaders> = {
  keys: (carrier) => Object.keys(carrier),
  get(carrier, key) {
    const v = carrier[key];
    // A repeated `traceparent` is ignored, as the access log's parser does (trace-context.ts);
    // repeated `tracestate` fields are one list (W3C Trace Context §3.3.1).
    if (Array.isArray(v)) return key === 'traceparent' ? undefined : v.join(',');
    return v;
  },
};
const setter: TextMapSetter<TraceHeaders> = {
  set(carrier, key, value) {
    carrier[key] = value;
  },
};

function hex(bytes: number): string {
  return randomBytes(bytes).toString('hex');
}

/** What the request path gets when the SDK failed: ids for the log, nothing recorded or sent. */
function inertRequestSpan(): RequestSpan {
  const traceId = hex(16);
  return {
    traceId,
    spanId: hex(8),
    startAttempt(_start: AttemptStart, out: TraceHeaders): AttemptSpan {
      // A new, unsampled trace: the caller's context is not trusted (reading it may be what failed).
      delete out['tracestate'];
      out['traceparent'] = `00-${traceId}-${hex(8)}-00`;
      return { end() {} };
    },
    end() {},
  };
}

/** The SDK's modules, loaded once tracing is on. */
interface Sdk {
  readonly api: typeof OtelApi;
  readonly propagator: TextMapPropagator;
}

class OtelAttemptSpan implements AttemptSpan {
  private ended = false;
  private readonly span: Span;
  private readonly sdk: Sdk;
  private readonly counters: TracingCounters;

  constructor(span: Span, sdk: Sdk, counters: TracingCounters) {
    this.span = span;
    this.sdk = sdk;
    this.counters = counters;
  }

  end(facts: AttemptFacts): void {
    if (this.ended) return;
    this.ended = true;
    if (!this.span.isRecording()) return;
    try {
      const attrs: Attributes = { 'edge_proxy.outcome': facts.outcome };
      if (facts.status !== undefined) attrs['http.response.status_code'] = facts.status;
      const failed = facts.outcome !== 'success';
      if (failed) {
        attrs['error.type'] = facts.reason ?? (facts.status !== undefined ? String(facts.status) : facts.outcome);
        if (facts.reason !== undefined) attrs['edge_proxy.reason'] = facts.reason;
        this.span.setStatus({ code: this.sdk.api.SpanStatusCode.ERROR, message: facts.reason ?? facts.outcome });
      }
      this.span.setAttributes(attrs);
      this.span.end();
    } catch {
      this.counters.error?.inc();
    }
  }
}

class OtelRequestSpan implements RequestSpan {
  readonly traceId: string;
  readonly spanId: string;
  private ended = false;
  /** This span's context, the parent of every attempt. */
  private readonly context: Context;
  private readonly span: Span;
  /** `GET`, ..., or `_OTHER`. */
  private readonly method: string;
  private readonly tracer: Tracer;
  private readonly sdk: Sdk;
  private readonly counters: TracingCounters;

  constructor(span: Span, method: string, tracer: Tracer, sdk: Sdk, counters: TracingCounters) {
    this.span = span;
    this.method = method;
    this.tracer = tracer;
    this.sdk = sdk;
    this.counters = counters;
    const sc: SpanContext = span.spanContext();
    this.traceId = sc.traceId;
    this.spanId = sc.spanId;
    this.context = sdk.api.trace.setSpan(sdk.api.ROOT_CONTEXT, span);
  }

  startAttempt(start: AttemptStart, headers: TraceHeaders): AttemptSpan {
    try {
      // Parent-based: the attempt of an unsampled request is not sampled either; it needs ids only.
      if (!this.span.isRecording()) return this.inject(this.tracer.startSpan(spanName(this.method), { kind: this.sdk.api.SpanKind.CLIENT }, this.context), headers);
      const attrs: Attributes = {
        'http.request.method': this.method,
        'server.address': start.host,
        'server.port': start.port,
        'edge_proxy.upstream': start.upstream,
        'edge_proxy.backend': start.backend,
        'edge_proxy.attempt': start.attempt,
        'edge_proxy.hedge': start.hedge,
      };
      if (start.attempt > 1) attrs['http.request.resend_count'] = start.attempt - 1;
      return this.inject(this.tracer.startSpan(spanName(this.method), { kind: this.sdk.api.SpanKind.CLIENT, attributes: attrs }, this.context), headers);
    } catch {
      this.counters.error?.inc();
      return { end() {} };
    }
  }

  /** Writes `span`'s context into `headers`: `traceparent` names the attempt; `tracestate` is the caller's, carried by the context. */
  private inject(span: Span, headers: TraceHeaders): AttemptSpan {
    delete headers['traceparent'];
    delete headers['tracestate'];
    this.sdk.propagator.inject(this.sdk.api.trace.setSpan(this.sdk.api.ROOT_CONTEXT, span), headers, setter);
    return new OtelAttemptSpan(span, this.sdk, this.counters);
  }

  end(facts: RequestFacts): void {
    if (this.ended) return;
    this.ended = true;
    if (!this.span.isRecording()) return;
    try {
      const attrs: Attributes = {
        'edge_proxy.outcome': facts.outcome,
        'edge_proxy.attempts': facts.attempts,
        'edge_proxy.bytes_in': facts.bytesIn,
        'edge_proxy.bytes_out': facts.bytesOut,
      };
      if (facts.status > 0) attrs['http.response.status_code'] = facts.status;
      if (facts.upstream !== undefined) attrs['edge_proxy.upstream'] = facts.upstream;
      if (facts.backend !== undefined) attrs['edge_proxy.backend'] = facts.backend;
      if (facts.code !== undefined) attrs['edge_proxy.code'] = facts.code;
      if (facts.reason !== undefined) attrs['edge_proxy.reason'] = facts.reason;
      if (facts.failureClass !== undefined) attrs['edge_proxy.failure_class'] = facts.failureClass;
      // OTel HTTP server spans: an error is a 5xx answered (a 4xx is the client's), or no answer at all after a failure.
      if (facts.status >= 500 || (facts.status === 0 && facts.outcome !== 'success')) {
        attrs['error.type'] = facts.reason ?? facts.code ?? (facts.status > 0 ? String(facts.status) : facts.outcome);
        this.span.setStatus({ code: this.sdk.api.SpanStatusCode.ERROR, message: facts.reason ?? facts.code ?? facts.outcome });
      }
      this.span.setAttributes(attrs);
      this.span.end();
    } catch {
      this.counters.error?.inc();
    }
  }
}

/** `GET`, ..., or `HTTP` for a method outside the registry (OTel HTTP span name conventions). */
function spanName(method: string): string {
  return KNOWN_METHODS.has(method) ? method : 'HTTP';
}

/** `host` of an `authority` (`host[:port]`, `[v6][:port]`), and its port when given. */
function splitAuthority(authority: string): { host: string; port: number | undefined } {
  const m = /^(\[[^\]]*\]|[^:]*)(?::(\d{1,5}))?$/.exec(authority);
  if (m === null) return { host: authority, port: undefined };
  return { host: m[1] as string, port: m[2] === undefined ? undefined : Number(m[2]) };
}

/** The server span's attributes at its start (docs/observability.md, "Tracing"). */
function serverAttributes(start: RequestStart, known: boolean): Attributes {
  const attrs: Attributes = {
    'http.request.method': known ? start.method : '_OTHER',
    'url.path': start.path,
    'url.scheme': 'https', // every listener is TLS (HTTP/3, and its HTTP/1.1 + HTTP/2 bootstrap)
    'network.protocol.name': 'http',
    'network.protocol.version': start.protocol,
    'client.address': start.clientAddress,
    'edge_proxy.request_id': start.requestId,
    'edge_proxy.listener': start.listener,
    'edge_proxy.generation': start.generation,
  };
  if (!known) attrs['http.request.method_original'] = start.method;
  if (start.authority !== undefined) {
    const { host, port } = splitAuthority(start.authority);
    attrs['server.address'] = host;
    if (port !== undefined) attrs['server.port'] = port;
  }
  return attrs;
}

class OtelRequestTracer implements RequestTracer {
  private readonly tracer: Tracer;
  private readonly sdk: Sdk;
  private readonly counters: TracingCounters;
  /** Flushes what is queued and stops the provider. */
  private readonly stop: () => Promise<void>;

  constructor(tracer: Tracer, sdk: Sdk, counters: TracingCounters, stop: () => Promise<void>) {
    this.tracer = tracer;
    this.sdk = sdk;
    this.counters = counters;
    this.stop = stop;
  }

  startRequest(headers: TraceHeaders, start: RequestStart): RequestSpan {
    try {
      const { api } = this.sdk;
      const parent = this.sdk.propagator.extract(api.ROOT_CONTEXT, headers, getter);
      const known = KNOWN_METHODS.has(start.method);
      const span = this.tracer.startSpan(spanName(start.method), { kind: api.SpanKind.SERVER }, parent);
      // The sampler (parent-based trace-id ratio) reads no attribute: they are built only for a
      // sampled span. An unsampled one (most requests at a small ratio) is ids only.
      if (span.isRecording()) span.setAttributes(serverAttributes(start, known));
      return new OtelRequestSpan(span, known ? start.method : '_OTHER', this.tracer, this.sdk, this.counters);
    } catch {
      this.counters.error?.inc();
      return inertRequestSpan();
    }
  }

  async shutdown(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
      timer.unref();
    });
    try {
      await Promise.race([this.stop(), deadline]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** ParentBasedSampler options that sample a caller's trace by `ratio`, whatever its flag. */
function untrustedParent(ratio: number): { remoteParentSampled: UntrustedParentSampler; remoteParentNotSampled: UntrustedParentSampler } {
  const s = new UntrustedParentSampler(ratio);
  return { remoteParentSampled: s, remoteParentNotSampled: s };
}

/**
 * The tracer of a worker: loads the OpenTelemetry SDK (only now), builds the provider, sampler,
 * batch processor and OTLP/HTTP JSON exporter, and registers nothing globally. Throws if the SDK
 * cannot be loaded (the worker then fails to start rather than run untraced unknowingly).
 */
export async function createRequestTracer(opts: TracingOptions): Promise<RequestTracer> {
  const [api, core, resources, base, otlp] = await Promise.all([
    import('@opentelemetry/api'),
    import('@opentelemetry/core'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/exporter-trace-otlp-http'),
  ]);
  const endpoint = opts.endpoint ?? DEFAULT_OTLP_TRACES_ENDPOINT;
  const limits = opts.limits ?? {};
  const maxQueueSize = limits.maxQueueSize ?? 2048;
  const exportTimeoutMs = limits.exportTimeoutMs ?? 10_000;
  const counters = new TracingCounters(opts.metrics);
  // JSON over HTTP (the exporter's encoding of this package), uncompressed. No headers of ours: the
  // SDK adds OTEL_EXPORTER_OTLP_(TRACES_)HEADERS of the environment (a collector's credential).
  const otlpExporter = new otlp.OTLPTraceExporter({ url: endpoint, timeoutMillis: exportTimeoutMs, compression: 'none' as never, headers: {}, concurrencyLimit: 4 });
  const exporter = new CountingExporter(otlpExporter, counters, endpointHostPort(endpoint), opts.log);
  const batch = new base.BatchSpanProcessor(exporter, {
    maxQueueSize,
    maxExportBatchSize: Math.min(limits.maxExportBatchSize ?? 512, maxQueueSize),
    // Unset: the SDK reads OTEL_BSP_SCHEDULE_DELAY (the OTel environment variable), else 5000 ms.
    ...(limits.scheduledDelayMs === undefined ? {} : { scheduledDelayMillis: limits.scheduledDelayMs }),
    // Past the exporter's own deadline (its retries included), so the exporter reports first.
    exportTimeoutMillis: exportTimeoutMs + 1000,
  });
  const provider = new base.BasicTracerProvider({
    resource: resources.resourceFromAttributes({ ...opts.resourceAttributes, 'service.name': opts.serviceName }),
    // A caller's flag is obeyed only when trusted (trace-sampler.ts); the attempts follow the
    // server span either way (local parent), and so does the flag sent upstream.
    sampler: new base.ParentBasedSampler({ root: new base.TraceIdRatioBasedSampler(opts.sampleRatio), ...(opts.trustIncomingSampling === true ? {} : untrustedParent(opts.sampleRatio)) }),
    // A path, authority or method comes from the client: each attribute value is cut to a bound
    // (the access log cuts at the same length), so one request cannot make a span large.
    spanLimits: { attributeValueLengthLimit: ATTRIBUTE_VALUE_MAX },
    spanProcessors: [new BoundedProcessor(batch, exporter, maxQueueSize, counters)],
  });
  const tracer = provider.getTracer('edge-proxy');
  const sdk: Sdk = { api, propagator: new core.W3CTraceContextPropagator() };
  const stop = async (): Promise<void> => {
    await provider.shutdown().catch(() => {});
    await exporter.settled();
  };
  return new OtelRequestTracer(tracer, sdk, counters, stop);
}
