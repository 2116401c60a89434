// Request-target normalization (docs/request-path.md, "The request target"): the one form of the
// path that protocol policy, routing and the backend all see. Pure, allocation-free on the fast
// path (a target with no '%', no '//' and no segment starting with '.' comes back as the same
// string), table-tested in test/normalize-target.test.ts.
//
// What is done, in order (RFC 3986 §6.2.2):
//   1. characters: a target holding a control character, space, DEL, '#', '\' or a non-ASCII
//      character is rejected (RFC 3986 §3.3 allows none of them; node's HTTP/1.1 parser lets
//      '\', '#' and high bytes through, our HTTP/3 decoder everything but NUL/CR/LF);
//   2. percent-encoding (§6.2.2.1, §6.2.2.2): octets of unreserved characters are decoded, the
//      hex digits of the others upper-cased; an encoded '/', '\', NUL or control character, a
//      malformed escape and an overlong UTF-8 sequence, are rejected: a backend that decodes them
//      would see another path;
//   3. segments (§5.2.4 remove_dot_segments): '.' and '..' are resolved, empty segments (a
//      duplicate '/') dropped; a dot segment carrying parameters (`/..;x/`, which Tomcat and
//      Jetty treat as '..') is rejected.
// The query is kept as sent, after the character check. Case is left alone: paths are
// case-sensitive (RFC 3986 §6.2.2.1); denied prefixes are matched case-insensitively by the
// protocol policy instead.

/** Why a target cannot be normalized safely (HTTP 400). */
export type TargetRejectReason = 'invalid_target_character' | 'invalid_percent_encoding' | 'encoded_separator' | 'dot_segment_parameters' | 'invalid_target_form';

/** A rejected target: a frozen constant per reason, so rejecting allocates nothing. */
export interface TargetRejection {
  readonly rejected: true;
  readonly reason: TargetRejectReason;
}

const REJECTIONS = new Map<TargetRejectReason, TargetRejection>();
function rejection(reason: TargetRejectReason): TargetRejection {
  let r = REJECTIONS.get(reason);
  if (r === undefined) {
    r = Object.freeze({ rejected: true as const, reason });
    REJECTIONS.set(reason, r);
  }
  return r;
}

/** Whether `r` is a rejection rather than a normalized target. */
export function isTargetRejection(r: string | TargetRejection | AbsoluteTarget): r is TargetRejection {
  return typeof r === 'object' && (r as TargetRejection).rejected === true;
}

const SLASH = 0x2f;
const DOT = 0x2e;
const PERCENT = 0x25;
const QUESTION = 0x3f;

/** Characters a target may never hold: controls, space, DEL, '#', '\' and anything non-ASCII. */
function forbidden(c: number): boolean {
  return c <= 0x20 || c >= 0x7f || c === 0x23 /* # */ || c === 0x5c /* \ */;
}

/**
 * Normalizes an origin-form target (path, optional `?query`). Returns the same string when it is
 * already normal, a new string when something changed, or a rejection. The target must start with
 * '/' (callers handle `*` and absolute-form first).
 */
export function normalizeOriginForm(target: string): string | TargetRejection {
  if (target.charCodeAt(0) !== SLASH) return rejection('invalid_target_form');
  let slow = false;
  let prev = 0;
  const n = target.length;
  let i = 0;
  for (; i < n; i++) {
    const c = target.charCodeAt(i);
    if (c === QUESTION) break;
    if (forbidden(c)) return rejection('invalid_target_character');
    // '%' (escapes to decode), '//' (empty segment), '/.' (a possible dot segment).
    if (c === PERCENT || (prev === SLASH && (c === SLASH || c === DOT))) slow = true;
    prev = c;
  }
  for (let j = i + 1; j < n; j++) if (forbidden(target.charCodeAt(j))) return rejection('invalid_target_character');
  if (!slow) return target;
  const path = normalizePath(target.slice(0, i));
  if (typeof path !== 'string') return path;
  return i === n ? path : path + target.slice(i);
}

const HEX = '0123456789ABCDEF';

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  return -1;
}

/** RFC 3986 §2.3 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~". */
function unreserved(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === DOT || c === 0x5f || c === 0x7e;
}

/**
 * Whether an escape starts an overlong UTF-8 sequence (RFC 3629 §3, §10): lead byte C0 or C1
 * (two bytes), E0 followed by 80-9F (three) or F0 followed by 80-8F (four). They are never valid
 * UTF-8 and exist to smuggle ASCII: `%C0%AE` is '.' and `%C0%AF` '/' to a lenient decoder, which
 * would then see `/x/../private` where we saw a harmless segment. Other escapes that are not
 * UTF-8 are kept (RFC 3986 does not require UTF-8, and they decode to no ASCII character).
 */
function overlong(prev: number, octet: number): boolean {
  return octet === 0xc0 || octet === 0xc1 || (prev === 0xe0 && octet >= 0x80 && octet < 0xa0) || (prev === 0xf0 && octet >= 0x80 && octet < 0x90);
}

/** The slow path: percent-encoding, then segments. `path` starts with '/' and has no query. */
function normalizePath(path: string): string | TargetRejection {
  let decoded = path;
  if (path.includes('%')) {
    decoded = '';
    // The octet of the escape just before this one (-1 when a character came between).
    let prevOctet = -1;
    for (let i = 0; i < path.length; i++) {
      const c = path.charCodeAt(i);
      if (c !== PERCENT) {
        decoded += path[i];
        prevOctet = -1;
        continue;
      }
      const hi = hexValue(path.charCodeAt(i + 1));
      const lo = hexValue(path.charCodeAt(i + 2));
      if (hi < 0 || lo < 0) return rejection('invalid_percent_encoding');
      const octet = hi * 16 + lo;
      // An encoded '/' or '\' would be a separator to a backend that decodes before splitting; an
      // encoded control character has no business in a path.
      if (octet === SLASH || octet === 0x5c || octet < 0x20 || octet === 0x7f) return rejection('encoded_separator');
      if (overlong(prevOctet, octet)) return rejection('invalid_percent_encoding');
      decoded += unreserved(octet) ? String.fromCharCode(octet) : `%${HEX[hi]}${HEX[lo]}`;
      prevOctet = octet;
      i += 2;
    }
  }
  // RFC 3986 §5.2.4 over whole segments; an empty segment (duplicate '/') is dropped.
  const segments = decoded.split('/');
  const out: string[] = [];
  let trailingSlash = false;
  for (let s = 1; s < segments.length; s++) {
    const seg = segments[s] as string;
    const last = s === segments.length - 1;
    if (seg === '' || seg === '.') {
      trailingSlash = last;
      continue;
    }
    if (seg === '..') {
      out.pop();
      trailingSlash = last;
      continue;
    }
    const semi = seg.indexOf(';');
    if (semi !== -1) {
      const name = seg.slice(0, semi);
      if (name === '.' || name === '..') return rejection('dot_segment_parameters');
    }
    out.push(seg);
    trailingSlash = false;
  }
  if (out.length === 0) return '/';
  const joined = `/${out.join('/')}`;
  return trailingSlash ? `${joined}/` : joined;
}

/** An absolute-form target split into the authority it names and its origin-form remainder. */
export interface AbsoluteTarget {
  readonly scheme: 'http' | 'https';
  readonly authority: string;
  /** Path and query, origin-form (not yet normalized). */
  readonly originForm: string;
}

/**
 * Splits an absolute-form target (RFC 9112 §3.2.2: `http://host[:port]/path?query`). Only `http`
 * and `https` are accepted; the authority must be non-empty and carry no userinfo (RFC 9110
 * §4.2.4); an empty path becomes '/'.
 */
export function splitAbsoluteForm(target: string): AbsoluteTarget | TargetRejection {
  const colon = target.indexOf('://');
  if (colon === -1) return rejection('invalid_target_form');
  const scheme = target.slice(0, colon).toLowerCase();
  if (scheme !== 'http' && scheme !== 'https') return rejection('invalid_target_form');
  const rest = target.slice(colon + 3);
  let end = rest.length;
  for (let i = 0; i < rest.length; i++) {
    const c = rest.charCodeAt(i);
    if (c === SLASH || c === QUESTION) {
      end = i;
      break;
    }
  }
  const authority = rest.slice(0, end);
  if (!isValidAuthority(authority)) return rejection('invalid_target_form');
  const tail = rest.slice(end);
  const originForm = tail.length === 0 ? '/' : tail.charCodeAt(0) === QUESTION ? `/${tail}` : tail;
  return { scheme, authority, originForm };
}

/**
 * Whether `authority` is `host[:port]` (RFC 3986 §3.2.2-3.2.3): a reg-name, IPv4 or bracketed
 * IP literal, no userinfo ('@' is refused: RFC 9110 §4.2.4 forbids it in http(s) URIs, and a
 * backend might route on the part after it), no path, query, space or control character.
 */
export function isValidAuthority(authority: string): boolean {
  const n = authority.length;
  if (n === 0) return false;
  for (let i = 0; i < n; i++) {
    const c = authority.charCodeAt(i);
    const ok =
      (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) ||
      c === 0x2d /* - */ || c === DOT || c === 0x5f /* _ */ || c === 0x7e /* ~ */ || c === 0x3a /* : */ || c === 0x5b /* [ */ || c === 0x5d /* ] */ ||
      c === PERCENT || c === 0x21 /* ! */ || c === 0x24 /* $ */ || c === 0x26 /* & */ || c === 0x27 /* ' */ || c === 0x28 /* ( */ || c === 0x29 /* ) */ ||
      c === 0x2a /* * */ || c === 0x2b /* + */ || c === 0x2c /* , */ || c === 0x3b /* ; */ || c === 0x3d; /* = */
    if (!ok) return false;
  }
  return true;
}
