// Content-Length as the proxy forwards it (RFC 9110 §8.6, RFC 9112 §6.3): one canonical decimal
// number. A field value is 1*DIGIT; a recipient of a repeated field or a list whose members all
// agree may replace it with one instance of the value, and must refuse one whose members differ
// (a request-smuggling shape: two parsers pick different lengths). Leading zeros are valid digits
// but not every parser reads `005` as 5 (some read octal, some refuse it), so the backend is sent
// `5`: what the proxy framed is what the backend reads.

/** The longest length kept: 15 digits, under 2^53 (the request path handles lengths as numbers). */
const MAX_DIGITS = 15;

/**
 * The canonical decimal form of a request's `content-length` field (a string, or the lines of a
 * repeated field), undefined when absent, null when invalid: a member that is not 1*DIGIT
 * (optional whitespace around list members), more than 15 significant digits, or members that differ.
 */
export function canonicalContentLength(v: string | readonly string[] | undefined): string | null | undefined {
  if (v === undefined) return undefined;
  // The common case: digits, no leading zero (or "0" itself).
  if (typeof v === 'string' && isCanonical(v)) return v;
  let out: string | undefined;
  for (const line of typeof v === 'string' ? [v] : v) {
    for (const part of line.split(',')) {
      const digits = part.trim();
      if (digits.length === 0 || !allDigits(digits)) return null;
      const value = digits.replace(/^0+(?=\d)/, '');
      if (value.length > MAX_DIGITS) return null;
      if (out !== undefined && out !== value) return null;
      out = value;
    }
  }
  return out ?? null;
}

/** Whether `v` is already the canonical form: digits only, no leading zero unless it is "0". */
function isCanonical(v: string): boolean {
  if (v.length === 0 || v.length > MAX_DIGITS || (v.length > 1 && v.charCodeAt(0) === 0x30)) return false;
  return allDigits(v);
}

function allDigits(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
  }
  return true;
}
