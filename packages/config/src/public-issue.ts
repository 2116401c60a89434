// Issues as the control API shows them. A candidate named by `config_path` may be any file the
// caller can name, so nothing of its content may come back in an answer, a history entry or an
// audit event: an issue keeps its code, its JSON path (key names are file content too, so each is
// cut to 64 characters with non-printable characters removed) and, for YAML syntax errors, the
// line and column; its message becomes the registry's meaning of the code. Rule messages quote
// values (`'10.0.0.0/33' is not a CIDR block`) and parser messages quote tags and alias names,
// so they are not passed on. `edge-proxy validate` on the command line still shows them: whoever
// runs it reads the file anyway.
import { CONFIG_ERROR_CODES } from './errors.ts';
import type { ConfigIssue } from './errors.ts';

/** Longest key name kept in a public path. */
export const MAX_PUBLIC_KEY_CHARS = 64;
/** Longest public path. */
export const MAX_PUBLIC_PATH_CHARS = 512;

/** Removes control, format (bidi), private-use and unassigned characters, and bounds the length. */
export function printable(text: string, max: number): string {
  const clean = text.replace(/\p{C}/gu, '');
  return clean.length <= max ? clean : `${clean.slice(0, max - 1)}…`;
}

/** A JSON path with every key name made printable and bounded. */
export function publicPath(p: string): string {
  const segments = p.split('.').map((s) => printable(s, MAX_PUBLIC_KEY_CHARS));
  return printable(segments.join('.'), MAX_PUBLIC_PATH_CHARS);
}

/** The issue without any text taken from the file. */
export function publicIssue(i: ConfigIssue): ConfigIssue {
  const position = i.code === 'EDGE_CONFIG_YAML_SYNTAX' ? /^line \d+, column \d+/.exec(i.message)?.[0] : undefined;
  const meaning = CONFIG_ERROR_CODES[i.code] ?? 'invalid configuration';
  return { path: publicPath(i.path), code: i.code, message: position === undefined ? meaning : `${position}: ${meaning}` };
}
