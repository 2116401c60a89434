// The tracer of a worker process, from `observability.tracing` of the configuration it started
// with (restart-required: a later generation cannot change it, the activation plan refuses that).
// With tracing off there is none and nothing of the OpenTelemetry SDK is loaded.
import { hostname } from 'node:os';
import type { ResolvedConfig } from '@edge-proxy/config';
import { createRequestTracer } from '@edge-proxy/telemetry';
import type { Logger, Metrics, RequestTracer } from '@edge-proxy/telemetry';

/**
 * The worker's tracer, or undefined when `observability.tracing.enabled` is false. `worker` is the
 * slot index (-1 without a supervisor). Rejects when the SDK cannot be loaded.
 */
export async function workerTracer(config: ResolvedConfig['config'], worker: number, metrics: Metrics, log: Logger | undefined): Promise<RequestTracer | undefined> {
  const tracing = config.observability.tracing;
  if (!tracing.enabled) return undefined;
  // OTLP/HTTP is the only exporter the schema allows (a second one would fail to type-check here).
  const exporter: 'otlp-http' = tracing.exporter;
  void exporter;
  const tracer = await createRequestTracer({
    ...(tracing.endpoint === undefined ? {} : { endpoint: tracing.endpoint }),
    serviceName: tracing.service_name,
    sampleRatio: tracing.sample_ratio,
    trustIncomingSampling: tracing.trust_incoming_sampling,
    resourceAttributes: { 'service.instance.id': `${hostname()}:${process.pid}`, 'host.name': hostname(), 'process.pid': process.pid, 'edge_proxy.worker': worker },
    metrics,
    ...(log === undefined ? {} : { log: { warn: (fields: object, msg: string) => log.warn(fields, msg) } }),
  });
  return tracer;
}
