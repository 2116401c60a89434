// Files of the state directory, written so that a crash or a power cut at any instant leaves either
// the old file or the new one, never a torn one: the bytes go to a temporary file in the same
// directory, which is fsynced, renamed over the target, and the directory is fsynced so that the
// rename itself is durable (rename(2) is atomic within one file system; POSIX leaves the
// directory entry's durability to an fsync of the directory).
import { randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, unlink } from 'node:fs/promises';
import path from 'node:path';

/** Mode of every state file: the service user only (a kept config text may hold inline tokens). */
export const STATE_FILE_MODE = 0o600;

/** Temporary names: `<name>.<pid>.<hex>.tmp`, so a leftover one is recognised and removed. */
const tempName = (name: string): string => `${name}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
const isTempOf = (name: string, entry: string): boolean => entry.startsWith(`${name}.`) && /\.\d+\.[0-9a-f]{8}\.tmp$/.test(entry);

/** Writes `data` to `<dir>/<name>` atomically and durably, mode 0600. Throws the errno error. */
export async function writeFileAtomic(dir: string, name: string, data: string | Uint8Array): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = path.join(dir, tempName(name));
  let renamed = false;
  try {
    // `wx`: never follows or reuses something already there; mode applies at creation.
    const fh = await open(tmp, 'wx', STATE_FILE_MODE);
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path.join(dir, name));
    renamed = true;
    const d = await open(dir, 'r');
    try {
      await d.sync();
    } finally {
      await d.close();
    }
  } finally {
    if (!renamed) await unlink(tmp).catch(() => undefined);
  }
}

/** Removes temporary files of `name` a crash left behind in `dir` (best effort). */
export async function removeStaleTemps(dir: string, name: string): Promise<void> {
  const entries = await readdir(dir).catch(() => [] as string[]);
  await Promise.all(entries.filter((e) => isTempOf(name, e)).map((e) => unlink(path.join(dir, e)).catch(() => undefined)));
}
