// Verified tokens remembered until their `exp` (issue 16, item 5): a token seen again skips the
// signature check. Bounded, least recently used out first; an entry is only good under the key
// set version it was verified with. Neither Envoy's jwt_authn nor NGINX does this by default.

/** What a successful verification leaves behind. */
export interface CachedVerification {
  /** The key set version the token was verified under (`JwksKeySet.version`; a constant for a shared secret). */
  readonly version: number;
  /** The token's `exp` claim, NumericDate (unix seconds). */
  readonly exp: number;
}

/**
 * Whether a token with `exp` (unix s) is expired at `nowMs` with `skewMs` of tolerance, the test
 * jose's `jwtVerify` makes (`exp <= now - tolerance`, `now` in whole seconds): a cached answer
 * and a fresh verification never disagree.
 */
export function expiredAt(exp: number, nowMs: number, skewMs: number): boolean {
  return exp <= Math.floor(nowMs / 1000) - skewMs / 1000;
}

/** A bounded map from token to its verification, least recently used dropped first. */
export class VerificationCache {
  private readonly capacity: number;
  // A Map iterates in insertion order: re-inserting on a hit keeps the least recently used first.
  private readonly entries = new Map<string, CachedVerification>();

  /** `capacity` ≥ 1 entries. */
  constructor(capacity: number) {
    this.capacity = Math.max(1, Math.floor(capacity));
  }

  get size(): number {
    return this.entries.size;
  }

  /** The entry of `token`, now the most recently used. */
  get(token: string): CachedVerification | undefined {
    const e = this.entries.get(token);
    if (e === undefined) return undefined;
    this.entries.delete(token);
    this.entries.set(token, e);
    return e;
  }

  set(token: string, entry: CachedVerification): void {
    this.entries.delete(token);
    this.entries.set(token, entry);
    if (this.entries.size > this.capacity) {
      const oldest = this.entries.keys().next();
      if (oldest.done !== true) this.entries.delete(oldest.value);
    }
  }

  delete(token: string): void {
    this.entries.delete(token);
  }
}
