// Configuration issues as they are kept (issue 38 finding 6). A candidate named by `config_path` may
// be any YAML-shaped file of the allowed directories, a copy of /etc/shadow included: each of its
// lines parses as a top-level key, so an "unknown key" issue's path is a line of the file. The
// operator who asked (validate, preview, activate: operator role or above) sees the public issue in
// the immediate answer, names of unknown keys included, since that is how a typo is found; what is
// stored or broadcast — history entries (viewers read them), the service log, the audit stream —
// keeps the code and the path of the KNOWN keys only: the key the schema does not define becomes
// `<unknown key>`, a name a map refuses `<invalid name>`.
import { publicIssue, publicPath } from '@edge-proxy/config';
import type { ConfigIssue } from '@edge-proxy/config';

/** What stands for a key name the schema does not define, in stored forms. */
export const UNKNOWN_KEY = '<unknown key>';
/** What stands for a map key name that is refused (its pattern), in stored forms. */
export const INVALID_NAME = '<invalid name>';

/** Stored paths of the public issues made by `publicAndStored` (same objects flow to answers and logs). */
const stored = new WeakMap<ConfigIssue, string>();

/** The validator's messages that quote a key name (packages/config/src/validate.ts), and what stands for it. */
const NAMING: readonly { readonly code: string; readonly pattern: RegExp; readonly mark: string; readonly always: boolean }[] = [
  // Every issue of this code names a key: one whose message has another shape hides its whole path.
  { code: 'EDGE_CONFIG_UNKNOWN_KEY', pattern: /^unknown key '([\s\S]*)'$/, mark: UNKNOWN_KEY, always: true },
  // This code is also a value of the wrong form (path of a known key): only the naming messages hide.
  { code: 'EDGE_CONFIG_FORMAT', pattern: /^'([\s\S]*)' is not an allowed name(?: here)?$/, mark: INVALID_NAME, always: false },
];

/** The path of `raw` with the key name it quotes replaced; the whole path when it cannot be told apart. */
function storedPath(raw: ConfigIssue): string {
  for (const n of NAMING) {
    if (raw.code !== n.code) continue;
    const name = n.pattern.exec(raw.message)?.[1];
    if (name === undefined && !n.always) continue;
    // Fail closed: a name the path does not end with hides the whole path.
    if (name === undefined || !raw.path.endsWith(name)) return n.mark;
    const parent = raw.path.slice(0, raw.path.length - name.length);
    if (parent === '') return n.mark;
    return parent.endsWith('.') ? `${publicPath(parent.slice(0, -1))}.${n.mark}` : n.mark;
  }
  return publicPath(raw.path);
}

/** The public issue of `raw` (publicIssue: no value of the file), remembering its stored form. */
export function publicAndStored(raw: ConfigIssue): ConfigIssue {
  const pub = publicIssue(raw);
  stored.set(pub, storedPath(raw));
  return pub;
}

/**
 * An issue as history, logs and audit keep it: code and message as public, the path without names
 * of unknown keys. An issue that did not come through `publicAndStored` keeps its path unless it
 * is an unknown key's, which is then hidden whole.
 */
export function storedIssue(i: { readonly path: string; readonly code: string; readonly message: string }): { path: string; code: string; message: string } {
  const path = stored.get(i as ConfigIssue) ?? (i.code === 'EDGE_CONFIG_UNKNOWN_KEY' ? UNKNOWN_KEY : i.path);
  return { path, code: i.code, message: i.message };
}
