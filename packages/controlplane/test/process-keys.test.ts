// What the supervisor decides from the process keys before it forks (supervisor/process-keys.ts):
// accounts resolved through NSS, the refusals (unknown account, a non-root start that could not
// switch, pin_workers without taskset), the warning of a root start without a user, the workers'
// environment, and the CPU list parsing. The workers' side runs in test/process-keys.test.ts.
import t from 'tap';
import { WORKER_CPUS_ENV, WORKER_DROP_ENV } from '@edge-proxy/ipc';
import { allowedCpus, hostProblems, prepareProcessKeys, resolveDropTarget } from '../src/supervisor/process-keys.ts';

const ROOT = { euid: 0, egid: 0 };
const USER = { euid: 1000, egid: 1000 };
type Keys = Parameters<typeof prepareProcessKeys>[0];
const keys = (security: Keys['security'], performance: Partial<Keys['performance']> = {}): Keys => ({ security, performance: { pin_workers: false, control_plane_threads: 4, ...performance } as Keys['performance'] });

t.test('nobody and nogroup resolve to their ids; names that do not exist are coded problems at their keys', async (t) => {
  t.same(resolveDropTarget({ user: 'nobody', group: 'nogroup' }), { target: { user: 'nobody', uid: 65534, gid: 65534 }, problems: [] });
  t.same(resolveDropTarget({ user: 'nobody' }).target, { user: 'nobody', uid: 65534, gid: 65534 }, "without a group: the user's primary group");
  t.same(resolveDropTarget({ group: 'nogroup' }).target, { gid: 65534 }, 'a group alone');
  t.same(resolveDropTarget({}), { problems: [] }, 'nothing to drop');
  t.same(resolveDropTarget({ user: 'no-such-user-x', group: 'no-such-group-x' }).problems, [
    { path: 'security.user', code: 'EDGE_STARTUP_ACCOUNT', message: "no user 'no-such-user-x' on this host" },
    { path: 'security.group', code: 'EDGE_STARTUP_ACCOUNT', message: "no group 'no-such-group-x' on this host" },
  ]);
  t.same(hostProblems(keys({ user: 'no-such-user-x' })).map((p) => p.code), ['EDGE_STARTUP_ACCOUNT'], '`edge-proxy -c` sees the same');
});

t.test('a start as root hands the workers the ids; without a user it warns', async (t) => {
  const env: NodeJS.ProcessEnv = {};
  const dropping = await prepareProcessKeys(keys({ user: 'nobody', group: 'nogroup' }), 2, ROOT, env);
  t.equal(dropping.problem, undefined);
  t.same(JSON.parse(dropping.workerEnv[WORKER_DROP_ENV] ?? 'null'), { user: 'nobody', uid: 65534, gid: 65534 });
  t.notOk(dropping.notes.some((n) => n.level === 'warn'), 'no warning');
  const keeping = await prepareProcessKeys(keys({}), 2, ROOT, env);
  t.same(keeping.workerEnv, {}, 'nothing for the workers to do');
  t.same(
    keeping.notes.filter((n) => n.level === 'warn').map((n) => n.message),
    ['running as root without security.user: the workers keep root after binding (set security.user and security.group, or run the service as its own user)'],
  );
  const groupOnly = await prepareProcessKeys(keys({ group: 'nogroup' }), 2, ROOT, env);
  t.ok(groupOnly.notes.some((n) => n.level === 'warn'), 'a group alone keeps uid 0: warned too');
});

t.test('a start that is not root cannot switch to another account: EDGE_STARTUP_PRIVILEGE', async (t) => {
  const r = await prepareProcessKeys(keys({ user: 'nobody' }), 1, USER, {});
  t.same(r.problem, { path: 'security.user', code: 'EDGE_STARTUP_PRIVILEGE', message: 'the service runs as uid 1000, not root: its workers cannot switch to nobody' });
  t.same(r.workerEnv, {});
  t.equal((await prepareProcessKeys(keys({}), 1, USER, {})).problem, undefined, 'no user: nothing to refuse, nothing to warn about');
  const self = await prepareProcessKeys(keys({ user: 'nobody', group: 'nogroup' }), 1, { euid: 65534, egid: 65534 }, {});
  t.equal(self.problem, undefined, 'already that account (a unit with User=): allowed');
  t.ok(self.notes.some((n) => n.message === 'already running as security.user/group: nothing to switch'));
  t.equal((await prepareProcessKeys(keys({ user: 'nobody', group: 'root' }), 1, { euid: 65534, egid: 65534 }, {})).problem?.code, 'EDGE_STARTUP_PRIVILEGE', 'the user but another group: refused');
});

t.test('pin_workers hands the workers the CPU list of the supervisor', async (t) => {
  const r = await prepareProcessKeys(keys({}, { pin_workers: true }), 2, ROOT, {});
  t.equal(r.problem, undefined, 'taskset is installed here');
  t.equal(r.workerEnv[WORKER_CPUS_ENV], allowedCpus().join(','));
  t.same(allowedCpus('Name:\tx\nCpus_allowed_list:\t0-3,6,8-9\n'), [0, 1, 2, 3, 6, 8, 9]);
  t.same(allowedCpus('Cpus_allowed_list:\t5\n'), [5]);
});

t.test('control_plane_threads: sized when the environment (or the re-exec) says so, a warning when not', async (t) => {
  const sized = await prepareProcessKeys(keys({}, { control_plane_threads: 3 }), 1, USER, { UV_THREADPOOL_SIZE: '3' });
  t.ok(sized.notes.some((n) => n.message === 'control-plane thread pool sized'));
  const reexecuted: NodeJS.ProcessEnv = { UV_THREADPOOL_SIZE: '3', EDGE_PROXY_UV_THREADPOOL_SIZE_WAS: '' };
  const after = await prepareProcessKeys(keys({}, { control_plane_threads: 3 }), 1, USER, reexecuted);
  t.ok(after.notes.some((n) => n.message === 'control-plane thread pool sized'));
  t.same(reexecuted, {}, 'the environment is given back as it was before the re-exec (workers and restart_command inherit it)');
  const restored: NodeJS.ProcessEnv = { UV_THREADPOOL_SIZE: '3', EDGE_PROXY_UV_THREADPOOL_SIZE_WAS: '16' };
  await prepareProcessKeys(keys({}, { control_plane_threads: 3 }), 1, USER, restored);
  t.same(restored, { UV_THREADPOOL_SIZE: '16' });
  const embedded = await prepareProcessKeys(keys({}, { control_plane_threads: 3 }), 1, USER, {});
  t.ok(embedded.notes.some((n) => n.level === 'warn' && n.message.startsWith('control_plane_threads not applied')), 'libuv default 4 ≠ 3 without a re-exec: warned');
});
