// The two-phase activation protocol (src/supervisor/two-phase.ts) against scripted participants:
// every branch of its header, with the exact outcome (ok, phase, code, note, replaced slots),
// which workers were sent which messages, and which were killed with which reason. The commit
// branches matter most: after commit is sent the candidate is active as soon as one live worker
// acknowledged it; a worker that did not is killed (commit_failed, or ipc_timeout when silent).
import t from 'tap';
import { IpcError } from '@edge-proxy/ipc';
import type { GenerationBundle, RequestChannel, ToWorker } from '@edge-proxy/ipc';
import { twoPhase } from '../src/supervisor/two-phase.ts';
import type { Participant } from '../src/supervisor/two-phase.ts';

type Req = Extract<ToWorker, { id: number }>;
/** What a scripted worker does with a message: answer, refuse with a code, exit after answering, or stay silent. */
type Act = 'ok' | 'exit-after-reply' | 'exit-before-reply' | 'timeout' | { readonly code: string; readonly message: string };

interface Scripted extends Participant {
  readonly got: string[];
  readonly kills: string[];
}

function worker(index: number, script: Partial<Record<'prepare' | 'commit' | 'abort', Act>> = {}): Scripted {
  let gone = false;
  const got: string[] = [];
  const kills: string[] = [];
  const channel = {
    request(m: { type: string }): Promise<unknown> {
      got.push(m.type);
      const act = script[m.type as 'prepare' | 'commit' | 'abort'] ?? 'ok';
      if (act === 'ok') return Promise.resolve(undefined);
      if (act === 'exit-after-reply') {
        gone = true;
        return Promise.resolve(undefined);
      }
      if (act === 'exit-before-reply') {
        gone = true;
        return Promise.reject(new IpcError('EDGE_IPC_CLOSED', 'the worker exited'));
      }
      if (act === 'timeout') return Promise.reject(new IpcError('EDGE_IPC_TIMEOUT', `no reply to ${m.type} within 50 ms`));
      return Promise.reject(new IpcError(act.code, act.message));
    },
  } as unknown as RequestChannel<Req>;
  return {
    index,
    channel,
    got,
    kills,
    gone: () => gone,
    kill(reason) {
      kills.push(reason);
      gone = true;
    },
  };
}

const bundle = { generation: 2, resolved: {} } as unknown as GenerationBundle;
const refuse = (index: number) => ({ code: 'EDGE_TEST_REFUSED', message: `worker ${index} refuses` });
const facts = (ws: readonly Scripted[]) => ws.map((w) => ({ got: w.got, kills: w.kills }));

t.test('every worker prepares and commits: ok, no note, nobody replaced', async (t) => {
  const ws = [worker(0), worker(1)];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: true });
  t.same(acked.map((p) => p.index), [0, 1]);
  t.same(facts(ws), [
    { got: ['prepare', 'commit'], kills: [] },
    { got: ['prepare', 'commit'], kills: [] },
  ]);
});

t.test('one of two refuses commit: active (committed by the other), the refusing one killed commit_failed and replaced', async (t) => {
  const ws = [worker(0), worker(1, { commit: refuse(1) })];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: true, note: 'committed by worker 0; not by worker 1 (worker 1 refuses): re-forked on generation 2', replaced: [1] });
  t.same(acked.map((p) => p.index), [0]);
  t.same(facts(ws), [
    { got: ['prepare', 'commit'], kills: [] },
    { got: ['prepare', 'commit'], kills: ['commit_failed'] },
  ]);
});

t.test('the first of three refuses commit: the candidate is still active on the two others', async (t) => {
  const ws = [worker(0, { commit: refuse(0) }), worker(1), worker(2)];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: true, note: 'committed by worker 1, 2; not by worker 0 (worker 0 refuses): re-forked on generation 2', replaced: [0] });
  t.same(acked.map((p) => p.index), [1, 2]);
  t.same(ws.map((w) => w.kills), [['commit_failed'], [], []]);
});

t.test('every worker refuses commit: failed in phase commit with the first code; all killed commit_failed, re-forked on the active generation', async (t) => {
  const ws = [worker(0, { commit: refuse(0) }), worker(1, { commit: refuse(1) })];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, {
    ok: false,
    phase: 'commit',
    code: 'EDGE_TEST_REFUSED',
    note: 'no worker committed generation 2: worker 0 (worker 0 refuses); worker 1 (worker 1 refuses); re-forked on generation 1',
    replaced: [0, 1],
  });
  t.same(acked, []);
  t.same(facts(ws), [
    { got: ['prepare', 'commit'], kills: ['commit_failed'] },
    { got: ['prepare', 'commit'], kills: ['commit_failed'] },
  ]);
});

t.test('no live acknowledgement: one silent (ipc_timeout) and one that exits after replying; the code is the first worker\'s', async (t) => {
  const ws = [worker(0, { commit: 'timeout' }), worker(1, { commit: 'exit-after-reply' })];
  const { outcome } = await twoPhase(ws, bundle, 50, 7);
  t.same(outcome, {
    ok: false,
    phase: 'commit',
    code: 'EDGE_IPC_TIMEOUT',
    note: 'no worker committed generation 2: worker 0 (no reply to commit within 50 ms); worker 1 (the worker exited); re-forked on generation 7',
    replaced: [0, 1],
  });
  // A worker already gone is not killed again by the pool (kill is a no-op on a dead process), but it is asked to.
  t.same(ws.map((w) => w.kills), [['ipc_timeout'], ['commit_failed']]);
});

t.test('a worker that exits during commit while another acknowledges: active, the dead one counted as replaced', async (t) => {
  const ws = [worker(0, { commit: 'exit-before-reply' }), worker(1)];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: true, note: 'committed by worker 1; not by worker 0 (the worker exited): re-forked on generation 2', replaced: [0] });
  t.same(acked.map((p) => p.index), [1]);
  t.same(ws.map((w) => w.kills), [['commit_failed'], []]);
});

t.test('a worker gone after it prepared, before commit: aborted everywhere, nobody sent commit, nobody killed', async (t) => {
  const ws = [worker(0, { prepare: 'exit-after-reply' }), worker(1)];
  const { outcome, acked } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: false, phase: 'prepare', code: 'EDGE_IPC_CLOSED', note: 'worker 0: exited after it prepared, before commit', replaced: [0] });
  t.same(acked, []);
  t.same(facts(ws), [
    { got: ['prepare', 'abort'], kills: [] },
    { got: ['prepare', 'abort'], kills: [] },
  ]);
});

t.test('a refused prepare: aborted everywhere with the worker\'s code; nobody killed or replaced', async (t) => {
  const ws = [worker(0), worker(1, { prepare: { code: 'EDGE_PREPARE_FAILED', message: 'generation 2 failed to prepare: bad key' } })];
  const { outcome } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: false, phase: 'prepare', code: 'EDGE_PREPARE_FAILED', note: 'worker 1: generation 2 failed to prepare: bad key', replaced: [] });
  t.same(facts(ws), [
    { got: ['prepare', 'abort'], kills: [] },
    { got: ['prepare', 'abort'], kills: [] },
  ]);
});

t.test('a silent prepare: killed ipc_timeout and aborted everywhere; an abort that times out kills that worker too', async (t) => {
  const ws = [worker(0, { prepare: 'timeout' }), worker(1, { abort: 'timeout' })];
  const { outcome } = await twoPhase(ws, bundle, 50, 1);
  t.same(outcome, { ok: false, phase: 'prepare', code: 'EDGE_IPC_TIMEOUT', note: 'worker 0: no reply to prepare within 50 ms', replaced: [0, 1] });
  t.same(facts(ws), [
    { got: ['prepare', 'abort'], kills: ['ipc_timeout'] },
    { got: ['prepare', 'abort'], kills: ['ipc_timeout'] },
  ]);
});

t.test('no worker: EDGE_NO_WORKERS, nothing sent', async (t) => {
  t.same(await twoPhase([], bundle, 50, 1), { outcome: { ok: false, phase: 'prepare', code: 'EDGE_NO_WORKERS', note: 'no worker is running' }, acked: [] });
});
