// The tracer of tracing.ts against a real OTLP/HTTP collector (test/support/otlp-receiver.ts):
// parent-based sampling, the span tree and what goes upstream as `traceparent`, the attributes,
// `end` once, export failures and the queue bound counted, and the SDK loaded only on demand.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { Metrics } from '../src/metrics/registry.ts';
import { ATTRIBUTE_VALUE_MAX, createRequestTracer } from '../src/tracing.ts';
import type { TracingOptions } from '../src/tracing.ts';
import type { AttemptStart, RequestFacts, RequestStart, RequestTracer, TraceHeaders } from '../src/request-tracer.ts';
import { SPAN_KIND, STATUS_ERROR, startOtlpReceiver } from '../../../test/support/otlp-receiver.ts';
import type { OtlpReceiver, ReceivedSpan } from '../../../test/support/otlp-receiver.ts';

const START: RequestStart = { requestId: 'req-1', method: 'GET', path: '/api/items', authority: 'edge.example:8443', protocol: '3', listener: 'main', clientAddress: '192.0.2.7', generation: 4 };
const ATTEMPT: AttemptStart = { attempt: 1, hedge: false, upstream: 'api', backend: 'b1', host: '127.0.0.1', port: 9001 };
const OK: RequestFacts = { status: 200, outcome: 'success', code: undefined, reason: undefined, failureClass: undefined, upstream: 'api', backend: 'b1', attempts: 1, bytesIn: 12, bytesOut: 345, durationMs: 3 };

const CALLER_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const CALLER_SPAN = '00f067aa0ba902b7';
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$/;

let receiver: OtlpReceiver;
t.before(async () => {
  receiver = await startOtlpReceiver();
});
t.teardown(() => receiver.close());

function tracer(o: Partial<TracingOptions> = {}): Promise<RequestTracer> {
  return createRequestTracer({ endpoint: receiver.url, serviceName: 'edge-test', sampleRatio: 1, resourceAttributes: { 'service.instance.id': 'w0', 'process.pid': process.pid }, limits: { scheduledDelayMs: 20, exportTimeoutMs: 2000 }, ...o });
}

/** One request with one attempt; returns the ids it had and the headers sent upstream. */
function request(tr: RequestTracer, incoming: TraceHeaders, requestId: string): { traceId: string; spanId: string; upstream: TraceHeaders } {
  const span = tr.startRequest(incoming, { ...START, requestId });
  const upstream: TraceHeaders = { 'x-request-id': requestId, ...incoming };
  span.startAttempt(ATTEMPT, upstream).end({ status: 200, outcome: 'success', reason: undefined });
  span.end(OK);
  return { traceId: span.traceId, spanId: span.spanId, upstream };
}

const ofTrace = (id: string) => (s: ReceivedSpan) => s.traceId === id;

t.test('ratio 1, no parent: a server span and its attempt exported; traceparent names the attempt', async (t) => {
  const tr = await tracer();
  const r = request(tr, {}, 'req-root');
  t.match(r.traceId, /^[0-9a-f]{32}$/);
  t.match(r.spanId, /^[0-9a-f]{16}$/);
  const spans = await receiver.waitForSpans(2, ofTrace(r.traceId));
  const server = spans.find((s) => s.kind === SPAN_KIND.server);
  const client = spans.find((s) => s.kind === SPAN_KIND.client);
  t.ok(server && client, 'one server and one client span');
  if (server === undefined || client === undefined) return;
  t.equal(server.spanId, r.spanId, 'RequestSpan.spanId is the server span');
  t.equal(server.parentSpanId, undefined, 'a new trace: the server span is a root');
  t.equal(client.parentSpanId, server.spanId, 'the attempt is a child of the server span');
  const tp = TRACEPARENT.exec(String(r.upstream['traceparent']));
  t.same(tp?.slice(1), [r.traceId, client.spanId, '01'], 'upstream traceparent: same trace, the attempt span, sampled');
  t.equal(r.upstream['tracestate'], undefined, 'no tracestate invented');
  t.equal(server.name, 'GET');
  t.same(server.attributes, {
    'http.request.method': 'GET', 'url.path': '/api/items', 'url.scheme': 'https', 'server.address': 'edge.example', 'server.port': 8443,
    'network.protocol.name': 'http', 'network.protocol.version': '3', 'client.address': '192.0.2.7',
    'edge_proxy.request_id': 'req-root', 'edge_proxy.listener': 'main', 'edge_proxy.generation': 4,
    'http.response.status_code': 200, 'edge_proxy.outcome': 'success', 'edge_proxy.attempts': 1, 'edge_proxy.bytes_in': 12, 'edge_proxy.bytes_out': 345,
    'edge_proxy.upstream': 'api', 'edge_proxy.backend': 'b1',
  }, 'server span attributes');
  t.same(client.attributes, {
    'http.request.method': 'GET', 'server.address': '127.0.0.1', 'server.port': 9001, 'edge_proxy.upstream': 'api', 'edge_proxy.backend': 'b1',
    'edge_proxy.attempt': 1, 'edge_proxy.hedge': false, 'http.response.status_code': 200, 'edge_proxy.outcome': 'success',
  }, 'attempt span attributes (no resend_count on the first attempt)');
  t.equal(server.status.code, 0, 'a 200 leaves the status unset');
  t.match(server.resource, { 'service.name': 'edge-test', 'service.instance.id': 'w0', 'process.pid': process.pid });
  t.match(receiver.requests.at(-1), { contentType: 'application/json', contentEncoding: undefined }, 'OTLP/HTTP JSON, uncompressed');
  await tr.shutdown(5000);
});

t.test('trust_incoming_sampling: the caller decides for its trace, the ratio for new traces', async (t) => {
  const sampledParent = { traceparent: `00-${CALLER_TRACE}-${CALLER_SPAN}-01`, tracestate: 'vendor=opaque,other=1' };
  const unsampledTrace = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1';
  const unsampledParent = { traceparent: `00-${unsampledTrace}-${CALLER_SPAN}-00` };

  // Ratio 0: a sampled caller's trace is still exported; a new trace is not.
  const zero = await tracer({ sampleRatio: 0, trustIncomingSampling: true });
  const child = request(zero, sampledParent, 'req-child');
  const fresh = request(zero, {}, 'req-fresh');
  await zero.shutdown(5000); // flushes: everything sampled has reached the collector now
  t.equal(child.traceId, CALLER_TRACE, 'the caller\'s trace id');
  const spans = receiver.spans.filter(ofTrace(CALLER_TRACE));
  const server = spans.find((s) => s.kind === SPAN_KIND.server);
  const client = spans.find((s) => s.kind === SPAN_KIND.client);
  t.equal(spans.length, 2, 'sampled parent, ratio 0: exported');
  t.equal(server?.parentSpanId, CALLER_SPAN, 'the server span\'s parent is the caller\'s span');
  t.equal(client?.parentSpanId, server?.spanId);
  t.same(TRACEPARENT.exec(String(child.upstream['traceparent']))?.slice(1), [CALLER_TRACE, client?.spanId, '01']);
  t.equal(child.upstream['tracestate'], 'vendor=opaque,other=1', 'tracestate passed on unchanged');
  t.equal(receiver.spans.filter(ofTrace(fresh.traceId)).length, 0, 'no parent, ratio 0: nothing exported');
  const freshTp = TRACEPARENT.exec(String(fresh.upstream['traceparent']));
  t.same(freshTp?.slice(1).filter((_, i) => i !== 1), [fresh.traceId, '00'], 'an unsampled new trace still propagates (flags 00)');
  t.not(freshTp?.[2], fresh.spanId, 'its parent-id is the attempt\'s span, not the request\'s');

  // Ratio 1: an unsampled caller's trace is not exported, but propagates with flags 00.
  const one = await tracer({ sampleRatio: 1, trustIncomingSampling: true });
  const unsampled = request(one, unsampledParent, 'req-unsampled');
  const marker = request(one, {}, 'req-marker');
  await one.shutdown(5000);
  t.equal(receiver.spans.filter(ofTrace(marker.traceId)).length, 2, 'ratio 1, no parent: exported (the flush happened)');
  t.equal(unsampled.traceId, unsampledTrace);
  t.equal(receiver.spans.filter(ofTrace(unsampledTrace)).length, 0, 'unsampled parent, ratio 1: nothing exported');
  const tp = TRACEPARENT.exec(String(unsampled.upstream['traceparent']));
  t.equal(tp?.[1], unsampledTrace, 'same trace id upstream');
  t.equal(tp?.[3], '00', 'flags 00 upstream');
  t.not(tp?.[2], CALLER_SPAN, 'a new parent-id (the attempt\'s)');
});

t.test('by default the ratio decides for a caller\'s trace too (its flag is not obeyed), and the spans stay in the caller\'s trace', async (t) => {
  // Ratio 0: a caller's `-01` is not exported; the attempt goes upstream in the caller's trace with OUR flag 00.
  const zero = await tracer({ sampleRatio: 0 });
  const forced = Array.from({ length: 50 }, (_, i) => request(zero, { traceparent: `00-${CALLER_TRACE}-${CALLER_SPAN}-01` }, `req-forced-${i}`));
  const marker = request(zero, { traceparent: `00-${CALLER_TRACE.replace(/.$/, 'f')}-${CALLER_SPAN}-01` }, 'req-zero-marker');
  await zero.shutdown(5000);
  t.equal(receiver.spans.filter((s) => String(s.attributes['edge_proxy.request_id']).startsWith('req-forced-') || s.traceId === marker.traceId).length, 0, '51 requests carrying -01, ratio 0: no span exported');
  const tps = forced.map((f) => TRACEPARENT.exec(String(f.upstream['traceparent'])));
  t.same(new Set(tps.map((m) => `${m?.[1]}-${m?.[3]}`)), new Set([`${CALLER_TRACE}-00`]), 'upstream: the caller\'s trace id, flags 00 (our decision), on all 50');
  t.ok(forced.every((f) => f.traceId === CALLER_TRACE), 'the request spans are in the caller\'s trace');

  // Ratio 1: a caller's `-00` is exported, as a child of the caller's span, and goes upstream with flags 01.
  const one = await tracer({ sampleRatio: 1 });
  const unsampledTrace = 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2';
  const linked = request(one, { traceparent: `00-${unsampledTrace}-${CALLER_SPAN}-00` }, 'req-linked');
  await one.shutdown(5000);
  const spans = receiver.spans.filter(ofTrace(unsampledTrace));
  const server = spans.find((s) => s.kind === SPAN_KIND.server);
  t.equal(spans.length, 2, 'ratio 1, caller\'s flag 00: exported (server and attempt span)');
  t.equal(server?.parentSpanId, CALLER_SPAN, 'linked: the server span\'s parent is the caller\'s span');
  t.equal(TRACEPARENT.exec(String(linked.upstream['traceparent']))?.[3], '01', 'flags 01 upstream');

  // A trace id the trace-id ratio sampler samples at any ratio > 0 (its folded value is 1): the draw ignores it.
  const small = await tracer({ sampleRatio: 0.05 });
  const chosen = '00000000000000000000000000000001';
  for (let i = 0; i < 200; i++) request(small, { traceparent: `00-${chosen}-${CALLER_SPAN}-01` }, `req-chosen-${i}`);
  await small.shutdown(5000);
  const exported = receiver.spans.filter((s) => s.kind === SPAN_KIND.server && s.traceId === chosen).length;
  // Binomial(200, 0.05): mean 10, P(>= 40) < 1e-12; a trace-id decision would export all 200.
  t.ok(exported < 40, `ratio 0.05, 200 requests with a chosen trace id and -01: ${exported} exported (about 10), not 200`);
});

t.test('malformed or repeated traceparent: a new trace, as the access log does', async (t) => {
  const tr = await tracer();
  for (const incoming of [{ traceparent: 'garbage' }, { traceparent: [`00-${CALLER_TRACE}-${CALLER_SPAN}-01`, `00-${CALLER_TRACE}-${CALLER_SPAN}-01`] }, { traceparent: `00-${'0'.repeat(32)}-${CALLER_SPAN}-01` }]) {
    const span = tr.startRequest(incoming, START);
    t.not(span.traceId, CALLER_TRACE, JSON.stringify(incoming));
    t.match(span.traceId, /^[0-9a-f]{32}$/);
    span.end(OK);
  }
  await tr.shutdown(5000);
});

t.test('failures: a 502 is an error with its reason; failed attempts are errors; a retry has resend_count; end twice is once', async (t) => {
  const tr = await tracer();
  const span = tr.startRequest({}, { ...START, method: 'PURGE', requestId: 'req-fail' });
  const h1: TraceHeaders = {};
  const a1 = span.startAttempt(ATTEMPT, h1);
  a1.end({ status: undefined, outcome: 'failure', reason: 'connect_refused' });
  a1.end({ status: 200, outcome: 'success', reason: undefined });
  const h2: TraceHeaders = { traceparent: 'stale', tracestate: 'stale=1' };
  const a2 = span.startAttempt({ ...ATTEMPT, attempt: 2, backend: 'b2', port: 9002 }, h2);
  a2.end({ status: 503, outcome: 'backend_error', reason: 'status_503' });
  const facts: RequestFacts = { ...OK, status: 502, outcome: 'backend_error', code: 'EDGE_UPSTREAM_UNAVAILABLE', reason: 'status_503', failureClass: 'upstream', backend: 'b2', attempts: 2 };
  span.end(facts);
  span.end(OK);
  await tr.shutdown(5000);
  const spans = receiver.spans.filter(ofTrace(span.traceId));
  t.equal(spans.length, 3, 'one server span and two attempts: a second end records nothing');
  const server = spans.find((s) => s.kind === SPAN_KIND.server);
  const [first, second] = spans.filter((s) => s.kind === SPAN_KIND.client).sort((a, b) => Number(a.attributes['edge_proxy.attempt']) - Number(b.attributes['edge_proxy.attempt']));
  t.equal(server?.name, 'HTTP', 'a method outside the registry: span named HTTP');
  t.match(server?.attributes, { 'http.request.method': '_OTHER', 'http.request.method_original': 'PURGE', 'http.response.status_code': 502, 'error.type': 'status_503', 'edge_proxy.reason': 'status_503', 'edge_proxy.code': 'EDGE_UPSTREAM_UNAVAILABLE', 'edge_proxy.failure_class': 'upstream', 'edge_proxy.attempts': 2, 'edge_proxy.backend': 'b2' });
  t.same(server?.status, { code: STATUS_ERROR, message: 'status_503' }, 'server span status error with the reason');
  t.same([first?.status.code, first?.attributes['error.type'], first?.attributes['http.response.status_code'], first?.attributes['http.request.resend_count']], [STATUS_ERROR, 'connect_refused', undefined, undefined], 'first attempt: error, the first end wins');
  t.same([second?.status.code, second?.attributes['error.type'], second?.attributes['http.response.status_code'], second?.attributes['http.request.resend_count']], [STATUS_ERROR, 'status_503', 503, 1], 'second attempt: error, resend_count 1');
  t.equal(second?.parentSpanId, server?.spanId);
  t.equal(TRACEPARENT.exec(String(h2['traceparent']))?.[2], second?.spanId, 'a stale traceparent is replaced by the attempt\'s');
  t.equal(h2['tracestate'], undefined, 'and a tracestate the caller did not send is removed');
});

t.test('attribute values from the client are cut to ATTRIBUTE_VALUE_MAX characters', async (t) => {
  const tr = await tracer();
  const span = tr.startRequest({}, { ...START, path: `/${'p'.repeat(5000)}`, method: `M${'x'.repeat(5000)}`, requestId: 'req-long' });
  span.end(OK);
  await tr.shutdown(5000);
  const server = receiver.spans.find((s) => s.attributes['edge_proxy.request_id'] === 'req-long');
  t.equal(String(server?.attributes['url.path']).length, ATTRIBUTE_VALUE_MAX, 'url.path cut');
  t.equal(String(server?.attributes['http.request.method_original']).length, ATTRIBUTE_VALUE_MAX, 'the original method cut');
});

t.test('endpoint down: failures counted, one warning naming host:port only, nothing thrown', async (t) => {
  const probe = createServer().listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const metrics = new Metrics('worker');
  const warnings: { fields: object; msg: string }[] = [];
  const tr = await tracer({ endpoint: `http://user:secret@127.0.0.1:${port}/v1/traces?token=abc`, metrics, log: { warn: (fields, msg) => warnings.push({ fields, msg }) }, limits: { scheduledDelayMs: 60_000, maxExportBatchSize: 1, exportTimeoutMs: 300 } });
  t.doesNotThrow(() => {
    for (let i = 0; i < 3; i++) tr.startRequest({}, START).end(OK);
  });
  await tr.shutdown(5000);
  const value = async (name: string, labels: Record<string, string> = {}): Promise<number> => (await metrics.counter(name).get()).values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))?.value ?? 0;
  t.equal(await value('svc_tracing_export_failures_total'), 3, 'three batches of one span, three failures');
  t.equal(await value('svc_tracing_spans_dropped_total', { reason: 'export_failed' }), 3);
  t.equal(await value('svc_tracing_spans_exported_total'), 0);
  t.equal(warnings.length, 1, 'one warning for the minute');
  t.match(warnings[0]?.fields, { endpoint: `127.0.0.1:${port}` });
  t.notMatch(JSON.stringify(warnings), /secret|token|user|v1\/traces/, 'no credentials, path or query logged');
});

t.test('queue bound: spans beyond maxQueueSize while an export is in flight are dropped and counted', async (t) => {
  const metrics = new Metrics('worker');
  const tr = await tracer({ metrics, limits: { maxQueueSize: 2, maxExportBatchSize: 2, scheduledDelayMs: 60_000, exportTimeoutMs: 5000 } });
  const release = receiver.hold();
  const ids: string[] = [];
  for (let i = 0; i < 6; i++) {
    const s = tr.startRequest({}, { ...START, requestId: `q${i}` });
    ids.push(s.traceId);
    s.end(OK);
  }
  // Spans 1-2 went out at once (a full batch; the collector holds the answer), 3-4 wait, 5-6 are dropped.
  release();
  await tr.shutdown(5000);
  const value = async (name: string, labels: Record<string, string> = {}): Promise<number> => (await metrics.counter(name).get()).values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))?.value ?? 0;
  t.equal(await value('svc_tracing_spans_dropped_total', { reason: 'queue_full' }), 2, 'two dropped');
  t.equal(await value('svc_tracing_spans_exported_total'), 4, 'four exported');
  t.same(ids.map((id) => receiver.spans.some(ofTrace(id))), [true, true, true, true, false, false]);
});

t.test('a collector credential comes from OTEL_EXPORTER_OTLP_TRACES_HEADERS, as the SDK reads it', async (t) => {
  process.env['OTEL_EXPORTER_OTLP_TRACES_HEADERS'] = 'authorization=Bearer%20collector-token';
  t.teardown(() => delete process.env['OTEL_EXPORTER_OTLP_TRACES_HEADERS']);
  const tr = await tracer();
  const r = request(tr, {}, 'req-credential');
  await tr.shutdown(5000);
  t.equal(receiver.spans.filter(ofTrace(r.traceId)).length, 2);
  t.equal(receiver.requests.at(-1)?.headers['authorization'], 'Bearer collector-token', 'the export carried the header');
});

t.test('never throws: an error inside the SDK is counted, the request gets ids and a traceparent', async (t) => {
  const metrics = new Metrics('worker');
  const tr = await tracer({ metrics });
  const hostile = new Proxy({}, { get: () => { throw new Error('boom'); }, ownKeys: () => { throw new Error('boom'); } }) as TraceHeaders;
  const span = tr.startRequest(hostile, START);
  t.match(span.traceId, /^[0-9a-f]{32}$/);
  t.match(span.spanId, /^[0-9a-f]{16}$/);
  const out: TraceHeaders = {};
  t.doesNotThrow(() => span.startAttempt(ATTEMPT, out).end({ status: 200, outcome: 'success', reason: undefined }));
  t.doesNotThrow(() => span.end(OK));
  t.match(out['traceparent'], TRACEPARENT, 'a valid traceparent still goes upstream');
  t.equal((await metrics.counter('svc_tracing_spans_dropped_total').get()).values.find((v) => v.labels['reason'] === 'error')?.value, 1, 'counted once');
  await tr.shutdown(5000);
});

t.test('the SDK is loaded by createRequestTracer only', async (t) => {
  // A fresh process: importing the telemetry package and building a worker registry loads
  // `@opentelemetry/api` (prom-client requires it) but no module of the SDK.
  const index = fileURLToPath(new URL('../src/index.ts', import.meta.url));
  const script = `
    import { registerHooks } from 'node:module';
    const seen = new Set();
    registerHooks({ resolve(s, c, next) { const r = next(s, c); const m = /node_modules\\/(@opentelemetry\\/[^/]+)/.exec(r.url); if (m) seen.add(m[1]); return r; } });
    const tel = await import(${JSON.stringify(index)});
    new tel.Metrics('worker');
    const before = [...seen].sort();
    await tel.createRequestTracer({ serviceName: 's', sampleRatio: 0 });
    console.log(JSON.stringify({ before, after: [...seen].sort() }));`;
  const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' })) as { before: string[]; after: string[] };
  t.same(out.before.filter((m) => m !== '@opentelemetry/api'), [], 'tracing off: no SDK module loaded');
  t.ok(['@opentelemetry/sdk-trace-base', '@opentelemetry/exporter-trace-otlp-http', '@opentelemetry/core', '@opentelemetry/resources'].every((m) => out.after.includes(m)), `the tracer loads the SDK (${out.after.join(', ')})`);
});
