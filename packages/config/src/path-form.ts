// The policy form of a request path: the one spelling that route prefixes and denied prefixes are
// compared in (docs/request-path.md, "Routing"; docs/decisions.md, "Routes match what the backend
// sees"). It lives in the config package because both sides need the same function: validation
// (two route prefixes equal in this form collide, EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS) and the
// worker (router and protocol policy). Pure; allocation-free for a path that needs no work.

const PARAMS = /;|%3b/;
/** Whether a lower-cased path needs the segment walk: a parameter, or a segment name Windows trims. */
const SEGMENT_WORK = /;|%3b|\.(?:\/|$)|%20(?:\/|$)|::\$data/;
const WINDOWS_TAIL = /(?:\.|%20)+$/;
const DATA_STREAM = '::$data';

/**
 * Whether `path` is already in policy form: no upper-case letter, no ';' or '%3B', no segment
 * ending in '.' or '%20', no ':' (the `::$DATA` suffix). One pass over char codes, no allocation;
 * the ordinary path (`/api/v1/users`) passes.
 */
function needsWork(path: string): boolean {
  const n = path.length;
  for (let i = 0; i < n; i++) {
    const c = path.charCodeAt(i);
    if (c >= 0x41 && c <= 0x5a) return true; // A-Z
    if (c === 0x3b /* ; */ || c === 0x3a /* : */) return true;
    if (c === 0x25 /* % */) {
      const a = path.charCodeAt(i + 1);
      const b = path.charCodeAt(i + 2) | 0x20;
      if ((a === 0x33 && b === 0x62) /* 3b */ || (a === 0x32 && b === 0x30) /* 20 */) return true;
    } else if (c === 0x2e /* . */ && (i + 1 === n || path.charCodeAt(i + 1) === 0x2f)) return true;
  }
  return false;
}

/**
 * A normalized path (no query; see the dataplane's routing/normalize-target.ts) as routes and
 * denied prefixes compare it: lower case (a backend on a case-insensitive file system or framework
 * — IIS, ASP.NET — serves `/PRIVATE` as `/private`), and every segment name cut at its path
 * parameters (';' or its escape '%3B': servlet containers — Tomcat, Jetty, Spring — strip
 * `;params` from each segment before mapping, so `/private;x/y` is `/private/y` to them) and
 * trimmed as Windows trims a file name (trailing dots and spaces, and the `::$DATA` stream suffix:
 * IIS serves `/private.`, `/private%20` and `/private::$DATA` as `/private`), with a segment left
 * empty by that dropped (`/;x/private` is `/private` once they also merge the '//'). Returns `path`
 * itself (no copy) when nothing needs doing.
 */
export function pathPolicyForm(path: string): string {
  if (!needsWork(path)) return path;
  const lower = path.toLowerCase();
  if (!SEGMENT_WORK.test(lower)) return lower;
  const segments = lower.split('/');
  let out = '';
  for (let s = 1; s < segments.length; s++) {
    const seg = segments[s] as string;
    const m = PARAMS.exec(seg);
    let name = m === null ? seg : seg.slice(0, m.index);
    if (name.endsWith(DATA_STREAM)) name = name.slice(0, -DATA_STREAM.length);
    name = name.replace(WINDOWS_TAIL, '');
    if (name === '' && s < segments.length - 1) continue;
    out += `/${name}`;
  }
  return out === '' ? '/' : out;
}

/**
 * A configured prefix (route `path_prefix`, `denied_path_prefixes` entry) in policy form, without
 * a trailing slash except for `/` itself: the form a path's segment prefixes are looked up in.
 */
export function prefixPolicyForm(prefix: string): string {
  const p = pathPolicyForm(prefix);
  return p.length > 1 ? p.replace(/\/+$/, '') || '/' : p;
}

/** Unreserved characters (RFC 3986 §2.3): normalization decodes their escapes. */
function unreserved(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2e || c === 0x5f || c === 0x7e;
}

/**
 * Why a configured prefix is not written as the normalized path a request is matched in
 * (docs/request-path.md, "The request target"), or undefined when it is. A prefix a normalized
 * request can never spell (`/%61pi` is `/api` once decoded, `/a//b` is `/a/b`, `/a/./b` is `/a/b`)
 * would route nothing as written and could collide unseen with another route: validation refuses
 * it (EDGE_CONFIG_FORMAT). Trailing slashes are fine (they are dropped).
 */
export function prefixNotNormal(prefix: string): string | undefined {
  const n = prefix.length;
  for (let i = 0; i < n; i++) {
    const c = prefix.charCodeAt(i);
    if (c <= 0x20 || c >= 0x7f || c === 0x23 /* # */ || c === 0x5c /* \ */ || c === 0x3f /* ? */) return 'holds a character a request path cannot (a control, space, non-ASCII, `#`, `\\` or `?`)';
    if (c !== 0x25 /* % */) continue;
    const hex = prefix.slice(i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return 'holds a malformed percent-escape';
    const v = parseInt(hex, 16);
    if (unreserved(v)) return `\`%${hex}\` is \`${String.fromCharCode(v)}\` in a normalized path: write the character`;
    if (v === 0x2f || v === 0x5c || v < 0x20 || v === 0x7f) return `\`%${hex}\` (an encoded separator or control) is refused in requests`;
  }
  const segments = prefix.replace(/\/+$/, '').split('/');
  for (let s = 1; s < segments.length; s++) {
    const seg = segments[s] as string;
    if (seg === '') return 'holds an empty segment (`//`), which a normalized path never has';
    if (seg === '.' || seg === '..') return 'holds a dot segment, which a normalized path never has';
  }
  return undefined;
}
