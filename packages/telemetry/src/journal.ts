// Writing to systemd's journal. systemd.exec(5) "$JOURNAL_STREAM": when stdout or stderr is
// connected to the journal, systemd sets JOURNAL_STREAM to `<device>:<inode>` of that stream, and
// a process that finds its stdout's device and inode equal to it may switch to the journal's
// native conventions. sd-daemon(3): a line prefixed `<N>` (a syslog priority) is stored with that
// PRIORITY and without the prefix (`SyslogLevelPrefix=` is on by default); journald adds its own
// timestamp. The variable is inherited by children whose stdout is somewhere else, hence the
// device and inode comparison rather than the variable alone.
import { fstatSync } from 'node:fs';

/** sd-daemon(3) priorities of the log levels (`fatal` is LOG_CRIT; `trace` goes with `debug`). */
const PRIORITY: Readonly<Record<string, string>> = { trace: '<7>', debug: '<7>', info: '<6>', warn: '<4>', error: '<3>', fatal: '<2>' };

/** The `<N>` prefix of a level label (`<6>`, info, for an unknown one). */
export function syslogPrefix(level: string): string {
  return PRIORITY[level] ?? '<6>';
}

/**
 * Whether file descriptor `fd` (default 1, stdout) is the journal stream systemd names in
 * `env.JOURNAL_STREAM`. False when the variable is unset or malformed, or the descriptor is
 * something else (a file, a pipe to another program).
 */
export function isJournalStream(env: NodeJS.ProcessEnv = process.env, fd = 1): boolean {
  const m = /^(\d+):(\d+)$/.exec(env['JOURNAL_STREAM'] ?? '');
  if (m === null) return false;
  try {
    // bigint: device numbers and inodes can exceed 2^53.
    const st = fstatSync(fd, { bigint: true });
    return st.dev === BigInt(m[1] as string) && st.ino === BigInt(m[2] as string);
  } catch {
    return false;
  }
}

/**
 * The `<N>` prefix for a JSON line pino wrote with a string level first (`{"level":"warn",...`):
 * read from the line itself, no parse.
 */
export function jsonLinePrefix(line: string): string {
  const start = '{"level":"'.length;
  if (!line.startsWith('{"level":"')) return '<6>';
  const end = line.indexOf('"', start);
  return end === -1 ? '<6>' : syslogPrefix(line.slice(start, end));
}
