// HTTP message rules for HTTP/3 (RFC 9114 §4.1.2, §4.2, §4.3): which field sections make a
// well-formed request, response or trailer section. Pure functions over decoded field lines;
// a malformed message is an H3_MESSAGE_ERROR stream error (RFC 9114 §4.1.2).

import { H3Error } from './errors.ts';
import type { Header } from './qpack/decoder.ts';

/** The parts of a validated request head (RFC 9114 §4.3.1). */
export interface RequestHead {
  method: string;
  /** Absent only for CONNECT. */
  scheme: string | undefined;
  /** From :authority, else from host; '' when neither is present (allowed for non-http schemes). */
  authority: string;
  /** Absent only for CONNECT. */
  path: string | undefined;
  /** The declared body length (content-length), when present. */
  contentLength: number | undefined;
}

/** The parts of a validated response head (RFC 9114 §4.3.2). */
export interface ResponseHead {
  status: number;
  contentLength: number | undefined;
}

const REQUEST_PSEUDO = new Set([':method', ':scheme', ':authority', ':path']);

/**
 * RFC 9114 §4.2: connection-specific fields MUST NOT appear; a message carrying one is malformed.
 * (`te` is allowed with the value "trailers" only and is checked separately.)
 */
export const CONNECTION_SPECIFIC_FIELDS: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade']);

// RFC 9110 §5.6.2 token characters, lowercase only (RFC 9114 §4.2: uppercase names are malformed).
const NAME_CHAR = (() => {
  const ok = new Uint8Array(128);
  for (const c of "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz") ok[c.charCodeAt(0)] = 1;
  return ok;
})();

function malformed(message: string): H3Error {
  return new H3Error('H3_MESSAGE_ERROR', message, { scope: 'stream' });
}

/** True when `name` is a valid lowercase field name (no pseudo-header colon). */
export function isValidFieldName(name: string): boolean {
  if (name.length === 0) return false;
  for (let i = 0; i < name.length; i++) {
    const c = name.charCodeAt(i);
    if (c >= 128 || NAME_CHAR[c] !== 1) return false;
  }
  return true;
}

/** RFC 9110 §5.5 / RFC 9114 §4.2: a field value never holds NUL, CR or LF. */
export function isValidFieldValue(value: string): boolean {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c === 0 || c === 0x0a || c === 0x0d) return false;
  }
  return true;
}

// Shared rules for every regular (non-pseudo) field line.
function checkRegularField(name: string, value: string, where: string): void {
  if (!isValidFieldName(name)) throw malformed(`${where}: invalid or uppercase field name ${JSON.stringify(name.slice(0, 64))}`);
  if (!isValidFieldValue(value)) throw malformed(`${where}: field ${name} holds NUL, CR or LF`);
  if (CONNECTION_SPECIFIC_FIELDS.has(name)) throw malformed(`${where}: connection-specific field ${name} (RFC 9114 §4.2)`);
  if (name === 'te' && value.trim().toLowerCase() !== 'trailers') throw malformed(`${where}: te may only be "trailers" (RFC 9114 §4.2)`);
}

/**
 * Parses content-length (RFC 9110 §8.6): digits only; repeated lines or a list must agree.
 * Returns undefined when absent.
 */
function contentLengthOf(values: readonly string[]): number | undefined {
  let length: number | undefined;
  for (const v of values) {
    for (const part of v.split(',')) {
      const text = part.trim();
      if (!/^\d{1,15}$/.test(text)) throw malformed(`invalid content-length ${JSON.stringify(v.slice(0, 32))}`);
      const n = Number(text);
      if (length !== undefined && n !== length) throw malformed('conflicting content-length values');
      length = n;
    }
  }
  return length;
}

/**
 * Validates a request field section (RFC 9114 §4.3.1). Throws H3_MESSAGE_ERROR for: a missing,
 * repeated, empty or unknown pseudo-header; a response pseudo-header; a pseudo-header after a
 * regular field; an uppercase or invalid name; NUL/CR/LF in a value; a connection-specific field;
 * `te` other than "trailers"; :authority and host disagreeing; a bad content-length.
 */
export function validateRequestHeaders(lines: readonly Header[]): RequestHead {
  const pseudo = new Map<string, string>();
  let regular = false;
  let host: string | undefined;
  const lengths: string[] = [];
  for (const [name, value] of lines) {
    if (name.startsWith(':')) {
      if (regular) throw malformed(`pseudo-header ${name} after a regular field`);
      if (!REQUEST_PSEUDO.has(name)) throw malformed(`pseudo-header ${JSON.stringify(name.slice(0, 32))} is not allowed in a request`);
      if (pseudo.has(name)) throw malformed(`repeated pseudo-header ${name}`);
      if (!isValidFieldValue(value)) throw malformed(`${name} holds NUL, CR or LF`);
      pseudo.set(name, value);
      continue;
    }
    regular = true;
    checkRegularField(name, value, 'request');
    if (name === 'host') host = value;
    else if (name === 'content-length') lengths.push(value);
  }
  const method = pseudo.get(':method');
  if (method === undefined || method.length === 0 || !isToken(method)) throw malformed('missing or invalid :method');
  const authorityPseudo = pseudo.get(':authority');
  if (authorityPseudo !== undefined && host !== undefined && authorityPseudo !== host) {
    throw malformed(':authority and host differ (RFC 9114 §4.3.1)');
  }
  const authority = authorityPseudo ?? host ?? '';
  const contentLength = contentLengthOf(lengths);
  if (method === 'CONNECT') {
    // RFC 9114 §4.4: CONNECT carries :authority only; extended CONNECT (:protocol) is not enabled.
    if (pseudo.has(':scheme') || pseudo.has(':path')) throw malformed('CONNECT must not carry :scheme or :path');
    if (authority.length === 0 || authorityPseudo === undefined) throw malformed('CONNECT requires :authority');
    return { method, scheme: undefined, authority, path: undefined, contentLength };
  }
  const scheme = pseudo.get(':scheme');
  const path = pseudo.get(':path');
  if (scheme === undefined || scheme.length === 0) throw malformed('missing :scheme');
  if (path === undefined || path.length === 0) throw malformed('missing or empty :path');
  if (scheme === 'http' || scheme === 'https') {
    // RFC 9114 §4.3.1: these schemes need an authority; the path is origin-form or "*" for OPTIONS.
    if (authority.length === 0) throw malformed(`${scheme} request without :authority or host`);
    if (!(path.startsWith('/') || (path === '*' && method === 'OPTIONS'))) throw malformed(':path must be origin-form ("/...") or "*" for OPTIONS');
  }
  return { method, scheme, authority, path, contentLength };
}

/**
 * Validates a response field section (RFC 9114 §4.3.2): exactly one :status of three digits,
 * no other pseudo-header, regular fields as for requests. 101 is malformed in HTTP/3 (§4.5).
 */
export function validateResponseHeaders(lines: readonly Header[]): ResponseHead {
  let status: number | undefined;
  let regular = false;
  const lengths: string[] = [];
  for (const [name, value] of lines) {
    if (name.startsWith(':')) {
      if (regular) throw malformed(`pseudo-header ${name} after a regular field`);
      if (name !== ':status') throw malformed(`pseudo-header ${JSON.stringify(name.slice(0, 32))} is not allowed in a response`);
      if (status !== undefined) throw malformed('repeated :status');
      if (!/^[1-5]\d\d$/.test(value)) throw malformed(`invalid :status ${JSON.stringify(value.slice(0, 8))}`);
      status = Number(value);
      continue;
    }
    regular = true;
    checkRegularField(name, value, 'response');
    if (name === 'content-length') lengths.push(value);
  }
  if (status === undefined) throw malformed('missing :status');
  if (status === 101) throw malformed('101 Switching Protocols is not allowed in HTTP/3 (RFC 9114 §4.5)');
  return { status, contentLength: contentLengthOf(lengths) };
}

/** Validates a trailer section (RFC 9114 §4.1): no pseudo-headers; regular fields as usual. */
export function validateTrailers(lines: readonly Header[]): void {
  for (const [name, value] of lines) {
    if (name.startsWith(':')) throw malformed(`pseudo-header ${name} in trailers`);
    checkRegularField(name, value, 'trailers');
  }
}

function isToken(text: string): boolean {
  // Methods are case-sensitive tokens (RFC 9110 §9.1): allow uppercase here.
  return isValidFieldName(text.toLowerCase());
}

/** RFC 9114 §4.2.2: the size of a field section is the sum of name + value + 32 per line. */
export function fieldSectionSize(lines: readonly (readonly [string, string])[]): number {
  let size = 0;
  for (const [name, value] of lines) size += name.length + value.length + 32;
  return size;
}

/**
 * RFC 9110 §6.4.1, §9.3.2: responses to HEAD, and 1xx, 204 and 304 responses, carry no content;
 * a sender drops body bytes for them.
 */
export function responseHasNoBody(method: string, status: number): boolean {
  return method === 'HEAD' || status < 200 || status === 204 || status === 304;
}
