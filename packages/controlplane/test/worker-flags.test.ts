// The V8 flags a worker is forked with: the supervisor's own execArgv, then each default the
// operator did not set (on the command line or in NODE_OPTIONS, in either spelling); and the glibc
// malloc tunables in its environment.
import t from 'tap';
import { WORKER_MALLOC_DEFAULTS, WORKER_V8_DEFAULTS, workerExecArgv, workerMallocTunables } from '../src/supervisor/worker-flags.ts';

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

t.test('malloc tunables: glibc\'s fixed thresholds unless the operator named them', async (t) => {
  const BOTH = 'glibc.malloc.trim_threshold=131072:glibc.malloc.mmap_threshold=131072';
  t.same(WORKER_MALLOC_DEFAULTS.map((d) => d.tunable), ['glibc.malloc.trim_threshold', 'glibc.malloc.mmap_threshold']);
  t.equal(workerMallocTunables({}), BOTH, 'both by default');
  t.equal(workerMallocTunables({ GLIBC_TUNABLES: '' }), BOTH, 'an empty variable names nothing');
  t.equal(workerMallocTunables({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' }), `glibc.malloc.arena_max=2:${BOTH}`, 'the operator\'s tunables are kept, first');
  t.equal(workerMallocTunables({ GLIBC_TUNABLES: 'glibc.malloc.trim_threshold=0' }), 'glibc.malloc.trim_threshold=0:glibc.malloc.mmap_threshold=131072', 'one the operator named is not added again');
  t.equal(workerMallocTunables({ MALLOC_MMAP_THRESHOLD_: '4096' }), 'glibc.malloc.trim_threshold=131072', 'the older variable counts as naming it');
  t.equal(workerMallocTunables({ GLIBC_TUNABLES: 'glibc.malloc.mmap_threshold=1', MALLOC_TRIM_THRESHOLD_: '1' }), undefined, 'both named: nothing to add, the environment is left as it is');
});
