// The V8 flags a worker is forked with: the supervisor's own execArgv, the operator's
// EDGE_PROXY_WORKER_FLAGS, then each default the operator did not set (on the command line, in
// EDGE_PROXY_WORKER_FLAGS or in NODE_OPTIONS, in either spelling); and the glibc malloc tunables in
// its environment. test/worker-flags.test.ts runs EDGE_PROXY_WORKER_FLAGS under `edge-proxy serve`.
import t from 'tap';
import { checkWorkerFlags, parseWorkerFlags, WORKER_FLAGS_MAX, WORKER_MALLOC_DEFAULTS, WORKER_V8_DEFAULTS, workerExecArgv, workerMallocTunables } from '../src/supervisor/worker-flags.ts';

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
  t.same(workerExecArgv([], '--heap-growing-percent=0'), [SEMI], 'read in NODE_OPTIONS too (where Node itself refuses this one: EDGE_PROXY_WORKER_FLAGS is its place)');
  t.same(workerExecArgv([], '--max_semi_space_size=8 --heap_growing_percent=100'), [], 'both set');
  t.same(workerExecArgv([], '--max-old-space-size=512'), [...WORKER_V8_DEFAULTS], 'another flag does not count');
});

t.test('EDGE_PROXY_WORKER_FLAGS: after the supervisor\'s own flags, and a default it sets is not added', async (t) => {
  t.same(workerExecArgv(['--enable-source-maps'], undefined, ['--heap-growing-percent=0']), ['--enable-source-maps', '--heap-growing-percent=0', '--max-semi-space-size=16'], 'V8\'s own growing factor back; the semi-space default stays');
  t.same(workerExecArgv([], undefined, ['--max_semi_space_size=8', '--memory-saver-mode']), ['--max_semi_space_size=8', '--memory-saver-mode', '--heap-growing-percent=50'], 'either spelling; a flag with no default is simply passed');
  t.same(workerExecArgv([], '--max-semi-space-size=32', ['--heap-growing-percent=100']), ['--heap-growing-percent=100'], 'NODE_OPTIONS and the variable together: no default left to add (NODE_OPTIONS reaches the worker through its environment)');
});

t.test('EDGE_PROXY_WORKER_FLAGS is parsed as --flag or --flag=value tokens, bounded', async (t) => {
  t.same(parseWorkerFlags(undefined), { ok: true, flags: [] });
  t.same(parseWorkerFlags('  '), { ok: true, flags: [] });
  t.same(parseWorkerFlags(' --heap-growing-percent=0\t--max_semi_space_size=8  --memory-saver-mode '), { ok: true, flags: ['--heap-growing-percent=0', '--max_semi_space_size=8', '--memory-saver-mode'] });
  for (const bad of ['--max-semi-space-size 8', '-e 1', 'heap-growing-percent=0', '--', '--=1', '---x', '/tmp/evil.js', '--a;b']) {
    const r = parseWorkerFlags(bad);
    t.equal(r.ok, false, `refused: ${bad}`);
    if (!r.ok) t.match(r.message, /is not a --flag or --flag=value$/);
  }
  t.match(parseWorkerFlags(Array.from({ length: WORKER_FLAGS_MAX + 1 }, () => '--x').join(' ')), { ok: false, message: `${WORKER_FLAGS_MAX + 1} flags, more than ${WORKER_FLAGS_MAX}` });
  t.match(parseWorkerFlags(`--x=${'a'.repeat(300)}`), { ok: false, message: 'a flag of 304 characters, more than 256' });
});

t.test('the flags are tried on the node the workers run on: an unknown one is refused in its own words', async (t) => {
  t.equal(await checkWorkerFlags(process.execPath, ['--heap-growing-percent=0', '--max-semi-space-size=8']), undefined, 'flags V8 knows, including one NODE_OPTIONS would refuse');
  t.match(await checkWorkerFlags(process.execPath, ['--no-such-flag-at-all']), /^node refused them \(exit 9\): .*bad option: --no-such-flag-at-all$/);
  t.match(await checkWorkerFlags('/nonexistent/node', ['--x']), /^node with these flags failed \(exit ENOENT\)$/, 'a node that cannot be started');
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
