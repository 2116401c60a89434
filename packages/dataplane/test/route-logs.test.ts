// Route-decision logs (`observability.routing`), asserted on the structured lines of a pino sink.
import t from 'tap';
import http from 'node:http';
import { once } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { resolveConfig, validateConfig } from '@edge-proxy/config';
import { Metrics, createLogger } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { handleRequest } from '../src/proxy/handler.ts';
import type { DownstreamRequest } from '../src/proxy/handler.ts';
import type { DownstreamResponse } from '../src/proxy/forward.ts';

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
  return { method: 'GET', path, authority: host, host: undefined, headers: {}, headerCount: 1, headerBytes: 10, remoteAddress: '127.0.0.1', protocol: '3', ingress: 'quic', earlyData: false, affinityKey: 'cid', upgrade: false, body: new PassThrough(), hasBody: false };
}

async function setup(routing: string): Promise<{ dataplane: Dataplane; lines: Record<string, unknown>[] }> {
  // No listener files are needed: validate the document, then resolve it without listeners.
  const v = validateConfig(
    {
      listen: { tls: { cert: 'c', key: 'k' } },
      upstream: { api: { route: { host: 'api.example.com', path_prefix: '/v1' }, backends: [{ id: 'a', address: `127.0.0.1:${port}` }] } },
      observability: { routing: JSON.parse(routing), control_api: { enabled: false } },
    },
    '/tmp',
  );
  if (!v.ok) throw new Error(JSON.stringify(v.issues));
  const resolved = await resolveConfig({ ...v.value, config: { ...v.value.config, listeners: [] } });
  if (!resolved.ok) throw new Error(JSON.stringify(resolved.issues));
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  const dataplane = new Dataplane(new Metrics('worker'), undefined, createLogger({ level: 'info', format: 'json', destination: sink }));
  dataplane.commit(dataplane.prepare(resolved.value, 7));
  t.teardown(() => dataplane.close());
  return { dataplane, lines };
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
