// Loading a configuration file: read, parse YAML, validate, resolve. Every step reports coded issues.
import path from 'node:path';
import { CORE_SCHEMA, load } from 'js-yaml';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';
import { validateConfig } from './validate.ts';
import { resolveConfig } from './resolve.ts';
import type { ResolvedConfig, ResolveOptions } from './resolve.ts';
import { fingerprint } from './secrets/pem.ts';
import { MAX_CONFIG_BYTES, describeReadFailure, readBoundedFile } from './source-file.ts';

export { MAX_CONFIG_BYTES };

/** Default configuration path when `--config` is omitted. */
export const DEFAULT_CONFIG_PATH = '/etc/edge-proxy/config.yaml';

/** Where a configuration came from. */
export interface ConfigSource {
  /** Absolute path of the file. */
  readonly path: string;
  /** Fingerprint of the file bytes. */
  readonly fingerprint: string;
}

export type LoadResult = { ok: true; value: ResolvedConfig; source: ConfigSource } | { ok: false; issues: ConfigIssue[] };

/** Largest number of nodes a document may expand to; YAML aliases can make a small file huge. */
export const MAX_DOCUMENT_NODES = 2_000_000;

/** Counts nodes as the document expands (aliases counted each time they are used), up to `limit`. */
function expandedSize(value: unknown, limit: number): number {
  let count = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0 && count <= limit) {
    const v = stack.pop();
    count++;
    if (Array.isArray(v)) for (const x of v) stack.push(x);
    else if (v !== null && typeof v === 'object') for (const x of Object.values(v)) stack.push(x);
  }
  return count;
}

/**
 * Parses YAML (JSON is YAML) text with the YAML 1.2 core schema. Duplicate keys and syntax errors
 * become issues with a position but without quoted source text, which may hold a secret.
 */
export function parseConfigText(text: string): { ok: true; value: unknown } | { ok: false; issues: ConfigIssue[] } {
  let value: unknown;
  try {
    value = load(text, { schema: CORE_SCHEMA, json: false });
  } catch (e) {
    const err = e as { reason?: string; mark?: { line: number; column: number } };
    const at = err.mark === undefined ? '' : `line ${err.mark.line + 1}, column ${err.mark.column + 1}: `;
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_YAML_SYNTAX', `${at}${err.reason ?? 'invalid YAML'}`)] };
  }
  if (expandedSize(value, MAX_DOCUMENT_NODES) > MAX_DOCUMENT_NODES) {
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_YAML_SYNTAX', `the document expands to more than ${MAX_DOCUMENT_NODES} nodes (alias expansion?)`)] };
  }
  return { ok: true, value };
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
  // A FIFO, a device or a huge file given with -c fails fast instead of stalling startup.
  const read = await readBoundedFile(abs);
  if (!read.ok) return { ok: false, issues: [issue('', 'EDGE_CONFIG_READ', `${abs}: ${describeReadFailure(read.failure)}`)] };
  const bytes = read.bytes;
  const result = await loadConfigText(bytes.toString('utf8'), path.dirname(abs), options);
  if (!result.ok) return result;
  return { ok: true, value: result.value, source: { path: abs, fingerprint: fingerprint(bytes) } };
}
