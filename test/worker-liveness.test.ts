// Frozen and dying workers (issue 11 item 11), end to end with real `edge-proxy serve` processes:
// a SIGSTOPped worker is killed and re-forked whether or not the watchdog is on, while the healthy
// worker keeps serving; a watchdog restart is rolling (never every listener closed first) and
// escalates to SIGKILL for a worker that does not drain; a worker that dies during a rolling
// restart, and a re-fork that cannot bind its port, leave the service serving and recovering.
// Most cases first activate generation 2 (backend `gen-b`; generation 1 is `gen-a`), so that what
// is served afterwards, on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections (servedBy), shows that
// every worker, re-forked ones included, serves the generation the control plane calls active.
import t from 'tap';
import type { Test } from 'tap';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import { once } from 'node:events';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import { alive, getFresh, snapshot, waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-liveness-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';

const backend = (answer: string): Promise<number> => namedBackend(t, answer);
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];

interface Instance {
  readonly served: Served;
  readonly proxy: Proxy;
  readonly mport: number;
  /** The same configuration with backend `gen-b`. */
  readonly bFile: string;
}

/** Starts `edge-proxy serve` on generation 1 (backend gen-a); `ca` is what API calls trust (default: the test CA). */
async function start(name: string, extra: { workers: number; performance?: string; watchdog?: string; tls?: { cert: string; key: string }; ca?: Buffer }): Promise<Instance> {
  const ports = await freePorts();
  const text = (backendPort: number): string =>
    serviceConfig({
      ports,
      cert: extra.tls ?? server,
      backendPort,
      performance: `worker_threads: ${extra.workers}${extra.performance === undefined ? '' : `, ${extra.performance}`}`,
      extra: extra.watchdog === undefined ? undefined : `resilience: { watchdog: { ${extra.watchdog} } }`,
      token: { token: TOKEN, role: 'admin', actor: 'liveness-test' },
    });
  const bFile = path.join(dir, `${name}-b.yaml`);
  writeFileSync(bFile, text(pb));
  const served = await serve(path.join(dir, `${name}.yaml`), text(pa));
  t.teardown(() => served.stop());
  return { served, proxy: { lport: ports.l, cport: ports.c, ca: extra.ca ?? caPem, token: TOKEN }, mport: ports.m, bFile };
}

/** Activates generation 2 (backend gen-b) and checks that every worker serves it on every protocol. */
async function toGenerationB(t: Test, inst: Instance): Promise<void> {
  const r = await api(inst.proxy.cport, inst.proxy.ca, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: inst.bFile, expected_generation: 1 });
  t.match(r, { status: 202, body: { generation: 2, status: 'active' } }, 'generation 2 (gen-b) activated');
  t.same(await servedBy(inst.proxy), allFrom('gen-b'), 'every worker serves gen-b on HTTP/1.1, HTTP/2 and HTTP/3');
}

/** `loops` concurrent request loops on fresh connections until stopped; answers `want` (successes) and the rest. */
function load(proxy: Proxy, loops: number, timeoutMs: number, want: string): { stop: () => Promise<{ ok: number; failed: number; okTimes: number[] }> } {
  let running = true;
  let failed = 0;
  const okTimes: number[] = [];
  const loop = async (): Promise<void> => {
    while (running) {
      const body = await getFresh(proxy, timeoutMs);
      if (body === want) okTimes.push(Date.now());
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
  const inst = await start('frozen', { workers: 2, performance: 'worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 8' });
  const { served, proxy, mport } = inst;
  await toGenerationB(t, inst);
  const snap = await snapshot(proxy);
  t.match(snap, { watchdog: { enabled: false }, workers: { unresponsive_after_ms: 2000 } });
  const before = await workers(proxy);
  const victim = before[0]?.pid ?? 0;
  // 8 loops: the chance that every one is stuck on the frozen worker for the whole window is small.
  const during = load(proxy, 8, 1500, 'gen-b');
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
  t.same(await servedBy(proxy), allFrom('gen-b'), 'after the re-fork every request on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections is answered by generation 2');
  const after = await snapshot(proxy);
  const list = (after['workers'] as { list: { pid: number; generation: number; state: string }[]; exits: Record<string, number> }).list;
  t.not(list[0]?.pid, victim, 'worker 0 is a new process');
  t.same(list.map((w) => [w.generation, w.state]), [[2, 'serving'], [2, 'serving']]);
  t.match(after, { generation: 2, workers: { exits: { unresponsive: 1 } } });
  t.match(served.lines.find((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === 0), { generation: 2 });
  t.match(served.lines.find((l) => l['msg'] === 'worker exited' && l['worker'] === 0), { signal: 'SIGKILL', reason: 'unresponsive' });
  t.equal(metricValue(await scrape(mport), 'svc_runtime_panics'), 1, 'the one frozen worker counted as one crash (this serve is its own)');
});

t.test('watchdog on: its restart with a SIGSTOPped worker is rolling, SIGKILLs the frozen worker once it misses a ping, and completes', async (t) => {
  const inst = await start('watchdog', {
    workers: 2,
    // Liveness slow on purpose (120 s): the restart, not the liveness check, must deal with the
    // frozen worker. Heartbeats every 250 ms, so that only a worker silent for 2 windows of 500 ms
    // (not one whose heartbeat a loaded machine delayed a little) makes the watchdog restart.
    performance: 'worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 480',
    watchdog: 'enabled: true, check_interval_ms: 500, unhealthy_consecutive_windows: 2, drain_grace_ms: 3000',
  });
  const { served, proxy } = inst;
  const before = await workers(proxy);
  const frozen = before[1]?.pid ?? 0;
  const during = load(proxy, 6, 400, 'gen-a');
  process.kill(frozen, 'SIGSTOP');
  const requested = await served.waitFor((l) => l['msg'] === 'restart requested', 20_000);
  t.match(requested, { reason: /^watchdog: .*worker_silent/ });
  t.match(await line(served, 'restart: draining and replacing worker'), { worker: 1 }, 'the frozen worker is replaced first');
  const exit = await line(served, 'worker exited', 1);
  t.match(exit, { signal: 'SIGKILL', reason: 'restart' }, 'SIGKILLed: it could not drain');
  await line(served, 'workers restarted', undefined, 60_000);
  // From the restart request until the healthy worker's own turn, by the supervisor's own clock (the
  // lines' times): when the test merely observed the lines, a loaded machine could shrink the
  // window to nothing (the frozen worker is killed within ms of the request).
  const from = Date.parse(String(requested['time']));
  const until = Date.parse(String((await line(served, 'restart: draining and replacing worker', 0))['time']));
  const { ok, okTimes } = await during.stop();
  t.ok(okTimes.some((x) => x > from && x < until), `the healthy worker kept accepting while the frozen one was handled (${ok} ok during the restart; ${okTimes.filter((x) => x > from && x < until).length} in the ${until - from} ms before its own turn)`);
  t.equal(await waitReady(proxy), 200);
  t.same(await servedBy(proxy), allFrom('gen-a'), 'after the restart every request on every protocol is answered by generation 1');
  const after = await snapshot(proxy);
  t.match(after, { generation: 1, watchdog: { restart_requested: false, restart_result: 'completed' } });
  const list = (after['workers'] as { list: { pid: number; generation: number; state: string }[] }).list;
  t.ok(list.every((w, i) => w.pid !== before[i]?.pid), 'both workers were replaced');
  t.same(list.map((w) => [w.generation, w.state]), [[1, 'serving'], [1, 'serving']]);
});

t.test('a worker SIGKILLed during a rolling restart: the restart completes on fresh workers', async (t) => {
  const inst = await start('dies', { workers: 2, watchdog: 'drain_grace_ms: 3000' });
  const { served, proxy } = inst;
  await toGenerationB(t, inst);
  const before = await workers(proxy);
  const r = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/restart', { token: TOKEN });
  t.equal(r.status, 202);
  const first = (await line(served, 'restart: draining and replacing worker'))['worker'] as number;
  const other = 1 - first;
  // The worker the restart has not reached yet dies on its own.
  process.kill(before[other]?.pid ?? 0, 'SIGKILL');
  await line(served, 'workers restarted', undefined, 60_000);
  t.equal(await waitReady(proxy), 200);
  t.match(await snapshot(proxy), { generation: 2, watchdog: { restart_result: 'completed' }, workers: { exits: { exited: 1 } } });
  const list = await workers(proxy);
  t.ok(list.every((w, i) => w.pid !== before[i]?.pid && w.state === 'serving' && w.generation === 2), 'both workers are new and serve generation 2');
  t.same(await servedBy(proxy), allFrom('gen-b'), 'every request on every protocol is answered by generation 2');
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
  const inst = await start('bind', { workers: 1, watchdog: 'drain_grace_ms: 1000' });
  const { served, proxy } = inst;
  await toGenerationB(t, inst);
  const victim = (await workers(proxy))[0]?.pid ?? 0;
  process.kill(victim, 'SIGKILL');
  const squatter = await squat(proxy.lport);
  const failure = await line(served, 'worker re-fork failed: retrying with backoff', 0);
  t.match(failure, { code: /ADDRINUSE|EDGE_/ });
  t.equal((await api(proxy.cport, proxy.ca, 'GET', '/ready')).status, 503, 'not ready while no worker serves');
  await new Promise<void>((r) => squatter.close(() => r()));
  t.match(await line(served, 'worker re-forked on the active generation', 0), { generation: 2 });
  t.equal(await waitReady(proxy), 200);
  t.same(await servedBy(proxy), allFrom('gen-b'), 'the re-fork serves generation 2 on every protocol');
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
  t.same((await workers(proxy)).map((w) => [w.generation, w.state]), [[2, 'serving']]);
  t.same(await servedBy(proxy), allFrom('gen-b'), 'and serves generation 2 on every protocol');
});

/** The certificate fingerprint a fresh TLS connection to the listener is served (`trusted`: the CAs accepted). */
function servedFingerprint(port: number, trusted: Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: trusted, ALPNProtocols: ['http/1.1'] }, () => {
      const fp = socket.getPeerCertificate().fingerprint256;
      socket.destroy();
      resolve(fp);
    });
    socket.setTimeout(3000, () => socket.destroy(new Error('timeout')));
    socket.on('error', reject);
  });
}

t.test('a worker re-forked after reload-certs is handed the reloaded certificate too: on TCP and on QUIC, by every worker', async (t) => {
  const files = { cert: path.join(dir, 'rc.crt'), key: path.join(dir, 'rc.key') };
  copyFileSync(server.cert, files.cert);
  copyFileSync(server.key, files.key);
  // The reloaded certificate is issued by another CA: a client that trusts only that CA completes
  // a handshake (TLS for HTTP/1.1 and HTTP/2, QUIC for HTTP/3) only with a worker that presents it.
  const ca2 = makeCa(path.join(dir, 'next'), 'ca2', '/CN=edge-proxy test CA 2');
  const ca2Pem = readFileSync(ca2.cert);
  const both = Buffer.concat([caPem, ca2Pem]);
  const { served, proxy } = await start('reload-certs', { workers: 2, tls: files, ca: both });
  const next = makeLeaf(path.join(dir, 'next'), 'server', ca2, { sans: ['localhost', '127.0.0.1'] });
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
    const fp = await servedFingerprint(proxy.lport, both);
    const k = fp === wanted ? 'reloaded' : 'stale';
    seen[k] = (seen[k] ?? 0) + 1;
  }
  t.same(seen, { reloaded: 30 }, 'every TLS connection, on either worker, gets the reloaded certificate');
  t.same(await servedBy({ lport: proxy.lport, ca: ca2Pem }), allFrom('gen-a'), 'trusting only the new CA, every HTTP/1.1, HTTP/2 and HTTP/3 connection (TLS and QUIC handshakes) succeeds');
  const old = await servedBy({ lport: proxy.lport, ca: caPem }, { perProtocol: 2 });
  t.same(
    Object.values(old).flatMap((tally) => Object.keys(tally).filter((a) => !a.startsWith('error: '))),
    [],
    `trusting only the old CA, no handshake succeeds on any protocol (${JSON.stringify(old)})`,
  );
});

t.test('an activation during a rolling restart succeeds, and every worker ends on the new generation', async (t) => {
  const { served, proxy, bFile } = await start('restart-activate', { workers: 2, watchdog: 'drain_grace_ms: 3000' });
  t.equal((await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/restart', { token: TOKEN })).status, 202);
  await line(served, 'restart: draining and replacing worker');
  // The worker being drained takes no part; its replacement is handed generation 2.
  const act = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: bFile, expected_generation: 1 });
  t.match(act, { status: 202, body: { generation: 2 } });
  await line(served, 'workers restarted', undefined, 60_000);
  t.equal(await waitReady(proxy), 200);
  t.same((await workers(proxy)).map((w) => [w.generation, w.state]), [[2, 'serving'], [2, 'serving']]);
  t.same(await servedBy(proxy), allFrom('gen-b'), 'every request on every protocol is answered by generation 2 (gen-b)');
  // The workers the restart brought up take the next activation too.
  const rb = await api(proxy.cport, proxy.ca, 'POST', '/admin/runtime/rollback', { token: TOKEN }, { target_generation: 1, expected_active_generation: 2 });
  t.match(rb, { status: 202, body: { generation: 1 } });
  t.same(await servedBy(proxy), allFrom('gen-a'), 'after rollback to generation 1 every request on every protocol is answered by gen-a');
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
  for (let i = 0; i < 150 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 100)); // other processes: poll, bounded (15 s)
  const took = Date.now() - killedAt;
  t.same(pids.filter(alive), [], `no worker outlives its supervisor (${took} ms)`);
  t.ok(took < 10_000, `gone within ${took} ms (deadline 5000 ms)`);
});
