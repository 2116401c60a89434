// Schema building blocks shared by every section. The schema is the single source of truth:
// the JSON Schema ajv checks, the defaults it fills in, the TypeScript type (via `Static`) and the
// generated reference in docs/configuration.md all come from these definitions.
//
// Convention: a property that has a `default` is declared required (so `Static<>` gives the
// normalized, defaulted type) and `relaxDefaults()` drops it from `required` before ajv sees it.
// Truly optional properties use `Type.Optional`.
import { Type } from '@sinclair/typebox';
import type { TProperties, TObject, TSchema, TOptional, TString, TInteger, ObjectOptions } from '@sinclair/typebox';

/** Schema annotations of ours: unit of a number, an example value, and docs-only notes. */
export interface Annotations {
  description: string;
  /** Unit shown in the docs (`ms`, `bytes`, `percent`, ...). */
  'x-unit'?: string;
  /** Example used in docs/configuration.md when there is no default. */
  'x-example'?: unknown;
}

/** A closed object: unknown keys are rejected everywhere (SPEC "Versioning" 3). */
export function Obj<P extends TProperties>(properties: P, options: ObjectOptions & Annotations): TObject<P> {
  return Type.Object(properties, { additionalProperties: false, ...options });
}

/** An integer number of milliseconds, 1 ms to 24 h unless bounds are given. */
export function Millis(def: number | undefined, description: string, bounds: { minimum?: number; maximum?: number } = {}): TInteger {
  return Type.Integer({
    minimum: bounds.minimum ?? 1,
    maximum: bounds.maximum ?? 86_400_000,
    ...(def === undefined ? { 'x-example': 1000 } : { default: def }),
    description,
    'x-unit': 'ms',
  });
}

/** An integer percentage, 0-100. */
export function Percent(def: number, description: string): TInteger {
  return Type.Integer({ minimum: 0, maximum: 100, default: def, description, 'x-unit': 'percent' });
}

/** A TCP/UDP port, 1-65535. */
export function Port(def: number | undefined, description: string): TInteger {
  return Type.Integer({ minimum: 1, maximum: 65535, description, ...(def === undefined ? { 'x-example': 9443 } : { default: def }) });
}

/** An HTTP method token (RFC 9110 §9.1), upper case. */
export const Method = Type.String({ pattern: '^[A-Z][A-Z0-9!#$%&\'*+.^_`|~-]*$', maxLength: 32, description: 'HTTP method' });

/** A list of HTTP methods. */
export function Methods(def: string[], description: string) {
  return Type.Array(Method, { uniqueItems: true, maxItems: 64, default: def, description });
}

/**
 * A secret reference: `literal:<value>` or `file://<path>`. A relative file path resolves against the
 * `base_dir` of the provider (`provider`, else `secrets.default_provider`).
 */
export const SecretRef = Obj(
  {
    ref: Type.String({ minLength: 1, maxLength: 4096, description: '`literal:<value>` or `file://<path>`' }),
    provider: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'provider name; default `secrets.default_provider`' })),
  },
  { description: 'secret reference', 'x-example': { ref: 'file://upstream-client.key' } },
);

/** The plaintext member and the `_ref` member of a secret pair; they are mutually exclusive. */
export type SecretPair<N extends string> = { [K in N]: TOptional<TString> } & { [K in `${N}_ref`]: TOptional<typeof SecretRef> };

/** Declares a secret field and its `_ref` twin (SPEC "Secret references"). */
export function secretPair<N extends string>(name: N, description: string): SecretPair<N> {
  return {
    [name]: Type.Optional(Type.String({ minLength: 1, maxLength: 1_048_576, description: `${description} (inline value; prefer \`${name}_ref\`)` })),
    [`${name}_ref`]: Type.Optional(SecretRef),
  } as SecretPair<N>;
}

/** Names of every secret field (the plaintext member of each pair); their values never leave the config package unredacted. */
export const SECRET_FIELD_NAMES = ['client_certificate', 'client_key', 'secret', 'client_secret', 'auth_token', 'token'] as const;

/** A deep copy of `schema` in which properties that carry a `default` are no longer `required`. */
export function relaxDefaults<T extends TSchema>(schema: T): T {
  const walk = (node: unknown): unknown => {
    if (Array.isArray(node)) return node.map(walk);
    if (node === null || typeof node !== 'object') return node;
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(node)) out[k] = walk(v);
    const props = out['properties'] as Record<string, { default?: unknown }> | undefined;
    const required = out['required'] as string[] | undefined;
    if (props !== undefined && required !== undefined) {
      const kept = required.filter((name) => props[name]?.default === undefined);
      if (kept.length > 0) out['required'] = kept;
      else delete out['required'];
    }
    return out;
  };
  return walk(schema) as T;
}

/** The same object schema with `default: {}`, so an absent section is filled with its defaults. */
export function Defaulted<T extends TObject>(schema: T): T {
  return { ...schema, default: {} };
}

/** A string that must be one of `values` (a JSON Schema `enum`, typed as the union of the values). */
export function Enum<const V extends readonly string[]>(values: V, options: { default?: V[number]; description: string; 'x-example'?: V[number] }) {
  return Type.Unsafe<V[number]>({ type: 'string', enum: [...values], ...options });
}

/** A map whose keys must match `keyPattern`; any other key is rejected (TypeBox records are open otherwise). */
export function Rec<V extends TSchema>(keyPattern: string, value: V, options: ObjectOptions & Annotations & { default?: unknown }) {
  return Type.Record(Type.String({ pattern: keyPattern }), value, { additionalProperties: false, ...options });
}

/** Key pattern of upstream pool (route) names. */
export const POOL_NAME = '^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$';
