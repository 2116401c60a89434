// Generations under load, end to end: `edge-proxy serve` with two workers, continuous HTTP/1.1 and
// HTTP/3 traffic, 25 activations and 25 rollbacks in a row; then a worker killed with SIGKILL.
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { api, serve } from './support/serve.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-cp-load-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'operator-token-0123456789abcdef';

async function backend(answer: string): Promise<number> {
  const s = http.createServer((_req, res) => res.end(answer));
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  t.teardown(() => new Promise<void>((r) => s.close(() => r())));
  return (s.address() as AddressInfo).port;
}
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];

function configText(backendPort: number): string {
  return `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backendPort}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: load-test }] }
`;
}
const aFile = path.join(dir, 'a.yaml');
const bFile = path.join(dir, 'b.yaml');
writeFileSync(bFile, configText(pb));
const served = await serve(aFile, configText(pa));
t.teardown(() => served.stop());
const call = (method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKEN }, body);

/** Continuous load: `h1` HTTP/1.1 loops (keep-alive) and `h3` HTTP/3 loops on one connection each. */
function startLoad(h1: number, h3: number): { stop: () => Promise<{ ok: number; bad: string[] }> } {
  let running = true;
  let ok = 0;
  const bad: string[] = [];
  const record = (status: number, body: string): void => {
    if (status === 200 && (body === 'gen-a' || body === 'gen-b')) ok++;
    else bad.push(`${status} ${body.slice(0, 60)}`);
  };
  const agent = new https.Agent({ keepAlive: true, maxSockets: h1 });
  const h1loop = async (): Promise<void> => {
    while (running) {
      await new Promise<void>((resolve) => {
        const req = https.get({ host: '127.0.0.1', port: lport, path: '/', ca: caPem, servername: 'localhost', agent }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => {
            record(res.statusCode ?? 0, body);
            resolve();
          });
        });
        req.on('error', (err) => {
          bad.push(`h1 error ${err.message}`);
          resolve();
        });
      });
    }
  };
  const h3loop = async (): Promise<void> => {
    const session = await Http3ClientSession.connect({ host: '127.0.0.1', port: lport, serverName: 'localhost', ca: caPem });
    try {
      while (running) {
        const r = await session.fetch({ path: '/' }).catch((err: Error) => ({ status: -1, body: Buffer.from(`h3 error ${err.message}`) }));
        record(r.status, r.body.toString());
      }
    } finally {
      await session.close(true);
    }
  };
  const loops = [...Array.from({ length: h1 }, h1loop), ...Array.from({ length: h3 }, h3loop)];
  return {
    async stop() {
      running = false;
      await Promise.all(loops);
      agent.destroy();
      return { ok, bad };
    },
  };
}

t.test('25 activations and 25 rollbacks under HTTP/1.1 and HTTP/3 load lose no request', async (t) => {
  const load = startLoad(2, 2);
  let active = 1;
  for (let i = 0; i < 25; i++) {
    const target = i % 2 === 0 ? bFile : aFile;
    const act = await call('POST', '/admin/runtime/activate', { config_path: target, expected_generation: active, reason: `load ${i}` });
    t.equal(act.status, 202, `activation ${i}`);
    const previous = active;
    active = act.body['generation'] as number;
    const rb = await call('POST', '/admin/runtime/rollback', { target_generation: previous, expected_active_generation: active, reason: `undo ${i}` });
    t.equal(rb.status, 202, `rollback ${i}`);
    active = previous;
    // Make the next activation go to the other config: activate it for real before continuing.
    const fwd = await call('POST', '/admin/runtime/activate', { config_path: target, expected_generation: active });
    t.equal(fwd.status, 202);
    active = fwd.body['generation'] as number;
  }
  const { ok, bad } = await load.stop();
  t.same(bad, [], 'no failed request and every answer from exactly one backend');
  t.ok(ok > 200, `${ok} requests answered during the activations`);
});

t.test('SIGKILL of a worker under load: re-forked on the active generation; /ready and metrics keep answering', async (t) => {
  const before = await call('GET', '/admin/runtime');
  const workers = (before.body['workers'] as { list: { pid: number; generation: number }[] }).list;
  const generation = before.body['generation'];
  t.equal(workers.length, 2);
  const load = startLoad(2, 0);
  const panicsBefore = metricValue(await scrape(mport), 'svc_runtime_panics');
  process.kill(workers[0]?.pid ?? 0, 'SIGKILL');
  const metricsDuring = await new Promise<number>((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    }).on('error', reject);
  });
  t.equal(metricsDuring, 200, 'the metrics endpoint answers while a worker is down');
  await served.waitFor((l) => l['msg'] === 'worker re-forked on the active generation', 30_000);
  let ready = 0;
  for (let i = 0; i < 80 && ready !== 200; i++) {
    ready = (await call('GET', '/ready')).status;
    if (ready !== 200) await new Promise((r) => setTimeout(r, 250)); // other processes: poll, bounded
  }
  t.equal(ready, 200, '/ready is 200 again');
  const after = await call('GET', '/admin/runtime');
  const list = (after.body['workers'] as { list: { pid: number; generation: number }[] }).list;
  t.not(list[0]?.pid, workers[0]?.pid, 'a new worker process');
  t.same(list.map((w) => w.generation), [generation, generation], 'both workers on the active generation');
  const during = await load.stop();
  t.ok(during.ok > 0, `${during.ok} requests answered while the worker was replaced (${during.bad.length} lost on the killed worker's connections)`);
  const afterLoad = startLoad(2, 1);
  await new Promise((r) => setTimeout(r, 1000)); // a bounded window of traffic (a load figure, not synchronisation)
  const { ok, bad } = await afterLoad.stop();
  t.same(bad, [], 'after the re-fork every request succeeds');
  t.ok(ok > 10);
  t.equal(metricValue(await scrape(mport), 'svc_runtime_panics') - panicsBefore, 1, 'the one worker crash is counted once');
});
