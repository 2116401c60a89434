// What `edge-proxy -c` can know about `log.file` before `serve` opens it: whether the file, or the
// directory it would be created in, exists and is writable by the user running the check. The
// check touches nothing (no file is created: one created by root would then be unwritable for the
// service user). It is not part of activation: `log.file` is restart-required, so an activation
// never opens another file, and the file the service has open needs no check. Run the check as the
// service user (for example `runuser -u edge-proxy -- edge-proxy -c FILE`) to learn what the
// service will meet; under a unit's ProtectSystem= / ReadWritePaths= only `serve` finds out.
import { accessSync, constants, statSync } from 'node:fs';
import path from 'node:path';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';

const AT = 'log.file';

const errno = (e: unknown): string => {
  const code = (e as NodeJS.ErrnoException).code ?? 'unknown';
  return code === 'ENOTDIR' ? 'a path component is not a directory: ENOTDIR' : code === 'EACCES' ? 'permission denied: EACCES' : code;
};

/** Problems `serve` would meet opening `file` for appending; empty when it looks writable. */
export function checkLogFile(file: string | undefined): ConfigIssue[] {
  if (file === undefined) return [];
  const abs = path.resolve(file);
  let stat;
  try {
    stat = statSync(abs);
  } catch (e) {
    if (errno(e) !== 'ENOENT') return [issue(AT, 'EDGE_CONFIG_LOG_FILE', `${abs} cannot be reached (${errno(e)})`)];
  }
  if (stat !== undefined) {
    if (stat.isDirectory()) return [issue(AT, 'EDGE_CONFIG_LOG_FILE', `${abs} is a directory`)];
    try {
      accessSync(abs, constants.W_OK);
      return [];
    } catch (e) {
      return [issue(AT, 'EDGE_CONFIG_LOG_FILE', `${abs} is not writable by this user (uid ${process.getuid?.() ?? '?'}; ${errno(e)})`)];
    }
  }
  const dir = path.dirname(abs);
  let dirStat;
  try {
    dirStat = statSync(dir);
  } catch (e) {
    return [issue(AT, 'EDGE_CONFIG_LOG_FILE', errno(e) === 'ENOENT' ? `directory ${dir} does not exist` : `directory ${dir} cannot be reached (${errno(e)})`)];
  }
  if (!dirStat.isDirectory()) return [issue(AT, 'EDGE_CONFIG_LOG_FILE', `${dir} is not a directory`)];
  try {
    accessSync(dir, constants.W_OK | constants.X_OK);
    return [];
  } catch (e) {
    return [issue(AT, 'EDGE_CONFIG_LOG_FILE', `directory ${dir} is not writable by this user (uid ${process.getuid?.() ?? '?'}; ${errno(e)}), so ${path.basename(abs)} cannot be created`)];
  }
}
