// checkLogFile: what `edge-proxy -c` can tell about `log.file` on this host, without creating it.
import t from 'tap';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { checkLogFile } from '../src/index.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-log-file-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const codes = (file: string | undefined): string[] => checkLogFile(file).map((i) => `${i.path} ${i.code} ${i.message}`);

t.test('usable: no log file, an existing writable file, a new file in a writable directory (not created)', async (t) => {
  t.same(codes(undefined), []);
  const existing = path.join(dir, 'existing.log');
  writeFileSync(existing, 'old line\n');
  t.same(codes(existing), []);
  const fresh = path.join(dir, 'fresh.log');
  t.same(codes(fresh), []);
  t.equal(existsSync(fresh), false, 'the check creates nothing');
});

t.test('unusable: missing directory, a directory, a path through a file, a directory that is a file', async (t) => {
  t.same(codes(path.join(dir, 'nope', 'x.log')), [`log.file EDGE_CONFIG_LOG_FILE directory ${path.join(dir, 'nope')} does not exist`]);
  t.same(codes(dir), [`log.file EDGE_CONFIG_LOG_FILE ${dir} is a directory`]);
  const file = path.join(dir, 'plain');
  writeFileSync(file, '');
  t.same(codes(path.join(file, 'x.log')), [`log.file EDGE_CONFIG_LOG_FILE ${path.join(file, 'x.log')} cannot be reached (a path component is not a directory: ENOTDIR)`]);
});

// Permission bits bind only a non-root user (root passes them): checked when the test is not root.
t.test('a read-only directory and a read-only file (non-root only)', { skip: process.getuid?.() === 0 ? 'root ignores permission bits' : false }, async (t) => {
  const ro = path.join(dir, 'ro');
  mkdirSync(ro);
  const roFile = path.join(dir, 'ro.log');
  writeFileSync(roFile, '');
  chmodSync(ro, 0o555);
  chmodSync(roFile, 0o444);
  t.teardown(() => chmodSync(ro, 0o755));
  t.match(codes(path.join(ro, 'x.log')), [/^log\.file EDGE_CONFIG_LOG_FILE directory .* is not writable by this user/]);
  t.match(codes(roFile), [/^log\.file EDGE_CONFIG_LOG_FILE .* is not writable by this user/]);
});
