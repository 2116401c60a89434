// Span export end to end (issue 17, item 4): a real `edge-proxy serve` (one worker) exporting to a
// real OTLP/HTTP collector (test/support/otlp-receiver.ts), real HTTP/1.1 backends that record the
// `traceparent` they receive (test/support/controlled-backend.ts), clients over HTTP/1.1, HTTP/2
// and HTTP/3. A request's spans are found by its trace id or its request id, awaited as they
// arrive; the batch delay is cut to 50 ms through the OTel environment variable
// OTEL_BSP_SCHEDULE_DELAY, so nothing waits the default 5 s (and raised to a minute where a test
// shows that stopping the service exports what its workers still hold).
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { request, startProxy } from './support/overload.ts';
import { HASH_HEADER, hashedPool, keyOwnedBy } from './support/retries.ts';
import { SPAN_KIND, STATUS_ERROR, startOtlpReceiver } from './support/otlp-receiver.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import type { ReceivedSpan } from './support/otlp-receiver.ts';
import type { StartedProxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-tracing-');
const receiver = await startOtlpReceiver();
t.teardown(() => receiver.close());
const refused = await freePort();
const ok = await controlledBackend(t, 'ok');
ok.set({ kind: 'slow', ms: 5000 }, '/slow');
const ra = await controlledBackend(t, 'ra');
const rb = await controlledBackend(t, 'rb');
ra.set({ kind: 'reset' }, '/r/fail');

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$/;
const VERSION = { h1: '1.1', h2: '2', h3: '3' } as const;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const pool = (name: string, prefix: string, port: number, more = ''): string => `${name}: { route: { path_prefix: ${prefix} }, backends: [{ id: ${name}-1, address: "127.0.0.1:${port}" }]${more} }`;
const UPSTREAM = `{ ${[pool('app', '/ok', ok.port), pool('slow', '/slow', ok.port, ', timeouts: { backend_request_ms: 300 }'), pool('dead', '/dead', refused), hashedPool('retry', '/r', [ra, rb])].join(', ')} }`;

/** A proxy whose worker sends a batch of spans `batchDelayMs` after its first span ended (or when full, or when it stops). */
function start(name: string, sampleRatio: number, batchDelayMs = 50, tracing = ''): Promise<StartedProxy> {
  return startProxy(t, files, name, {
    performance: 'global_inflight_limit: 100',
    upstream: UPSTREAM,
    resilience: `{ ${QUIET}, retry_budget: { max_attempts: 2 } }`,
    observability: `  tracing: { enabled: true, endpoint: "${receiver.url}", service_name: edge-e2e, sample_ratio: ${sampleRatio}${tracing} }\n`,
    env: { OTEL_BSP_SCHEDULE_DELAY: String(batchDelayMs) },
  });
}

const p = await start('sampled', 1);

const ofTrace = (id: string) => (s: ReceivedSpan) => s.traceId === id;
const server = (spans: readonly ReceivedSpan[]): ReceivedSpan | undefined => spans.find((s) => s.kind === SPAN_KIND.server);
const clients = (spans: readonly ReceivedSpan[]): ReceivedSpan[] => spans.filter((s) => s.kind === SPAN_KIND.client).sort((a, b) => Number(a.attributes['edge_proxy.attempt']) - Number(b.attributes['edge_proxy.attempt']));
/** The spans of the request whose server span carries request id `id` (its attempts included). */
async function spansOfRequest(id: string, attempts: number): Promise<ReceivedSpan[]> {
  const [root] = await receiver.waitForSpans(1, (s) => s.kind === SPAN_KIND.server && s.attributes['edge_proxy.request_id'] === id);
  return receiver.waitForSpans(1 + attempts, ofTrace(root?.traceId ?? ''));
}

t.test('a caller\'s traceparent over h1, h2 and h3: server span child of the caller, one attempt span, the backend sees the attempt', async (t) => {
  for (const [i, protocol] of PROTOCOLS.entries()) {
    const trace = `4bf92f3577b34da6a3ce929d0e0e473${i}`;
    const caller = `00f067aa0ba902b${i}`;
    const id = `trace-${protocol}`;
    const a = await request(p, protocol, { path: `/ok/${protocol}?token=SECRET`, headers: { traceparent: `00-${trace}-${caller}-01`, tracestate: 'vendor=v1', 'x-request-id': id } });
    t.equal(a.status, 200, `${protocol}: 200`);
    const spans = await receiver.waitForSpans(2, ofTrace(trace));
    const s = server(spans);
    const [c] = clients(spans);
    t.equal(spans.length, 2, `${protocol}: two spans in the caller's trace`);
    t.match(s, { name: 'GET', parentSpanId: caller, status: { code: 0 } }, `${protocol}: the server span is a child of the caller's span`);
    t.match(s?.attributes, { 'http.request.method': 'GET', 'url.path': `/ok/${protocol}`, 'url.scheme': 'https', 'network.protocol.version': VERSION[protocol], 'http.response.status_code': 200, 'edge_proxy.request_id': id, 'edge_proxy.listener': `127.0.0.1:${p.lport}`, 'edge_proxy.generation': 1, 'edge_proxy.upstream': 'app', 'edge_proxy.backend': 'app-1', 'edge_proxy.attempts': 1, 'edge_proxy.outcome': 'success' }, `${protocol}: server span attributes, the request id among them`);
    t.match(c, { name: 'GET', parentSpanId: s?.spanId, attributes: { 'server.address': '127.0.0.1', 'server.port': ok.port, 'edge_proxy.attempt': 1, 'http.response.status_code': 200 } }, `${protocol}: the attempt span is a child of the server span`);
    t.equal(c?.attributes['http.request.resend_count'], undefined, `${protocol}: a first attempt is no resend`);
    const arrival = ok.arrivals.find((x) => x.path.startsWith(`/ok/${protocol}`));
    t.same(TRACEPARENT.exec(String(arrival?.headers['traceparent']))?.slice(1), [trace, c?.spanId, '01'], `${protocol}: the backend's traceparent names the attempt span`);
    t.equal(arrival?.headers['tracestate'], 'vendor=v1', `${protocol}: tracestate passed on unchanged`);
    t.match(s?.resource, { 'service.name': 'edge-e2e', 'process.pid': Number }, `${protocol}: resource of the worker`);
  }
  t.notOk(JSON.stringify(receiver.spans).includes('SECRET'), 'no query string exported');
});

t.test('a retried request: two attempt spans, the second with resend_count 1; the backend that answered saw the second', async (t) => {
  const key = await keyOwnedBy(p, ra, '/r/probe');
  const a = await request(p, 'h1', { path: '/r/fail', headers: { [HASH_HEADER]: key, 'x-request-id': 'trace-retry' } });
  t.same([a.status, a.headers['x-backend']], [200, 'rb'], 'answered by rb after ra reset the first attempt');
  const spans = await spansOfRequest('trace-retry', 2);
  const s = server(spans);
  const [first, second] = clients(spans);
  t.match(s?.attributes, { 'edge_proxy.attempts': 2, 'http.response.status_code': 200, 'edge_proxy.backend': 'rb' });
  t.match(first, { parentSpanId: s?.spanId, status: { code: STATUS_ERROR }, attributes: { 'edge_proxy.backend': 'ra', 'server.port': ra.port } }, 'the first attempt failed: span status error');
  t.equal(first?.attributes['http.request.resend_count'], undefined);
  t.match(second, { parentSpanId: s?.spanId, status: { code: 0 }, attributes: { 'edge_proxy.backend': 'rb', 'http.request.resend_count': 1, 'edge_proxy.attempt': 2 } }, 'the retry: resend_count 1');
  const atRb = rb.arrivals.find((x) => x.path === '/r/fail');
  const atRa = ra.arrivals.find((x) => x.path === '/r/fail');
  t.equal(TRACEPARENT.exec(String(atRb?.headers['traceparent']))?.[2], second?.spanId, 'rb received the second attempt\'s span as parent');
  t.equal(TRACEPARENT.exec(String(atRa?.headers['traceparent']))?.[2], first?.spanId, 'ra received the first attempt\'s');
});

t.test('502 and 504: server span status error with the reason', async (t) => {
  const a502 = await request(p, 'h2', { path: '/dead/x', headers: { 'x-request-id': 'trace-502' } });
  t.equal(a502.status, 502);
  const s502 = server(await spansOfRequest('trace-502', 1));
  t.match(s502, { status: { code: STATUS_ERROR, message: 'transport' }, attributes: { 'http.response.status_code': 502, 'error.type': 'transport', 'edge_proxy.reason': 'transport', 'edge_proxy.code': 'EDGE_UPSTREAM_TRANSPORT', 'edge_proxy.failure_class': 'transport' } }, '502: error, reason transport');
  const a504 = await request(p, 'h3', { path: '/slow/x', headers: { 'x-request-id': 'trace-504' } });
  t.equal(a504.status, 504);
  const [root] = await receiver.waitForSpans(1, (s) => s.kind === SPAN_KIND.server && s.attributes['edge_proxy.request_id'] === 'trace-504');
  t.match(root, { status: { code: STATUS_ERROR, message: 'headers_timeout' }, attributes: { 'http.response.status_code': 504, 'error.type': 'headers_timeout', 'edge_proxy.outcome': 'timeout' } }, '504: error, reason headers_timeout');
  const attempts = clients(await receiver.waitForSpans(2, ofTrace(root?.traceId ?? '')));
  t.ok(attempts.length >= 1 && attempts.every((c) => c.status.code === STATUS_ERROR), 'its attempts failed: status error');
});

t.test('sample_ratio 0: a new trace is not exported but still propagates; a trusted sampled caller\'s is, when the service stops at the latest', async (t) => {
  // No batch leaves on its timer (a minute): what is exported here is what the worker flushes as it stops.
  // The caller's flag decides only with trust_incoming_sampling (test/tracing-sampling.test.ts: not by default).
  const q = await start('unsampled', 0, 60_000, ', trust_incoming_sampling: true');
  const a = await request(q, 'h1', { path: '/ok/unsampled', headers: { 'x-request-id': 'trace-unsampled' } });
  t.equal(a.status, 200);
  const tp = TRACEPARENT.exec(String(ok.arrivals.find((x) => x.path === '/ok/unsampled')?.headers['traceparent']));
  t.ok(tp, 'the backend received a valid traceparent');
  t.equal(tp?.[3], '00', 'flags 00: not sampled');
  // A later request of a sampled caller is exported: the pipeline went past the first one.
  const marker = 'abcdef0123456789abcdef0123456789';
  t.equal((await request(q, 'h1', { path: '/ok/marker', headers: { traceparent: `00-${marker}-0123456789abcdef-01` } })).status, 200);
  t.equal(await q.served.stop(), 0, 'the service stopped (SIGTERM)');
  t.equal((await receiver.waitForSpans(2, ofTrace(marker), 5000)).length, 2, 'a sampled parent\'s trace is exported with ratio 0, by the worker\'s flush as it stopped');
  t.same(receiver.spans.filter((s) => s.traceId === tp?.[1] || s.attributes['edge_proxy.request_id'] === 'trace-unsampled'), [], 'nothing of the unsampled request was exported');
});
