// systemd notification: the protocol as data (environment, addresses, datagrams), the watchdog gate
// as a pure policy with a fixed clock, and the notifier against a real unix datagram socket (a
// filesystem path and an abstract `@name`): READY=1 waits for readiness, reloads are framed, a
// wedged pool withholds WATCHDOG=1 until it serves again, a send failure is one warn line.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describeService, formatNotify, notifyAddress, readNotifyEnvironment, unsetNotifyEnvironment, watchdogPingMs } from '../src/systemd/notify-protocol.ts';
import { initialGate, stallLimitMs, stepGate } from '../src/systemd/watchdog-gate.ts';
import { SystemdNotifier } from '../src/systemd/notifier.ts';
import type { NotifyLog, ServiceView } from '../src/systemd/notifier.ts';
import { notifyReceiver } from '../../../test/support/notify-socket.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-sd-notifier-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

t.test('NOTIFY_SOCKET: a path as is, @name as an abstract address, anything else unsupported', async (t) => {
  t.same(notifyAddress(undefined), { socket: undefined, unsupported: undefined });
  t.same(notifyAddress(''), { socket: undefined, unsupported: undefined });
  t.same(notifyAddress('/run/systemd/notify'), { socket: '/run/systemd/notify', unsupported: undefined });
  t.same(notifyAddress('@sd-notify-x'), { socket: '\0sd-notify-x', unsupported: undefined });
  t.same(notifyAddress('@'), { socket: undefined, unsupported: '@' });
  t.same(notifyAddress('vsock:2:1234'), { socket: undefined, unsupported: 'vsock:2:1234' });
  t.same(notifyAddress('relative/path'), { socket: undefined, unsupported: 'relative/path' });
});

t.test('WATCHDOG_USEC: pings at half of it, only for our pid', async (t) => {
  const table: [usec: string | undefined, pid: string | undefined, ms: number | undefined][] = [
    ['30000000', undefined, 15_000],
    ['30000000', '', 15_000],
    ['30000000', '42', 15_000],
    ['30000000', '43', undefined],
    ['1000', '42', 1],
    ['1500', undefined, 1],
    ['0', undefined, undefined],
    ['-5', undefined, undefined],
    ['12abc', undefined, undefined],
    [undefined, '42', undefined],
  ];
  for (const [usec, pid, ms] of table) t.equal(watchdogPingMs(usec, pid, 42), ms, `WATCHDOG_USEC=${usec} WATCHDOG_PID=${pid}`);
});

t.test('the variables are read, left for a re-exec, then removed before forking (workers and restart_command must not inherit them)', async (t) => {
  const env: NodeJS.ProcessEnv = { NOTIFY_SOCKET: '@x', WATCHDOG_USEC: '2000000', WATCHDOG_PID: '7', PATH: '/bin' };
  t.same(readNotifyEnvironment(env, 7), { socket: '\0x', unsupported: undefined, watchdogPingMs: 1000 });
  t.equal(env['NOTIFY_SOCKET'], '@x', 'reading leaves them (an execve of this process passes them on)');
  unsetNotifyEnvironment(env);
  t.same(env, { PATH: '/bin' }, 'only PATH is left');
  t.same(readNotifyEnvironment({ WATCHDOG_USEC: '2000000' }, 7), { socket: undefined, unsupported: undefined, watchdogPingMs: undefined }, 'no socket: no watchdog either');
  const own: NodeJS.ProcessEnv = { NOTIFY_SOCKET: '/run/n', WATCHDOG_USEC: '1000000', OTHER: 'x' };
  const n = SystemdNotifier.fromEnvironment(() => undefined, own, 7);
  t.ok(n.enabled, 'the notifier keeps what it read');
  n.unsetEnvironment();
  t.same(own, { OTHER: 'x' }, 'unsetEnvironment() empties the environment it read');
  t.ok(n.enabled, 'and still notifies');
});

t.test('datagrams: KEY=value lines; a STATUS is one bounded line', async (t) => {
  t.equal(formatNotify({ kind: 'ready', status: 'generation 1 active; 2/2 workers ready' }), 'READY=1\nSTATUS=generation 1 active; 2/2 workers ready');
  t.equal(formatNotify({ kind: 'reloading', monotonicUsec: 123456789n, status: 'reloading' }), 'RELOADING=1\nMONOTONIC_USEC=123456789\nSTATUS=reloading');
  t.equal(formatNotify({ kind: 'stopping', status: 'stopping' }), 'STOPPING=1\nSTATUS=stopping');
  t.equal(formatNotify({ kind: 'watchdog' }), 'WATCHDOG=1');
  t.equal(formatNotify({ kind: 'status', status: 'a\nREADY=1\r\nb' }), 'STATUS=a READY=1 b', 'a line break cannot smuggle an assignment');
  t.equal(formatNotify({ kind: 'status', status: 'x'.repeat(500) }).length, 'STATUS='.length + 200);
  t.equal(describeService({ generation: 4, workersReady: 1, workersExpected: 2 }, 'not ready'), 'not ready; generation 4 active; 1/2 workers ready');
});

t.test('watchdog gate: pings while ready or coming back; withheld past the stall limit; resumed when serving', async (t) => {
  const limit = 1000;
  let s = initialGate(0);
  // [now, ready, progressAt, ping, transition]
  const table: [number, boolean, number | undefined, boolean, string | undefined][] = [
    [100, true, undefined, true, undefined],
    [600, false, undefined, true, undefined], // not ready for 500 ms: within the limit
    [1100, false, undefined, true, undefined], // 1000 ms exactly: still within
    [1101, false, undefined, false, 'withheld'],
    [1500, false, undefined, false, undefined], // still withheld, logged once
    [1600, false, 1550, true, 'resumed'], // a worker came back (progress)
    [2550, false, 1550, true, undefined],
    [2551, false, 1550, false, 'withheld'],
    [2600, true, 1550, true, 'resumed'],
  ];
  for (const [now, ready, progressAt, ping, transition] of table) {
    const step = stepGate(s, { now, ready, progressAt, stallLimitMs: limit });
    t.equal(step.ping, ping, `t=${now} ready=${ready}: ping ${ping}`);
    t.equal(step.transition, transition, `t=${now}: transition ${transition}`);
    s = step.state;
  }
  t.equal(stallLimitMs(5000), 5000 + 60_000 + 10_000, 'stall limit: drain grace + the pool comeback deadline + the longest re-fork backoff');
});

/** A log that keeps its lines. */
function memoryLog(): NotifyLog & { lines: { level: string; fields: Record<string, unknown>; message: string }[] } {
  const lines: { level: string; fields: Record<string, unknown>; message: string }[] = [];
  const at = (level: string) => (fields: object, message: string) => void lines.push({ level, fields: fields as Record<string, unknown>, message });
  return { lines, info: at('info'), warn: at('warn'), error: at('error') };
}

function view(over: Partial<ServiceView> = {}): ServiceView {
  return { generation: 1, workersReady: 2, workersExpected: 2, ready: true, stallLimitMs: 60_000, ...over };
}

for (const kind of ['path', 'abstract'] as const) {
  t.test(`notifier over a ${kind} socket: READY=1 waits for readiness, reloads framed, STOPPING=1 ends the pings`, async (t) => {
    const address = kind === 'path' ? path.join(dir, 'n.sock') : `@edge-sd-notify-test-${process.pid}`;
    const receiver = notifyReceiver(address);
    t.teardown(() => receiver.close());
    const log = memoryLog();
    const n = SystemdNotifier.fromEnvironment(() => log, { NOTIFY_SOCKET: address, WATCHDOG_USEC: '100000' }, process.pid);
    t.ok(n.enabled);
    let current = view({ ready: false, workersReady: 1 });
    n.started(() => current, new EventEmitter());
    await new Promise((r) => setTimeout(r, 300)); // the notifier polls every 50 ms: several polls pass
    t.same(receiver.received.map((m) => m.text), [], 'nothing while the pool is not ready');
    current = view();
    const ready = await receiver.next((m) => m.fields['READY'] === '1', 5000);
    t.equal(ready.text, 'READY=1\nSTATUS=generation 1 active; 2/2 workers ready');
    await receiver.next((m) => m.text === 'WATCHDOG=1', 5000, receiver.received.indexOf(ready) + 1);
    const out = await n.reloading(async () => {
      current = view({ generation: 2 });
      return 'done';
    });
    t.equal(out, 'done', 'the reload result passes through');
    const reloading = await receiver.next((m) => m.fields['RELOADING'] === '1', 5000);
    const back = await receiver.next((m) => m.fields['READY'] === '1', 5000, receiver.received.indexOf(reloading) + 1);
    t.equal(back.fields['STATUS'], 'generation 2 active; 2/2 workers ready');
    await t.rejects(
      n.reloading(() => Promise.reject(new Error('boom'))),
      /boom/,
      'a failing reload rethrows',
    );
    await receiver.next((m) => m.fields['READY'] === '1', 5000, receiver.received.indexOf(back) + 1);
    n.stopping();
    const stopping = await receiver.next((m) => m.fields['STOPPING'] === '1', 5000);
    await new Promise((r) => setTimeout(r, 250)); // several ping intervals (50 ms)
    t.same(receiver.received.slice(receiver.received.indexOf(stopping) + 1).map((m) => m.text), [], 'nothing after STOPPING=1');
    await n.close();
    t.same(log.lines, [], 'nothing logged');
  });
}

t.test('a wedged pool withholds WATCHDOG=1 (one error line), a worker coming back resumes them', async (t) => {
  const address = path.join(dir, 'wedge.sock');
  const receiver = notifyReceiver(address);
  t.teardown(() => receiver.close());
  const log = memoryLog();
  const n = SystemdNotifier.fromEnvironment(() => log, { NOTIFY_SOCKET: address, WATCHDOG_USEC: '40000' }, process.pid);
  const pool = new EventEmitter();
  let current = view({ stallLimitMs: 200 });
  n.started(() => current, pool);
  await receiver.next((m) => m.fields['READY'] === '1', 5000);
  current = view({ ready: false, workersReady: 0, stallLimitMs: 200 });
  const wedged = await receiver.next((m) => m.fields['STATUS']?.startsWith('WEDGED') === true, 5000);
  t.match(wedged.fields['STATUS'], /^WEDGED: worker pool not ready for \d+ ms with no worker coming back \(limit 200 ms\); generation 1 active; 0\/2 workers ready$/);
  const at = receiver.received.indexOf(wedged);
  await new Promise((r) => setTimeout(r, 300)); // 15 ping intervals
  t.same(receiver.received.slice(at + 1).filter((m) => m.text === 'WATCHDOG=1'), [], 'no ping while wedged');
  t.same(log.lines.map((l) => [l.level, l.fields['code']]), [['error', 'EDGE_SYSTEMD_WATCHDOG_WITHHELD']], 'one error line');
  // A worker comes back (the pool is still not ready): progress resumes the pings for one more stall limit.
  pool.emit('refork', 0, 1);
  await receiver.next((m) => m.text === 'WATCHDOG=1', 5000, at + 1);
  t.same(log.lines.slice(0, 2).map((l) => l.level), ['error', 'info'], 'resumption logged at info');
  await n.close();
});

t.test('a notification that cannot be sent: one warn line, never a throw', async (t) => {
  const log = memoryLog();
  const n = SystemdNotifier.fromEnvironment(() => log, { NOTIFY_SOCKET: path.join(dir, 'nobody-listens.sock'), WATCHDOG_USEC: '20000' }, process.pid);
  n.started(() => view(), new EventEmitter());
  await new Promise((r) => setTimeout(r, 200)); // READY=1 and about 20 pings, all failing
  n.statusNow();
  await n.reloading(async () => undefined);
  await n.close();
  t.same(log.lines.map((l) => [l.level, l.fields['code']]), [['warn', 'EDGE_SYSTEMD_NOTIFY_FAILED']], 'one warn line for every failed send');
  t.match(log.lines[0]?.fields['err'], /No such file or directory/);
});

t.test('an unsupported NOTIFY_SOCKET is one warn line; without NOTIFY_SOCKET nothing happens', async (t) => {
  const log = memoryLog();
  const n = SystemdNotifier.fromEnvironment(() => log, { NOTIFY_SOCKET: 'vsock:2:99' }, process.pid);
  t.notOk(n.enabled);
  n.started(() => view(), new EventEmitter());
  t.same(log.lines.map((l) => [l.level, l.fields['code']]), [['warn', 'EDGE_SYSTEMD_NOTIFY_FAILED']]);
  const quiet = memoryLog();
  const none = SystemdNotifier.fromEnvironment(() => quiet, {}, process.pid);
  none.started(() => view(), new EventEmitter());
  t.equal(await none.reloading(async () => 7), 7);
  none.stopping();
  await none.close();
  t.same(quiet.lines, []);
});
