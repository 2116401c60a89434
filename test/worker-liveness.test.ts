// Frozen and dying workers (issue 11 item 11), end to end with real `edge-proxy serve` processes:
// a SIGSTOPped worker is killed and re-forked whether or not the watchdog is on, while the healthy
// worker keeps serving; a watchdog restart is rolling (never every listener closed first) and
// escalates to SIGKILL for a worker that does not drain; a worker that dies during a rolling
// restart, and a re-fork that cannot bind its port, leave the service serving and recovering.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import { once } from 'node:events';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { getFresh, getMany, snapshot, tally, waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-liveness-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';

const upstream = http.createServer((_req, res) => res.end('ok'));
upstream.listen(0, '127.0.0.1');
await once(upstream, 'listening');
t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
const bport = (upstream.address() as AddressInfo).port;

async function start(name: string, extra: { workers: number; performance?: string; watchdog?: string; tls?: { cert: string; key: string } }): Promise<{ served: Served; proxy: Proxy; mport: number }> {
  const ports = { l: await freePort(), c: await freePort(), m: await freePort() };
  const text = `
listen: { address: 127.0.0.1, port: ${ports.l}, tls: { cert: ${(extra.tls ?? server).cert}, key: ${(extra.tls ?? server).key} } }
log: { format: json, level: info }
performance: { worker_threads: ${extra.workers}${extra.performance === undefined ? '' : `, ${extra.performance}`} }
${extra.watchdog === undefined ? '' : `resilience: { watchdog: { ${extra.watchdog} } }`}
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${bport}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${ports.m} }
  control_api:
    address: 127.0.0.1
    port: ${ports.c}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: liveness-test }] }
`;
  const served = await serve(path.join(dir, `${name}.yaml`), text);
  t.teardown(() => served.stop());
  return { served, proxy: { lport: ports.l, cport: ports.c, ca: caPem, token: TOKEN }, mport: ports.m };
}

/** `loops` concurrent request loops on fresh connections until stopped; successes and failures. */
function load(proxy: Proxy, loops: number, timeoutMs: number): { stop: () => Promise<{ ok: number; failed: number; okTimes: number[] }> } {
  let running = true;
  let failed = 0;
  const okTimes: number[] = [];
  const loop = async (): Promise<void> => {
    while (running) {
      const body = await getFresh(proxy, timeoutMs);
      if (body === 'ok') okTimes.push(Date.now());
      else failed++;
    }
  };
  const all = Array.from({ length: loops }, loop);
  return {
    async stop() {
      running = false;
      await Promise.all(all);
      return { ok: okTimes.length, failed, okTimes };
    },
  };
}

const line = (s: Served, msg: string, worker?: number, timeoutMs = 30_000) => s.waitFor((l) => l['msg'] === msg && (worker === undefined || l['worker'] === worker), timeoutMs);

t.test('watchdog off (the default): a SIGSTOPped worker is killed within the silence limit and re-forked; the healthy one keeps serving', async (t) => {
  const { served, proxy, mport } = await start('frozen', { workers: 2, performance: 'worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 8' });
  const snap = await snapshot(proxy);
  t.match(snap, { watchdog: { enabled: false }, workers: { unresponsive_after_ms: 2000 } });
  const before = await workers(proxy);
  const victim = before[0]?.pid ?? 0;
  const during = load(proxy, 4, 1500);
  const stoppedAt = Date.now();
  process.kill(victim, 'SIGSTOP');
  const killed = await line(served, 'worker unresponsive: killed (SIGKILL), re-forking it', 0, 20_000);
  const detectedMs = Date.now() - stoppedAt;
  t.ok(detectedMs < 8000, `killed ${detectedMs} ms after it froze (limit 2000 ms + checks every 125 ms)`);
  t.ok((killed['silent_ms'] as number) > 2000, `silent ${killed['silent_ms'] as number} ms when killed`);
  t.equal((await api(proxy.cport, proxy.ca, 'GET', '/ready')).status, 503, '/ready 503 until the replacement serves');
  await line(served, 'worker re-forked on the active generation', 0);
  t.equal(await waitReady(proxy), 200, '/ready 200 once it serves');
  const { ok, failed, okTimes } = await during.stop();
  t.ok(okTimes.some((x) => x > stoppedAt && x < stoppedAt + detectedMs), `requests kept succeeding while worker 0 was frozen (${ok} ok, ${failed} lost to the frozen worker)`);
  t.same(tally(await getMany(proxy, 20)), { ok: 20 }, 'after the re-fork 20/20 requests on fresh connections succeed');
  const after = await snapshot(proxy);
  const list = (after['workers'] as { list: { pid: number; generation: number; state: string }[]; exits: Record<string, number> }).list;
  t.not(list[0]?.pid, victim, 'worker 0 is a new process');
  t.same(list.map((w) => [w.generation, w.state]), [[1, 'serving'], [1, 'serving']]);
  t.match(after, { workers: { exits: { unresponsive: 1 } } });
  t.match(served.lines.find((l) => l['msg'] === 'worker exited' && l['worker'] === 0), { signal: 'SIGKILL', reason: 'unresponsive' });
  t.equal(metricValue(await scrape(mport), 'svc_runtime_panics'), 1, 'the one frozen worker counted as one crash (this serve is its own)');
});

t.test('watchdog on: its restart with a SIGSTOPped worker is rolling, SIGKILLs the frozen worker once it misses a ping, and completes', async (t) => {
  const { served, proxy } = await start('watchdog', {
    workers: 2,
    // Liveness slow on purpose: the restart, not the liveness check, must deal with the frozen worker.
    performance: 'worker_heartbeat_ms: 1000, worker_unresponsive_heartbeats: 120',
    watchdog: 'enabled: true, check_interval_ms: 500, unhealthy_consecutive_windows: 2, drain_grace_ms: 3000',
  });
  const before = await workers(proxy);
  const frozen = before[1]?.pid ?? 0;
  const during = load(proxy, 6, 400);
  process.kill(frozen, 'SIGSTOP');
  const requested = await served.waitFor((l) => l['msg'] === 'restart requested', 20_000);
  const requestedAt = Date.now();
  t.match(requested, { reason: /^watchdog: .*worker_silent/ });
  t.match(await line(served, 'restart: draining and replacing worker'), { worker: 1 }, 'the frozen worker is replaced first');
  const exit = await line(served, 'worker exited', 1);
  const frozenGoneAt = Date.now();
  t.match(exit, { signal: 'SIGKILL', reason: 'restart' }, 'SIGKILLed: it could not drain');
  await line(served, 'workers restarted', undefined, 60_000);
  const { ok, okTimes } = await during.stop();
  t.ok(okTimes.some((x) => x > requestedAt && x < frozenGoneAt), `the healthy worker kept accepting while the frozen one was handled (${ok} ok during the restart)`);
  t.equal(await waitReady(proxy), 200);
  t.same(tally(await getMany(proxy, 20)), { ok: 20 }, 'after the restart 20/20 succeed');
  const after = await snapshot(proxy);
  t.match(after, { watchdog: { restart_requested: false, restart_result: 'completed' } });
  const list = (after['workers'] as { list: { pid: number }[] }).list;
  t.ok(list.every((w, i) => w.pid !== before[i]?.pid), 'both workers were replaced');
});

t.test('a worker SIGKILLed during a rolling restart: the restart completes on fresh workers', async (t) => {
  const { served, proxy } = await start('dies', { workers: 2, watchdog: 'drain_grace_ms: 3000' });
  const before = await workers(proxy);
  const r = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/restart', { token: TOKEN });
  t.equal(r.status, 202);
  const first = (await line(served, 'restart: draining and replacing worker'))['worker'] as number;
  const other = 1 - first;
  // The worker the restart has not reached yet dies on its own.
  process.kill(before[other]?.pid ?? 0, 'SIGKILL');
  await line(served, 'workers restarted', undefined, 60_000);
  t.equal(await waitReady(proxy), 200);
  t.match(await snapshot(proxy), { watchdog: { restart_result: 'completed' }, workers: { exits: { exited: 1 } } });
  const list = await workers(proxy);
  t.ok(list.every((w, i) => w.pid !== before[i]?.pid && w.state === 'serving' && w.generation === 1), 'both workers are new and serve generation 1');
  t.same(tally(await getMany(proxy, 20)), { ok: 20 });
});

/** Takes the listener's TCP port as soon as it is free (bounded), so a re-fork cannot bind it. */
async function squat(port: number): Promise<net.Server> {
  for (let i = 0; i < 1500; i++) {
    const s = net.createServer();
    const bound = await new Promise<boolean>((resolve) => {
      s.once('error', () => resolve(false));
      s.listen({ host: '127.0.0.1', port }, () => resolve(true));
    });
    if (bound) return s;
    await new Promise((r) => setTimeout(r, 20)); // the port is held by another process: poll, bounded
  }
  throw new Error(`port ${port} never became free`);
}

t.test('a re-fork that cannot bind (port taken): retried with backoff, /ready 503 meanwhile, serving again once the port is free', async (t) => {
  const { served, proxy } = await start('bind', { workers: 1, watchdog: 'drain_grace_ms: 1000' });
  const victim = (await workers(proxy))[0]?.pid ?? 0;
  process.kill(victim, 'SIGKILL');
  const squatter = await squat(proxy.lport);
  const failure = await line(served, 'worker re-fork failed: retrying with backoff', 0);
  t.match(failure, { code: /ADDRINUSE|EDGE_/ });
  t.equal((await api(proxy.cport, proxy.ca, 'GET', '/ready')).status, 503, 'not ready while no worker serves');
  await new Promise<void>((r) => squatter.close(() => r()));
  await line(served, 'worker re-forked on the active generation', 0);
  t.equal(await waitReady(proxy), 200);
  t.same(tally(await getMany(proxy, 10)), { ok: 10 });
  // Each attempt that could not bind was taken out with its own 'worker exited' line: the counter matches them.
  const handoverExits = served.lines.filter((l) => l['msg'] === 'worker exited' && l['reason'] === 'handover_failed').length;
  t.ok(handoverExits >= 1, `${handoverExits} failed handovers logged`);
  t.equal(((await snapshot(proxy))['workers'] as { exits: Record<string, number> }).exits['handover_failed'], handoverExits, 'and each counted once in workers.exits');

  // The same during a rolling restart: the restart stops, the slot keeps being retried.
  const r = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/restart', { token: TOKEN });
  t.equal(r.status, 202);
  const squatter2 = await squat(proxy.lport);
  const stopped = await line(served, 'restart stopped: the other workers keep serving', undefined, 60_000);
  t.match(stopped, { worker: 0 });
  t.match(await snapshot(proxy), { watchdog: { restart_requested: false, restart_result: 'failed' } });
  await new Promise<void>((r2) => squatter2.close(() => r2()));
  t.equal(await waitReady(proxy), 200, 'serving again once the port is free');
  t.same(tally(await getMany(proxy, 10)), { ok: 10 });
});

/** The certificate fingerprint a fresh TLS connection to the listener is served. */
function servedFingerprint(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] }, () => {
      const fp = socket.getPeerCertificate().fingerprint256;
      socket.destroy();
      resolve(fp);
    });
    socket.setTimeout(3000, () => socket.destroy(new Error('timeout')));
    socket.on('error', reject);
  });
}

t.test('a worker re-forked after reload-certs is handed the reloaded certificate too', async (t) => {
  const files = { cert: path.join(dir, 'rc.crt'), key: path.join(dir, 'rc.key') };
  copyFileSync(server.cert, files.cert);
  copyFileSync(server.key, files.key);
  const { served, proxy } = await start('reload-certs', { workers: 2, tls: files });
  const next = makeLeaf(path.join(dir, 'next'), 'server', ca, { sans: ['localhost', '127.0.0.1'] });
  copyFileSync(next.cert, files.cert);
  copyFileSync(next.key, files.key);
  const wanted = new X509Certificate(readFileSync(next.cert)).fingerprint256;
  t.equal((await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/reload-certs', { token: TOKEN })).status, 200);
  const victim = (await workers(proxy))[0]?.pid ?? 0;
  process.kill(victim, 'SIGKILL');
  await line(served, 'worker re-forked on the active generation', 0);
  t.equal(await waitReady(proxy), 200);
  const seen: Record<string, number> = {};
  for (let i = 0; i < 30; i++) {
    const fp = await servedFingerprint(proxy.lport);
    const k = fp === wanted ? 'reloaded' : 'stale';
    seen[k] = (seen[k] ?? 0) + 1;
  }
  t.same(seen, { reloaded: 30 }, 'every connection, on either worker, gets the reloaded certificate');
});

t.test('an activation during a rolling restart succeeds, and every worker ends on the new generation', async (t) => {
  const { served, proxy } = await start('restart-activate', { workers: 2, watchdog: 'drain_grace_ms: 3000' });
  t.equal((await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/restart', { token: TOKEN })).status, 202);
  await line(served, 'restart: draining and replacing worker');
  // The worker being drained takes no part; its replacement is handed generation 2.
  const act = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/activate', { token: TOKEN }, { expected_generation: 1 });
  t.match(act, { status: 202, body: { generation: 2 } });
  await line(served, 'workers restarted', undefined, 60_000);
  t.equal(await waitReady(proxy), 200);
  t.same((await workers(proxy)).map((w) => [w.generation, w.state]), [[2, 'serving'], [2, 'serving']]);
  t.same(tally(await getMany(proxy, 20)), { ok: 20 });
});

t.test('the supervisor SIGKILLed: its workers exit within the deadline even with client connections open', async (t) => {
  const { served, proxy } = await start('orphans', { workers: 2 });
  const pids = (await workers(proxy)).map((w) => w.pid);
  // An idle HTTP/2 connection, an idle HTTP/1.1 keep-alive connection and an HTTP/3 one, all left open.
  const session = http2.connect(`https://127.0.0.1:${proxy.lport}`, { ca: caPem, servername: 'localhost' });
  session.on('error', () => undefined);
  const h2 = session.request({ ':path': '/' });
  h2.resume();
  await once(h2, 'end');
  const agent = new https.Agent({ keepAlive: true });
  await new Promise<void>((resolve, reject) => {
    https.get({ host: '127.0.0.1', port: proxy.lport, path: '/', ca: caPem, servername: 'localhost', agent }, (res) => res.resume().on('end', resolve)).on('error', reject);
  });
  const h3 = await Http3ClientSession.connect({ host: '127.0.0.1', port: proxy.lport, serverName: 'localhost', ca: caPem });
  t.equal((await h3.fetch({ path: '/' })).status, 200);
  t.teardown(async () => {
    session.destroy();
    agent.destroy();
    await h3.close(true).catch(() => undefined);
  });
  const killedAt = Date.now();
  served.proc.kill('SIGKILL');
  await once(served.proc, 'exit');
  const alive = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  for (let i = 0; i < 150 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 100)); // other processes: poll, bounded (15 s)
  const took = Date.now() - killedAt;
  t.same(pids.filter(alive), [], `no worker outlives its supervisor (${took} ms)`);
  t.ok(took < 10_000, `gone within ${took} ms (deadline 5000 ms)`);
});
