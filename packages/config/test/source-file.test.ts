// The bounded reader against real files: regular files only (directory, FIFO, device refused
// before they are opened), the size cap, confinement with symlinks resolved, and the public form
// of issues (codes and bounded paths; never text from the file).
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { CONFIG_ERROR_CODES, MAX_CONFIG_BYTES, isInside, parseConfigText, publicIssue, publicPath, readBoundedFile, validateConfig } from '../src/index.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-config-source-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const allowed = path.join(dir, 'allowed');
const outside = path.join(dir, 'outside');
mkdirSync(allowed);
mkdirSync(outside);
writeFileSync(path.join(allowed, 'ok.yaml'), 'a: 1\n');
writeFileSync(path.join(outside, 'secret'), 'root: hash\n');
symlinkSync(path.join(outside, 'secret'), path.join(allowed, 'link.yaml'));
symlinkSync(outside, path.join(allowed, 'dirlink'));
mkdirSync(path.join(allowed, 'sub'));
writeFileSync(path.join(allowed, 'sub', 'nested.yaml'), 'b: 2\n');
mkdirSync(path.join(dir, 'allowed-not'));
writeFileSync(path.join(dir, 'allowed-not', 'x'), 'c: 3\n');
execFileSync('mkfifo', [path.join(allowed, 'pipe')]);
writeFileSync(path.join(allowed, 'big.yaml'), Buffer.alloc(MAX_CONFIG_BYTES + 1, 0x20));

const cases: [string, string, readonly string[] | undefined, string][] = [
  ['a regular file inside', path.join(allowed, 'ok.yaml'), [allowed], 'ok'],
  ['a file in a subdirectory', path.join(allowed, 'sub', 'nested.yaml'), [allowed], 'ok'],
  ['a symlink inside pointing outside', path.join(allowed, 'link.yaml'), [allowed], 'not_allowed'],
  ['a path through a symlinked directory', path.join(allowed, 'dirlink', 'secret'), [allowed], 'not_allowed'],
  ['a dot-dot path', `${allowed}/../outside/secret`, [allowed], 'not_allowed'],
  ['the allowed directory itself', allowed, [allowed], 'not_allowed'],
  ['a sibling with the same prefix', path.join(dir, 'allowed-not', 'x'), [allowed], 'not_allowed'],
  ['no allowed directory at all', path.join(allowed, 'ok.yaml'), [], 'not_allowed'],
  ['unconfined: the outside file', path.join(outside, 'secret'), undefined, 'ok'],
  ['a directory', path.join(allowed, 'sub'), [allowed], 'not_regular_file'],
  ['a FIFO (no writer: would block a plain read)', path.join(allowed, 'pipe'), [allowed], 'not_regular_file'],
  ['/dev/zero', '/dev/zero', undefined, 'not_regular_file'],
  ['a file above the cap', path.join(allowed, 'big.yaml'), [allowed], 'too_large'],
  ['a missing file', path.join(allowed, 'nope.yaml'), [allowed], 'not_found'],
];

for (const [name, file, dirs, want] of cases) {
  t.test(name, async (t) => {
    const r = await readBoundedFile(file, dirs === undefined ? {} : { allowedDirs: dirs });
    t.equal(r.ok ? 'ok' : r.failure, want);
  });
}

t.test('maxBytes bounds the read', async (t) => {
  t.match(await readBoundedFile(path.join(allowed, 'ok.yaml'), { maxBytes: 3 }), { ok: false, failure: 'too_large' });
  t.match(await readBoundedFile(path.join(allowed, 'ok.yaml'), { maxBytes: 5 }), { ok: true });
});

t.test('isInside', async (t) => {
  t.ok(isInside('/a/b/c', '/a/b'));
  t.notOk(isInside('/a/b', '/a/b'));
  t.notOk(isInside('/a/bc', '/a/b'));
  t.notOk(isInside('/a', '/a/b'));
});

t.test('public issues keep codes, positions and bounded paths; never text from the file', async (t) => {
  const parsed = parseConfigText('listen: !<tag:LEAKED> x\n');
  if (parsed.ok) return void t.fail('the tag is unknown');
  const syntax = publicIssue(parsed.issues[0]!);
  t.match(syntax, { code: 'EDGE_CONFIG_YAML_SYNTAX', message: /^line 1, column \d+: / });
  t.notOk(syntax.message.includes('LEAKED'));
  const v = validateConfig({ version: 'LEAKED', listen: {} }, dir);
  if (v.ok) return void t.fail('version is wrong');
  for (const i of v.issues.map(publicIssue)) {
    t.equal(i.message, CONFIG_ERROR_CODES[i.code]);
    t.notOk(JSON.stringify(i).includes('LEAKED'));
  }
  t.equal(publicPath(`upstream.${'k'.repeat(100)}\u001b[2J.x`), `upstream.${'k'.repeat(63)}….x`);
  t.equal(publicPath('a.b\u202e\u0000c'), 'a.bc', 'control and bidi characters removed');
});
