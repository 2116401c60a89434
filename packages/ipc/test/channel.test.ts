// The request channel across a real child process with structured-clone serialization.
import t from 'tap';
import { fork } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { IpcError, RequestChannel, isFromWorker, isToWorker } from '../src/index.ts';

t.test('request/reply, coded refusal, timeout, and close on exit', async (t) => {
  const child = fork(path.join(import.meta.dirname, 'fixtures-child.ts'), [], { serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  t.teardown(() => child.kill('SIGKILL'));
  await once(child, 'message');
  const ch = new RequestChannel<{ id: number; type: string; payload?: unknown }>(child);
  const key = new Uint8Array([1, 2, 3, 250]);
  const echoed = await ch.request<{ key: Uint8Array; nested: Map<string, number> }>({ type: 'echo', payload: { key, nested: new Map([['a', 1]]) } }, 5000);
  t.same([...echoed.key], [1, 2, 3, 250], 'binary data crosses intact (structured clone)');
  t.equal(echoed.nested.get('a'), 1);
  await t.rejects(ch.request({ type: 'fail' }, 5000), { code: 'EDGE_PREPARE_FAILED', message: 'cannot prepare' });
  await t.rejects(ch.request({ type: 'slow' }, 100), { code: 'EDGE_IPC_TIMEOUT' });
  const pending = ch.request({ type: 'slow' }, 60_000);
  child.send({ type: 'exit' });
  await once(child, 'exit');
  ch.close();
  await t.rejects(pending, { code: 'EDGE_IPC_CLOSED' });
  await t.rejects(ch.request({ type: 'echo' }, 100), IpcError);
  t.equal(ch.inflight, 0);
});

t.test('a request to a child that died before the channel heard of it fails at once, and nothing is thrown', async (t) => {
  const child = fork(path.join(import.meta.dirname, 'fixtures-child.ts'), [], { serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  t.teardown(() => child.kill('SIGKILL'));
  await once(child, 'message');
  const ch = new RequestChannel<{ id: number; type: string }>(child);
  child.kill('SIGKILL');
  await once(child, 'exit'); // the channel is not closed: the supervisor may not have handled the exit yet
  // Without a send callback node emits 'error' on the child, which nobody handles: that crashed
  // the supervisor when a scrape or an activation raced a worker's death.
  const started = Date.now();
  await t.rejects(ch.request({ type: 'echo' }, 60_000), { code: 'EDGE_IPC_CLOSED' });
  t.ok(Date.now() - started < 5_000, 'rejected by the send, not by the 60 s timeout');
  t.equal(ch.inflight, 0);
});

t.test('boundary guards drop unknown messages', async (t) => {
  t.ok(isToWorker({ type: 'commit', id: 1, generation: 2 }));
  t.notOk(isToWorker({ type: 'commit' }), 'requests need an id');
  t.notOk(isToWorker({ type: 'rm -rf', id: 1 }));
  t.notOk(isToWorker(null));
  t.ok(isFromWorker({ type: 'heartbeat', stats: {} }));
  t.notOk(isFromWorker({ type: 'reply' }));
  t.notOk(isFromWorker('ready'));
});
