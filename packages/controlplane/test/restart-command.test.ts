// runRestartCommand judged against real processes: each way a command can fail to restart the
// service, and success only when the service is stopping.
import t from 'tap';
import { describeFailure, runRestartCommand } from '../src/supervisor/restart-command.ts';

const notStopping = (): boolean => false;

t.test('a non-zero exit: its status and last stderr line', async (t) => {
  const r = await runRestartCommand(['/bin/sh', '-c', 'echo first >&2; echo "Failed to restart: denied" >&2; exit 3'], 5000, notStopping);
  t.same(r, { ok: false, reason: 'EDGE_RESTART_COMMAND_FAILED', exit_code: 3, signal: null, stderr: 'Failed to restart: denied' });
  if (!r.ok) t.equal(describeFailure(r), 'the restart command exited with status 3');
});

t.test('ended by a signal', async (t) => {
  const r = await runRestartCommand(['/bin/sh', '-c', 'kill -TERM $$'], 5000, notStopping);
  t.match(r, { ok: false, reason: 'EDGE_RESTART_COMMAND_FAILED', exit_code: null, signal: 'SIGTERM' });
  if (!r.ok) t.equal(describeFailure(r), 'the restart command was ended by SIGTERM');
});

t.test('a missing executable: its errno', async (t) => {
  t.same(await runRestartCommand(['/nonexistent/restart-me'], 5000, notStopping), { ok: false, reason: 'EDGE_RESTART_COMMAND_NOT_STARTED', errno: 'ENOENT' });
});

t.test('still running at the deadline: the whole process group is killed', async (t) => {
  const started = Date.now();
  // The shell's child (sleep) would outlive a kill of the shell alone.
  const r = await runRestartCommand(['/bin/sh', '-c', 'echo hanging >&2; sleep 60; echo never'], 300, notStopping);
  t.same(r, { ok: false, reason: 'EDGE_RESTART_COMMAND_TIMEOUT', timeout_ms: 300, stderr: 'hanging' });
  t.ok(Date.now() - started < 5000, 'judged at the deadline, not when the command ends');
});

t.test('exit 0: failed unless the service is stopping by the deadline', async (t) => {
  t.same(await runRestartCommand(['/bin/true'], 200, notStopping), { ok: false, reason: 'EDGE_RESTART_COMMAND_NO_RESTART', timeout_ms: 200 });
  let stopping = false;
  setTimeout(() => (stopping = true), 50);
  t.same(await runRestartCommand(['/bin/true'], 500, () => stopping), { ok: true }, 'SIGTERM reached the service: the command worked');
});

t.test('a command killed along with the service it restarted still counts as success', async (t) => {
  t.same(await runRestartCommand(['/bin/false'], 5000, () => true), { ok: true });
});
