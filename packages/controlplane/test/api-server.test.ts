// The control API server's connection bounds, over real TLS: `max_connections` (the newcomer
// displaces the oldest unauthenticated connection, counted in svc_control_api_connection_limit_drops)
// and `connection_timeout_ms` (lifetime). The attack scenarios run end to end in
// test/controlplane-security.test.ts.
import t from 'tap';
import tls from 'node:tls';
import https from 'node:https';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { validateConfig, resolveConfig } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import type { AuditEvent } from '@edge-proxy/telemetry';
import { ControlApiServer } from '../src/api/server.ts';
import type { ApiAnswer, ControlPlaneHandlers } from '../src/api/server.ts';
import { Authenticator } from '../src/api/auth.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-api-server-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost'] });
const v = validateConfig({ listen: { tls: { cert: cert.cert, key: cert.key } }, upstream: { a: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: 'h' }] } } }, dir);
if (!v.ok) throw new Error(JSON.stringify(v.issues));
const r = await resolveConfig(v.value);
if (!r.ok) throw new Error(JSON.stringify(r.issues));
const resolved = r.value;

const ok = (): ApiAnswer => ({ status: 200, body: {} });
const handlers: ControlPlaneHandlers = {
  health: ok,
  ready: ok,
  snapshot: async () => ok(),
  history: ok,
  historyGeneration: ok,
  validate: async () => ok(),
  preview: async () => ok(),
  activate: async () => ok(),
  rollback: async () => ok(),
  reload: async () => ok(),
  reloadCerts: async () => ok(),
  restart: async () => ok(),
};

async function start(maxConnections: number, connectionTimeoutMs: number): Promise<{ port: number; metrics: Metrics; events: AuditEvent[] }> {
  const metrics = new Metrics('supervisor');
  const events: AuditEvent[] = [];
  const server = new ControlApiServer(
    { address: '127.0.0.1', port: 0, cert: readFileSync(cert.cert, 'utf8'), key: readFileSync(cert.key, 'utf8'), clientAuth: undefined, maxConnections, connectionTimeoutMs, maxBodyBytes: 1024, reloadPath: '/admin/runtime/reload', reloadCertsPath: '/admin/runtime/reload-certs', auditEnabled: true },
    new Authenticator(resolved.config, resolved.material),
    handlers,
    metrics,
    (e) => events.push(e),
  );
  const port = await server.listen(0);
  t.teardown(() => server.close());
  return { port, metrics, events };
}

const connect = (port: number): Promise<tls.TLSSocket | Error> =>
  new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: readFileSync(ca.cert), ALPNProtocols: ['http/1.1'] });
    s.once('secureConnect', () => resolve(s));
    s.once('error', (e) => resolve(e));
  });

t.test('a connection beyond max_connections displaces the oldest unauthenticated one, counted as a drop', async (t) => {
  const { port, metrics } = await start(2, 30_000);
  const a = await connect(port);
  const b = await connect(port);
  if (a instanceof Error || b instanceof Error) return void t.fail('the first two connections are accepted');
  const aClosed = once(a, 'close');
  const c = await connect(port);
  t.notOk(c instanceof Error, 'the third connection is accepted');
  await aClosed;
  t.ok(a.destroyed && !b.destroyed, 'the oldest (a) made room; b stays');
  t.match(await metrics.registry.metrics(), /^svc_control_api_connection_limit_drops 1$/m);
  for (const s of [b, c]) if (!(s instanceof Error)) s.destroy();
});

t.test('a connection is closed when its lifetime (connection_timeout_ms) ends', async (t) => {
  const { port } = await start(10, 300);
  const s = await connect(port);
  if (s instanceof Error) return void t.fail(s.message);
  const started = Date.now();
  await once(s, 'close');
  const lived = Date.now() - started;
  t.ok(lived >= 250 && lived < 5000, `closed after ${lived} ms`);
});

t.test('audit events carry trace_id and span_id from the caller\'s traceparent, and nothing from a malformed one', async (t) => {
  const { port, events } = await start(16, 60_000);
  const call = (traceparent: string | undefined): Promise<number> =>
    new Promise((resolve, reject) => {
      const req = https.request({ host: '127.0.0.1', port, method: 'POST', path: '/admin/runtime/validate', servername: 'localhost', ca: readFileSync(ca.cert), agent: false, headers: { 'content-type': 'application/json', ...(traceparent === undefined ? {} : { traceparent }) } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      req.on('error', reject);
      req.end('{}');
    });
  const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
  const span = '00f067aa0ba902b7';
  await call(`00-${trace}-${span}-01`);
  const traced = events.splice(0);
  t.ok(traced.length > 0, `${traced.length} audit events for the call`);
  t.same(traced.map((e) => [e.trace_id, e.span_id]), traced.map(() => [trace, span]), 'every event of the call is correlated');
  await call('00-not-a-trace-01');
  const untraced = events.splice(0);
  t.ok(untraced.length > 0);
  t.same(untraced.map((e) => [e.trace_id, e.span_id]), untraced.map(() => [null, null]), 'a malformed traceparent is ignored');
  t.ok(untraced.every((e) => typeof e.request_id === 'string' && e.request_id.length === 36), 'request ids as before');
});
