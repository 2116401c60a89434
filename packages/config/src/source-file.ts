// Reading a file the service is told to read (its configuration, secret and TLS files) without
// letting the file decide how long the read takes or how much memory it needs: only a regular
// file is opened (checked before the open and again on the open descriptor), it is opened
// O_NONBLOCK so a FIFO swapped in between never stalls the reader, and at most `maxBytes` are
// read whatever the file claims. With `allowedDirs` the path is confined: symlinks are resolved
// first and the real path must lie inside one of the (themselves resolved) directories; on Linux
// the open descriptor's path is checked again, so a directory swapped in between does not help.
// Failures carry a code and the path, never file content.
import { constants } from 'node:fs';
import { lstat, open, readlink, realpath } from 'node:fs/promises';
import path from 'node:path';

/** Largest file read: configuration, certificates, keys, CA bundles (a 1,000-pool config is a few hundred KiB). */
export const MAX_CONFIG_BYTES = 4 * 1024 * 1024;

/** Why a file was not read. */
export type ReadFailure = 'not_found' | 'permission_denied' | 'not_allowed' | 'not_regular_file' | 'too_large' | 'unreadable';

export type BoundedRead = { readonly ok: true; readonly bytes: Buffer; readonly realPath: string } | { readonly ok: false; readonly failure: ReadFailure; readonly detail: string };

export interface BoundedReadOptions {
  /** Largest accepted file (default MAX_CONFIG_BYTES). */
  readonly maxBytes?: number;
  /** When given, the resolved path must lie inside one of these directories. */
  readonly allowedDirs?: readonly string[];
}

/** Human text of a failure (no file content: the path is added by the caller). */
export function describeReadFailure(failure: ReadFailure, maxBytes = MAX_CONFIG_BYTES): string {
  switch (failure) {
    case 'not_found':
      return 'no such file';
    case 'permission_denied':
      return 'permission denied';
    case 'not_allowed':
      return 'outside the directories config_path may name';
    case 'not_regular_file':
      return 'not a regular file';
    case 'too_large':
      return `larger than ${maxBytes} bytes`;
    case 'unreadable':
      return 'unreadable';
  }
}

function fromErrno(e: unknown): BoundedRead {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'ENOENT' || code === 'ENOTDIR') return { ok: false, failure: 'not_found', detail: code };
  if (code === 'EACCES' || code === 'EPERM') return { ok: false, failure: 'permission_denied', detail: code };
  // O_NOFOLLOW on a symlink swapped in after realpath.
  if (code === 'ELOOP') return { ok: false, failure: 'not_allowed', detail: code };
  return { ok: false, failure: 'unreadable', detail: code ?? 'unknown' };
}

/** Whether `file` (a resolved path) lies inside `dir` (a resolved directory). */
export function isInside(file: string, dir: string): boolean {
  const rel = path.relative(dir, file);
  return rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel);
}

async function resolvedDirs(dirs: readonly string[]): Promise<string[]> {
  const out = await Promise.all(dirs.map((d) => realpath(d).catch(() => undefined)));
  return out.filter((d): d is string => d !== undefined);
}

/** Reads `file` under the rules above. Never throws for file-system reasons. */
export async function readBoundedFile(file: string, options: BoundedReadOptions = {}): Promise<BoundedRead> {
  const maxBytes = options.maxBytes ?? MAX_CONFIG_BYTES;
  let real: string;
  try {
    real = await realpath(file);
  } catch (e) {
    return fromErrno(e);
  }
  const dirs = options.allowedDirs === undefined ? undefined : await resolvedDirs(options.allowedDirs);
  if (dirs !== undefined && !dirs.some((d) => isInside(real, d))) return { ok: false, failure: 'not_allowed', detail: 'outside' };
  let before;
  try {
    before = await lstat(real);
  } catch (e) {
    return fromErrno(e);
  }
  // Checked before opening: opening some devices has effects of its own (a watchdog device arms).
  if (!before.isFile()) return { ok: false, failure: 'not_regular_file', detail: 'type' };
  if (before.size > maxBytes) return { ok: false, failure: 'too_large', detail: 'size' };
  let fh;
  try {
    fh = await open(real, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW | constants.O_NOCTTY);
  } catch (e) {
    return fromErrno(e);
  }
  try {
    const st = await fh.stat();
    if (!st.isFile() || st.dev !== before.dev || st.ino !== before.ino) return { ok: false, failure: 'not_regular_file', detail: 'changed' };
    if (st.size > maxBytes) return { ok: false, failure: 'too_large', detail: 'size' };
    if (dirs !== undefined && process.platform === 'linux') {
      const opened = await readlink(`/proc/self/fd/${fh.fd}`).catch(() => undefined);
      if (opened !== undefined && !dirs.some((d) => isInside(opened, d))) return { ok: false, failure: 'not_allowed', detail: 'moved' };
    }
    // The file may grow after fstat: read at most maxBytes + 1 and refuse if the extra byte came.
    const buf = Buffer.allocUnsafe(Math.min(maxBytes + 1, Math.max(st.size + 1, 4096)));
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, maxBytes + 1 - total), null);
      if (bytesRead === 0) break;
      chunks.push(Buffer.from(buf.subarray(0, bytesRead)));
      total += bytesRead;
      if (total > maxBytes) return { ok: false, failure: 'too_large', detail: 'grew' };
    }
    return { ok: true, bytes: Buffer.concat(chunks, total), realPath: real };
  } catch (e) {
    return fromErrno(e);
  } finally {
    await fh.close().catch(() => undefined);
  }
}
