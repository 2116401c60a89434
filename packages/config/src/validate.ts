// Validation without I/O: schema (with defaults), secret extraction, every cross-field rule, then
// normalization. All issues of a document are reported together; nothing here throws on bad input.
import { Ajv } from 'ajv';
import type { ErrorObject, ValidateFunction } from 'ajv';
import { ConfigSchema } from './schema/root.ts';
import type { RawConfig } from './schema/root.ts';
import { relaxDefaults } from './schema/common.ts';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';
import { extractSecrets } from './secrets/refs.ts';
import type { SecretSource } from './secrets/refs.ts';
import { normalize } from './normalize.ts';
import type { NormalizedConfig } from './normalize.ts';
import { ALL_RULES } from './rules/index.ts';
import { applyDerivedDefaults } from './derived-defaults.ts';

/** The only supported schema version (SPEC "Versioning" 1). */
export const SUPPORTED_VERSION = 1;

/** A validated configuration: normalized data plus where each secret comes from (never serialized). */
export interface ValidatedConfig {
  readonly config: NormalizedConfig;
  readonly secretSources: ReadonlyMap<string, SecretSource>;
  /** Directory relative paths in the document resolve against. */
  readonly baseDir: string;
  /** Each effective listener's key as the file spells it (`listen` or `listeners[i]`), for error paths. */
  readonly listenerPaths?: readonly string[];
}

export type ValidationResult = { ok: true; value: ValidatedConfig } | { ok: false; issues: ConfigIssue[] };

let compiled: ValidateFunction | undefined;

function validator(): ValidateFunction {
  if (compiled === undefined) {
    const ajv = new Ajv({ allErrors: true, useDefaults: true, strict: true, allowUnionTypes: true, verbose: true });
    ajv.addVocabulary(['x-unit', 'x-example']);
    compiled = ajv.compile(relaxDefaults(ConfigSchema));
  }
  return compiled;
}

/** Turns an ajv instance path (`/upstream/api/backends/0`) into our dotted path (`upstream.api.backends[0]`). */
function toPath(doc: unknown, pointer: string, extra?: string): string {
  let out = '';
  let node: unknown = doc;
  const segments = pointer === '' ? [] : pointer.slice(1).split('/').map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  if (extra !== undefined) segments.push(extra);
  for (const seg of segments) {
    if (Array.isArray(node)) {
      out += `[${seg}]`;
      node = node[Number(seg)];
    } else {
      out = out === '' ? seg : `${out}.${seg}`;
      node = node !== null && typeof node === 'object' ? (node as Record<string, unknown>)[seg] : undefined;
    }
  }
  return out;
}

function mapAjvError(doc: unknown, e: ErrorObject): ConfigIssue {
  const p = e.params as Record<string, unknown>;
  switch (e.keyword) {
    case 'additionalProperties':
      if ((e.parentSchema as { patternProperties?: unknown } | undefined)?.patternProperties !== undefined) {
        return issue(toPath(doc, e.instancePath, String(p['additionalProperty'])), 'EDGE_CONFIG_FORMAT', `'${String(p['additionalProperty'])}' is not an allowed name here`);
      }
      return issue(toPath(doc, e.instancePath, String(p['additionalProperty'])), 'EDGE_CONFIG_UNKNOWN_KEY', `unknown key '${String(p['additionalProperty'])}'`);
    case 'required':
      return issue(toPath(doc, e.instancePath, String(p['missingProperty'])), 'EDGE_CONFIG_REQUIRED', `'${String(p['missingProperty'])}' is required`);
    case 'type':
      return issue(toPath(doc, e.instancePath), 'EDGE_CONFIG_TYPE', `must be ${String(p['type'])}`);
    case 'enum':
      return issue(toPath(doc, e.instancePath), 'EDGE_CONFIG_ENUM', `must be one of: ${(p['allowedValues'] as unknown[]).join(', ')}`);
    case 'const':
      return issue(toPath(doc, e.instancePath), 'EDGE_CONFIG_ENUM', `must be ${JSON.stringify(p['allowedValue'])}`);
    case 'pattern':
    case 'format':
      return issue(toPath(doc, e.instancePath), 'EDGE_CONFIG_FORMAT', 'has the wrong form (see docs/configuration.md)');
    case 'propertyNames':
      return issue(toPath(doc, e.instancePath, String(p['propertyName'])), 'EDGE_CONFIG_FORMAT', `'${String(p['propertyName'])}' is not an allowed name`);
    default:
      return issue(toPath(doc, e.instancePath), 'EDGE_CONFIG_RANGE', e.message ?? 'out of range');
  }
}

/** Drops the noise ajv adds around a `propertyNames` failure (a pattern error on the key itself). */
function schemaIssues(doc: unknown, errors: readonly ErrorObject[]): ConfigIssue[] {
  const relevant = errors.filter((e) => !(e.keyword === 'pattern' && e.propertyName !== undefined));
  const seen = new Set<string>();
  const out: ConfigIssue[] = [];
  for (const e of relevant) {
    const i = mapAjvError(doc, e);
    const key = `${i.path}\0${i.code}\0${i.message}`;
    if (!seen.has(key)) {
      seen.add(key);
      out.push(i);
    }
  }
  return out;
}

/**
 * Validates a parsed document. Never throws for any input: every problem is a coded issue with its path.
 * @param input the parsed YAML/JSON value
 * @param baseDir directory that relative file paths resolve against (the config file's directory)
 */
export function validateConfig(input: unknown, baseDir: string): ValidationResult {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_NOT_OBJECT', 'the configuration must be a mapping of top-level keys')] };
  }
  const version = (input as Record<string, unknown>)['version'];
  if (version !== undefined && version !== SUPPORTED_VERSION) {
    return { ok: false, issues: [issue('version', 'EDGE_CONFIG_UNSUPPORTED_VERSION', `version ${JSON.stringify(version)} is not supported; only ${SUPPORTED_VERSION}`)] };
  }
  let doc: Record<string, unknown>;
  try {
    doc = structuredClone(input) as Record<string, unknown>;
  } catch {
    return { ok: false, issues: [issue('', 'EDGE_CONFIG_TYPE', 'the configuration holds values that are not plain data')] };
  }
  // Before the schema's fixed defaults: an ordered pair with one side set derives the other.
  applyDerivedDefaults(doc);
  const validate = validator();
  const schemaOk = validate(doc);
  const issues: ConfigIssue[] = schemaOk ? [] : schemaIssues(doc, validate.errors ?? []);
  const raw = doc as unknown as RawConfig;
  const secrets = extractSecrets(doc, raw.secrets ?? { providers: {} }, baseDir);
  issues.push(...secrets.issues);
  const ctx = { doc: raw, secrets: secrets.sources, secretFieldsPresent: secrets.present };
  for (const rule of ALL_RULES) {
    try {
      issues.push(...rule.check(ctx));
    } catch {
      // A rule met a shape the schema already rejected; the schema issue stands for it.
      if (schemaOk) issues.push(issue('', 'EDGE_CONFIG_TYPE', `rule ${rule.name} could not read the document`));
    }
  }
  if (issues.length > 0) return { ok: false, issues };
  const config = normalize(raw, secrets.slots);
  const usesList = Array.isArray(raw.listeners) && raw.listeners.length > 0;
  const listenerPaths = config.listeners.map((_, i) => (usesList ? `listeners[${i}]` : 'listen'));
  return { ok: true, value: { config, secretSources: secrets.sources, baseDir, listenerPaths } };
}
