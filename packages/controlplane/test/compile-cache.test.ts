// The workers' compile cache (supervisor/compile-cache.ts): where it is, when it is refused, and
// the warm-up process that fills it. The warm-up runs real node processes on small TypeScript
// entries of the test's own; test/compile-cache.test.ts runs it under `edge-proxy serve`.
import t from 'tap';
import { chmodSync, chownSync, mkdirSync, readdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { COMPILE_CACHE_SUBDIR, planCompileCache, warmCompileCache, workerCacheEnv } from '../src/supervisor/compile-cache.ts';

const euid = process.geteuid?.() ?? -1;

/** Every file below `dir`. */
function files(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.join(e.parentPath, e.name));
}

t.test('created in the state directory, mode 0700, owned by the service', async (t) => {
  const root = t.testdir();
  const state = path.join(root, 'state');
  const plan = planCompileCache(state, {});
  t.same(plan, { dir: path.join(state, COMPILE_CACHE_SUBDIR) });
  const st = statSync(path.join(state, COMPILE_CACHE_SUBDIR));
  t.ok(st.isDirectory());
  t.equal(st.mode & 0o777, 0o700, 'no access for the group or others');
  t.equal(st.uid, euid);
  t.same(planCompileCache(state, {}), plan, 'an existing directory of ours is used as it is');
});

t.test('a worker gets the directory, and never the warm-up switch, whatever the supervisor\'s environment holds', async (t) => {
  t.same(workerCacheEnv({ dir: '/var/lib/edge-proxy/compile-cache' }), { NODE_COMPILE_CACHE: '/var/lib/edge-proxy/compile-cache', EDGE_WORKER_WARMUP: '' });
  t.same(workerCacheEnv({ off: 'disabled' }), { EDGE_WORKER_WARMUP: '' });
  t.same(workerCacheEnv({ problem: { code: 'EDGE_COMPILE_CACHE_UNSAFE', message: 'm' } }), { EDGE_WORKER_WARMUP: '' });
});

t.test('Node\'s own switches win: NODE_DISABLE_COMPILE_CACHE turns it off, an operator\'s NODE_COMPILE_CACHE is left alone', async (t) => {
  const root = t.testdir();
  const state = path.join(root, 'state');
  t.same(planCompileCache(state, { NODE_DISABLE_COMPILE_CACHE: '1' }), { off: 'disabled' });
  t.same(planCompileCache(state, { NODE_COMPILE_CACHE: '/srv/cache' }), { off: 'operator' });
  t.same(planCompileCache(state, { NODE_DISABLE_COMPILE_CACHE: '' }), { dir: path.join(state, COMPILE_CACHE_SUBDIR) }, 'an empty value sets nothing');
});

t.test('a directory others could write code into is refused (EDGE_COMPILE_CACHE_UNSAFE)', async (t) => {
  const root = t.testdir();
  const code = (plan: ReturnType<typeof planCompileCache>): string | undefined => ('problem' in plan ? plan.problem.code : undefined);

  const open = path.join(root, 'open');
  mkdirSync(path.join(open, COMPILE_CACHE_SUBDIR), { recursive: true });
  chmodSync(path.join(open, COMPILE_CACHE_SUBDIR), 0o777);
  const openPlan = planCompileCache(open, {});
  t.equal(code(openPlan), 'EDGE_COMPILE_CACHE_UNSAFE', 'writable by others');
  t.match('problem' in openPlan ? openPlan.problem.message : '', /mode 777/);
  chmodSync(path.join(open, COMPILE_CACHE_SUBDIR), 0o770);
  t.equal(code(planCompileCache(open, {})), 'EDGE_COMPILE_CACHE_UNSAFE', 'writable by the group');

  const linked = path.join(root, 'linked');
  mkdirSync(linked);
  mkdirSync(path.join(root, 'elsewhere'), { mode: 0o700 });
  symlinkSync(path.join(root, 'elsewhere'), path.join(linked, COMPILE_CACHE_SUBDIR));
  t.equal(code(planCompileCache(linked, {})), 'EDGE_COMPILE_CACHE_UNSAFE', 'a link, even to a safe directory');

  const other = path.join(root, 'other');
  mkdirSync(path.join(other, COMPILE_CACHE_SUBDIR), { recursive: true, mode: 0o700 });
  const otherPlan = planCompileCache(other, {}, euid + 1);
  t.equal(code(otherPlan), 'EDGE_COMPILE_CACHE_UNSAFE', 'owned by another user');
  t.match('problem' in otherPlan ? otherPlan.problem.message : '', `owned by uid ${euid}, not by the service's uid ${euid + 1}`);
  if (euid === 0) {
    // As root for real: a directory that belongs to nobody.
    chownSync(path.join(other, COMPILE_CACHE_SUBDIR), 65534, 65534);
    t.equal(code(planCompileCache(other, {})), 'EDGE_COMPILE_CACHE_UNSAFE', 'owned by nobody, seen by root');
  }
});

t.test('a directory that cannot be made is EDGE_COMPILE_CACHE_UNUSABLE', async (t) => {
  const root = t.testdir();
  const blocked = path.join(root, 'blocked');
  writeFileSync(blocked, 'a file where the state directory should be');
  const plan = planCompileCache(blocked, {});
  t.equal('problem' in plan ? plan.problem.code : undefined, 'EDGE_COMPILE_CACHE_UNUSABLE');
  t.match('problem' in plan ? plan.problem.message : '', /cannot create .*\(ENOTDIR\)/);
  const file = path.join(root, 'file');
  mkdirSync(file);
  writeFileSync(path.join(file, COMPILE_CACHE_SUBDIR), '');
  const filePlan = planCompileCache(file, {});
  t.equal('problem' in filePlan ? filePlan.problem.code : undefined, 'EDGE_COMPILE_CACHE_UNUSABLE', 'a file where the directory should be');
  t.match('problem' in filePlan ? filePlan.problem.message : '', /\(EEXIST\)/);
});

t.test('warm-up: the entry loads its modules and leaves; what Node compiled is in the cache, and a second process finds it', async (t) => {
  const root = t.testdir();
  const dir = path.join(root, 'cache');
  mkdirSync(dir, { mode: 0o700 });
  const app = path.join(root, 'app');
  mkdirSync(app);
  writeFileSync(path.join(app, 'dep.ts'), 'export const answer: number = 42;\n');
  // Like worker/main.ts: static imports, then leave when told to warm up, else do the work.
  writeFileSync(path.join(app, 'entry.ts'), [
    "import { answer } from './dep.ts';",
    "if (process.env['EDGE_WORKER_WARMUP'] === '1') process.exit(0);",
    "process.stdout.write(`served ${answer}`);",
    '',
  ].join('\n'));
  const first = await warmCompileCache({ exec: path.join(app, 'entry.ts'), execArgv: ['--max-semi-space-size=16'], dir });
  t.ok(first.ok, JSON.stringify(first));
  const written = files(dir);
  t.ok(written.length >= 4, `${written.length} cache files (stripped source and code cache of two modules)`);
  const second = await warmCompileCache({ exec: path.join(app, 'entry.ts'), execArgv: ['--max-semi-space-size=16'], dir, env: { ...process.env, NODE_DEBUG_NATIVE: 'COMPILE_CACHE' } });
  t.ok(second.ok);
  t.same(files(dir).sort(), written.sort(), 'a warm cache is read, not written again');
});

t.test('warm-up failures are reported, never thrown: an exit code with the last stderr line, a signal, a timeout, a missing entry', async (t) => {
  const root = t.testdir();
  const dir = path.join(root, 'cache');
  mkdirSync(dir, { mode: 0o700 });
  const failing = path.join(root, 'failing.ts');
  writeFileSync(failing, "process.stderr.write('first line\\nthe reason it failed\\n');\nprocess.exit(3);\n");
  const failed = await warmCompileCache({ exec: failing, execArgv: [], dir });
  t.same(failed, { ok: false, message: 'the warm-up process exited 3: the reason it failed' });

  const hanging = path.join(root, 'hanging.ts');
  writeFileSync(hanging, 'setInterval(() => {}, 1000);\n');
  const t0 = performance.now();
  const timedOut = await warmCompileCache({ exec: hanging, execArgv: [], dir, timeoutMs: 300 });
  t.same(timedOut, { ok: false, message: 'the warm-up process was still running after 300 ms: killed' });
  t.ok(performance.now() - t0 < 5000, 'it did not wait for the process beyond its deadline');

  const killed = path.join(root, 'killed.ts');
  writeFileSync(killed, "process.kill(process.pid, 'SIGKILL');\n");
  t.same(await warmCompileCache({ exec: killed, execArgv: [], dir }), { ok: false, message: 'the warm-up process was ended by SIGKILL' });

  const missing = await warmCompileCache({ exec: path.join(root, 'nowhere.ts'), execArgv: [], dir });
  t.equal(missing.ok, false);
  t.match(missing.ok ? '' : missing.message, /^the warm-up process exited 1: /, 'node names the missing entry');
});
