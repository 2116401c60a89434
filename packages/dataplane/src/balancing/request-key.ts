// Request key specs (`client_ip`, `host`, `path`, `route`, `header:NAME`, `cookie:NAME`,
// `query:NAME`) compiled once per pool into an extractor. Two forms:
//
// - `compileKeySpec`, for consistent hashing: the bare value, a missing one replaced by the client
//   IP, so every request hashes somewhere (placement, not accounting: a collision only co-locates).
// - `compileSelector`, for scoped rate limits and quota selectors (accounting): the value tagged
//   with the kind of selector that produced it (`h:` header, `c:` cookie, `q:` query, `a:` client
//   address, `n:` host, `p:` path, `r:` route), so no value of one selector can equal a value of
//   another. Without the tag a client sending `x-api-key: 10.1.2.3` was counted in the bucket of
//   every header-less client behind 10.1.2.3 and spent its limit (issue 38, finding 4). A missing
//   value follows the limit's `key_fallback`: `client_ip` (the client address, tagged `a:`, in its
//   own space) or `none` (the limit does not apply). A value over `MAX_RAW_SELECTOR` characters is
//   kept as its SHA-256 digest (tag `#` instead of `:`), so a key weighs the same whatever the
//   client sends (a header value may take up to `max_headers_bytes`).
import { hash } from 'node:crypto';

/** What an extractor reads from a request; header names are lower case. */
export interface KeySource {
  readonly clientIp: string;
  readonly host: string;
  readonly path: string;
  readonly route: string;
  header(name: string): string | undefined;
}

export type KeyExtractor = (req: KeySource) => string;

function cookieValue(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq !== -1 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

function queryValue(path: string, name: string): string | undefined {
  const q = path.indexOf('?');
  if (q === -1) return undefined;
  for (const pair of path.slice(q + 1).split('&')) {
    const eq = pair.indexOf('=');
    const k = eq === -1 ? pair : pair.slice(0, eq);
    if (safeDecode(k) === name) return eq === -1 ? '' : safeDecode(pair.slice(eq + 1));
  }
  return undefined;
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return s;
  }
}

/** Compiles a key spec (validated by the config rules) into an extractor. */
export function compileKeySpec(spec: string): KeyExtractor {
  const colon = spec.indexOf(':');
  const kind = colon === -1 ? spec : spec.slice(0, colon);
  const name = colon === -1 ? '' : spec.slice(colon + 1);
  switch (kind) {
    case 'host':
      return (r) => r.host || r.clientIp;
    case 'path':
      return (r) => {
        const q = r.path.indexOf('?');
        return q === -1 ? r.path : r.path.slice(0, q);
      };
    case 'route':
      return (r) => r.route;
    case 'header': {
      const lower = name.toLowerCase();
      return (r) => r.header(lower) ?? r.clientIp;
    }
    case 'cookie':
      return (r) => cookieValue(r.header('cookie'), name) ?? r.clientIp;
    case 'query':
      return (r) => queryValue(r.path, name) ?? r.clientIp;
    default:
      return (r) => r.clientIp;
  }
}

/** What a rate limit or quota policy does with a request that lacks its selector's value (`key_fallback`). */
export type KeyFallback = 'client_ip' | 'none';

/** A tagged selector value (see the header); `undefined` when the value is missing and the fallback is `none`. */
export type SelectorExtractor = (req: KeySource) => string | undefined;

/** Selector values longer than this many characters are kept as their digest (43 characters). */
export const MAX_RAW_SELECTOR = 64;

/** `tag` + `:` + `value`, or `tag` + `#` + SHA-256 (base64url) of a value over `MAX_RAW_SELECTOR` characters. */
export function tagValue(tag: string, value: string): string {
  return value.length > MAX_RAW_SELECTOR ? `${tag}#${hash('sha256', value, 'base64url')}` : `${tag}:${value}`;
}

/** Compiles a key spec (validated by the config rules) into a tagged selector with the given fallback. */
export function compileSelector(spec: string, fallback: KeyFallback): SelectorExtractor {
  const colon = spec.indexOf(':');
  const kind = colon === -1 ? spec : spec.slice(0, colon);
  const name = colon === -1 ? '' : spec.slice(colon + 1);
  const missing: SelectorExtractor = fallback === 'none' ? () => undefined : (r) => tagValue('a', r.clientIp);
  const orFallback = (tag: string, value: string | undefined, r: KeySource): string | undefined => (value === undefined ? missing(r) : tagValue(tag, value));
  switch (kind) {
    case 'host':
      return (r) => orFallback('n', r.host === '' ? undefined : r.host, r);
    case 'path':
      return (r) => {
        const q = r.path.indexOf('?');
        return tagValue('p', q === -1 ? r.path : r.path.slice(0, q));
      };
    case 'route':
      return (r) => tagValue('r', r.route);
    case 'header': {
      const lower = name.toLowerCase();
      return (r) => orFallback('h', r.header(lower), r);
    }
    case 'cookie':
      return (r) => orFallback('c', cookieValue(r.header('cookie'), name), r);
    case 'query':
      return (r) => orFallback('q', queryValue(r.path, name), r);
    default:
      return (r) => tagValue('a', r.clientIp);
  }
}
