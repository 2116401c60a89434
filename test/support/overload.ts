// What the overload end-to-end tests (issue 13) share: one request over HTTP/1.1, HTTP/2 or
// HTTP/3, with or without a body, that reports status, headers, body and time, and that the test
// can abort mid-flight (socket destroy, stream reset, QUIC connection close); the shed answers of
// the contract, checked field by field; the snapshot's `admission` and `circuit_breakers` blocks;
// and a bounded poll for state that changes in other processes (the snapshot is fed by worker
// heartbeats).
import https from 'node:https';
import http2 from 'node:http2';
import { Http3ClientSession } from '@edge-proxy/http3';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { metricValue, scrape } from './exposition.ts';
import { api, serve } from './serve.ts';
import { freePorts, serviceConfig } from './service-config.ts';
import type { Protocol } from './served-by.ts';
import type { Served } from './serve.ts';
import type { AdmissionBlock, CircuitBreakersBlock } from '@edge-proxy/controlplane';

/** Where the proxy listens and how to reach its control API and metrics. */
export interface Proxy {
  /** Listener port (TCP for HTTP/1.1 and HTTP/2, UDP for HTTP/3). */
  readonly lport: number;
  /** Control API port (HTTPS, `ca`). */
  readonly cport: number;
  /** Metrics port (plain HTTP). */
  readonly mport: number;
  readonly ca: Buffer;
  readonly token: string;
}

/** One answer; `status` 0 and `error` set when no response came. */
export interface Answer {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
  /** From sending the request (connection established) to the end of the body, ms. */
  readonly ms: number;
  readonly error?: string;
}

/** One request: path, method and headers (default GET /), and how long to wait for it. */
export interface RequestOptions {
  readonly path?: string;
  readonly method?: string;
  readonly headers?: Readonly<Record<string, string>>;
  /** Request body with its `content-length`: bytes sent whole, or chunks sent as they come (default none: the request ends after its head). */
  readonly body?: Buffer | StreamedBody;
  /** Gives up after this long (default 20 s). For HTTP/3 this is the client's response-head deadline, which resets the stream. */
  readonly timeoutMs?: number;
}

/** A body sent chunk by chunk as `chunks` yields them (e.g. the rest once the test saw the proxy do something), declared with `content-length: length`. */
export interface StreamedBody {
  readonly length: number;
  readonly chunks: AsyncIterable<Buffer>;
}

/** Writes `body` to a request stream and ends it; a stream that fails meanwhile reports it on its own. */
function writeBody(w: { write(c: Buffer): unknown; end(c?: Buffer): unknown; readonly destroyed: boolean }, body: Buffer | StreamedBody | undefined): void {
  if (body === undefined || Buffer.isBuffer(body)) {
    w.end(body);
    return;
  }
  void (async () => {
    for await (const c of body.chunks) {
      if (w.destroyed) return;
      w.write(c);
    }
    if (!w.destroyed) w.end();
  })();
}

/** A request under way. */
export interface Sent {
  readonly answer: Promise<Answer>;
  /** Resolves once the request is on the wire (connection established, head sent). */
  readonly sent: Promise<void>;
  /** Resolves with the status once the response head arrived, before its body (0 when the request ended without one). */
  readonly head: Promise<number>;
  /**
   * Abandons it: HTTP/1.1 destroys the socket, HTTP/2 resets the stream (CANCEL), HTTP/3 closes the
   * QUIC connection (the project's client has no per-request cancel; its response-head deadline,
   * `timeoutMs`, is the way to reset one stream).
   */
  abort(): void;
}

/** `o.headers` with the `content-length` of `o.body` when there is one. */
const withLength = (o: RequestOptions): Record<string, string> => ({ ...o.headers, ...(o.body === undefined ? {} : { 'content-length': String(o.body.length) }) });

const flat = (h: Record<string, unknown>): Record<string, string> => Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), Array.isArray(v) ? v.join(', ') : String(v)]));

function sendH1(p: Proxy, o: RequestOptions): Sent {
  let onSent: () => void = () => undefined;
  const sent = new Promise<void>((r) => (onSent = r));
  let onHead: (status: number) => void = () => undefined;
  const head = new Promise<number>((r) => (onHead = r));
  let req: ReturnType<typeof https.request> | undefined;
  const answer = new Promise<Answer>((resolve) => {
    const t0 = performance.now();
    const fail = (err: Error): void => resolve({ status: 0, headers: {}, body: '', ms: performance.now() - t0, error: err.message });
    req = https.request({ host: '127.0.0.1', port: p.lport, path: o.path ?? '/', method: o.method ?? 'GET', ca: p.ca, servername: 'localhost', headers: { host: 'localhost', ...withLength(o) }, agent: false }, (res) => {
      onHead(res.statusCode ?? 0);
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: flat(res.headers), body, ms: performance.now() - t0 }));
      res.on('error', fail);
      res.on('aborted', () => fail(new Error('response aborted')));
    });
    req.setTimeout(o.timeoutMs ?? 20_000, () => req?.destroy(new Error('timeout')));
    req.on('error', fail);
    req.on('socket', (s) => s.once('secureConnect', onSent));
    writeBody(req, o.body);
  });
  void answer.then((a) => onHead(a.status));
  return { answer, sent, head, abort: () => req?.destroy(new Error('aborted by the test')) };
}

/** Starts one request on `session`; `done` hears its outcome once (status 0 and `error` when no complete response came). */
function h2Exchange(session: http2.ClientHttp2Session, o: RequestOptions, done: (a: Omit<Answer, 'ms'>) => void, onHead: (status: number) => void = () => undefined): http2.ClientHttp2Stream {
  // Without a body the HEADERS frame ends the stream, as browsers send a GET.
  const stream = session.request({ ':path': o.path ?? '/', ':method': o.method ?? 'GET', ':authority': 'localhost', ...withLength(o) }, { endStream: o.body === undefined });
  let status = 0;
  let headers: Record<string, string> = {};
  let body = '';
  stream.setEncoding('utf8');
  stream.on('response', (h) => {
    status = Number(h[':status']);
    headers = flat(Object.fromEntries(Object.entries(h).filter(([k]) => !k.startsWith(':'))));
    onHead(status);
  });
  stream.on('data', (c: string) => (body += c));
  stream.on('end', () => done({ status, headers, body }));
  stream.on('error', (err) => done({ status: 0, headers: {}, body, error: err.message }));
  stream.on('close', () => done({ status: 0, headers: {}, body, error: `stream closed (code ${stream.rstCode})` }));
  if (o.body !== undefined) writeBody(stream, o.body);
  return stream;
}

function sendH2(p: Proxy, o: RequestOptions): Sent {
  let onSent: () => void = () => undefined;
  const sent = new Promise<void>((r) => (onSent = r));
  let onHead: (status: number) => void = () => undefined;
  const head = new Promise<number>((r) => (onHead = r));
  const session = http2.connect(`https://localhost:${p.lport}`, { ca: p.ca, host: '127.0.0.1', servername: 'localhost' } as http2.SecureClientSessionOptions);
  let stream: http2.ClientHttp2Stream | undefined;
  const answer = new Promise<Answer>((resolve) => {
    let t0 = performance.now();
    let settled = false;
    const done = (a: Omit<Answer, 'ms'>): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.close();
      resolve({ ...a, ms: performance.now() - t0 });
    };
    const timer = setTimeout(() => done({ status: 0, headers: {}, body: '', error: 'timeout' }), o.timeoutMs ?? 20_000);
    session.on('error', (err) => done({ status: 0, headers: {}, body: '', error: err.message }));
    session.once('connect', () => {
      t0 = performance.now();
      onSent();
    });
    stream = h2Exchange(session, o, done, onHead);
  });
  void answer.then((a) => onHead(a.status));
  return { answer, sent, head, abort: () => stream?.close(http2.constants.NGHTTP2_CANCEL) };
}

/** An HTTP/2 connection on which many requests run at once (the proxy allows 100 concurrent streams per connection). */
export interface H2Connection {
  /** One request on a new stream; its answer (`ms` from the stream's start). */
  request(o?: RequestOptions): Promise<Answer>;
}

/** Opens an HTTP/2 connection to the proxy; destroyed at teardown. */
export async function connectH2(t: { teardown(fn: () => unknown): void }, p: Proxy): Promise<H2Connection> {
  const session = http2.connect(`https://localhost:${p.lport}`, { ca: p.ca, host: '127.0.0.1', servername: 'localhost' } as http2.SecureClientSessionOptions);
  t.teardown(() => session.destroy());
  await new Promise<void>((resolve, reject) => {
    session.once('connect', () => resolve());
    session.once('error', reject);
  });
  // A session error fails the streams under way, each of which reports it.
  session.on('error', () => undefined);
  return {
    request: (o = {}) =>
      new Promise<Answer>((resolve) => {
        const t0 = performance.now();
        let settled = false;
        const done = (a: Omit<Answer, 'ms'>): void => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          resolve({ ...a, ms: performance.now() - t0 });
        };
        const stream = h2Exchange(session, o, done);
        const timer = setTimeout(() => {
          stream.close(http2.constants.NGHTTP2_CANCEL);
          done({ status: 0, headers: {}, body: '', error: 'timeout' });
        }, o.timeoutMs ?? 20_000);
      }),
  };
}

/** One request on `session`: `onSent` once it is on its way, `onHead` with the status once the head arrived, then the whole answer; rejects as the client does. */
async function h3Exchange(session: Http3ClientSession, o: RequestOptions, onSent: () => void = () => undefined, onHead: (status: number) => void = () => undefined): Promise<Omit<Answer, 'ms'>> {
  const headers = withLength(o);
  const pending = session.request({ path: o.path ?? '/', method: o.method ?? 'GET', authority: 'localhost', ...(Object.keys(headers).length === 0 ? {} : { headers }), ...(o.body === undefined ? {} : { body: Buffer.isBuffer(o.body) ? o.body : o.body.chunks }), timeoutMs: o.timeoutMs ?? 20_000 });
  onSent();
  const r = await pending;
  onHead(r.status);
  const body = await r.bytes();
  return { status: r.status, headers: flat(Object.fromEntries(Object.entries(r.headers).filter(([k]) => !k.startsWith(':')))), body: body.toString('utf8') };
}

/** A QUIC connection on which requests run one after another or at once. */
export interface H3Connection {
  /** One request on a new stream; its answer (`ms` from the stream's start). */
  request(o?: RequestOptions): Promise<Answer>;
}

/** Opens an HTTP/3 connection to the proxy (the handshake done before any request); closed at teardown. */
export async function connectH3(t: { teardown(fn: () => unknown): void }, p: Proxy): Promise<H3Connection> {
  const session = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 10_000 });
  t.teardown(() => session.close(true).catch(() => undefined));
  return {
    request: async (o = {}) => {
      const t0 = performance.now();
      try {
        return { ...(await h3Exchange(session, o)), ms: performance.now() - t0 };
      } catch (err) {
        return { status: 0, headers: {}, body: '', ms: performance.now() - t0, error: (err as Error).message };
      }
    },
  };
}

function sendH3(p: Proxy, o: RequestOptions): Sent {
  let onSent: () => void = () => undefined;
  const sent = new Promise<void>((r) => (onSent = r));
  let onHead: (status: number) => void = () => undefined;
  const head = new Promise<number>((r) => (onHead = r));
  let session: Http3ClientSession | undefined;
  let aborted = false;
  const answer = (async (): Promise<Answer> => {
    let t0 = performance.now();
    try {
      session = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 10_000 });
      if (aborted) throw new Error('aborted by the test');
      t0 = performance.now();
      return { ...(await h3Exchange(session, o, onSent, onHead)), ms: performance.now() - t0 };
    } catch (err) {
      onSent();
      return { status: 0, headers: {}, body: '', ms: performance.now() - t0, error: (err as Error).message };
    } finally {
      await session?.close(true).catch(() => undefined);
    }
  })();
  void answer.then((a) => onHead(a.status));
  return {
    answer,
    sent,
    head,
    abort: () => {
      aborted = true;
      void session?.close(true).catch(() => undefined);
    },
  };
}

const SENDERS: Record<Protocol, (p: Proxy, o: RequestOptions) => Sent> = { h1: sendH1, h2: sendH2, h3: sendH3 };

/** Sends one request over `protocol` on its own connection. */
export function send(p: Proxy, protocol: Protocol, o: RequestOptions = {}): Sent {
  return SENDERS[protocol](p, o);
}

/** One request over `protocol` on its own connection; its answer. */
export function request(p: Proxy, protocol: Protocol, o: RequestOptions = {}): Promise<Answer> {
  return send(p, protocol, o).answer;
}

/** Shed reasons of the contract (the `reason` label of `svc_overload_shed_by_reason_total`). */
export type ShedReason = 'brownout' | 'queue_full' | 'queue_timeout' | 'circuit_open';

/** The body of each shed answer (HELPERS.md "Shed answers"). */
export const SHED_BODY: Readonly<Record<ShedReason, string>> = {
  brownout: '503 Service Unavailable: brownout active: non-core route shed (EDGE_SHED_BROWNOUT)\n',
  queue_full: '503 Service Unavailable: route queue full (EDGE_SHED_QUEUE_FULL)\n',
  queue_timeout: '503 Service Unavailable: waited too long for admission (EDGE_SHED_QUEUE_TIMEOUT)\n',
  circuit_open: "503 Service Unavailable: every backend's circuit breaker is open (EDGE_SHED_CIRCUIT_OPEN)\n",
};

interface Assertions {
  equal(found: unknown, wanted: unknown, message: string): unknown;
  ok(v: unknown, message: string): unknown;
}

/** Asserts that `a` is the shed answer for `reason`: status, Retry-After, content type, cache-control and body (none for HEAD). */
export function assertShed(t: Assertions, a: Answer, reason: ShedReason, retryAfter: number, what: string, head = false): void {
  t.equal(a.status, 503, `${what}: 503${a.error === undefined ? '' : ` (error: ${a.error})`}`);
  t.equal(a.headers['retry-after'], String(retryAfter), `${what}: Retry-After ${retryAfter}`);
  t.equal(a.headers['content-type'], 'text/plain; charset=utf-8', `${what}: content-type`);
  t.equal(a.headers['cache-control'], 'no-store', `${what}: cache-control no-store`);
  t.equal(a.body, head ? '' : SHED_BODY[reason], `${what}: the ${reason} body`);
}

/** The value of a metric series (sum over series whose labels include `labels`) from a fresh scrape. */
export async function metric(p: Proxy, name: string, labels: Readonly<Record<string, string>> = {}): Promise<number> {
  return metricValue(await scrape(p.mport), name, labels);
}

/**
 * Requests in flight and waiting right now (`svc_inflight_requests`, the sum of
 * `svc_route_queue_depth`), read from the workers at the scrape: unlike the snapshot, which is as
 * old as the last heartbeat, never a value from before the test's last step.
 */
export async function loadNow(p: Proxy): Promise<{ inflight: number; queued: number }> {
  const text = await scrape(p.mport);
  return { inflight: metricValue(text, 'svc_inflight_requests'), queued: metricValue(text, 'svc_route_queue_depth') };
}

/** The counters every shed moves, read in one scrape. */
export interface ShedCounters {
  readonly shed: number;
  readonly byReason: number;
  readonly outcome: number;
  readonly breakerRejected: number;
}

/** `svc_overload_shed`, `svc_overload_shed_by_reason_total{reason}`, `svc_upstream_requests_total{upstream,outcome="overload_shed"}` and `svc_circuit_breaker_rejected_total`. */
export async function shedCounters(p: Proxy, reason: ShedReason, upstream: string): Promise<ShedCounters> {
  const text = await scrape(p.mport);
  return {
    shed: metricValue(text, 'svc_overload_shed'),
    byReason: metricValue(text, 'svc_overload_shed_by_reason_total', { reason }),
    outcome: metricValue(text, 'svc_upstream_requests_total', { upstream, outcome: 'overload_shed' }),
    breakerRejected: metricValue(text, 'svc_circuit_breaker_rejected_total'),
  };
}

/** The snapshot's `admission` block (per worker and summed), as the supervisor declares it. */
export type Admission = AdmissionBlock;

/** One backend of the snapshot's `circuit_breakers` block. */
export type BreakerEntry = CircuitBreakersBlock['backends'][number];

/** GET /admin/runtime; the body. */
export async function snapshot(p: Proxy): Promise<Record<string, unknown>> {
  const r = await api(p.cport, p.ca, 'GET', '/admin/runtime', { token: p.token });
  if (r.status !== 200) throw new Error(`GET /admin/runtime: ${r.status}`);
  return r.body;
}

/** The snapshot's `admission` block. */
export async function admission(p: Proxy): Promise<Admission> {
  return (await snapshot(p))['admission'] as Admission;
}

/** The breaker of `upstream`/`backend` in the snapshot (undefined when not listed). */
export async function breaker(p: Proxy, upstream: string, backend: string): Promise<BreakerEntry | undefined> {
  const cb = (await snapshot(p))['circuit_breakers'] as { backends?: BreakerEntry[] } | undefined;
  return cb?.backends?.find((b) => b.upstream === upstream && b.backend === backend);
}

/**
 * Calls `read` every `everyMs` until `pred` holds for its value, for at most `timeoutMs`; the last
 * value read (the caller asserts on it, so a timeout fails with what was seen). For state that
 * changes in other processes: the proxy's workers and the supervisor's heartbeat-fed snapshot.
 */
export async function pollUntil<T>(read: () => Promise<T>, pred: (v: T) => boolean, timeoutMs = 5000, everyMs = 25): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = await read();
  while (!pred(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, everyMs)); // another process's state: poll, bounded
    v = await read();
  }
  return v;
}

/** What `startProxy` needs: the test's temp dir and certificate (`serviceFiles`). */
export interface ProxyFiles {
  readonly dir: string;
  readonly leaf: { readonly cert: string; readonly key: string };
  readonly caPem: Buffer;
}

/** The parts of the configuration an overload test varies. */
export interface OverloadSetup {
  /** Entries of `performance` after `worker_threads: 1, worker_heartbeat_ms: 100, worker_unresponsive_heartbeats: 100` (limits). */
  readonly performance: string;
  /** The `upstream` map, YAML flow style. */
  readonly upstream: string;
  /** The `resilience` block, YAML flow style. */
  readonly resilience: string;
  /** `performance.worker_threads` (default 1: every limit of the test is the node's). */
  readonly workers?: number;
  /** More entries of `observability` (serviceConfig's `observability`). */
  readonly observability?: string;
  /** More environment variables of the service (e.g. `OTEL_BSP_SCHEDULE_DELAY`). */
  readonly env?: Readonly<Record<string, string>>;
  /** More top-level YAML after `resilience` (e.g. `default_auth: { ... }`), one key a line. */
  readonly extra?: string;
}

const TOKENS = { viewer: 'viewer-token-overload-0123456789', operator: 'operator-token-overload-0123456789' } as const;

/** A started proxy, with its configuration file (rewrite it and activate to swap generations). */
export interface StartedProxy extends Proxy {
  /** The running service: its log lines (audit, transitions) and its stop. */
  readonly served: Served;
  readonly configFile: string;
  readonly configText: string;
}

/**
 * Starts `edge-proxy serve` with one worker unless `o.workers` says more (every limit is per worker: one worker makes the
 * limits of the test the limits of the node) and a 100 ms heartbeat (the snapshot's admission
 * and breaker blocks follow the workers within it); stopped at teardown. Its control API token
 * has role `viewer` unless `role` says `operator` (activations).
 */
export async function startProxy(t: { teardown(fn: () => unknown): void }, files: ProxyFiles, name: string, o: OverloadSetup, role: keyof typeof TOKENS = 'viewer'): Promise<StartedProxy> {
  const ports = await freePorts();
  const configFile = path.join(files.dir, `${name}.yaml`);
  const configText = serviceConfig({
    ports,
    cert: files.leaf,
    controlApiTls: files.leaf,
    token: { token: TOKENS[role], role, actor: 'overload-e2e' },
    // 100 heartbeats of silence (10 s) before the supervisor kills a worker: the default 5
    // (500 ms at this interval) kills a worker still loading on a loaded machine.
    performance: `worker_threads: ${o.workers ?? 1}, worker_heartbeat_ms: 100, worker_unresponsive_heartbeats: 100, ${o.performance}`,
    upstream: o.upstream,
    extra: `resilience: ${o.resilience}${o.extra === undefined ? '' : `\n${o.extra}`}`,
    ...(o.observability === undefined ? {} : { observability: o.observability }),
  });
  const served = await serve(configFile, configText, undefined, { ...o.env });
  t.teardown(() => served.stop());
  const proxy = { lport: ports.l, cport: ports.c, mport: ports.m, ca: files.caPem, token: TOKENS[role], served, configFile, configText };
  // Until the workers' first heartbeats the snapshot's admission block is all zeros.
  await pollUntil(() => admission(proxy), (a) => (a.workers?.length ?? 0) >= (o.workers ?? 1), 10_000);
  return proxy;
}

interface Matcher {
  match(found: unknown, pattern: unknown, message: string): unknown;
}

/**
 * Activates `text` as generation `generation` on `p` (started with role `operator`): written
 * beside `p`'s configuration file as `<name>.yaml`, POSTed to /admin/runtime/activate, asserted
 * 202, then awaited until the snapshot shows the generation (every worker committed it).
 */
export async function activate(t: Matcher, p: StartedProxy, name: string, text: string, generation: number): Promise<void> {
  const file = path.join(path.dirname(p.configFile), `${name}.yaml`);
  writeFileSync(file, text);
  const r = await api(p.cport, p.ca, 'POST', '/admin/runtime/activate', { token: p.token }, { config_path: file, expected_generation: generation - 1, reason: name });
  t.match(r, { status: 202, body: { generation } }, `${name}: activated as generation ${generation} (${JSON.stringify(r.body).slice(0, 200)})`);
  await pollUntil(async () => (await snapshot(p))['generation'], (g) => g === generation, 10_000);
}
