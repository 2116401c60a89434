// The metrics endpoint under a connection flood (the control API's lock-out, issue 11 item 10, had
// a twin here): a real `edge-proxy serve`; 300 idle TCP connections from one address cannot keep
// Prometheus out, idle connections are closed, and the endpoint's limits and path are live.
import t from 'tap';
import http from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-metrics-guard-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'operator-token-0123456789abcdef';
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
// Two backends: the activation below also moves `app`, so the data plane shows it took effect.
const backend = (name: string): Promise<number> => namedBackend(t, name);
const backends = { one: await backend('one'), two: await backend('two') };
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 3 });

const configText = (metricsPath: string, app: 'one' | 'two' = 'one'): string => `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 1 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backends[app]}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport}, path: ${metricsPath}, max_connections: 64, max_connections_per_source: 8, idle_timeout_ms: 1500 }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: ops }] }
`;
const served = await serve(path.join(dir, 'config.yaml'), configText('/metrics'));
t.teardown(() => served.stop());

function scrape(p: string, localAddress: string): Promise<number> {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: mport, path: p, localAddress, agent: false, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    }).on('error', reject);
  });
}

t.test('300 idle connections from one address do not lock the scraper out', async (t) => {
  const sockets: net.Socket[] = [];
  t.teardown(() => sockets.forEach((s) => s.destroy()));
  let closedByServer = 0;
  let flushed: () => void = () => {};
  // 300 opened, at most 8 (the per-source cap) may stay: resolves once 292 were closed by the server.
  const displaced = new Promise<void>((resolve) => (flushed = resolve));
  for (let i = 0; i < 300; i++) {
    const s = net.connect({ host: '127.0.0.1', port: mport, localAddress: '127.0.0.1' });
    s.on('error', () => {});
    s.on('close', () => {
      if (++closedByServer === 292) flushed();
    });
    sockets.push(s);
    await once(s, 'connect');
  }
  t.equal(await scrape('/metrics', '127.0.0.2'), 200, 'another address scrapes');
  t.equal(await scrape('/metrics', '127.0.0.1'), 200, 'the flooding address itself still scrapes (its oldest idle connection is displaced)');
  // The flood was displaced down to the per-source cap.
  await displaced;
  t.ok(300 - closedByServer <= 8, `at most 8 of the 300 stay open (${300 - closedByServer} open)`);
  const line = await served.waitFor((l) => String(l['msg']).startsWith('metrics endpoint connection displaced'));
  t.equal(line['level'], 'warn', 'one warn line (rate limited) names the displacement');
  t.equal(line['suppressed_since_last'], 0, 'the first line stands for itself: nothing was suppressed before it');
});

t.test('a connection that never sends a request is closed after idle_timeout_ms', async (t) => {
  const s = net.connect({ host: '127.0.0.1', port: mport, localAddress: '127.0.0.3' });
  s.on('error', () => {});
  await once(s, 'connect');
  const opened = Date.now();
  await once(s, 'close');
  const took = Date.now() - opened;
  t.ok(took >= 1400 && took < 10_000, `closed after ${took} ms (idle_timeout_ms 1500)`);
});

t.test('path and limits are live: an activation moves the endpoint', async (t) => {
  const next = path.join(dir, 'next.yaml');
  writeFileSync(next, configText('/m2', 'two'));
  t.same(await answers(), allFrom('one', { perProtocol: 3 }), 'before: backend one on every protocol');
  const r = await api(cport, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: next });
  t.equal(r.status, 202, JSON.stringify(r.body));
  t.same(await answers(), allFrom('two', { perProtocol: 3 }), 'the new generation serves (backend two) on every protocol');
  t.equal(await scrape('/m2', '127.0.0.4'), 200, 'the new path answers');
  t.equal(await scrape('/metrics', '127.0.0.4'), 404, 'the old path is gone');
});
