// The benchmark scripts' command lines: a bad option ends a script with one stderr line naming
// it and exit 2, never a stack trace; the scripts' exported parsers still throw (bench-soak and
// bench-tail test them), in one line.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchArgs } from '../scripts/lib/bench-args.ts';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));

t.test('benchArgs throws parseArgs\' error in one line', async (t) => {
  const options = { 'alt-flags': { type: 'string', multiple: true } } as const;
  t.same(benchArgs({ args: ['--alt-flags=--max-semi-space-size=8'], options, strict: true }).values, { 'alt-flags': ['--max-semi-space-size=8'] }, 'a value that starts with dashes, written with =');
  t.throws(() => benchArgs({ args: ['--alt-flags', '--max-semi-space-size=8'], options, strict: true }), /^Option '--alt-flags' argument is ambiguous\. Did you forget .* use '--alt-flags=-XYZ'\.$/, 'one line');
  t.throws(() => benchArgs({ args: ['--nope'], options, strict: true }), /^Unknown option '--nope'/);
});

const cases = [
  { script: 'proxy.ts', args: ['--alt-flags', '--max-semi-space-size=8'], says: /^proxy\.ts: Option '--alt-flags' argument is ambiguous\. .*'--alt-flags=-XYZ'\.$/ },
  { script: 'proxy.ts', args: ['--h3-warmup-rounds', '1.5'], says: /^proxy\.ts: --h3-warmup-rounds: bad value "1\.5"$/ },
  { script: 'soak.ts', args: ['--minutes', '0'], says: /^soak\.ts: --minutes: bad value "0"$/ },
  { script: 'tail.ts', args: ['--nope'], says: /^tail\.ts: Unknown option '--nope'/ },
  { script: 'h3.ts', args: ['--nope'], says: /^h3\.ts: Unknown option '--nope'/ },
];

for (const c of cases) {
  t.test(`${c.script} ${c.args.join(' ')}: one stderr line, exit 2, nothing started`, async (t) => {
    const r = spawnSync(process.execPath, [path.join(root, 'scripts/bench', c.script), ...c.args], { encoding: 'utf8', timeout: 30_000 });
    t.equal(r.status, 2, 'exit 2');
    const lines = r.stderr.split('\n').filter((l) => l !== '');
    t.equal(lines.length, 1, `one line: ${r.stderr}`);
    t.match(lines[0], c.says);
    t.notMatch(r.stderr, /^\s+at /m, 'no stack trace');
    t.equal(r.stdout, '', 'nothing on stdout: no target was started');
  });
}
