// The names a JWKS source is known by outside its own module: an opaque id (metric label, snapshot
// key, log field) and a sanitized endpoint (the snapshot). The configured URL itself may carry
// credentials or a signed query, so it never leaves the fetcher.
import { createHash } from 'node:crypto';

/**
 * `jwks-` and 12 hex digits of SHA-256 over the URL and the trust it is fetched with: stable
 * across restarts and nodes (dashboards keep their series), the same URL under another CA is
 * another source, and the URL cannot be read back from it.
 */
export function jwksSourceId(url: string, caPems: readonly string[] = []): string {
  const h = createHash('sha256').update('edge-proxy jwks source\0').update(url);
  for (const pem of caPems) h.update('\0').update(pem);
  return `jwks-${h.digest('hex').slice(0, 12)}`;
}

/** Scheme, host, port and path of `url`: user info, query and fragment dropped ("invalid" if unparsable). */
export function sanitizeEndpoint(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return 'invalid';
  }
  return `${u.protocol}//${u.host}${u.pathname}`;
}
