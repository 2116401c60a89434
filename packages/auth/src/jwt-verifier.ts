// JWT verification of one pool's requests (issue 16, item 1) with jose, against the keys the
// supervisor hands this worker (KeyStore) or a shared secret, with the bounded cache of verified
// tokens (item 5). Answers values, never throws, and never puts a token or a claim anywhere: the
// outcome says why, in the bounded vocabulary of svc_jwt_validation_failures_total.
import type { CryptoKey, JWTPayload, JWTVerifyGetKey, JWTVerifyOptions } from 'jose';
import { jose } from './jose.ts';
import { tokenFromHeader } from './bearer-token.ts';
import { validatesTokens } from './key-store.ts';
import type { KeyStore, SourceKeys } from './key-store.ts';
import { VerificationCache, expiredAt } from './verification-cache.ts';

/** Values of `svc_jwt_validation_failures_total{reason}` (SPEC "Data-plane rejections" and docs/auth.md). */
export const JWT_FAILURE_REASONS = [
  'missing_token',
  'malformed_token',
  'key_source_unavailable',
  'missing_verification_key',
  'algorithm_not_allowed',
  'invalid_signature',
  'issuer_mismatch',
  'audience_mismatch',
  'token_expired',
  'token_not_yet_valid',
] as const;
export type JwtFailureReason = (typeof JWT_FAILURE_REASONS)[number];

/**
 * Bounded label values of `svc_jwt_algorithm_rejections_total{algorithm}`: every JWS `alg` of the
 * IANA registry (RFC 7518 §3.1, EdDSA RFC 8037, ES256K RFC 8812, Ed25519 and Ed448 RFC 9864) and
 * `other` for anything else: the attacker writes the header.
 */
export const JWT_ALGORITHM_LABELS: readonly string[] = Object.freeze([
  'HS256', 'HS384', 'HS512', 'RS256', 'RS384', 'RS512', 'ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512', 'none',
  'EdDSA', 'ES256K', 'Ed25519', 'Ed448', 'other',
]);
const LABELS: ReadonlySet<string> = new Set(JWT_ALGORITHM_LABELS);

/** The label of a token's `alg` header: itself when registered, else `other`. */
export function algorithmLabel(alg: unknown): string {
  return typeof alg === 'string' && alg !== 'other' && LABELS.has(alg) ? alg : 'other';
}

/** A pool's JWT policy (from `upstream.<pool>.auth.jwt`, resolved by the lead's provision step). */
export interface JwtPolicy {
  /** Required `iss`; absent: any. */
  readonly issuer?: string;
  /** Accepted `aud` values (a token's `aud` must hold one); empty: any `aud`. */
  readonly audiences: readonly string[];
  /** `alg` allowlist. `none` is never accepted; HS* only with `secret`, the others only without (algorithm confusion). */
  readonly algorithms: readonly string[];
  /** JWKS source id (`jwksSourceId`) holding the keys of the asymmetric algorithms. */
  readonly sourceId?: string;
  /** Longest wait for keys, ms (a source never fetched yet, a `kid` not in the set): the source's `timeout_ms`. */
  readonly jwksTimeoutMs: number;
  /** HMAC key of the HS* algorithms. */
  readonly secret?: Uint8Array;
  /** Tolerance on `exp` / `nbf`, ms (`clock_skew_ms`, default 30000). */
  readonly clockSkewMs: number;
  /** Lower-case header name: `authorization` wants `Bearer <jwt>`, another header `Bearer <jwt>` or the bare token. */
  readonly header: string;
  /** Verified tokens remembered until their `exp` (`verification_cache_entries`, default 10000); 0: none. */
  readonly cacheEntries: number;
}

/** What a verification decided. */
export type JwtOutcome =
  | { readonly ok: true; readonly cached: boolean }
  | {
      readonly ok: false;
      readonly reason: JwtFailureReason;
      /** A `JWT_ALGORITHM_LABELS` value; set for `algorithm_not_allowed`. */
      readonly algorithm?: string;
      /** The token's `kid` was not in the set even after a refresh (`svc_jwks_unknown_kid_total`). */
      readonly unknownKid?: boolean;
    };

const OK_VERIFIED: JwtOutcome = Object.freeze({ ok: true, cached: false });
const OK_CACHED: JwtOutcome = Object.freeze({ ok: true, cached: true });
const FAILURES = Object.freeze(Object.fromEntries(JWT_FAILURE_REASONS.map((r) => [r, Object.freeze({ ok: false, reason: r })]))) as Readonly<Record<JwtFailureReason, JwtOutcome>>;

const HMAC = /^HS(256|384|512)$/;
/** The cache version of tokens verified with a shared secret (it only changes with the policy, hence the verifier). */
const SECRET_VERSION = -1;
/** Keys tried for a token more than one key of the set matches (no `kid`, or a `kid` the IdP repeats): a bound on the cost of one request. */
const MAX_CANDIDATE_KEYS = 8;
/** No key of the set matches the token's `kid` and `alg`: refresh once, then `missing_verification_key`. */
const NO_MATCHING_KEY = Symbol('no matching key');

/** The `code` of a jose error (never its message: it may quote a claim). */
function codeOf(e: unknown): string | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === 'string' ? c : undefined;
}

/** A jose failure as a reason. */
function reasonOf(e: unknown): JwtFailureReason {
  switch (codeOf(e)) {
    case 'ERR_JOSE_ALG_NOT_ALLOWED':
      return 'algorithm_not_allowed';
    case 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED':
      return 'invalid_signature';
    case 'ERR_JWT_EXPIRED':
      return 'token_expired';
    case 'ERR_JWT_CLAIM_VALIDATION_FAILED': {
      const { claim, reason } = e as { claim?: unknown; reason?: unknown };
      if (claim === 'iss') return 'issuer_mismatch';
      if (claim === 'aud') return 'audience_mismatch';
      // `nbf` of the wrong type is reason `invalid`: a malformed token, not an early one.
      if (claim === 'nbf' && reason === 'check_failed') return 'token_not_yet_valid';
      return 'malformed_token';
    }
    case 'ERR_JWS_INVALID':
    case 'ERR_JWT_INVALID':
    case 'ERR_JOSE_NOT_SUPPORTED': // an unrecognized `crit` extension
      return 'malformed_token';
    default:
      // A key jose would not use (import failed, RSA modulus under 2048 bits, ...): no key verifies this token.
      return 'missing_verification_key';
  }
}

/**
 * `jwtVerify` against a key set. When several keys match (no `kid`), each is tried in turn (up to
 * `MAX_CANDIDATE_KEYS`) until one verifies; the claims checks only run after a good signature, so
 * the first error that is not a bad signature is the answer.
 */
async function verifyWithSet(token: string, getKey: JWTVerifyGetKey, options: JWTVerifyOptions): Promise<JWTPayload> {
  try {
    return (await jose().jwtVerify(token, getKey, options)).payload;
  } catch (e) {
    if (codeOf(e) !== 'ERR_JWKS_MULTIPLE_MATCHING_KEYS') throw e;
    let last: unknown = e;
    let tried = 0;
    for await (const key of e as AsyncIterable<CryptoKey>) {
      if (++tried > MAX_CANDIDATE_KEYS) break;
      try {
        return (await jose().jwtVerify(token, key, options)).payload;
      } catch (err) {
        if (codeOf(err) !== 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED') throw err;
        last = err;
      }
    }
    throw last;
  }
}

/** Verifies the JWTs of one pool's requests (one verifier per pool and generation, in each worker). */
export class JwtVerifier {
  private readonly policy: JwtPolicy;
  private readonly store: KeyStore | undefined;
  private readonly now: () => number;
  /** The allowlist jose enforces: the policy's, less `none`, less HS* without a secret and the others with one. */
  private readonly algorithms: string[];
  private readonly allowed: ReadonlySet<string>;
  private readonly cache: VerificationCache | undefined;

  /** `now`: the clock (unix ms) the time claims are checked against; `Date.now` by default. */
  constructor(policy: JwtPolicy, store: KeyStore | undefined, now: () => number = Date.now) {
    this.policy = policy;
    this.store = store;
    this.now = now;
    const hmac = policy.secret !== undefined;
    this.algorithms = policy.algorithms.filter((a) => a !== 'none' && HMAC.test(a) === hmac);
    this.allowed = new Set(this.algorithms);
    this.cache = policy.cacheEntries > 0 ? new VerificationCache(policy.cacheEntries) : undefined;
    // jose is loaded with the first generation that verifies tokens, as it is prepared, not by its
    // first request (some 50 ms of module loading on the event loop).
    jose();
  }

  /** The header's value(s) as the request carries them. Never throws. */
  /**
   * The outcome at once when the header alone or the cache decides it (no token, a malformed
   * header, a token verified before or expired since); undefined when a signature must be checked
   * (call `verify`). Lets the request path go on without a promise on a cache hit. Never throws.
   */
  verifyNow(value: string | readonly string[] | undefined): JwtOutcome | undefined {
    try {
      const extracted = tokenFromHeader(value, this.policy.header);
      if (!('token' in extracted)) return FAILURES[extracted.reason];
      return this.cache === undefined ? undefined : this.fromCache(this.cache, extracted.token);
    } catch {
      return FAILURES.malformed_token;
    }
  }

  async verify(value: string | readonly string[] | undefined): Promise<JwtOutcome> {
    try {
      return await this.check(value);
    } catch {
      // Not reached by any input we know of; an exception must still not fail open or crash the request.
      return FAILURES.malformed_token;
    }
  }

  private async check(value: string | readonly string[] | undefined): Promise<JwtOutcome> {
    const extracted = tokenFromHeader(value, this.policy.header);
    if (!('token' in extracted)) return FAILURES[extracted.reason];
    const token = extracted.token;
    if (this.cache !== undefined) {
      const hit = this.fromCache(this.cache, token);
      if (hit !== undefined) return hit;
    }
    let header: { alg?: unknown; kid?: unknown };
    try {
      header = jose().decodeProtectedHeader(token);
    } catch {
      return FAILURES.malformed_token;
    }
    const { alg, kid } = header;
    if (typeof alg !== 'string' || alg === '') return FAILURES.malformed_token;
    // Before any key is looked at: `none`, and HS256 signed with an RSA public key under an asymmetric policy, end here.
    if (!this.allowed.has(alg)) return { ok: false, reason: 'algorithm_not_allowed', algorithm: algorithmLabel(alg) };
    if (this.policy.secret !== undefined) {
      const secret = this.policy.secret;
      const r = await this.attempt(token, alg, SECRET_VERSION, (options) => jose().jwtVerify(token, secret, options).then((v) => v.payload));
      return r === NO_MATCHING_KEY ? FAILURES.missing_verification_key : r;
    }
    return this.verifyWithJwks(token, alg, typeof kid === 'string' ? kid : undefined);
  }

  private async verifyWithJwks(token: string, alg: string, kid: string | undefined): Promise<JwtOutcome> {
    const { sourceId, jwksTimeoutMs } = this.policy;
    const store = this.store;
    if (sourceId === undefined || store === undefined) return FAILURES.key_source_unavailable;
    const set = store.get(sourceId);
    // No fetch has completed yet: wait (bounded) for the supervisor's first push.
    if (set === undefined || set.state === 'never_fetched') await store.refresh(sourceId, jwksTimeoutMs);
    const keys = this.usableKeys(store, sourceId);
    if (keys === undefined) return FAILURES.key_source_unavailable;
    const first = await this.attempt(token, alg, keys.set.version, (options) => verifyWithSet(token, keys.getKey, options));
    if (first !== NO_MATCHING_KEY) return first;
    // A kid not in the set: the IdP may have rotated. One refresh (coalesced, cooled down by the supervisor), one retry.
    await store.refresh(sourceId, jwksTimeoutMs);
    const after = this.usableKeys(store, sourceId);
    if (after === undefined) return FAILURES.key_source_unavailable;
    const again = await this.attempt(token, alg, after.set.version, (options) => verifyWithSet(token, after.getKey, options));
    if (again !== NO_MATCHING_KEY) return again;
    const unknownKid = kid !== undefined && !after.set.keys.some((k) => k.kid === kid);
    return { ok: false, reason: 'missing_verification_key', unknownKid };
  }

  /** The source's keys when its state validates tokens and it has some. */
  private usableKeys(store: KeyStore, sourceId: string): SourceKeys | undefined {
    const set = store.get(sourceId);
    if (set === undefined || !validatesTokens(set.state) || set.keys.length === 0) return undefined;
    try {
      return store.keys(sourceId);
    } catch {
      // A pushed set jose cannot read as a JWKS: nothing to validate with.
      return undefined;
    }
  }

  /** One jose verification at the current time; a success is remembered under `version`. */
  private async attempt(token: string, alg: string, version: number, run: (options: JWTVerifyOptions) => Promise<JWTPayload>): Promise<JwtOutcome | typeof NO_MATCHING_KEY> {
    const p = this.policy;
    const options: JWTVerifyOptions = {
      algorithms: this.algorithms,
      clockTolerance: p.clockSkewMs / 1000,
      currentDate: new Date(this.now()),
    };
    if (p.issuer !== undefined) options.issuer = p.issuer;
    if (p.audiences.length > 0) options.audience = [...p.audiences];
    let payload: JWTPayload;
    try {
      payload = await run(options);
    } catch (e) {
      if (codeOf(e) === 'ERR_JWKS_NO_MATCHING_KEY') return NO_MATCHING_KEY;
      const reason = reasonOf(e);
      return reason === 'algorithm_not_allowed' ? { ok: false, reason, algorithm: algorithmLabel(alg) } : FAILURES[reason];
    }
    // Tokens without `exp` are not remembered: nothing would ever end their entry but eviction.
    if (this.cache !== undefined && typeof payload.exp === 'number' && Number.isFinite(payload.exp)) this.cache.set(token, { version, exp: payload.exp });
    return OK_VERIFIED;
  }

  /**
   * The cached answer for `token`: valid while the key set version it was verified under is the
   * source's current one (and that source still validates) and the token is not expired;
   * an entry past `exp` answers `token_expired` without any crypto.
   */
  private fromCache(cache: VerificationCache, token: string): JwtOutcome | undefined {
    const entry = cache.get(token);
    if (entry === undefined) return undefined;
    if (entry.version !== this.currentVersion()) {
      cache.delete(token);
      return undefined;
    }
    if (expiredAt(entry.exp, this.now(), this.policy.clockSkewMs)) {
      cache.delete(token);
      return FAILURES.token_expired;
    }
    return OK_CACHED;
  }

  /** The version tokens verified now are remembered under (undefined: the source cannot validate). */
  private currentVersion(): number | undefined {
    if (this.policy.secret !== undefined) return SECRET_VERSION;
    const id = this.policy.sourceId;
    const set = id === undefined ? undefined : this.store?.get(id);
    return set !== undefined && validatesTokens(set.state) ? set.version : undefined;
  }
}
