// A worker that dies, hangs or refuses in the middle of an activation (issue 11 item 6, issue 18
// item 1), end to end: real `edge-proxy serve` with two workers, two backends that answer `gen-a`
// and `gen-b`, and the test-only hooks: EDGE_TEST_PAUSE holds worker 1 (or 0) at a named step so
// that SIGKILL or SIGSTOP lands in that exact window; EDGE_TEST_FAIL makes named workers refuse
// commit (the commit-failure path of two-phase.ts). In every case what the control plane calls
// active (history, snapshot, the response) is what every worker serves: checked with real requests
// on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections, which the kernel spreads over both workers'
// SO_REUSEPORT sockets.
import t from 'tap';
import type { Test } from 'tap';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import { snapshot, waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-act-fail-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';

const backend = (answer: string): Promise<number> => namedBackend(t, answer);
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];

const configText = (ports: ServicePorts, backendPort: number): string =>
  serviceConfig({
    ports,
    cert: server,
    backendPort,
    performance: 'worker_threads: 2, worker_heartbeat_ms: 250, worker_unresponsive_heartbeats: 8',
    token: { token: TOKEN, role: 'admin', actor: 'failure-test' },
  });

interface Instance {
  readonly served: Served;
  readonly proxy: Proxy;
  readonly mport: number;
  readonly bFile: string;
  readonly aFile: string;
  call(method: string, p: string, body?: unknown): ReturnType<typeof api>;
}

/** A fresh `edge-proxy serve` (generation 1 = backend gen-a) with the test hook set by `hook`. */
async function start(name: string, hook: { EDGE_TEST_PAUSE: string } | { EDGE_TEST_FAIL: string }): Promise<Instance> {
  const ports = await freePorts();
  const aFile = path.join(dir, `${name}-a.yaml`);
  const bFile = path.join(dir, `${name}-b.yaml`);
  writeFileSync(bFile, configText(ports, pb));
  const served = await serve(aFile, configText(ports, pa), 60_000, hook);
  t.teardown(() => served.stop());
  const proxy: Proxy = { lport: ports.l, cport: ports.c, ca: caPem, token: TOKEN };
  return { served, proxy, mport: ports.m, aFile, bFile, call: (method, p, body) => api(ports.c, caPem, method, p, { token: TOKEN }, body) };
}

const paused = (s: Served, step: string, worker: number, generation: number) =>
  s.waitFor((l) => l['msg'] === 'test hook: paused' && l['step'] === step && l['worker'] === worker && l['generation'] === generation, 30_000);

/**
 * Every worker serves `generation` (snapshot) and every request on a fresh connection answers
 * `body`, on HTTP/1.1, HTTP/2 and HTTP/3 (8 each: a worker left on another generation would take
 * about half of them).
 */
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
  t.same(await servedBy(inst.proxy), allFrom(body), `every request on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections answered by ${body}`);
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
  const inst = await start('a', { EDGE_TEST_PAUSE: 'prepare:1:2' });
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
  const inst = await start('b', { EDGE_TEST_PAUSE: 'prepare:1:2' });
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
  const inst = await start('c', { EDGE_TEST_PAUSE: 'commit:1:2' });
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
  const inst = await start('d', { EDGE_TEST_PAUSE: 'prepare:1:2' });
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
  const inst = await start('e', { EDGE_TEST_PAUSE: 'commit:1:2' });
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

/** The value of one sample of the supervisor's /metrics (0 when absent). */
async function sample(inst: Instance, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${inst.mport}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels === '' ? ' ' : `{${labels}} `}`));
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(' ') + 1));
}

const refuses = (worker: number): string => `test hook: worker ${worker} refuses commit of generation 2`;

t.test('(f) one of two workers refuses commit: active (committed by worker 0), the refusing worker killed commit_failed and re-forked on generation 2', async (t) => {
  const inst = await start('f', { EDGE_TEST_FAIL: 'commit:1:2' });
  const before = await workers(inst.proxy);
  const r = await inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const note = `committed by worker 0; not by worker 1 (${refuses(1)}): re-forked on generation 2`;
  t.match(r, { status: 202, body: { generation: 2, status: 'active', config_source: inst.bFile, note } });
  t.equal(r.body['note'], note, 'the note names the refusing worker and nothing is still missing');
  t.ok(inst.served.lines.some((l) => l['msg'] === 'test hook: step' && l['step'] === 'refused' && l['worker'] === 1 && l['generation'] === 2), 'worker 1 did refuse');
  const h = (await inst.call('GET', '/admin/runtime/history/2')).body;
  t.match(h, { retained_generation: { status: 'active', has_bundle: true }, entries: [{ operation: 'activate', result: 'succeeded', note }] });
  await assertServes(t, inst, 2, 'gen-b');
  const after = await workers(inst.proxy);
  t.equal(after[0]?.pid, before[0]?.pid, 'worker 0 (it acknowledged) was left alone');
  t.not(after[1]?.pid, before[1]?.pid, 'worker 1 is a new process');
  t.same(after.map((w) => w.incarnation), [0, 1]);
  t.match(await snapshot(inst.proxy), { generation: 2, workers: { exits: { commit_failed: 1, exited: 0, ipc_timeout: 0, unresponsive: 0, handover_failed: 0 } } });
  t.match(inst.served.lines.find((l) => l['msg'] === 'worker exited' && l['worker'] === 1), { signal: 'SIGKILL', reason: 'commit_failed' });
  t.match(inst.served.lines.find((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === 1), { generation: 2 });
  t.equal(await sample(inst, 'svc_runtime_activation_total', 'result="success",reason="activated"'), 1, 'counted as one successful activation');
  t.equal(await sample(inst, 'svc_runtime_panics'), 1, 'the killed worker counts as one worker crash');
  t.match(
    await inst.served.waitFor((l) => l['audit'] === true && l['event_type'] === 'operation_result' && l['action'] === 'activate' && l['generation'] === 2),
    { result: 'succeeded' },
    'audited as a success of generation 2',
  );
  await assertRecovers(t, inst, 2);
});

t.test('(g) every worker refuses commit: 500 swap_failed, generation 1 stays, both workers killed commit_failed and re-forked on it', async (t) => {
  const inst = await start('g', { EDGE_TEST_FAIL: 'commit:0,1:2' });
  const before = await workers(inst.proxy);
  const r = await inst.call('POST', '/admin/runtime/activate', { config_path: inst.bFile, expected_generation: 1 });
  const note = `no worker committed generation 2: worker 0 (${refuses(0)}); worker 1 (${refuses(1)}); re-forked on generation 1`;
  t.match(r, { status: 500, body: { reason: 'swap_failed', generation: 2, active_generation: 1 } });
  t.equal(r.body['message'], note, 'the message names both refusals and the generation they were re-forked on');
  const h = (await inst.call('GET', '/admin/runtime/history/2')).body;
  t.match(h, { retained_generation: { status: 'failed_prepare', has_bundle: false, rollback_candidate: false, note }, entries: [{ operation: 'activate', result: 'failed', note }] });
  await assertServes(t, inst, 1, 'gen-a');
  const after = await workers(inst.proxy);
  t.ok(after.every((w, i) => w.pid !== before[i]?.pid), 'both workers are new processes');
  t.same(after.map((w) => w.incarnation), [1, 1]);
  t.match(await snapshot(inst.proxy), { generation: 1, workers: { exits: { commit_failed: 2, exited: 0, ipc_timeout: 0, unresponsive: 0, handover_failed: 0 } } });
  for (const w of [0, 1]) {
    t.match(inst.served.lines.find((l) => l['msg'] === 'worker exited' && l['worker'] === w), { signal: 'SIGKILL', reason: 'commit_failed' }, `worker ${w} killed commit_failed`);
    t.match(inst.served.lines.find((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === w), { generation: 1 }, `worker ${w} re-forked on generation 1`);
  }
  t.equal(await sample(inst, 'svc_runtime_activation_total', 'result="failure",reason="swap_failed"'), 1, 'counted as one failed activation (swap_failed)');
  t.equal(await sample(inst, 'svc_runtime_rejections_total', 'reason="swap_failed"'), 1);
  t.equal(await sample(inst, 'svc_runtime_panics'), 2, 'two killed workers');
  t.match(
    await inst.served.waitFor((l) => l['audit'] === true && l['event_type'] === 'operation_result' && l['action'] === 'activate' && l['generation'] === 2),
    { result: 'failed', reason: 'swap_failed', failure_class: 'internal' },
    'audited as a failure, by reason',
  );
  t.match(await inst.call('POST', '/admin/runtime/rollback', { target_generation: 2 }), { status: 409, body: { reason: 'not_rollback_candidate' } }, 'the candidate nobody committed is no rollback target');
  await assertRecovers(t, inst, 1);
});
