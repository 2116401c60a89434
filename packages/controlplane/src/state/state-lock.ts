// One service per state directory (issue 38 finding 11). Two `serve` processes on one state
// directory would both resume, number and overwrite the same generations; so the directory is
// held for the life of the supervisor, and a second start is refused with one coded line.
//
// Node has no flock(2)/fcntl(2) locks, and a lock file alone (O_EXCL, pid inside) needs a stale-
// lock takeover that two simultaneous starts can both win. The mutex is therefore the kernel's: a
// Unix socket in Linux's abstract namespace, named from the directory's device and inode (so
// every path to the same directory, links and bind mounts included, is one name). bind(2) of a
// name already bound fails with EADDRINUSE, atomically, whoever asks; the kernel releases it when
// the process ends however it ends (SIGKILL included), so there is no stale mutex to take over.
// The socket is close-on-exec: the re-exec that sizes libuv's pool (process-keys.ts) releases it
// and the new image takes it again.
//
// `serve.lock` in the directory (pid, its start time in clock ticks, boot id; JSON, 0600) says who
// holds it: the second start names that pid, and a start that finds the file of a process that no
// longer runs (a SIGKILLed service) logs the takeover. It also covers what the abstract name
// cannot: abstract sockets belong to a network namespace, so two services in two namespaces
// sharing one directory both bind; the second then finds a live holder in the file and refuses.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { mkdir, stat, unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { readBoundedFile } from '@edge-proxy/config';
import { removeStaleTemps, writeFileAtomic } from './atomic-file.ts';

export const LOCK_FILE = 'serve.lock';
/** Largest `serve.lock` read (bytes): a few numbers. */
const MAX_LOCK_BYTES = 1024;
/** A refused start waits up to 20 × 50 ms for the holder's `serve.lock`, to name its pid. */
const HOLDER_WAIT_TRIES = 20;
const HOLDER_WAIT_STEP_MS = 50;

/** Who holds (or held) the directory, as `serve.lock` says. */
export interface LockHolder {
  readonly pid: number;
  /** `/proc/<pid>/stat` field 22: clock ticks after boot; with the boot id it names one process. */
  readonly start_ticks: string;
  readonly boot_id: string;
  readonly started_at_unix_ms: number;
}

/** How the lock was taken: held, or refused with the holder when it is known. */
export type LockResult =
  | { readonly ok: true; readonly lock: StateLock; readonly stale?: LockHolder }
  | { readonly ok: false; readonly holder: LockHolder | undefined; readonly message: string };

/** What identifies processes on this host (injected in tests). */
export interface ProcessTable {
  /** Start time of `pid` (`/proc/<pid>/stat` field 22), undefined when no such process runs. */
  startTicks(pid: number): string | undefined;
  readonly bootId: string;
  readonly pid: number;
}

/** Field 22 of `/proc/<pid>/stat`, read after the command name (which may hold spaces and parentheses). */
function procStartTicks(pid: number): string | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    // Fields after the name start at field 3: field 22 is index 19.
    return fields[19];
  } catch {
    return undefined;
  }
}

function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return '';
  }
}

/** This host's process table through /proc. */
export const PROC: ProcessTable = { startTicks: procStartTicks, bootId: bootId(), pid: process.pid };

/** Whether `h` names a process running now on this host other than `self`. */
export function isLiveHolder(h: LockHolder, table: ProcessTable): boolean {
  if (h.pid === table.pid || h.boot_id !== table.bootId) return false;
  const ticks = table.startTicks(h.pid);
  return ticks !== undefined && ticks === h.start_ticks;
}

/** Parses `serve.lock`; undefined when it is not one. */
export function parseLockFile(text: string): LockHolder | undefined {
  try {
    const v = JSON.parse(text) as Record<string, unknown>;
    if (!Number.isSafeInteger(v['pid']) || (v['pid'] as number) <= 0 || typeof v['start_ticks'] !== 'string' || typeof v['boot_id'] !== 'string' || typeof v['started_at_unix_ms'] !== 'number') return undefined;
    return { pid: v['pid'] as number, start_ticks: v['start_ticks'], boot_id: v['boot_id'], started_at_unix_ms: v['started_at_unix_ms'] };
  } catch {
    return undefined;
  }
}

/** The abstract socket name of a directory: its device and inode when it exists, else its absolute path. */
export async function lockName(dir: string): Promise<string> {
  const st = await stat(dir).catch(() => undefined);
  const key = st?.isDirectory() === true ? `dev:${st.dev}:ino:${st.ino}` : `path:${path.resolve(dir)}`;
  return `\0edge-proxy/state-lock/${createHash('sha256').update(key).digest('hex').slice(0, 40)}`;
}

/** Binds the abstract name; EADDRINUSE when another process holds it. */
function bindName(name: string): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    // Nobody is meant to connect: a connection is closed at once.
    const server = net.createServer((s) => s.destroy());
    server.once('error', reject);
    server.listen({ path: name, exclusive: true }, () => {
      server.off('error', reject);
      server.unref();
      resolve(server);
    });
  });
}

/** The held lock of a state directory. */
export class StateLock {
  readonly dir: string;
  private server: net.Server | undefined;
  private readonly own: LockHolder;

  constructor(dir: string, server: net.Server, own: LockHolder) {
    this.dir = dir;
    this.server = server;
    this.own = own;
  }

  /** Releases the directory: the name, and `serve.lock` when it is still this process's. Never throws. */
  async release(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (s === undefined) return;
    await new Promise<void>((r) => s.close(() => r()));
    const file = path.join(this.dir, LOCK_FILE);
    const read = await readBoundedFile(file, { maxBytes: MAX_LOCK_BYTES });
    const h = read.ok ? parseLockFile(read.bytes.toString('utf8')) : undefined;
    if (h !== undefined && h.pid === this.own.pid && h.start_ticks === this.own.start_ticks) await unlink(file).catch(() => undefined);
  }
}

/**
 * Takes the state directory `dir` (created 0700 if missing). Refused when another process holds
 * its name, or when `serve.lock` names another process that runs now (another network namespace).
 * `stale` is the holder of a `serve.lock` left by a process that no longer runs. Writing
 * `serve.lock` may fail (an unwritable directory: that failure is the state store's to report);
 * the name is held all the same.
 */
export async function acquireStateLock(dir: string, table: ProcessTable = PROC, now: () => number = Date.now): Promise<LockResult> {
  await mkdir(dir, { recursive: true, mode: 0o700 }).catch(() => undefined);
  const file = path.join(dir, LOCK_FILE);
  const readHolder = async (): Promise<LockHolder | undefined> => {
    const read = await readBoundedFile(file, { maxBytes: MAX_LOCK_BYTES });
    return read.ok ? parseLockFile(read.bytes.toString('utf8')) : undefined;
  };
  let server: net.Server;
  try {
    server = await bindName(await lockName(dir));
  } catch (err) {
    // A holder that bound a moment ago writes serve.lock right after: wait for it, briefly, to name it.
    let holder = await readHolder();
    for (let i = 0; i < HOLDER_WAIT_TRIES && holder === undefined; i++) {
      await new Promise((r) => setTimeout(r, HOLDER_WAIT_STEP_MS));
      holder = await readHolder();
    }
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    if (code !== 'EADDRINUSE') return { ok: false, holder, message: `state directory ${dir}: its lock could not be taken (${code})` };
    return { ok: false, holder, message: `state directory ${dir} is held by another running edge-proxy serve${holder === undefined ? '' : ` (pid ${holder.pid})`}` };
  }
  const previous = await readHolder();
  if (previous !== undefined && isLiveHolder(previous, table)) {
    await new Promise<void>((r) => server.close(() => r()));
    return { ok: false, holder: previous, message: `state directory ${dir} is held by another running edge-proxy serve (pid ${previous.pid}, per ${LOCK_FILE})` };
  }
  const own: LockHolder = { pid: table.pid, start_ticks: table.startTicks(table.pid) ?? '', boot_id: table.bootId, started_at_unix_ms: now() };
  await removeStaleTemps(dir, LOCK_FILE);
  await writeFileAtomic(dir, LOCK_FILE, JSON.stringify(own)).catch(() => undefined);
  // This very process before a re-exec (same pid, same start) is no stale holder.
  const self = previous !== undefined && previous.pid === own.pid && previous.start_ticks === own.start_ticks && previous.boot_id === own.boot_id;
  const stale = previous !== undefined && !self ? previous : undefined;
  return { ok: true, lock: new StateLock(dir, server, own), ...(stale === undefined ? {} : { stale }) };
}
