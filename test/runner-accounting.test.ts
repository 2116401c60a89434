// The runner's accounting (scripts/lib/tap-accounting.ts) against real tap runs of planted test
// files: a file that registers no tests, one that crashes, one that exits non-zero after passing,
// one killed by a signal, one that hangs past tap's timeout. Each must be a counted, named
// failure; tap's own summary line passes the killed one and skips the empty one.
import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { accountTap } from '../scripts/lib/tap-accounting.ts';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
// Inside the repository so the fixtures resolve `tap`; named `.fixture.ts`, never picked up by the suite.
const dir = mkdtempSync(path.join(root, 'test', '.runner-fixtures-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

const FIXTURES: Record<string, string> = {
  'ok.fixture.ts': `import t from 'tap';\nt.pass('one');\nt.test('sub', async (t) => { t.pass('a'); t.pass('b'); });\n`,
  'empty.fixture.ts': `export const nothing = 1;\n`,
  'crash.fixture.ts': `import t from 'tap';\nt.pass('one');\nsetTimeout(() => { throw new Error('boom'); }, 10);\n`,
  'exit.fixture.ts': `import t from 'tap';\nt.pass('one');\nt.pass('two');\nsetTimeout(() => process.exit(3), 10);\n`,
  'kill.fixture.ts': `import t from 'tap';\nt.pass('one');\nt.test('sub', async (t) => { t.pass('a'); process.kill(process.pid, 'SIGKILL'); });\n`,
  'fail.fixture.ts': `import t from 'tap';\nt.equal(1, 2, 'planted');\nt.pass('fine');\n`,
  'hang.fixture.ts': `import t from 'tap';\nt.pass('one');\nt.test('sub', async (t) => { t.pass('a'); await new Promise(() => setInterval(() => {}, 1000)); });\n`,
};
for (const [name, text] of Object.entries(FIXTURES)) writeFileSync(path.join(dir, name), text);
// The fixtures' directory is the inner run's project root, so that its `.tap/` is its own: a run
// rooted at the repository clears `.tap/processinfo` at its start, under the suite's own run
// writing there (CI: `ENOTEMPTY: rmdir .tap/processinfo`, the inner tap dead before its first file).
// The same plugins as the repository's .taprc, so tap has nothing to rebuild.
writeFileSync(path.join(dir, '.taprc'), 'plugin:\n  - "!@tapjs/typescript"\ndisable-coverage: true\n');

/** What an inner tap run printed (stderr: its tail), how it exited and how long it took. */
interface TapRun {
  readonly out: string;
  readonly err: string;
  readonly code: number | null;
  readonly ms: number;
}

/**
 * A fresh `tap` run of `files`, in the fixtures' directory. Its environment is the suite's without
 * what the outer tap gives its own test processes (TAP_*, its processinfo loader in NODE_OPTIONS):
 * the inner run is a run of its own, as a developer's. Its stderr is kept for the assertions'
 * diagnostics.
 */
function tap(files: string[], timeoutS: number): Promise<TapRun> {
  const bin = path.join(root, 'node_modules', '.bin', 'tap');
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(TAP($|_)|_TAPJS_|NODE_OPTIONS$)/.test(k)));
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['--reporter=tap', `--timeout=${timeoutS}`, ...files], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err = (err + c.toString()).slice(-4000)));
    child.on('error', reject);
    child.on('close', (code) => resolve({ out, err, code, ms: Date.now() - started }));
  });
}

/** How the inner run went, for a failed assertion's message. */
function diag(r: TapRun): Record<string, unknown> {
  return { exit: r.code, ms: r.ms, stdoutTail: r.out.slice(-1500), stderrTail: r.err.slice(-1500) };
}

t.test('crashed, killed, empty and non-zero-exit files are each a named failure; passing files are not', async (t) => {
  const run = await tap(['ok.fixture.ts', 'empty.fixture.ts', 'crash.fixture.ts', 'exit.fixture.ts', 'kill.fixture.ts', 'fail.fixture.ts'], 120);
  const a = accountTap(run.out);
  t.same(
    Object.fromEntries(a.problems.map((p) => [p.file, p.reason])),
    {
      'empty.fixture.ts': 'registers no tests',
      'crash.fixture.ts': 'exited with code 1, 1 failed assertion(s)',
      'exit.fixture.ts': 'exited with code 3',
      'kill.fixture.ts': 'killed by SIGKILL',
      'fail.fixture.ts': 'exited with code 1, 1 failed assertion(s)',
    },
    'each abnormal file named with its reason; ok.fixture.ts absent',
    diag(run),
  );
  // Leaves: ok 3, crash 1, exit 2, kill 2 (one, a), fail 1.
  t.equal(a.passed, 9, 'passing assertions', diag(run));
  // crash: boom + file; empty: file; exit: file; kill: file; fail: planted + file.
  t.equal(a.failed, 7, 'failed assertions plus one per abnormal file', diag(run));
});

t.test('a file that hangs past the timeout is a named failure', async (t) => {
  const run = await tap(['hang.fixture.ts'], 10);
  const a = accountTap(run.out);
  t.same(a.problems.map((p) => p.file), ['hang.fixture.ts'], 'the hanging file is the one problem', diag(run));
  t.match(a.problems[0]?.reason ?? '', /^timed out/, 'named as timed out', diag(run));
  t.ok(a.failed >= 1, 'counted as a failure', diag(run));
  t.equal(a.passed, 2, 'its passing assertions still counted', diag(run));
});
