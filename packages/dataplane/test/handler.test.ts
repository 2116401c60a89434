// The request handler driven directly (the internal interface both ingresses use): route-decision
// logs (`observability.routing`), asserted on the structured lines of a pino sink, and defects of
// ours, which answer 502 (or leave a finished response alone), are reported, and still end the
// request exactly once.
import t from 'tap';
import http from 'node:http';
import { once } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import type { ResolvedConfig } from '@edge-proxy/config';
import { Metrics, createLogger } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { handleRequest } from '../src/proxy/handler.ts';
import type { DownstreamRequest, RuntimeSource } from '../src/proxy/handler.ts';
import type { Runtime } from '../src/runtime/provision.ts';
import type { DownstreamResponse } from '../src/proxy/forward.ts';
import { resolvedForTest } from './support/resolved-config.ts';

const backend = http.createServer((_req, res) => res.end('ok'));
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
const port = (backend.address() as AddressInfo).port;

/** A minimal downstream response (the internal interface the handler writes to). */
class FakeResponse extends Writable {
  headersSent = false;
  status = 0;
  writeHead(status: number): this {
    this.status = status;
    this.headersSent = true;
    return this;
  }
  override _write(_c: Buffer, _e: BufferEncoding, cb: () => void): void {
    cb();
  }
}

function request(path: string, host: string): DownstreamRequest {
  return { method: 'GET', path, authority: host, host: undefined, headers: {}, headerCount: 1, headerBytes: 10, remoteAddress: '127.0.0.1', protocol: '3', ingress: 'quic', listener: 'l', scheme: 'https', earlyData: false, affinityKey: 'cid', upgrade: false, body: new PassThrough(), hasBody: false };
}

async function setup(routing: string, onPanic?: (err: unknown) => void): Promise<{ dataplane: Dataplane; lines: Record<string, unknown>[]; metrics: Metrics; resolved: ResolvedConfig }> {
  // No listener files are needed: validate the document, then resolve it without listeners.
  const resolved = await resolvedForTest({
    listen: { tls: { cert: 'c', key: 'k' } },
    upstream: { api: { route: { host: 'api.example.com', path_prefix: '/v1' }, backends: [{ id: 'a', address: `127.0.0.1:${port}` }] } },
    observability: { routing: JSON.parse(routing), control_api: { enabled: false } },
  });
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  const metrics = new Metrics('worker');
  const dataplane = new Dataplane(metrics, onPanic, createLogger({ level: 'info', format: 'json', destination: sink }));
  dataplane.commit(dataplane.prepare(resolved, 7));
  t.teardown(() => dataplane.close());
  return { dataplane, lines, metrics, resolved: resolved };
}

t.test('enabled with reasons: one structured line per decision, query string left out', async (t) => {
  const { dataplane, lines } = await setup('{"enabled": true, "include_reason": true}');
  const res = new FakeResponse();
  await handleRequest(dataplane.acquire(), request('/v1/users?token=secret-value', 'api.example.com'), res as unknown as DownstreamResponse);
  t.equal(res.status, 200);
  await handleRequest(dataplane.acquire(), request('/nowhere', 'other.example.com'), new FakeResponse() as unknown as DownstreamResponse);
  const decisions = lines.filter((l) => l['msg'] === 'route decision');
  t.match(decisions[0], { generation: 7, method: 'GET', host: 'api.example.com', path: '/v1/users', protocol: '3', decision: 'match', route: 'api', reason: { host: 'exact', prefix: '/v1', method: 'any' } });
  t.match(decisions[1], { decision: 'not_found', route: null, host: 'other.example.com' });
  t.notOk(JSON.stringify(lines).includes('secret-value'), 'the query string never reaches the log');
});

t.test('include_reason false: the decision without its reason; disabled: no line', async (t) => {
  const a = await setup('{"enabled": true, "include_reason": false}');
  await handleRequest(a.dataplane.acquire(), request('/v1/x', 'api.example.com'), new FakeResponse() as unknown as DownstreamResponse);
  const d = a.lines.find((l) => l['msg'] === 'route decision');
  t.equal(d?.['route'], 'api');
  t.notOk('reason' in (d ?? {}));
  const b = await setup('{"enabled": false}');
  await handleRequest(b.dataplane.acquire(), request('/v1/x', 'api.example.com'), new FakeResponse() as unknown as DownstreamResponse);
  t.equal(b.lines.filter((l) => l['msg'] === 'route decision').length, 0);
});

/** The runtime of `dataplane`, handed out once and counted back in. */
function countingSource(dataplane: Dataplane): RuntimeSource & { released: number } {
  return {
    released: 0,
    acquire: () => dataplane.acquire(),
    release(rt: Runtime) {
      this.released++;
      dataplane.release(rt);
    },
  };
}

function counterValue(text: string, name: string): number {
  const m = new RegExp(`^${name} (\\d+)$`, 'm').exec(text);
  return m === null ? 0 : Number(m[1]);
}

t.test('a defect before the upstream attempt: 502, reported, runtime released once', async (t) => {
  const panics: unknown[] = [];
  const { dataplane, metrics } = await setup('{"enabled": false}', (err) => panics.push(err));
  const source = countingSource(dataplane);
  const rt = source.acquire();
  (rt.router as { resolve: unknown }).resolve = () => {
    throw new Error('router defect');
  };
  const res = new FakeResponse();
  await handleRequest(rt, request('/v1/x', 'api.example.com'), res as unknown as DownstreamResponse, source);
  t.equal(res.status, 502);
  t.equal(panics.length, 1);
  t.match(String(panics[0]), /router defect/);
  t.equal(source.released, 1);
  const text = await metrics.registry.metrics();
  t.equal(counterValue(text, 'svc_requests_failure'), 1);
  t.equal(counterValue(text, 'svc_requests_success'), 0);
});

t.test('a defect after the response (inside the upstream callbacks): reported, the exchange still ends once', async (t) => {
  const panics: unknown[] = [];
  const { dataplane, metrics } = await setup('{"enabled": false}', (err) => panics.push(err));
  const source = countingSource(dataplane);
  const rt = source.acquire();
  const stats = rt.deps.stats;
  stats.observe = () => {
    throw new Error('stats defect');
  };
  const res = new FakeResponse();
  await handleRequest(rt, request('/v1/x', 'api.example.com'), res as unknown as DownstreamResponse, source);
  t.equal(res.status, 200, 'the backend answer went out before the defect');
  t.ok(res.writableFinished, 'and was complete');
  t.equal(panics.length, 1);
  t.match(String(panics[0]), /stats defect/);
  t.equal(source.released, 1);
  t.equal(stats.inflight((rt.upstreams.get('api')?.backends[0] as { key: string }).key), 0, 'the in-flight count was given back');
  const text = await metrics.registry.metrics();
  t.equal(counterValue(text, 'svc_requests_failure'), 1);
});

t.test('defects injected at every phase that holds a slot: each slot (global, upstream, backend) and the runtime are given back exactly once', async (t) => {
  type Inject = (rt: Runtime, dp: Dataplane) => void;
  const boom = (what: string) => () => {
    throw new Error(`${what} defect`);
  };
  const cases: [string, Inject, number][] = [
    ['select: the selector throws after admission took the global and upstream slots', (rt) => ((rt.upstreams.get('api') as { selector: { pick: unknown } }).selector.pick = boom('pick')), 502],
    ['forward: the pool throws while the attempt starts (backend slot held)', (rt) => ((rt.deps.pools as { get: unknown }).get = () => ({ dispatch: boom('dispatch') })), 502],
    ['attempt end: the breaker record throws before the backend slot is ended', (_rt, dp) => ((dp.breakers as { record: unknown }).record = boom('breaker')), 200],
    ['attempt end: passive health throws after the backend slot is ended', (rt) => ((rt.deps.health as { passive: unknown }).passive = boom('health')), 200],
  ];
  for (const [name, inject, status] of cases) {
    const panics: unknown[] = [];
    const { dataplane } = await setup('{"enabled": false}', (err) => panics.push(err));
    const source = countingSource(dataplane);
    const rt = source.acquire();
    inject(rt, dataplane);
    const res = new FakeResponse();
    await handleRequest(rt, request('/v1/x', 'api.example.com'), res as unknown as DownstreamResponse, source);
    const key = (rt.upstreams.get('api')?.backends[0] as { key: string }).key;
    const view = dataplane.overload.admissionView();
    t.same(
      { status: res.status, panics: panics.length, released: source.released, inflight: view.inflight, queued: view.queued, backend: rt.deps.stats.inflight(key) },
      { status, panics: 1, released: 1, inflight: 0, queued: 0, backend: 0 },
      name,
    );
  }
});

t.test('a generation replaced with requests in flight on it: one line when it starts draining, one when its last request ends', async (t) => {
  const { dataplane, lines, resolved } = await setup('{"enabled": false}');
  const drainLines = (): Record<string, unknown>[] => lines.filter((l) => String(l['msg']).startsWith('generation drain'));
  const held = [dataplane.acquire(), dataplane.acquire()];
  dataplane.commit(dataplane.prepare(resolved, 8));
  t.match(drainLines(), [{ level: 'info', msg: 'generation draining: its requests in flight finish on it', generation: 7, replaced_by: 8, requests_in_flight: 2 }]);
  dataplane.release(held[0] as Runtime);
  t.equal(drainLines().length, 1, 'one request still in flight: not drained yet');
  dataplane.release(held[1] as Runtime);
  t.match(drainLines()[1], { level: 'info', msg: 'generation drained: its last request finished', generation: 7, duration_ms: Number });
  dataplane.commit(dataplane.prepare(resolved, 9));
  t.equal(drainLines().length, 2, 'a generation replaced with nothing in flight has nothing to drain: no line');
});
