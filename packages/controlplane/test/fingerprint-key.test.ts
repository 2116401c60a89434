// The node-local fingerprint key in a real state directory: created once (0600, 32 bytes), read
// back unchanged, and an unusable directory or key file costs persistence, never the start.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FINGERPRINT_KEY_FILE, loadFingerprintKey } from '../src/state/fingerprint-key.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

t.test('created once with mode 0600, then read back; concurrent starts agree on one key', async (t) => {
  const state = path.join(dir, 'fresh', 'nested');
  const [a, b, c] = await Promise.all([loadFingerprintKey(state), loadFingerprintKey(state), loadFingerprintKey(state)]);
  t.same([a.mode, b.mode, c.mode], ['persisted', 'persisted', 'persisted']);
  t.ok(a.key.equals(b.key) && b.key.equals(c.key), 'one key for every racer');
  const file = path.join(state, FINGERPRINT_KEY_FILE);
  t.equal(statSync(file).mode & 0o777, 0o600);
  t.equal(statSync(state).mode & 0o777, 0o700);
  t.ok(readFileSync(file).equals(a.key));
  const again = await loadFingerprintKey(state);
  t.ok(again.key.equals(a.key), 'the same key after a restart');
});

t.test('an unusable state directory or key file gives an ephemeral key with a coded reason', async (t) => {
  const notDir = path.join(dir, 'plain-file');
  writeFileSync(notDir, 'x');
  const a = await loadFingerprintKey(notDir);
  t.match(a, { mode: 'ephemeral', problem: 'EEXIST' });
  t.equal(a.key.length, 32);

  const wrongSize = path.join(dir, 'wrong-size');
  mkdirSync(wrongSize);
  writeFileSync(path.join(wrongSize, FINGERPRINT_KEY_FILE), 'short');
  t.match(await loadFingerprintKey(wrongSize), { mode: 'ephemeral', problem: 'EDGE_STATE_KEY_INVALID' });
  t.equal(readFileSync(path.join(wrongSize, FINGERPRINT_KEY_FILE), 'utf8'), 'short', 'an operator-placed file is never overwritten');

  // A link planted in place of the key is not followed; a FIFO does not hang the start.
  const linked = path.join(dir, 'linked');
  mkdirSync(linked);
  writeFileSync(path.join(dir, 'elsewhere'), Buffer.alloc(32, 1));
  symlinkSync(path.join(dir, 'elsewhere'), path.join(linked, FINGERPRINT_KEY_FILE));
  t.match(await loadFingerprintKey(linked), { mode: 'ephemeral', problem: 'ELOOP' });
  const fifo = path.join(dir, 'fifo');
  mkdirSync(fifo);
  execFileSync('mkfifo', [path.join(fifo, FINGERPRINT_KEY_FILE)]);
  t.match(await loadFingerprintKey(fifo), { mode: 'ephemeral', problem: 'EDGE_STATE_KEY_INVALID' });

  if (process.getuid?.() !== 0) {
    const locked = path.join(dir, 'locked');
    mkdirSync(locked);
    chmodSync(locked, 0o500);
    t.match(await loadFingerprintKey(locked), { mode: 'ephemeral', problem: 'EACCES' });
  }
});
