// Generation operations with a fake activator (the worker pool is an internal interface): every
// status of validate / preview / activate / rollback, history records, secret rotation, and
// rollback re-reading secret files from disk.
import t from 'tap';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { GenerationBundle } from '@edge-proxy/ipc';
import { GenerationManager } from '../src/generations/activation.ts';
import type { Activator } from '../src/generations/activation.ts';
import { OperationAbort } from '../src/generations/operation-queue.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-activation-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca);
const client1 = makeLeaf(dir, 'client1', ca, { usage: 'client', sans: ['edge'] });
const client2 = makeLeaf(dir, 'client2', ca, { usage: 'client', sans: ['edge'] });
writeFileSync(path.join(dir, 'client.crt'), readFileSync(client1.cert));
writeFileSync(path.join(dir, 'client.key'), readFileSync(client1.key));

function config(name: string, opts: { port?: number; weight?: number; extra?: string; broken?: boolean } = {}): string {
  const file = path.join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    opts.broken === true
      ? 'listen: {tls: {cert: x}}\nupstream: {}\n'
      : `
listen: { address: 127.0.0.1, port: ${opts.port ?? 9889}, tls: { cert: ${server.cert}, key: ${server.key} } }
upstream:
  api:
    route: { path_prefix: / }
    tls: { client_certificate_ref: { ref: "file://${path.join(dir, 'client.crt')}" }, client_key_ref: { ref: "file://${path.join(dir, 'client.key')}" } }
    backends: [{ id: a, address: "https://127.0.0.1:8443", weight: ${opts.weight ?? 1} }]
${opts.extra ?? ''}`,
  );
  return file;
}

class FakePool implements Activator {
  readonly seen: GenerationBundle[] = [];
  failNext: string | undefined;
  async activate(bundle: GenerationBundle) {
    this.seen.push(bundle);
    if (this.failNext !== undefined) {
      const note = this.failNext;
      this.failNext = undefined;
      return { ok: false as const, phase: 'prepare' as const, code: 'EDGE_PREPARE_FAILED', note };
    }
    return { ok: true as const };
  }
}

const pool = new FakePool();
const base = config('base');
const m = new GenerationManager(pool, base, undefined, () => 1_700_000_000_000);

t.test('bootstrap activates generation 1', async (t) => {
  const r = await m.bootstrap();
  t.equal(r.status, 202);
  t.equal(m.activeGeneration, 1);
  t.equal(m.configSource, base);
});

t.test('validate: 200, unchanged, nothing recorded', async (t) => {
  const before = m.history.entries().length;
  const r = await m.validate({});
  t.equal(r.status, 200);
  t.match(r.body, { candidate_status: 'unchanged', active_generation: 1, candidate: { generation: 2 } });
  t.equal(m.history.entries().length, before, 'validate is never recorded');
});

t.test('preview: 200 and recorded with who and why', async (t) => {
  const r = await m.preview({ config_path: config('heavier', { weight: 5 }), requested_by: 'alice', reason: 'check weights' });
  t.equal(r.status, 200);
  t.match(r.body, { candidate_status: 'activatable', diff: { domains: { backends: { activation: 'live' } } } });
  t.match(m.history.entries()[0], { operation: 'preview', result: 'recorded', requested_by: 'alice', reason: 'check weights' });
  t.equal(m.activeGeneration, 1, 'preview changes nothing');
});

t.test('activate with config_path: 202, new active source, diff recorded', async (t) => {
  const heavier = config('heavier', { weight: 5 });
  const r = await m.activate({ config_path: heavier, expected_generation: 1, requested_by: 'deploy-bot', reason: 'rollout 42' });
  t.equal(r.status, 202);
  t.match(r.body, { generation: 2, status: 'active', config_source: heavier });
  t.equal(m.configSource, heavier, 'config_path becomes the active source');
  t.match(m.history.entries()[0], { operation: 'activate', generation: 2, result: 'succeeded', requested_by: 'deploy-bot', reason: 'rollout 42', config_source: heavier });
  t.equal(pool.seen.at(-1)?.generation, 2);
});

t.test('stale expected_generation: 409, nothing changes', async (t) => {
  const r = await m.activate({ expected_generation: 1 });
  t.equal(r.status, 409);
  t.match(r.body, { reason: 'stale_generation' });
  t.equal(m.activeGeneration, 2);
});

t.test('listener port change: 409 restart_required with rejected_changes', async (t) => {
  const r = await m.activate({ config_path: config('moved', { port: 9999 }) });
  t.equal(r.status, 409);
  t.match(r.body, { reason: 'restart_required', plan: { candidate_status: 'restart_required', rejected_changes: [{ activation: 'restart_required', reason: 'listener removal' }] } });
  t.equal(m.activeGeneration, 2);
  t.equal(m.configSource, path.join(dir, 'heavier.yaml'), 'a rejected config_path does not become the source');
});

t.test('invalid file: 400 with coded errors', async (t) => {
  const r = await m.activate({ config_path: config('broken', { broken: true }) });
  t.equal(r.status, 400);
  t.match(r.body, { reason: 'invalid_config', plan: { candidate_status: 'invalid', errors: [{ code: 'EDGE_CONFIG_TLS_PARTIAL_PAIR' }] } });
  t.match(m.history.entries()[0], { operation: 'activate', result: 'rejected' });
});

t.test('a worker fails to prepare: 500, failed_prepare with the note, active unchanged', async (t) => {
  pool.failNext = 'upstream api: TLS material cannot be used (ee key too small)';
  const r = await m.activate({ config_path: config('heavier2', { weight: 7 }) });
  t.equal(r.status, 500);
  t.match(r.body, { reason: 'prepare_failed', generation: 3 });
  t.same(m.history.retainedGeneration(3), { generation: 3, status: 'failed_prepare', rollback_candidate: false, has_bundle: false, note: 'upstream api: TLS material cannot be used (ee key too small)' });
  t.equal(m.activeGeneration, 2);
});

t.test('same-path secret rotation: secret_material_changed in the diff', async (t) => {
  writeFileSync(path.join(dir, 'client.crt'), readFileSync(client2.cert));
  writeFileSync(path.join(dir, 'client.key'), readFileSync(client2.key));
  const r = await m.activate({ requested_by: 'cert-bot' });
  t.equal(r.status, 202);
  t.match(r.body, { generation: 4, diff: { backend_policies: [{ upstream: 'api', secret_material_changed: true, client_identity_changed: true }] } });
});

t.test('rollback: 404 unknown, 409 active or stale, 202 restores and re-reads secrets from disk', async (t) => {
  t.match(await m.rollback({ target_generation: 99 }), { status: 404, reason: 'generation_not_retained' });
  t.match(await m.rollback({ target_generation: 4 }), { status: 409, reason: 'already_active' });
  t.match(await m.rollback({ target_generation: 3 }), { status: 409, reason: 'not_rollback_candidate' });
  t.match(await m.rollback({ target_generation: 1, expected_active_generation: 2 }), { status: 409, reason: 'stale_generation' });
  // Generation 1 was activated with client1's certificate; the file now holds client2's: rollback resolves it anew.
  const r = await m.rollback({ target_generation: 1, expected_active_generation: 4, requested_by: 'oncall', reason: 'bad rollout' });
  t.equal(r.status, 202);
  t.equal(m.activeGeneration, 1);
  const sent = pool.seen.at(-1);
  t.equal(sent?.generation, 1);
  t.equal(sent?.resolved.material.secrets['upstream.api.tls.client_certificate']?.value, readFileSync(client2.cert, 'utf8'), 'the secret file was re-read at rollback');
  t.match(m.history.entries()[0], { operation: 'rollback', generation: 1, target_generation: 1, result: 'succeeded', requested_by: 'oncall' });
  t.same(
    m.history.retained().map((g) => `${g.generation}:${g.status}`),
    ['4:rolled_back', '3:failed_prepare', '2:superseded', '1:active'],
  );
});

t.test('config_path refusals: outside the allowed directory, not a regular file; nothing recorded', async (t) => {
  const outside = mkdtempSync(path.join(tmpdir(), 'edge-activation-outside-'));
  t.teardown(() => rmSync(outside, { recursive: true, force: true }));
  writeFileSync(path.join(outside, 'x.yaml'), 'root: "$6$LEAK"\n');
  const before = m.history.entries().length;
  t.match(await m.activate({ config_path: path.join(outside, 'x.yaml') }), { status: 403, reason: 'config_path_not_allowed', body: { message: /outside the directories/ } });
  t.match(await m.preview({ config_path: path.join(outside, 'x.yaml') }), { status: 403, reason: 'config_path_not_allowed' });
  mkdirSync(path.join(dir, 'a-directory'));
  t.match(await m.validate({ config_path: path.join(dir, 'a-directory') }), { status: 400, reason: 'config_path_not_regular_file' });
  t.match(await m.activate({ config_path: '/dev/zero' }), { status: 403, reason: 'config_path_not_allowed' });
  t.equal(m.history.entries().length, before, 'refusals are not recorded');
  t.equal(m.activeGeneration, 1);
});

t.test('an invalid candidate inside the directory: codes and paths only, in the answer and the history', async (t) => {
  const hostile = path.join(dir, 'hostile.yaml');
  writeFileSync(hostile, 'version: "LEAK-VALUE"\n');
  const r = await m.activate({ config_path: hostile });
  t.match(r, { status: 400, reason: 'invalid_config', body: { plan: { errors: [{ code: 'EDGE_CONFIG_UNSUPPORTED_VERSION', path: 'version' }] } } });
  t.notOk(JSON.stringify(r.body).includes('LEAK-VALUE'));
  t.notOk(JSON.stringify(m.history.entries()).includes('LEAK-VALUE'));
});

t.test('an operation whose caller left while it waited is not carried out', async (t) => {
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const blocker = m.exclusive({}, () => held);
  const ac = new AbortController();
  const gone = m.activate({ config_path: config('never', { weight: 9 }) }, 'activate', { signal: ac.signal });
  const seen = pool.seen.length;
  ac.abort({ code: 'caller_gone' });
  await t.rejects(gone, { code: 'EDGE_OPERATION_ABANDONED', reason: 'caller_gone', phase: 'queued' } as object as Error);
  release();
  await blocker;
  t.equal(pool.seen.length, seen, 'the workers were never asked');
  t.notOk(m.history.entries().some((e) => e.config_source?.endsWith('never.yaml')), 'nothing recorded');
});

t.test('a deadline that passes while the candidate is read: abandoned at the checkpoint, nothing recorded or prepared', async (t) => {
  const ac = new AbortController();
  const seen = pool.seen.length;
  const entries = m.history.entries().length;
  const late = m.activate({ config_path: config('late', { weight: 8 }) }, 'activate', { signal: ac.signal });
  // One loop turn: the operation has its turn and is inside the file reads (several I/O steps).
  await new Promise((r) => setImmediate(r));
  ac.abort(new OperationAbort('deadline_exceeded'));
  await t.rejects(late, { code: 'EDGE_OPERATION_ABANDONED', reason: 'deadline_exceeded', phase: 'running' } as object as Error);
  t.equal(pool.seen.length, seen, 'the workers were never asked');
  t.equal(m.history.entries().length, entries, 'nothing recorded');
});

/** The pool's answers to the commit-failure branches of two-phase.ts, handed out in order. */
class ScriptedPool implements Activator {
  readonly seen: number[] = [];
  readonly answers: Awaited<ReturnType<Activator['activate']>>[] = [];
  async activate(bundle: GenerationBundle) {
    this.seen.push(bundle.generation);
    return this.answers.shift() ?? { ok: true as const };
  }
}

t.test('commit failures: one refusal is still an activation (202 with the note); none acknowledged is 500 swap_failed, recorded failed_prepare, active unchanged', async (t) => {
  const sp = new ScriptedPool();
  const first = config('commit-first', { weight: 1 });
  const gm = new GenerationManager(sp, first, undefined, () => 1_700_000_000_000);
  t.equal((await gm.bootstrap()).status, 202);

  // One of two workers refused commit: the candidate is active (committed by the other).
  const partly = 'committed by worker 0; not by worker 1 (test hook: worker 1 refuses commit of generation 2): re-forked on generation 2';
  sp.answers.push({ ok: true, note: partly });
  const second = config('commit-second', { weight: 2 });
  const r2 = await gm.activate({ config_path: second, expected_generation: 1, requested_by: 'ops' });
  t.match(r2, { status: 202, generation: 2, body: { generation: 2, status: 'active', config_source: second, note: partly, rejected_changes: [] } });
  t.equal(r2.reason, undefined, 'a success carries no failure reason');
  t.equal(gm.activeGeneration, 2);
  t.equal(gm.configSource, second, 'config_path became the active source');
  t.match(gm.history.entries()[0], { operation: 'activate', generation: 2, result: 'succeeded', note: partly });
  t.same(gm.history.retainedGeneration(2), { generation: 2, status: 'active', rollback_candidate: false, has_bundle: true });

  // Every worker refused commit: the candidate never served; generation 2 stays active.
  const none = 'no worker committed generation 3: worker 0 (refused); worker 1 (refused); re-forked on generation 2';
  sp.answers.push({ ok: false, phase: 'commit', code: 'EDGE_TEST_REFUSED', note: none });
  const third = config('commit-third', { weight: 3 });
  const r3 = await gm.activate({ config_path: third, expected_generation: 2 });
  t.same([r3.status, r3.reason, r3.generation], [500, 'swap_failed', 3]);
  t.match(r3.body, { reason: 'swap_failed', message: none, generation: 3, active_generation: 2 });
  t.equal(gm.activeGeneration, 2, 'the active generation is unchanged');
  t.equal(gm.configSource, second, 'a candidate nobody committed does not become the active source');
  t.same(gm.history.retainedGeneration(3), { generation: 3, status: 'failed_prepare', rollback_candidate: false, has_bundle: false, note: none });
  t.match(gm.history.entries()[0], { operation: 'activate', generation: 3, result: 'failed', note: none });
  t.match(await gm.rollback({ target_generation: 3 }), { status: 409, reason: 'not_rollback_candidate' }, 'never a rollback target');
  t.same(gm.history.retained().map((g) => `${g.generation}:${g.status}`), ['3:failed_prepare', '2:active', '1:previous']);

  // A rollback nobody commits: 500 swap_failed, nothing moves.
  sp.answers.push({ ok: false, phase: 'commit', code: 'EDGE_TEST_REFUSED', note: 'no worker committed generation 1' });
  const rb = await gm.rollback({ target_generation: 1, expected_active_generation: 2 });
  t.match(rb, { status: 500, reason: 'swap_failed', body: { reason: 'swap_failed', message: 'no worker committed generation 1', active_generation: 2 } });
  t.equal(gm.activeGeneration, 2);
  t.same(gm.history.retained().map((g) => `${g.generation}:${g.status}`), ['3:failed_prepare', '2:active', '1:previous'], 'rollback failure changes no status');
  t.match(gm.history.entries()[0], { operation: 'rollback', target_generation: 1, result: 'failed' });

  // Afterwards a rollback that the workers commit works, and a prepare failure still says prepare_failed.
  t.match(await gm.rollback({ target_generation: 1, expected_active_generation: 2 }), { status: 202, generation: 1 });
  sp.answers.push({ ok: false, phase: 'prepare', code: 'EDGE_PREPARE_FAILED', note: 'worker 0: bad' });
  t.match(await gm.activate({ config_path: third }), { status: 500, reason: 'prepare_failed', body: { active_generation: 1 } });
  t.same(sp.seen, [1, 2, 3, 1, 1, 4]);
});
