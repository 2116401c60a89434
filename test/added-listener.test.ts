// A listener added by activation is live (issue 12 item 7): a real `edge-proxy serve` with two
// workers; an activation adds a TLS listener, and every worker binds it at commit (checked in each
// worker's own file descriptors), it answers HTTPS (HTTP/1.1, HTTP/2) and HTTP/3 with an Alt-Svc
// naming its own port, the runtime snapshot lists it, and a worker re-forked afterwards binds it
// too. An added listener whose port another program holds fails the activation in prepare with
// EDGE_LISTENER_BIND_FAILED, and nothing changes: the active generation serves on, and the same
// listener activates once the port is free.
import t from 'tap';
import https from 'node:https';
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
import { holdsPort } from './support/sockets.ts';
import { snapshot, waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-added-listener-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';
const backendPort = await namedBackend(t, 'app');
const [pa, pb, pc, cport, mport] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];

const listener = (name: string, port: number): string => `  - { name: ${name}, address: 127.0.0.1, port: ${port}, alt_svc_max_age_s: 600, tls: { cert: ${server.cert}, key: ${server.key} } }\n`;
const configText = (...ls: [string, number][]): string => `
listeners:
${ls.map(([n, p]) => listener(n, p)).join('')}
log: { format: json, level: info }
performance: { worker_threads: 2, worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 8 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backendPort}" }] } }
observability:
  routing: { enabled: true }
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: listener-test }] }
`;

const served = await serve(path.join(dir, 'one.yaml'), configText(['a', pa]), 60_000);
t.teardown(() => served.stop());
const call = (method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKEN }, body);
const proxy = (lport: number): Proxy => ({ lport, cport, ca: caPem, token: TOKEN });

/** The Alt-Svc header of one HTTP/1.1 answer on `port`. */
function altSvc(port: number): Promise<string | undefined> {
  return new Promise((resolve, reject) => {
    https
      .get({ host: '127.0.0.1', port, path: '/', ca: caPem, servername: 'localhost', agent: false }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.headers['alt-svc'] as string | undefined));
      })
      .on('error', reject);
  });
}

/** Every worker (pid from the snapshot) holds a listening TCP socket and a UDP socket on `port`. */
async function boundByEveryWorker(port: number): Promise<{ pid: number; tcp: boolean; udp: boolean }[]> {
  return (await workers(proxy(pa))).map((w) => ({ pid: w.pid, ...holdsPort(w.pid, port) }));
}

t.test('an added listener is bound by every worker at commit and answers HTTPS and HTTP/3', async (t) => {
  t.same((await boundByEveryWorker(pb)).map((w) => [w.tcp, w.udp]), [[false, false], [false, false]], 'before: no worker holds port b');
  const next = path.join(dir, 'two.yaml');
  writeFileSync(next, configText(['a', pa], ['b', pb]));
  const r = await call('POST', '/admin/runtime/activate', { config_path: next, expected_generation: 1 });
  t.match(r, { status: 202, body: { generation: 2, diff: { domains: { listeners: { activation: 'live', changes: [{ path: 'listeners[b]', change: 'added', activation: 'live' }] } } } } });
  // No wait: the activation answered after every worker committed, so the sockets are there now.
  const bound = await boundByEveryWorker(pb);
  t.equal(bound.length, 2);
  t.same(bound.map((w) => [w.tcp, w.udp]), [[true, true], [true, true]], `both workers hold TCP and UDP sockets on port b (${JSON.stringify(bound)})`);
  t.same(await servedBy({ lport: pb, ca: caPem }), allFrom('app'), 'listener b answers on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections');
  t.same(await servedBy({ lport: pa, ca: caPem }, { perProtocol: 3 }), allFrom('app', { perProtocol: 3 }), 'listener a serves on');
  t.equal(await altSvc(pb), `h3=":${pb}"; ma=600`, 'b advertises HTTP/3 on its own port');
  const snap = await snapshot(proxy(pa));
  t.same(Object.keys((snap['tls'] as { listeners: Record<string, unknown> }).listeners).sort(), ['a', 'b'], 'the snapshot TLS view lists the added listener');
  t.match(snap, { generation: 2, readiness: 'ready' });
});

t.test('a worker re-forked after the activation binds the added listener too', async (t) => {
  const before = await workers(proxy(pa));
  const victim = before[1]?.pid ?? 0;
  process.kill(victim, 'SIGKILL');
  await served.waitFor((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === 1 && l['generation'] === 2, 30_000);
  t.equal(await waitReady(proxy(pa)), 200);
  const after = await boundByEveryWorker(pb);
  t.not(after[1]?.pid, victim, 'worker 1 is a new process');
  t.same(after.map((w) => [w.tcp, w.udp]), [[true, true], [true, true]], `the new worker holds port b as well (${JSON.stringify(after)})`);
  t.same(await servedBy({ lport: pb, ca: caPem }), allFrom('app'), 'listener b answers on every protocol');
});

t.test('an added listener whose port is taken fails the activation in prepare with EDGE_LISTENER_BIND_FAILED; nothing changes', async (t) => {
  // Another program holds port c (TCP, without SO_REUSEPORT): no worker can bind it.
  const squatter = net.createServer((s) => s.destroy());
  squatter.listen(pc, '127.0.0.1');
  await once(squatter, 'listening');
  const third = path.join(dir, 'three.yaml');
  writeFileSync(third, configText(['a', pa], ['b', pb], ['c', pc]));
  const r = await call('POST', '/admin/runtime/activate', { config_path: third, expected_generation: 2 });
  t.match(r, { status: 500, body: { reason: 'prepare_failed', code: 'EDGE_LISTENER_BIND_FAILED', generation: 3, active_generation: 2, message: new RegExp(`listener c \\(127\\.0\\.0\\.1:${pc}\\) could not be bound: EADDRINUSE`) } });
  t.match((await call('GET', '/admin/runtime/history/3')).body, { retained_generation: { status: 'failed_prepare' } });
  // One error line, the supervisor's: its probe bind without SO_REUSEPORT (listener-probe.ts,
  // issue 38 finding 11) finds the port taken before any worker is asked to bind it.
  const bindLines = () => served.lines.filter((l) => l['code'] === 'EDGE_LISTENER_BIND_FAILED');
  await served.waitFor((l) => l['code'] === 'EDGE_LISTENER_BIND_FAILED');
  t.equal(bindLines().length, 1, 'one error line');
  t.match(bindLines()[0], { level: 'error', generation: 3, phase: 'prepare', err: /listener c .*EADDRINUSE/ }, 'naming the code, the generation and the listener');
  t.notMatch(served.text(), /\n\s+at .+:\d+:\d+\)?\n/, 'no stack trace in the output');
  t.match(await snapshot(proxy(pa)), { generation: 2, readiness: 'ready' }, 'generation 2 stays active and ready');
  const list = await workers(proxy(pa));
  t.same(list.map((w) => [w.generation, w.state]), [[2, 'serving'], [2, 'serving']], 'no worker was killed or moved');
  t.same((await boundByEveryWorker(pc)).map((w) => [w.tcp, w.udp]), [[false, false], [false, false]], 'no worker kept a socket on port c');
  t.same(await servedBy({ lport: pa, ca: caPem }, { perProtocol: 3 }), allFrom('app', { perProtocol: 3 }), 'listener a serves on');
  t.same(await servedBy({ lport: pb, ca: caPem }, { perProtocol: 3 }), allFrom('app', { perProtocol: 3 }), 'listener b serves on');

  // Once the port is free the same candidate activates: the failure left nothing behind.
  await new Promise<void>((resolve) => squatter.close(() => resolve()));
  const again = await call('POST', '/admin/runtime/activate', { config_path: third, expected_generation: 2 });
  t.match(again, { status: 202, body: { generation: 4 } });
  t.same((await boundByEveryWorker(pc)).map((w) => [w.tcp, w.udp]), [[true, true], [true, true]], 'both workers now hold port c');
  t.same(await servedBy({ lport: pc, ca: caPem }, { perProtocol: 3 }), allFrom('app', { perProtocol: 3 }), 'listener c answers on every protocol');
});

t.test('a rollback to a generation without an added listener is refused 409 restart_required: removing a listener needs a restart', async (t) => {
  const r = await call('POST', '/admin/runtime/rollback', { target_generation: 2, expected_active_generation: 4 });
  t.match(r, { status: 409, body: { reason: 'restart_required', rejected_changes: [{ path: 'listeners[c]', change: 'removed', activation: 'restart_required', reason: 'listener removal' }] } });
  t.match(await snapshot(proxy(pa)), { generation: 4 }, 'generation 4 stays active');
  t.same(await servedBy({ lport: pc, ca: caPem }, { perProtocol: 2 }), allFrom('app', { perProtocol: 2 }), 'listener c serves on');
});
