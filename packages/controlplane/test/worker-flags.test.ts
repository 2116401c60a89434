// The V8 flags a worker is forked with: the supervisor's own execArgv, then each default the
// operator did not set (on the command line or in NODE_OPTIONS, in either spelling).
import t from 'tap';
import { WORKER_V8_DEFAULTS, workerExecArgv } from '../src/supervisor/worker-flags.ts';

t.test('the defaults are added after the supervisor\'s own flags', async (t) => {
  t.same(workerExecArgv(['--enable-source-maps'], undefined), ['--enable-source-maps', ...WORKER_V8_DEFAULTS]);
  t.same(workerExecArgv([], ''), [...WORKER_V8_DEFAULTS]);
  t.ok(WORKER_V8_DEFAULTS.includes('--max-semi-space-size=16'), 'a 16 MiB semi-space by default');
  t.ok(WORKER_V8_DEFAULTS.includes('--heap-growing-percent=50'), 'an old generation grown to 1.5 times its live size by default');
});

t.test('a flag the operator set is never added again, whatever its value or spelling; the other defaults still are', async (t) => {
  const HGP = '--heap-growing-percent=50';
  const SEMI = '--max-semi-space-size=16';
  t.same(workerExecArgv([], '--max-semi-space-size=64'), [HGP], 'NODE_OPTIONS, dashes');
  t.same(workerExecArgv([], '--trace-warnings  --max_semi_space_size=4 '), [HGP], 'NODE_OPTIONS, underscores, among others');
  t.same(workerExecArgv(['--max-semi-space-size=32'], undefined), ['--max-semi-space-size=32', HGP], 'the command line');
  t.same(workerExecArgv(['--max-semi-space-size', '32'], undefined), ['--max-semi-space-size', '32', HGP], 'the command line, value apart');
  t.same(workerExecArgv([], '--heap-growing-percent=0'), [SEMI], 'V8\'s own growing factor back (0: its default)');
  t.same(workerExecArgv([], '--max_semi_space_size=8 --heap_growing_percent=100'), [], 'both set');
  t.same(workerExecArgv([], '--max-old-space-size=512'), [...WORKER_V8_DEFAULTS], 'another flag does not count');
});
