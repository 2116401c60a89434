// Retries, body replay, the response prebuffer and hedging (docs/retries.md), driven through the
// handler (the internal interface every ingress uses) against two real HTTP/1.1 backends whose
// behaviour each test scripts by arrival order: the first request to arrive at either backend
// fails (reset, 503, a cut response) or hangs, the next ones are served. Which backend the
// round-robin picks first does not matter then. End to end over HTTP/1.1, HTTP/2 and HTTP/3:
// test/retry-e2e.test.ts and test/hedge-e2e.test.ts.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import type { AddressInfo, Socket } from 'node:net';
import { Metrics } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { handleRequest } from '../src/proxy/handler.ts';
import type { DownstreamRequest } from '../src/proxy/handler.ts';
import type { DownstreamResponse } from '../src/proxy/forward.ts';
import { resolvedForTest } from './support/resolved-config.ts';

/** What a backend does with the n-th request to arrive at either backend (0-based). */
type Script = (n: number, req: http.IncomingMessage, body: Buffer, res: http.ServerResponse) => void;

interface Pair {
  readonly ports: [number, number];
  /** Per arrival: backend index, method, body sha256, and whether its connection closed before the answer ended. */
  readonly arrivals: { backend: number; method: string; sha: string; aborted: boolean }[];
  script: Script;
}

async function backends(t: Test): Promise<Pair> {
  const pair: Pair = { ports: [0, 0], arrivals: [], script: (_n, _req, body, res) => res.end(`ok ${body.length}`) };
  for (const i of [0, 1]) {
    const sockets = new Set<Socket>();
    const server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        const arrival = { backend: i, method: req.method ?? '', sha: createHash('sha256').update(body).digest('hex'), aborted: false };
        const n = pair.arrivals.push(arrival) - 1;
        res.on('close', () => {
          if (!res.writableFinished) arrival.aborted = true;
        });
        pair.script(n, req, body, res);
      });
    });
    server.on('connection', (s: Socket) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    pair.ports[i] = (server.address() as AddressInfo).port;
    t.teardown(() => {
      for (const s of sockets) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    });
  }
  return pair;
}

/** A downstream response that records what the handler wrote. */
class Recorder extends Writable {
  headersSent = false;
  status = 0;
  headers: Record<string, unknown> = {};
  readonly chunks: Buffer[] = [];
  /** Why the handler cut the response, if it did. */
  error: Error | undefined;
  constructor() {
    super();
    this.on('error', (err) => (this.error = err));
  }
  writeHead(status: number, headers: Record<string, unknown> = {}): this {
    this.status = status;
    this.headers = headers;
    this.headersSent = true;
    return this;
  }
  override _write(c: Buffer, _e: BufferEncoding, cb: () => void): void {
    this.chunks.push(c);
    cb();
  }
  get body(): string {
    return Buffer.concat(this.chunks).toString();
  }
}

function request(method: string, path: string, body?: Buffer): DownstreamRequest {
  const stream = new PassThrough();
  if (body !== undefined) {
    // In pieces, as a client sends it.
    for (let i = 0; i < body.length; i += 16_384) stream.write(body.subarray(i, i + 16_384));
    stream.end();
  } else stream.end();
  const headers = body === undefined ? {} : { 'content-length': String(body.length) };
  return { method, path, authority: 'example.com', host: undefined, headers, headerCount: 1, headerBytes: 10, remoteAddress: '127.0.0.1', protocol: '2', ingress: 'bootstrap-h2', listener: 'l', scheme: 'https', earlyData: false, affinityKey: 'c', upgrade: false, body: stream, hasBody: body !== undefined };
}

async function proxy(t: Test, pair: Pair, extra: { resilience?: Record<string, unknown>; body?: Record<string, unknown> } = {}): Promise<{ dataplane: Dataplane; metrics: Metrics; send: (r: DownstreamRequest) => Promise<Recorder> }> {
  const resolved = await resolvedForTest({
    listen: { tls: { cert: 'c', key: 'k' } },
    performance: { body: { max_request_body_bytes: 1_048_576, request_buffer_bytes: 262_144, ...extra.body } },
    upstream: { api: { route: { path_prefix: '/' }, backends: pair.ports.map((p, i) => ({ id: `b${i}`, address: `127.0.0.1:${p}` })) } },
    resilience: { circuit_breaker: { enabled: false }, ...extra.resilience },
    observability: { control_api: { enabled: false } },
  });
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics);
  dataplane.commit(dataplane.prepare(resolved, 1));
  t.teardown(() => dataplane.close());
  const send = async (r: DownstreamRequest): Promise<Recorder> => {
    const res = new Recorder();
    await handleRequest(dataplane.acquire(), r, res as unknown as DownstreamResponse);
    if (!res.writableFinished && !res.destroyed) await once(res, 'finish');
    return res;
  };
  return { dataplane, metrics, send };
}

async function counter(m: Metrics, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await m.registry.metrics();
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (want.every((w) => line.includes(w))) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** The first request to arrive is reset (after its body was read); the others answer the sha256 of their body. */
const resetFirst: Script = (n, req, body, res) => {
  if (n === 0) {
    req.socket.resetAndDestroy();
    return;
  }
  res.end(createHash('sha256').update(body).digest('hex'));
};

t.test('a PUT of 100 kB whose first attempt is reset is retried on the other backend with the same bytes', async (t) => {
  const pair = await backends(t);
  pair.script = resetFirst;
  const { metrics, send } = await proxy(t, pair);
  const body = randomBytes(100_000);
  const sha = createHash('sha256').update(body).digest('hex');
  const res = await send(request('PUT', '/x', body));
  t.equal(res.status, 200);
  t.equal(res.body, sha, 'the answer is the hash of the bytes the second backend read: the ones sent');
  t.same(
    pair.arrivals.map((a) => [a.method, a.sha]),
    [
      ['PUT', sha],
      ['PUT', sha],
    ],
    'both attempts carried the whole body',
  );
  t.not(pair.arrivals[0]?.backend, pair.arrivals[1]?.backend, 'the retry went to the other backend');
  t.equal(await counter(metrics, 'svc_retries_total'), 1);
  t.equal(await counter(metrics, 'svc_retry_attempts_total', { reason: 'transport' }), 1);
  t.equal(await counter(metrics, 'svc_request_buffered_bytes'), 0, 'the body is given back at the end');
  t.equal(await counter(metrics, 'svc_request_buffered_high_watermark_bytes'), 100_000, 'it was held whole');
});

t.test('a body larger than request_buffer_bytes streams and is not retried', async (t) => {
  const pair = await backends(t);
  pair.script = resetFirst;
  const { metrics, send } = await proxy(t, pair, { body: { request_buffer_bytes: 65_536 } });
  const res = await send(request('PUT', '/x', randomBytes(100_000)));
  t.equal(res.status, 502);
  t.equal(pair.arrivals.length, 1, 'one attempt');
  t.equal(await counter(metrics, 'svc_retry_denied_total', { reason: 'body_not_buffered' }), 1);
  t.equal(await counter(metrics, 'svc_request_buffer_limit_rejects'), 1);
  t.equal(await counter(metrics, 'svc_request_buffered_high_watermark_bytes'), 0, 'a body declared larger is never held');
});

t.test('POST is never retried, with or without a body', async (t) => {
  const pair = await backends(t);
  pair.script = (_n, req) => req.socket.resetAndDestroy();
  const { metrics, send } = await proxy(t, pair);
  t.equal((await send(request('POST', '/x', randomBytes(1000)))).status, 502);
  t.equal((await send(request('POST', '/x'))).status, 502);
  t.equal(pair.arrivals.length, 2, 'one attempt each');
  t.equal(await counter(metrics, 'svc_retries_total'), 0);
  t.equal(await counter(metrics, 'svc_retry_denied_total'), 0, 'no retry was wanted');
});

t.test("a backend's 503 to a GET is discarded and retried; with max_attempts 1 it is forwarded as it came", async (t) => {
  const pair = await backends(t);
  pair.script = (n, _req, _body, res) => {
    if (n % 2 === 0) {
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.end('backend 503 body');
      return;
    }
    res.end('fine');
  };
  const { metrics, send } = await proxy(t, pair);
  const res = await send(request('GET', '/x'));
  t.same([res.status, res.body], [200, 'fine'], 'the retry answered; the 503 body never reached the client');
  t.equal(await counter(metrics, 'svc_retry_attempts_total', { reason: 'status_503' }), 1);

  const one = await backends(t);
  one.script = pair.script;
  const single = await proxy(t, one, { resilience: { retry_budget: { max_attempts: 1 } } });
  const r1 = await single.send(request('GET', '/x'));
  t.same([r1.status, r1.body], [503, 'backend 503 body'], 'one attempt: the 503 as the backend sent it');
});

t.test('a response cut inside the prebuffer is retried; one cut past it is not', async (t) => {
  const pair = await backends(t);
  pair.script = (n, _req, _body, res) => {
    if (n === 0) {
      res.writeHead(200, { 'content-length': '1000' });
      res.write('partial'.repeat(10));
      setImmediate(() => res.socket?.resetAndDestroy());
      return;
    }
    res.end('complete');
  };
  const { metrics, send } = await proxy(t, pair);
  const res = await send(request('GET', '/x'));
  t.same([res.status, res.body], [200, 'complete'], 'the client got the retry, never the partial body');
  t.equal(await counter(metrics, 'svc_retries_total'), 1);

  const big = await backends(t);
  big.script = (n, _req, _body, res) => {
    if (n === 0) {
      res.writeHead(200, { 'content-length': String(200_000) });
      res.write(Buffer.alloc(100_000, 120));
      setTimeout(() => res.socket?.resetAndDestroy(), 50);
      return;
    }
    res.end('complete');
  };
  const p2 = await proxy(t, big);
  const r2 = await p2.send(request('GET', '/x'));
  t.equal(r2.status, 200, 'committed at once (declared larger than the prebuffer)');
  t.ok(r2.destroyed, 'then cut: the client sees a truncated response');
  t.equal(r2.error?.message, 'read ECONNRESET', 'cut with the backend failure');
  t.equal(big.arrivals.length, 1, 'not retried');
  t.equal(await counter(p2.metrics, 'svc_response_prebuffer_limit_rejects'), 1);
});

t.test('hedging: the slow primary loses to a hedge on the other backend, and is cancelled', async (t) => {
  const pair = await backends(t);
  pair.script = (n, _req, _body, res) => {
    if (n === 0) return; // never answers
    res.end('fast');
  };
  const { metrics, send } = await proxy(t, pair, { resilience: { hedging: { enabled: true, delay_ms: 30 } } });
  const t0 = performance.now();
  const res = await send(request('GET', '/x'));
  const ms = performance.now() - t0;
  t.same([res.status, res.body], [200, 'fast']);
  t.ok(ms < 1000, `answered in ${ms.toFixed(0)} ms`);
  await t.resolves(
    (async () => {
      while (pair.arrivals[0]?.aborted !== true) await new Promise((r) => setImmediate(r));
    })(),
    'the slow backend sees its request abandoned',
  );
  t.not(pair.arrivals[0]?.backend, pair.arrivals[1]?.backend, 'the hedge went to the other backend');
  t.equal(await counter(metrics, 'svc_hedge_triggered_total'), 1);
  t.equal(await counter(metrics, 'svc_hedge_won_total'), 1);
  t.equal(await counter(metrics, 'svc_hedge_wasted_total'), 0);
  // POST is not hedged.
  pair.arrivals.length = 0;
  pair.script = (n, _req, _body, res) => {
    setTimeout(() => res.end('slow'), n === 0 ? 150 : 0);
  };
  const post = await send(request('POST', '/x'));
  t.same([post.status, post.body, pair.arrivals.length], [200, 'slow', 1], 'POST: one attempt, waited for');
  t.equal(await counter(metrics, 'svc_hedge_triggered_total'), 1, 'no hedge for POST');
  // A primary that answers after the hedge was sent but before it: counted as wasted and late.
  pair.arrivals.length = 0;
  pair.script = (n, _req, _body, res) => {
    setTimeout(() => res.end(n === 0 ? 'primary' : 'hedge'), n === 0 ? 60 : 1000);
  };
  const late = await send(request('GET', '/x'));
  t.same([late.status, late.body], [200, 'primary']);
  t.equal(await counter(metrics, 'svc_hedge_primary_won_after_trigger_total'), 1);
  t.equal(await counter(metrics, 'svc_hedge_wasted_total'), 1);
  t.equal(await counter(metrics, 'svc_hedge_primary_late_samples_total'), 1);
  const lateMs = await counter(metrics, 'svc_hedge_primary_late_ms_total');
  t.ok(lateMs >= 20 && lateMs < 200, `primary late by ${lateMs} ms after the hedge (answered at ~60 ms, hedge at 30 ms)`);
});

t.test('a dead pool: attempts stay within the budget (primaries + 30 + ratio %)', async (t) => {
  const pair = await backends(t);
  pair.script = (_n, req) => req.socket.resetAndDestroy();
  const { metrics, send } = await proxy(t, pair, { resilience: { retry_budget: { ratio_percent: 10, max_attempts: 5 } } });
  const N = 200;
  for (let i = 0; i < N; i += 20) {
    const batch = [];
    for (let j = 0; j < 20; j++) batch.push(send(request('GET', `/x${i + j}`)));
    for (const r of await Promise.all(batch)) t.equal(r.status, 502);
  }
  const retries = await counter(metrics, 'svc_retries_total');
  t.equal(pair.arrivals.length, N + retries, 'every attempt reached a backend');
  t.ok(retries <= 30 + Math.ceil((N * 10) / 100), `${retries} retries for ${N} requests: within 30 + 10 %`);
  t.ok(retries >= 30, 'the floor was used');
  t.ok((await counter(metrics, 'svc_retry_denied_total', { reason: 'budget_exhausted' })) > 0, 'refusals counted');
});
