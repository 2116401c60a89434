// Incoming sampling decisions (issue 38, finding 6): a client's `traceparent …-01` no longer forces
// span export. Real `edge-proxy serve` processes (one worker) export to a real OTLP/HTTP collector
// (test/support/otlp-receiver.ts); a real HTTP/1.1 backend records the `traceparent` it receives;
// clients over HTTP/1.1, HTTP/2 and HTTP/3. By default `sample_ratio` decides for every request and
// the span stays in the caller's trace; `trust_incoming_sampling: true` restores the caller's say.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { metric, request, startProxy } from './support/overload.ts';
import { SPAN_KIND, startOtlpReceiver } from './support/otlp-receiver.ts';
import type { StartedProxy } from './support/overload.ts';
import type { ReceivedSpan } from './support/otlp-receiver.ts';

const files = serviceFiles(t, 'edge-trace-sampling-');
const receiver = await startOtlpReceiver();
t.teardown(() => receiver.close());
const backend = await controlledBackend(t, 'app');

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$/;
const CALLER_SPAN = '00f067aa0ba902b7';
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const N = 50;

function start(name: string, tracing: string): Promise<StartedProxy> {
  return startProxy(t, files, name, {
    performance: 'global_inflight_limit: 100',
    upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: app-1, address: "127.0.0.1:${backend.port}" }] } }`,
    resilience: `{ ${QUIET} }`,
    observability: `  tracing: { enabled: true, endpoint: "${receiver.url}", service_name: edge-sampling, ${tracing} }\n`,
    env: { OTEL_BSP_SCHEDULE_DELAY: '50' },
  });
}

/** A trace id of `tag` (two hex digits) and `i`. */
const traceOf = (tag: string, i: number): string => `${tag}${'0'.repeat(26)}${i.toString(16).padStart(4, '0')}`;

/** N requests (spread over h1, h2, h3), each with its own caller trace and flag `flag`; returns the trace ids. */
async function callers(p: StartedProxy, tag: string, flag: '00' | '01'): Promise<string[]> {
  const traces: string[] = [];
  for (let i = 0; i < N; i++) {
    const protocol = PROTOCOLS[i % PROTOCOLS.length] ?? 'h1';
    const trace = traceOf(tag, i);
    traces.push(trace);
    const a = await request(p, protocol, { path: `/${tag}/${i}`, headers: { traceparent: `00-${trace}-${CALLER_SPAN}-${flag}` } });
    if (a.status !== 200) throw new Error(`${protocol} /${tag}/${i}: ${a.status}`);
  }
  return traces;
}

/** What the backend received as `traceparent` for the requests of `tag`: [trace id, flags] each. */
function upstreamOf(tag: string): [string | undefined, string | undefined][] {
  return backend.arrivals.filter((a) => a.path.startsWith(`/${tag}/`)).map((a) => {
    const m = TRACEPARENT.exec(String(a.headers['traceparent']));
    return [m?.[1], m?.[3]];
  });
}

/** The 100 spans of the traces `ids`, awaited (on a timeout, the worker's tracing counters say why). */
async function exported(p: StartedProxy, ids: ReadonlySet<string>): Promise<ReceivedSpan[]> {
  try {
    return await receiver.waitForSpans(2 * N, (s) => ids.has(s.traceId), 20_000);
  } catch (e) {
    const counters = await Promise.all(['queue_full', 'export_failed', 'error'].map(async (reason) => `${reason} ${await metric(p, 'svc_tracing_spans_dropped_total', { reason })}`));
    throw new Error(`${(e as Error).message.slice(0, 200)}; exported ${await metric(p, 'svc_tracing_spans_exported_total')}, dropped: ${counters.join(', ')}`);
  }
}

t.test('default (untrusted), sample_ratio 0: 50 requests carrying traceparent -01 export no span; the backend gets the caller\'s trace id with flags 00', async (t) => {
  const p = await start('untrusted-zero', 'sample_ratio: 0');
  const traces = await callers(p, 'a0', '01');
  const sent = upstreamOf('a0');
  t.equal(sent.length, N, 'the backend saw the 50 requests');
  t.same(sent.map(([id]) => id), traces, 'each carried its caller\'s trace id upstream (the span links to the caller\'s trace)');
  t.same(new Set(sent.map(([, flags]) => flags)), new Set(['00']), 'flags 00 upstream: our decision, not the caller\'s');
  t.equal(await p.served.stop(), 0, 'stopped (SIGTERM): the worker flushed whatever it held');
  const ids = new Set(traces);
  t.equal(receiver.spans.filter((s) => ids.has(s.traceId)).length, 0, '0 spans exported for 50 requests with -01');
});

t.test('trust_incoming_sampling: true, sample_ratio 0: the caller\'s -01 decides: all 50 exported, children of the caller\'s span', async (t) => {
  const p = await start('trusted-zero', 'sample_ratio: 0, trust_incoming_sampling: true');
  const traces = await callers(p, 'b0', '01');
  const ids = new Set(traces);
  const spans = await exported(p, ids);
  const servers = spans.filter((s) => s.kind === SPAN_KIND.server);
  t.equal(servers.length, N, '50 server spans exported');
  t.equal(spans.filter((s) => s.kind === SPAN_KIND.client).length, N, 'and 50 attempt spans');
  t.ok(servers.every((s) => s.parentSpanId === CALLER_SPAN), 'each a child of the caller\'s span');
  t.same(new Set(upstreamOf('b0').map(([, flags]) => flags)), new Set(['01']), 'flags 01 upstream');
  t.equal(await metric(p, 'svc_tracing_spans_exported_total'), 2 * N, 'svc_tracing_spans_exported_total 100');
});

t.test('default (untrusted), sample_ratio 1: a caller\'s -00 does not suppress export; the span is the caller\'s span\'s child, flags 01 upstream', async (t) => {
  const p = await start('untrusted-one', 'sample_ratio: 1');
  const traces = await callers(p, 'c1', '00');
  const ids = new Set(traces);
  const spans = await exported(p, ids);
  const servers = spans.filter((s) => s.kind === SPAN_KIND.server);
  t.equal(servers.length, N, '50 server spans exported');
  t.same(new Set(servers.map((s) => s.parentSpanId)), new Set([CALLER_SPAN]), 'each linked to the caller\'s span');
  t.same(new Set(upstreamOf('c1').map(([, flags]) => flags)), new Set(['01']), 'flags 01 upstream');
  t.same(upstreamOf('c1').map(([id]) => id), traces, 'the caller\'s trace ids upstream');
});
