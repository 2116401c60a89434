// The token a request carries in the configured header (RFC 6750 §2.1 for `authorization`).

/** Longest token accepted, characters (JWS compact is ASCII): anything longer is refused unread. */
export const MAX_TOKEN_LENGTH = 8192;

/** Three base64url segments (RFC 7515 §7.1); the signature may be empty (`alg: none`, refused later by its alg). */
const COMPACT_JWS = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

/** RFC 6750 §2.1: `Bearer` (case-insensitive, RFC 9110 §11.1), one or more spaces, the token. */
const BEARER = /^bearer +(\S*)$/i;

/** The token, or why there is none to verify. */
export type TokenFromHeader = { readonly token: string } | { readonly reason: 'missing_token' | 'malformed_token' };

/**
 * The compact JWS in `value`, the header's value(s) as the request carries them. `authorization`
 * wants `Bearer <jwt>`; another header takes `Bearer <jwt>` or the bare token. No value, an empty
 * one, or another scheme in `authorization` is `missing_token` (RFC 6750 §3.1: a request with an
 * unsupported method carries no bearer credentials); several values, a token over
 * `MAX_TOKEN_LENGTH` or anything but three base64url segments is `malformed_token`.
 */
export function tokenFromHeader(value: string | readonly string[] | undefined, header: string): TokenFromHeader {
  let v: string | undefined;
  if (typeof value === 'string') v = value;
  else if (value !== undefined) {
    if (value.length > 1) return { reason: 'malformed_token' };
    v = value[0];
  }
  if (v === undefined) return { reason: 'missing_token' };
  v = v.trim();
  if (v === '') return { reason: 'missing_token' };
  if (v.length > MAX_TOKEN_LENGTH + 16) return { reason: 'malformed_token' };
  const m = BEARER.exec(v);
  let token: string;
  if (m !== null) token = m[1] as string;
  else if (header === 'authorization') return /^bearer$/i.test(v) || /^bearer\s/i.test(v) ? { reason: 'malformed_token' } : { reason: 'missing_token' };
  else token = v;
  if (token.length > MAX_TOKEN_LENGTH || !COMPACT_JWS.test(token)) return { reason: 'malformed_token' };
  return { token };
}
