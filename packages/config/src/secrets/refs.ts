// Secret references (SPEC "Secret references"): parsing `literal:` / `file://`, the sanitized form
// shown to operators, and the extraction of every secret field out of the configuration document.
//
// Normalization moves each secret (plaintext or `_ref`) out of the document into a `SecretSource`
// held beside it, and leaves a `SecretSlot` (no secret bytes) in the normalized config. So a
// normalized config, a diff or a plan can be serialized anywhere without leaking a secret.
import path from 'node:path';
import { SECRET_FIELD_NAMES } from '../schema/common.ts';
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';

export type SecretFieldName = (typeof SECRET_FIELD_NAMES)[number];

/** What the normalized config keeps of a secret field: where it came from, never its value. */
export interface SecretSlot {
  /** Path of the field in the document, e.g. `upstream.api.tls.client_key`. */
  readonly path: string;
  /** Field name without `_ref`. */
  readonly field: SecretFieldName;
  /** `inline` (plaintext field), `literal` (`literal:` reference) or `file` (`file://` reference). */
  readonly source_kind: 'inline' | 'literal' | 'file';
  /** Display form without secret bytes or full paths: `inline`, `literal:<redacted>`, `file://<provider>/<name>`. */
  readonly reference: string;
}

/** Where a secret's value comes from; kept beside the normalized config, never serialized to operators. */
export type SecretSource =
  | { readonly kind: 'inline' | 'literal'; readonly value: string }
  | { readonly kind: 'file'; readonly file: string; readonly provider: string | undefined };

interface ProviderRegistry {
  readonly default_provider?: string | undefined;
  readonly providers: Readonly<Record<string, { readonly kind: string; readonly base_dir: string }>>;
}

/** Sanitized display form of a file reference: provider name (or `local`) and the file's base name. */
export function sanitizeFileReference(file: string, provider: string | undefined): string {
  return `file://${provider ?? 'local'}/${path.basename(file)}`;
}

/** Parses one `_ref` object into a source, or an issue. Relative files resolve against the provider's base_dir. */
export function parseSecretRef(
  at: string,
  ref: { ref: string; provider?: string | undefined },
  registry: ProviderRegistry,
  configDir: string,
): SecretSource | ConfigIssue {
  if (ref.ref.startsWith('literal:')) {
    const value = ref.ref.slice('literal:'.length);
    if (value.length === 0) return issue(at, 'EmptySecret', 'the literal reference is empty');
    return { kind: 'literal', value };
  }
  if (ref.ref.startsWith('file://')) {
    const name = ref.ref.slice('file://'.length);
    if (name.length === 0 || name.includes('\0')) return issue(at, 'EDGE_CONFIG_SECRET_REF', 'a file:// reference needs a path');
    const providerName = ref.provider ?? registry.default_provider;
    const provider = providerName === undefined ? undefined : registry.providers[providerName];
    if (providerName !== undefined && provider === undefined) {
      return issue(at, 'EDGE_CONFIG_SECRET_PROVIDER', `secret provider '${providerName}' is not configured under secrets.providers`);
    }
    if (path.isAbsolute(name)) return { kind: 'file', file: path.normalize(name), provider: providerName };
    if (provider === undefined) {
      return issue(at, 'EDGE_CONFIG_SECRET_PROVIDER', 'a relative file:// reference needs a provider (set secrets.default_provider or `provider`)');
    }
    const base = path.resolve(configDir, provider.base_dir);
    const file = path.resolve(base, name);
    if (file !== base && !file.startsWith(base + path.sep)) {
      return issue(at, 'EDGE_CONFIG_SECRET_REF', `a relative file:// reference must stay inside the base_dir of provider '${providerName}'`);
    }
    return { kind: 'file', file, provider: providerName };
  }
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(ref.ref)?.[1];
  return issue(at, 'EDGE_CONFIG_SECRET_REF', scheme === undefined ? 'a reference must start with `literal:` or `file://`' : `unsupported reference scheme '${scheme}:' (use literal: or file://)`);
}

function slotFor(at: string, field: SecretFieldName, source: SecretSource): SecretSlot {
  switch (source.kind) {
    case 'inline':
      return { path: at, field, source_kind: 'inline', reference: 'inline' };
    case 'literal':
      return { path: at, field, source_kind: 'literal', reference: 'literal:<redacted>' };
    case 'file':
      return { path: at, field, source_kind: 'file', reference: sanitizeFileReference(source.file, source.provider) };
  }
}

const FIELDS: ReadonlySet<string> = new Set(SECRET_FIELD_NAMES);

/** Formats one segment of a document path. */
export function joinPath(base: string, key: string | number): string {
  if (typeof key === 'number') return `${base}[${key}]`;
  return base === '' ? key : `${base}.${key}`;
}

/**
 * Walks the document, checks every secret pair (mutual exclusion, reference syntax, provider) and
 * removes the secret members from it in place, returning the slots and the sources keyed by path.
 */
export function extractSecrets(
  doc: Record<string, unknown>,
  registry: ProviderRegistry,
  configDir: string,
): { slots: SecretSlot[]; sources: Map<string, SecretSource>; present: Set<string>; issues: ConfigIssue[] } {
  const slots: SecretSlot[] = [];
  const sources = new Map<string, SecretSource>();
  const issues: ConfigIssue[] = [];
  const present = new Set<string>();
  const visit = (node: unknown, at: string): void => {
    if (Array.isArray(node)) {
      node.forEach((child, i) => visit(child, joinPath(at, i)));
      return;
    }
    if (node === null || typeof node !== 'object') return;
    const obj = node as Record<string, unknown>;
    for (const field of SECRET_FIELD_NAMES) {
      const plain = obj[field];
      const ref = obj[`${field}_ref`];
      if (plain === undefined && ref === undefined) continue;
      const fieldPath = joinPath(at, field);
      present.add(fieldPath);
      delete obj[field];
      delete obj[`${field}_ref`];
      if (plain !== undefined && ref !== undefined) {
        issues.push(issue(fieldPath, 'EDGE_CONFIG_SECRET_EXCLUSIVE', `\`${field}\` and \`${field}_ref\` are mutually exclusive; set one`));
        continue;
      }
      let source: SecretSource | ConfigIssue;
      if (plain !== undefined) {
        source = typeof plain === 'string' && plain.length > 0 ? { kind: 'inline', value: plain } : issue(fieldPath, 'EmptySecret', 'the secret is empty');
      } else if (ref !== null && typeof ref === 'object' && typeof (ref as { ref?: unknown }).ref === 'string') {
        source = parseSecretRef(joinPath(at, `${field}_ref`), ref as { ref: string; provider?: string }, registry, configDir);
      } else {
        continue; // the schema reports the malformed reference object
      }
      if ('code' in source) {
        issues.push(source);
        continue;
      }
      sources.set(fieldPath, source);
      slots.push(slotFor(fieldPath, field, source));
    }
    for (const [key, child] of Object.entries(obj)) {
      if (FIELDS.has(key.replace(/_ref$/, ''))) continue;
      visit(child, joinPath(at, key));
    }
  };
  visit(doc, '');
  return { slots, sources, present, issues };
}
