// The state directory's lock (issue 38 finding 11): the abstract-socket name is one per directory
// (however it is reached), taken by one holder at a time and free again when it is released; the
// lock file names the holder, and a file of a process that no longer runs is a stale holder.
import t from 'tap';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { LOCK_FILE, acquireStateLock, isLiveHolder, lockName, parseLockFile } from '../src/state/state-lock.ts';
import type { LockHolder, ProcessTable } from '../src/state/state-lock.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-lock-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

/** A process table where `running` maps pids to their start ticks. */
const table = (pid: number, running: Record<number, string>, bootId = 'boot-a'): ProcessTable => ({ pid, bootId, startTicks: (p) => running[p] });
const holder = (pid: number, ticks: string, bootId = 'boot-a'): LockHolder => ({ pid, start_ticks: ticks, boot_id: bootId, started_at_unix_ms: 1 });

t.test('isLiveHolder: same pid and start on this boot, and not this process', async (t) => {
  const me = table(10, { 10: '100', 20: '200', 30: '300' });
  const cases: [LockHolder, boolean, string][] = [
    [holder(20, '200'), true, 'another process, running, same start'],
    [holder(20, '199'), false, 'the pid was reused by a later process'],
    [holder(40, '400'), false, 'no such process'],
    [holder(20, '200', 'boot-b'), false, 'a holder from before a reboot'],
    [holder(10, '100'), false, 'this very process (before its re-exec)'],
  ];
  for (const [h, live, name] of cases) t.equal(isLiveHolder(h, me), live, name);
});

t.test('parseLockFile: only the shape it writes', async (t) => {
  t.same(parseLockFile(JSON.stringify(holder(5, '9'))), holder(5, '9'));
  for (const bad of ['', '{', '[]', '{"pid":0,"start_ticks":"1","boot_id":"b","started_at_unix_ms":1}', '{"pid":-5,"start_ticks":"1","boot_id":"b","started_at_unix_ms":1}', '{"pid":5,"start_ticks":1,"boot_id":"b","started_at_unix_ms":1}', '{"pid":"5"}']) t.equal(parseLockFile(bad), undefined, JSON.stringify(bad));
});

t.test('lockName: one name per directory, whatever path reaches it', async (t) => {
  const d = path.join(dir, 'named');
  mkdirSync(d);
  symlinkSync(d, path.join(dir, 'link'));
  t.equal(await lockName(path.join(dir, 'link')), await lockName(d), 'through a symbolic link');
  t.equal(await lockName(`${d}/./`), await lockName(d), 'another spelling');
  t.not(await lockName(path.join(dir, 'other')), await lockName(d), 'another directory');
  t.match(await lockName(d), /^\0edge-proxy\/state-lock\/[0-9a-f]{40}$/);
});

t.test('acquire: one holder at a time, free again once released; the file names the holder', async (t) => {
  const d = path.join(dir, 'held');
  const first = await acquireStateLock(d, table(process.pid, { [process.pid]: '77' }), () => 5);
  t.ok(first.ok, 'taken, the directory created');
  if (!first.ok) return;
  t.equal(first.stale, undefined, 'nothing stale');
  t.same(JSON.parse(readFileSync(path.join(d, LOCK_FILE), 'utf8')), { pid: process.pid, start_ticks: '77', boot_id: 'boot-a', started_at_unix_ms: 5 });
  const second = await acquireStateLock(d, table(process.pid, { [process.pid]: '77' }));
  t.match(second, { ok: false, holder: { pid: process.pid }, message: `state directory ${d} is held by another running edge-proxy serve (pid ${process.pid})` }, 'the name is taken: refused');
  await first.lock.release();
  t.throws(() => readFileSync(path.join(d, LOCK_FILE)), { code: 'ENOENT' }, 'release removes its file');
  const again = await acquireStateLock(d);
  t.ok(again.ok, 'free again');
  if (again.ok) await again.lock.release();
});

t.test('acquire: a file left by a process that no longer runs is stale (taken over); one of a running process in another namespace refuses', async (t) => {
  const d = path.join(dir, 'stale');
  mkdirSync(d);
  writeFileSync(path.join(d, LOCK_FILE), JSON.stringify(holder(4242, '1')));
  const taken = await acquireStateLock(d, table(process.pid, { [process.pid]: '9' }));
  t.match(taken, { ok: true, stale: { pid: 4242 } }, 'taken over, the old holder named');
  if (taken.ok) await taken.lock.release();
  // The name is free (another network namespace has its own), but the file names a live process.
  writeFileSync(path.join(d, LOCK_FILE), JSON.stringify(holder(4243, '5')));
  const refused = await acquireStateLock(d, table(process.pid, { [process.pid]: '9', 4243: '5' }));
  t.match(refused, { ok: false, holder: { pid: 4243 }, message: /held by another running edge-proxy serve \(pid 4243, per serve\.lock\)/ });
  // A garbage file is no holder: taken, rewritten.
  writeFileSync(path.join(d, LOCK_FILE), 'garbage');
  const garbage = await acquireStateLock(d, table(process.pid, { [process.pid]: '9' }));
  t.match(garbage, { ok: true, stale: undefined });
  if (garbage.ok) await garbage.lock.release();
});
