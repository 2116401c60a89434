// A fetched JWKS document → the public signing keys workers may verify with, or why the document
// is unusable. Every key is imported once with jose here, so a worker is never handed a key that
// cannot verify; what is handed on is the JWK itself (public members only), cloned over IPC.
import type { JWK } from 'jose';
import { jose } from './jose.ts';
import type { JwksFailureReason } from './types.ts';

/** Why a document is refused (the set is quarantined when keys are held). */
export type KeySetFailure = Extract<JwksFailureReason, 'invalid_json' | 'invalid_key_set' | 'no_usable_keys'>;

export type KeySetResult = { readonly ok: true; readonly keys: readonly JWK[] } | { readonly ok: false; readonly reason: KeySetFailure };

/** Private members of RSA (RFC 7518 §6.3.2) and EC / OKP (§6.2.2, RFC 8037 §2) keys. */
const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth'] as const;

/** Members handed to workers: what selecting and importing a public signing key needs. */
const PUBLIC_MEMBERS = ['kty', 'kid', 'use', 'alg', 'crv', 'n', 'e', 'x', 'y'] as const;

/** JWS algorithms with asymmetric keys that jose verifies (RFC 7518 §3.1, RFC 8037 §3.1). */
const SIGNING_ALGS: ReadonlySet<string> = new Set(['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519']);

/** jose refuses RSA keys under 2048 bits when verifying: such a key is not usable. */
const MIN_RSA_BITS = 2048;

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The algorithm a key without `alg` is checked under (jose imports a key for one algorithm). */
function defaultAlg(k: Json): string | undefined {
  if (k.kty === 'RSA') return 'RS256';
  if (k.kty === 'EC') return ({ 'P-256': 'ES256', 'P-384': 'ES384', 'P-521': 'ES512' } as Record<string, string>)[String(k.crv)];
  if (k.kty === 'OKP' && k.crv === 'Ed25519') return 'Ed25519';
  return undefined;
}

/**
 * The public JWK of `k` when it is an asymmetric signing key that imports, else undefined.
 * RFC 7517 §5: keys with a `kty` not understood, missing members or unsupported values are
 * ignored, not fatal to the set; so are `oct` keys (a shared secret has no place in a JWKS and
 * tokens signed with HMAC use the configured `secret_ref`) and keys for another `use` or `alg`.
 */
async function publicSigningKey(k: unknown): Promise<JWK | undefined> {
  if (!isObject(k) || (k.kty !== 'RSA' && k.kty !== 'EC' && k.kty !== 'OKP')) return undefined;
  if (k.use !== undefined && k.use !== 'sig') return undefined;
  if (k.alg !== undefined && (typeof k.alg !== 'string' || !SIGNING_ALGS.has(k.alg))) return undefined;
  const alg = (k.alg as string | undefined) ?? defaultAlg(k);
  if (alg === undefined) return undefined;
  const jwk: Json = {};
  for (const m of PUBLIC_MEMBERS) if (typeof k[m] === 'string') jwk[m] = k[m];
  try {
    const key = await jose().importJWK(jwk as JWK, alg);
    if (key instanceof Uint8Array || key.type !== 'public') return undefined;
    const bits = (key.algorithm as { modulusLength?: number }).modulusLength;
    if (bits !== undefined && bits < MIN_RSA_BITS) return undefined;
  } catch {
    return undefined;
  }
  return jwk as JWK;
}

/**
 * Reads a JWKS document (RFC 7517 §5). Not UTF-8 JSON: `invalid_json`. Not an object with a
 * `keys` array, or any asymmetric key carrying private members (an IdP publishing its private
 * keys is broken, so nothing it serves is trusted): `invalid_key_set`. No usable key left:
 * `no_usable_keys`.
 */
export async function readKeySet(body: Uint8Array): Promise<KeySetResult> {
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    return { ok: false, reason: 'invalid_json' };
  }
  if (!isObject(doc) || !Array.isArray(doc.keys)) return { ok: false, reason: 'invalid_key_set' };
  const entries: unknown[] = doc.keys;
  if (entries.some((k) => isObject(k) && k.kty !== 'oct' && PRIVATE_MEMBERS.some((m) => Object.hasOwn(k, m)))) return { ok: false, reason: 'invalid_key_set' };
  const keys: JWK[] = [];
  for (const k of entries) {
    const jwk = await publicSigningKey(k);
    if (jwk !== undefined) keys.push(jwk);
  }
  return keys.length === 0 ? { ok: false, reason: 'no_usable_keys' } : { ok: true, keys };
}
