// The control operation queue: one at a time, in order; an operation whose caller left or whose
// deadline passed while it waited is answered at once and never carried out.
import t from 'tap';
import { OperationAbandoned, OperationAbort, OperationQueue, checkpoint, operationSignal } from '../src/generations/operation-queue.ts';
import type { AbandonReason } from '../src/generations/operation-queue.ts';
import { abandonedAnswer } from '../src/api/server.ts';

function gate(): { open: () => void; wait: Promise<void> } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { open, wait };
}

t.test('operations run one at a time, in order', async (t) => {
  const q = new OperationQueue();
  const order: string[] = [];
  const g = gate();
  const started = gate();
  const a = q.run(undefined, async () => {
    order.push('a start');
    started.open();
    await g.wait;
    order.push('a end');
  });
  const b = q.run(undefined, async () => void order.push('b'));
  await started.wait;
  t.equal(q.queued, 1, 'b waits behind a');
  g.open();
  await Promise.all([a, b]);
  t.same(order, ['a start', 'a end', 'b']);
});

t.test('a caller that leaves while queued is answered at once and its operation never runs', async (t) => {
  const q = new OperationQueue();
  const g = gate();
  const a = q.run(undefined, () => g.wait);
  const ac = new AbortController();
  let ran = false;
  const b = q.run(ac.signal, async () => void (ran = true));
  ac.abort(new OperationAbort('caller_gone'));
  await t.rejects(b, { code: 'EDGE_OPERATION_ABANDONED', reason: 'caller_gone', phase: 'queued' } as object as Error);
  t.equal(q.queued, 0);
  const c = q.run(undefined, async () => 'c ran');
  g.open();
  await a;
  t.equal(await c, 'c ran', 'the queue goes on behind the skipped one');
  t.equal(ran, false, 'the abandoned operation was not carried out');
});

t.test('a deadline that passes while queued abandons; a checkpoint abandons a running one', async (t) => {
  const q = new OperationQueue();
  const g = gate();
  const a = q.run(undefined, () => g.wait);
  const op = operationSignal(20);
  // The deadline timer is unref'd (it must not keep a stopping supervisor alive): hold the loop open.
  const alive = setInterval(() => undefined, 1000);
  t.teardown(() => clearInterval(alive));
  await t.rejects(q.run(op.signal, async () => 1), { name: 'OperationAbandoned', reason: 'deadline_exceeded', phase: 'queued' } as object as Error);
  g.open();
  await a;
  const late = operationSignal(10_000);
  late.callerGone();
  t.throws(() => checkpoint(late.signal), { name: 'OperationAbandoned', reason: 'caller_gone', phase: 'running' } as object as Error);
  late.dispose();
  t.doesNotThrow(() => checkpoint(undefined));
});

t.test('the answer to an abandoned operation', async (t) => {
  const cases: [AbandonReason, 'queued' | 'running', number, string][] = [
    ['deadline_exceeded', 'queued', 503, 'control_plane_busy'],
    ['deadline_exceeded', 'running', 504, 'operation_deadline_exceeded'],
    ['caller_gone', 'queued', 499, 'caller_gone'],
    ['caller_gone', 'running', 499, 'caller_gone'],
  ];
  for (const [reason, phase, status, code] of cases) {
    t.match(abandonedAnswer(new OperationAbandoned(reason, phase)), { status, reason: code, abandoned: true, body: { reason: code } }, `${reason} while ${phase}`);
  }
});
