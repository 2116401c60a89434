// A worker that dies or hangs in the middle of an activation (issue 11 item 6), end to end: real
// `edge-proxy serve` with two workers, two backends that answer `gen-a` and `gen-b`, and the
// test-only EDGE_TEST_PAUSE hook holding worker 1 (or 0) at a named step so that SIGKILL or
// SIGSTOP lands in that exact window. In every case what the control plane calls active
// (history, snapshot, the response) is what every worker serves: checked with real requests on
// fresh connections, which the kernel spreads over both workers' SO_REUSEPORT sockets.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { getMany, snapshot, tally, waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-act-fail-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';
const N = 30;

async function backend(answer: string): Promise<number> {
  const s = http.createServer((_req, res) => res.end(answer));
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  t.teardown(() => new Promise<void>((r) => s.close(() => r())));
  return (s.address() as AddressInfo).port;
}
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];

function configText(ports: { l: number; c: number; m: number }, backendPort: number): string {
  return `
listen: { address: 127.0.0.1, port: ${ports.l}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2, worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 8 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backendPort}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${ports.m} }
  control_api:
    address: 127.0.0.1
    port: ${ports.c}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: failure-test }] }
`;
}

interface Instance {
  readonly served: Served;
  readonly proxy: Proxy;
  readonly bFile: string;
  readonly aFile: string;
  call(method: string, p: string, body?: unknown): ReturnType<typeof api>;
}

/** A fresh `edge-proxy serve` (generation 1 = backend gen-a) with the pause hook set to `pause`. */
async function start(name: string, pause: string): Promise<Instance> {
  const ports = { l: await freePort(), c: await freePort(), m: await freePort() };
  const aFile = path.join(dir, `${name}-a.yaml`);
  const bFile = path.join(dir, `${name}-b.yaml`);
  writeFileSync(bFile, configText(ports, pb));
  const served = await serve(aFile, configText(ports, pa), 60_000, { EDGE_TEST_PAUSE: pause });
  t.teardown(() => served.stop());
  const proxy: Proxy = { lport: ports.l, cport: ports.c, ca: caPem, token: TOKEN };
  return { served, proxy, aFile, bFile, call: (method, p, body) => api(ports.c, caPem, method, p, { token: TOKEN }, body) };
}

const paused = (s: Served, step: string, worker: number, generation: number) =>
  s.waitFor((l) => l['msg'] === 'test hook: paused' && l['step'] === step && l['worker'] === worker && l['generation'] === generation, 30_000);

/** Every worker serves `generation` (snapshot) and every request on a fresh connection answers `body`. */
async function assertServes(t: Test, inst: Instance, generation: number, body: string): Promise<void> {
  const history = (await inst.call('GET', '/admin/runtime/history')).body;
  t.equal(history['active_generation'], generation, `history calls generation ${generation} active`);
  t.equal((await snapshot(inst.proxy))['generation'], generation, 'the snapshot agrees');
  t.equal(await waitReady(inst.proxy), 200, '/ready 200');
  const list = await workers(inst.proxy);
  t.same(
    list.map((w) => [w.generation, w.state]),
    list.map(() => [generation, 'serving']),
    `every worker reports generation ${generation}`,
  );
  t.same(tally(await getMany(inst.proxy, N)), { [body]: N }, `${N}/${N} requests on fresh connections answered by ${body}`);
}

/** Activation and rollback still work afterwards. */
async function assertRecovers(t: Test, inst: Instance, active: number): Promise<void> {
  const act = await inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: active });
  t.equal(act.status, 202, 'a later activation succeeds');
  const g = act.body['generation'] as number;
  await assertServes(t, inst, g, 'gen-b');
  const rb = await inst.call('POST', '/admin/runtime/rollback', { target_generation: 1, expected_active_generation: g });
  t.equal(rb.status, 202, 'rollback to generation 1 succeeds');
  await assertServes(t, inst, 1, 'gen-a');
}

t.test('(a) worker SIGKILLed before it answers prepare: aborted everywhere (failed_prepare); generation 1 everywhere, the re-forked worker included', async (t) => {
  const inst = await start('a', 'prepare:1:2');
  const before = await workers(inst.proxy);
  const pending = inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const line = await paused(inst.served, 'prepare', 1, 2);
  process.kill(line['pid'] as number, 'SIGKILL');
  const r = await pending;
  t.match(r, { status: 500, body: { reason: 'prepare_failed', generation: 2, active_generation: 1, message: /worker 1: the worker exited/ } });
  const h = await inst.call('GET', '/admin/runtime/history/2');
  t.match(h.body, { retained_generation: { status: 'failed_prepare', has_bundle: false } });
  await assertServes(t, inst, 1, 'gen-a');
  const after = await workers(inst.proxy);
  t.not(after[1]?.pid, before[1]?.pid, 'worker 1 is a new process');
  t.equal(after[0]?.pid, before[0]?.pid, 'worker 0 was left alone');
  await assertRecovers(t, inst, 1);
});

t.test('(b) worker SIGKILLed after it prepared, before commit was sent: aborted everywhere; generation 1 everywhere', async (t) => {
  const inst = await start('b', 'prepare:1:2');
  const pending = inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  // Worker 0 has prepared generation 2 and answered; worker 1 is held in prepare.
  const [prepared, held] = await Promise.all([
    inst.served.waitFor((l) => l['msg'] === 'test hook: step' && l['step'] === 'prepared' && l['worker'] === 0 && l['generation'] === 2, 30_000),
    paused(inst.served, 'prepare', 1, 2),
  ]);
  process.kill(prepared['pid'] as number, 'SIGKILL');
  await inst.served.waitFor((l) => l['msg'] === 'worker exited' && l['worker'] === 0, 30_000);
  process.kill(held['pid'] as number, 'SIGUSR2'); // worker 1 now prepares and answers
  const r = await pending;
  // Worker 0's `prepared` reply left before it was killed; the supervisor normally reads it first
  // ("exited after it prepared"), but may see the exit first ("the worker exited"): both abort.
  t.match(r, { status: 500, body: { reason: 'prepare_failed', active_generation: 1, message: /worker 0: (exited after it prepared, before commit|the worker exited)/ } });
  t.notOk(inst.served.lines.some((l) => l['msg'] === 'test hook: step' && l['step'] === 'commit' && l['generation'] === 2), 'no worker was sent commit');
  await assertServes(t, inst, 1, 'gen-a');
  await assertRecovers(t, inst, 1);
});

t.test('(c) worker SIGKILLed during commit: rolled forward; generation 2 active everywhere, the re-forked worker included', async (t) => {
  const inst = await start('c', 'commit:1:2');
  const before = await workers(inst.proxy);
  const pending = inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const line = await paused(inst.served, 'commit', 1, 2);
  process.kill(line['pid'] as number, 'SIGKILL');
  const r = await pending;
  t.match(r, { status: 202, body: { generation: 2, status: 'active', note: /committed by worker 0; not by worker 1 .*re-forked on generation 2/ } });
  await assertServes(t, inst, 2, 'gen-b');
  t.not((await workers(inst.proxy))[1]?.pid, before[1]?.pid, 'worker 1 is a new process');
  t.match((await inst.call('GET', '/admin/runtime/history/2')).body, { retained_generation: { status: 'active' } });
  // Rollback to 1 is not `already_active` (the split brain of issue 11): it works.
  const rb = await inst.call('POST', '/admin/runtime/rollback', { target_generation: 1, expected_active_generation: 2 });
  t.equal(rb.status, 202);
  await assertServes(t, inst, 1, 'gen-a');
});

t.test('(d) worker SIGSTOPped in prepare: killed as unresponsive, aborted everywhere; generation 1 everywhere', async (t) => {
  const inst = await start('d', 'prepare:1:2');
  const pending = inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const line = await paused(inst.served, 'prepare', 1, 2);
  const stoppedAt = Date.now();
  process.kill(line['pid'] as number, 'SIGSTOP');
  const r = await pending;
  const took = Date.now() - stoppedAt;
  t.match(r, { status: 500, body: { reason: 'prepare_failed', active_generation: 1 } });
  t.ok(took < 15_000, `the activation ended ${took} ms after the worker froze (silence limit 2000 ms, not the 30 s phase deadline)`);
  t.ok(inst.served.lines.some((l) => l['msg'] === 'worker unresponsive: killed (SIGKILL), re-forking it' && l['worker'] === 1), 'the frozen worker was killed as unresponsive');
  await assertServes(t, inst, 1, 'gen-a');
  await assertRecovers(t, inst, 1);
});

t.test('(e) worker SIGSTOPped during commit: killed as unresponsive; rolled forward, generation 2 everywhere', async (t) => {
  const inst = await start('e', 'commit:1:2');
  const pending = inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const line = await paused(inst.served, 'commit', 1, 2);
  process.kill(line['pid'] as number, 'SIGSTOP');
  const r = await pending;
  t.match(r, { status: 202, body: { generation: 2, note: /committed by worker 0; not by worker 1/ } });
  t.ok(inst.served.lines.some((l) => l['msg'] === 'worker unresponsive: killed (SIGKILL), re-forking it' && l['worker'] === 1), 'the frozen worker was killed as unresponsive');
  await assertServes(t, inst, 2, 'gen-b');
  const rb = await inst.call('POST', '/admin/runtime/rollback', { target_generation: 1, expected_active_generation: 2 });
  t.equal(rb.status, 202);
  await assertServes(t, inst, 1, 'gen-a');
});
