// The two-phase activation protocol as a pure function over fake participants (no processes), the
// message-order view (two-phase.test.ts holds the branch-by-branch outcomes):
// which messages each worker gets, in which order, who is killed and why, the outcome's code and
// note, and which workers count as having committed. worker-pool.test.ts runs it on real workers.
import t from 'tap';
import type { GenerationBundle } from '@edge-proxy/ipc';
import { describeError, twoPhase } from '../src/supervisor/two-phase.ts';
import type { Participant } from '../src/supervisor/two-phase.ts';

type Answer = 'ok' | 'gone-after' | { code?: string; message: string };
interface Script {
  prepare?: Answer;
  commit?: Answer;
  abort?: Answer;
}

interface Fake extends Participant {
  readonly sent: string[];
  readonly timeouts: number[];
  readonly kills: string[];
}

function coded(code: string | undefined, message: string): Error {
  return Object.assign(new Error(message), code === undefined ? {} : { code });
}

/** A worker that answers each message type as scripted (`ok` by default). */
function fake(index: number, script: Script = {}): Fake {
  let gone = false;
  const sent: string[] = [];
  const timeouts: number[] = [];
  const kills: string[] = [];
  const channel = {
    request(message: { type: 'prepare' | 'commit' | 'abort'; generation?: number; bundle?: GenerationBundle }, timeoutMs: number): Promise<unknown> {
      sent.push(`${message.type}:${message.generation ?? message.bundle?.generation}`);
      timeouts.push(timeoutMs);
      const a = script[message.type] ?? 'ok';
      if (a === 'ok') return Promise.resolve(undefined);
      if (a === 'gone-after') {
        gone = true; // answered, then exited before the next phase
        return Promise.resolve(undefined);
      }
      return Promise.reject(coded(a.code, a.message));
    },
  };
  return {
    index,
    channel: channel as unknown as Participant['channel'],
    gone: () => gone,
    kill(reason) {
      kills.push(reason);
      gone = true; // being taken out by the supervisor
    },
    sent,
    timeouts,
    kills,
  };
}

const bundle = { generation: 5 } as unknown as GenerationBundle;

t.test('no workers: refused before anything is sent', async (t) => {
  const r = await twoPhase([], bundle, 1000, 4);
  t.same(r, { outcome: { ok: false, phase: 'prepare', code: 'EDGE_NO_WORKERS', note: 'no worker is running' }, acked: [] });
});

t.test('every worker prepares and commits: ok with no note, all acked, nobody killed, no abort', async (t) => {
  const ws = [fake(0), fake(1), fake(2)];
  const r = await twoPhase(ws, bundle, 1234, 4);
  t.same(r.outcome, { ok: true });
  t.equal(r.outcome.ok && r.outcome.note, undefined);
  t.same(r.acked.map((m) => m.index), [0, 1, 2]);
  for (const w of ws) {
    t.same(w.sent, ['prepare:5', 'commit:5'], `worker ${w.index}: prepare of the bundle, then commit of its generation`);
    t.same(w.timeouts, [1234, 1234], 'the phase timeout is passed to every request');
    t.same(w.kills, []);
  }
});

t.test('a refused prepare aborts everywhere: no commit sent, nobody killed, the first code and every note', async (t) => {
  const ws = [fake(0), fake(1, { prepare: { code: 'EDGE_PROVISION_FAILED', message: 'no cert' } }), fake(2, { prepare: { code: 'EDGE_OTHER', message: 'also bad' } })];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'prepare', code: 'EDGE_PROVISION_FAILED', note: 'worker 1: no cert; worker 2: also bad', replaced: [] });
  t.same(r.acked, []);
  for (const w of ws) {
    t.same(w.sent, ['prepare:5', 'abort:5'], `worker ${w.index}: aborted, never committed`);
    t.same(w.kills, []);
  }
});

t.test('a prepare that times out: that worker is killed (ipc_timeout) and counted as replaced; the others abort', async (t) => {
  const ws = [fake(0, { prepare: { code: 'EDGE_IPC_TIMEOUT', message: 'no answer in 1000 ms' } }), fake(1)];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'prepare', code: 'EDGE_IPC_TIMEOUT', note: 'worker 0: no answer in 1000 ms', replaced: [0] });
  t.same(ws[0]?.kills, ['ipc_timeout']);
  t.same(ws[1]?.kills, []);
  t.same(ws[1]?.sent, ['prepare:5', 'abort:5']);
});

t.test('a worker that prepared and exited before commit: EDGE_IPC_CLOSED, abort everywhere, nothing committed', async (t) => {
  const ws = [fake(0), fake(1, { prepare: 'gone-after' })];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'prepare', code: 'EDGE_IPC_CLOSED', note: 'worker 1: exited after it prepared, before commit', replaced: [1] });
  t.notOk(ws.some((w) => w.sent.includes('commit:5')), 'commit is never sent');
  t.same(ws[0]?.kills, []);
});

t.test('an error without a code: EDGE_WORKER_ERROR; an abort that times out kills, another abort error does not', async (t) => {
  const ws = [fake(0, { prepare: { message: 'plain failure' }, abort: { code: 'EDGE_IPC_TIMEOUT', message: 'silent' } }), fake(1, { abort: { code: 'EDGE_IPC_CLOSED', message: 'gone' } })];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'prepare', code: 'EDGE_WORKER_ERROR', note: 'worker 0: plain failure', replaced: [0] });
  t.same(ws[0]?.kills, ['ipc_timeout']);
  t.same(ws[1]?.kills, []);
});

t.test('a commit refused by one worker: active on the others, the refuser killed (commit_failed) and named', async (t) => {
  const ws = [fake(0), fake(1, { commit: { code: 'EDGE_COMMIT_REFUSED', message: 'unknown generation' } }), fake(2)];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: true, note: 'committed by worker 0, 2; not by worker 1 (unknown generation): re-forked on generation 5', replaced: [1] });
  t.same(r.acked.map((m) => m.index), [0, 2]);
  t.same(ws[1]?.kills, ['commit_failed']);
  t.same(ws[0]?.kills, []);
  t.same(ws[2]?.kills, []);
  t.notOk(ws.some((w) => w.sent.some((s) => s.startsWith('abort'))), 'no abort after the commit point');
});

t.test('a commit that times out kills with ipc_timeout; a worker that acked and exited is not counted as acked', async (t) => {
  const ws = [fake(0, { commit: { code: 'EDGE_IPC_TIMEOUT', message: 'silent' } }), fake(1, { commit: 'gone-after' }), fake(2)];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: true, note: 'committed by worker 2; not by worker 0 (silent); worker 1 (the worker exited): re-forked on generation 5', replaced: [0, 1] });
  t.same(r.acked.map((m) => m.index), [2]);
  t.same(ws[0]?.kills, ['ipc_timeout']);
  t.same(ws[1]?.kills, ['commit_failed']);
});

t.test('no worker commits: the candidate never became active; all killed, re-forked on the active generation', async (t) => {
  const ws = [fake(0, { commit: { code: 'EDGE_A', message: 'first' } }), fake(1, { commit: { code: 'EDGE_B', message: 'second' } })];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'commit', code: 'EDGE_A', note: 'no worker committed generation 5: worker 0 (first); worker 1 (second); re-forked on generation 4', replaced: [0, 1] });
  t.same(r.acked, []);
  t.same(ws.map((w) => w.kills), [['commit_failed'], ['commit_failed']]);
});

t.test('no worker commits, every one exited: EDGE_IPC_CLOSED', async (t) => {
  const ws = [fake(0, { commit: 'gone-after' })];
  const r = await twoPhase(ws, bundle, 1000, 4);
  t.same(r.outcome, { ok: false, phase: 'commit', code: 'EDGE_IPC_CLOSED', note: 'no worker committed generation 5: worker 0 (the worker exited); re-forked on generation 4', replaced: [0] });
});

t.test('describeError: code and message when present, stable fallbacks when not', async (t) => {
  t.same(describeError(coded('EDGE_X', 'm')), { code: 'EDGE_X', message: 'm' });
  t.same(describeError({ code: 7, message: 8 }), { code: 'EDGE_WORKER_ERROR', message: '[object Object]' });
  t.same(describeError('just text'), { code: 'EDGE_WORKER_ERROR', message: 'just text' });
  t.same(describeError(undefined), { code: 'EDGE_WORKER_ERROR', message: 'undefined' });
  t.same(describeError(null), { code: 'EDGE_WORKER_ERROR', message: 'null' });
});
