// Field lines <-> the header objects of Node's http/http2 APIs, so the data plane handles an
// HTTP/3 request the way it handles an HTTP/2 one. Incoming: names are already lowercase
// (RFC 9114 §4.2); repeats join with ", " (RFC 9110 §5.3), except cookie, which joins with "; "
// (RFC 9114 §4.2.1), and set-cookie, which stays a list (RFC 9110 §5.3 note). Outgoing: names are
// lowercased and checked, arrays become repeated lines.

import { H3Error } from './errors.ts';
import { CONNECTION_SPECIFIC_FIELDS, isValidFieldName, isValidFieldValue } from './message-validation.ts';
import type { Header } from './qpack/decoder.ts';

/** Headers as Node's http2 compatibility API exposes them (pseudo-headers included). */
export type IncomingHeaders = Record<string, string | string[] | undefined>;

/** Headers an application passes in: values may be numbers or lists. */
export type OutgoingHeaders = Record<string, string | number | readonly string[] | undefined>;

/** Builds the header object for `lines` (an object without prototype, like Node's). */
export function headersObject(lines: readonly Header[]): IncomingHeaders {
  const out: IncomingHeaders = Object.create(null) as IncomingHeaders;
  for (const [name, value] of lines) {
    const prev = out[name];
    if (prev === undefined) {
      out[name] = name === 'set-cookie' ? [value] : value;
    } else if (Array.isArray(prev)) {
      prev.push(value);
    } else {
      out[name] = `${prev}${name === 'cookie' ? '; ' : ', '}${value}`;
    }
  }
  return out;
}

/** Node's `rawHeaders` shape: [name, value, name, value, ...]. */
export function rawHeaderList(lines: readonly Header[]): string[] {
  const out: string[] = [];
  for (const [name, value] of lines) out.push(name, value);
  return out;
}

function invalid(message: string): H3Error {
  return new H3Error('EDGE_H3_INVALID_USE', message);
}

/**
 * Checks an application-supplied field and returns its lowercase name. Connection-specific
 * fields are dropped (returns undefined): a proxy copying HTTP/1.1 headers must not forward them
 * (RFC 9114 §4.2), and refusing the whole response for it would be unhelpful.
 */
export function outgoingName(name: string, value: string, allowPseudo = false): string | undefined {
  const lower = name.toLowerCase();
  if (lower.startsWith(':')) {
    if (!allowPseudo) throw invalid(`pseudo-header ${lower} cannot be set by the application`);
  } else if (!isValidFieldName(lower)) {
    throw invalid(`invalid header name ${JSON.stringify(name.slice(0, 64))}`);
  }
  if (!isValidFieldValue(value)) throw invalid(`header ${lower} holds NUL, CR or LF`);
  if (CONNECTION_SPECIFIC_FIELDS.has(lower)) return undefined;
  if (lower === 'te' && value.trim().toLowerCase() !== 'trailers') return undefined;
  return lower;
}

/** Appends the field lines of `headers` to `out`, validated. */
export function appendOutgoing(out: Header[], headers: OutgoingHeaders | undefined, allowPseudo = false): Header[] {
  if (headers === undefined) return out;
  for (const [name, raw] of Object.entries(headers)) {
    if (raw !== undefined) appendOutgoingField(out, name, raw, allowPseudo);
  }
  return out;
}

/** Appends the field lines of one header (one per value), validated. */
export function appendOutgoingField(out: Header[], name: string, raw: string | number | readonly string[], allowPseudo = false): Header[] {
  const values = Array.isArray(raw) ? (raw as readonly string[]) : [String(raw)];
  for (const v of values) {
    const value = String(v);
    const lower = outgoingName(name, value, allowPseudo);
    if (lower !== undefined) out.push([lower, value]);
  }
  return out;
}
