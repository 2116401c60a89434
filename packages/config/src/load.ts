// Loading a configuration file: read, parse YAML, validate, resolve. Every step reports coded issues.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parseDocument } from 'yaml';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';
import { validateConfig } from './validate.ts';
import { resolveConfig } from './resolve.ts';
import type { ResolvedConfig, ResolveOptions } from './resolve.ts';
import { fingerprint } from './secrets/pem.ts';

/** Default configuration path when `--config` is omitted. */
export const DEFAULT_CONFIG_PATH = '/etc/edge-proxy/config.yaml';

/** Largest configuration file read (a 1,000-pool config is a few hundred KiB). */
export const MAX_CONFIG_BYTES = 64 * 1024 * 1024;

/** YAML syntax errors reported per file; a broken file can produce thousands. */
const MAX_YAML_ERRORS = 20;

/** Where a configuration came from. */
export interface ConfigSource {
  /** Absolute path of the file. */
  readonly path: string;
  /** Fingerprint of the file bytes. */
  readonly fingerprint: string;
}

export type LoadResult = { ok: true; value: ResolvedConfig; source: ConfigSource } | { ok: false; issues: ConfigIssue[] };

/** Parses YAML (JSON is YAML) text. Duplicate keys, anchors loops and syntax errors become issues. */
export function parseConfigText(text: string): { ok: true; value: unknown } | { ok: false; issues: ConfigIssue[] } {
  try {
    const doc = parseDocument(text, { uniqueKeys: true, prettyErrors: true, strict: true });
    if (doc.errors.length > 0) {
      return {
        ok: false,
        // Only the first message line and the position, without quoted source text: the line may hold a secret.
        issues: [
          ...doc.errors.slice(0, MAX_YAML_ERRORS).map((e) => {
            const at = e.linePos?.[0];
            const what = (e.message.split('\n')[0] ?? e.code).replace(/ at line \d+, column \d+:?$/, '').replace(/:\s*["'`].*$/, '');
            return issue('', 'EDGE_CONFIG_YAML_SYNTAX', `${at === undefined ? '' : `line ${at.line}, column ${at.col}: `}${what}`);
          }),
          ...(doc.errors.length > MAX_YAML_ERRORS ? [issue('', 'EDGE_CONFIG_YAML_SYNTAX', `${doc.errors.length - MAX_YAML_ERRORS} more YAML errors not shown`)] : []),
        ],
      };
    }
    return { ok: true, value: doc.toJS({ maxAliasCount: 100 }) as unknown };
  } catch (e) {
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_YAML_SYNTAX', e instanceof Error ? e.message.split('\n')[0] ?? 'invalid YAML' : 'invalid YAML')] };
  }
}

/** Parses, validates and resolves configuration text; relative paths resolve against `baseDir`. */
export async function loadConfigText(text: string, baseDir: string, options: ResolveOptions = {}): Promise<{ ok: true; value: ResolvedConfig } | { ok: false; issues: ConfigIssue[] }> {
  const parsed = parseConfigText(text);
  if (!parsed.ok) return parsed;
  const validated = validateConfig(parsed.value, baseDir);
  if (!validated.ok) return validated;
  return resolveConfig(validated.value, options);
}

/** Reads, parses, validates and resolves a configuration file. */
export async function loadConfigFile(file: string, options: ResolveOptions = {}): Promise<LoadResult> {
  const abs = path.resolve(file);
  let bytes: Buffer;
  try {
    bytes = await readFile(abs);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? 'unreadable';
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_READ', `${abs}: ${code === 'ENOENT' ? 'no such file' : code === 'EACCES' ? 'permission denied' : code}`)] };
  }
  if (bytes.byteLength > MAX_CONFIG_BYTES) return { ok: false, issues: [issue('', 'EDGE_CONFIG_READ', `${abs}: larger than ${MAX_CONFIG_BYTES} bytes`)] };
  const result = await loadConfigText(bytes.toString('utf8'), path.dirname(abs), options);
  if (!result.ok) return result;
  return { ok: true, value: result.value, source: { path: abs, fingerprint: fingerprint(bytes) } };
}
