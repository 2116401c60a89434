// The node-local key of secret fingerprints, kept in the service's state directory.
//
// Viewers see fingerprints of secrets (snapshot `secrets.material`, history `config_fingerprint`)
// so that a rotation is visible. A plain SHA-256 of a token or a dictionary JWT key can be
// reversed offline with a word list, so those fingerprints are HMACs under this key (see
// `keyedFingerprint` in @edge-proxy/config). The key never leaves the supervisor: it is not in a
// bundle, a log line or an API answer.
import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { link, mkdir, open, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';

/** File name of the key inside the state directory. */
export const FINGERPRINT_KEY_FILE = 'fingerprint.key';
const KEY_BYTES = 32;

/** The key and where it came from. */
export interface FingerprintKey {
  readonly key: Buffer;
  /** `persisted`: read from or written to the state directory; `ephemeral`: this process only. */
  readonly mode: 'persisted' | 'ephemeral';
  /** Path of the key file. */
  readonly file: string;
  /** Why the key is ephemeral (an errno code or a coded reason), when it is. */
  readonly problem?: string;
}

/** Reads the key from `<stateDir>/fingerprint.key`, or creates it (mode 0600, never replaced). */
export async function loadFingerprintKey(stateDir: string): Promise<FingerprintKey> {
  const file = path.join(stateDir, FINGERPRINT_KEY_FILE);
  try {
    await mkdir(stateDir, { recursive: true, mode: 0o700 });
    const existing = await readKey(file);
    if (existing !== undefined) return { key: existing, mode: 'persisted', file };
    // Written under a unique name, then linked into place: two processes starting on one state
    // directory both end up with the key that won the link, never a half-written file.
    const fresh = randomBytes(KEY_BYTES);
    const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}`;
    await writeFile(tmp, fresh, { mode: 0o600, flag: 'wx' });
    try {
      await link(tmp, file);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
    const stored = await readKey(file);
    if (stored === undefined) return { key: fresh, mode: 'ephemeral', file, problem: 'EDGE_STATE_KEY_INVALID' };
    return { key: stored, mode: 'persisted', file };
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? 'EDGE_STATE_KEY_INVALID';
    return { key: randomBytes(KEY_BYTES), mode: 'ephemeral', file, problem: code };
  }
}

/** The key in `file`; undefined when there is none. Throws (coded) when the file is not usable. */
async function readKey(file: string): Promise<Buffer | undefined> {
  let handle;
  try {
    // O_NOFOLLOW: the key file itself is never a link planted somewhere else; O_NONBLOCK: a FIFO
    // put in its place cannot hang the start.
    handle = await open(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.size !== KEY_BYTES) throw Object.assign(new Error('not a key file'), { code: 'EDGE_STATE_KEY_INVALID' });
    const buf = Buffer.alloc(KEY_BYTES);
    const { bytesRead } = await handle.read(buf, 0, KEY_BYTES, 0);
    if (bytesRead !== KEY_BYTES) throw Object.assign(new Error('short key file'), { code: 'EDGE_STATE_KEY_INVALID' });
    return buf;
  } finally {
    await handle.close();
  }
}
