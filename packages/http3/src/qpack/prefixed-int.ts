// Prefixed integers (RFC 7541 §5.1, used by RFC 9204 §4.1.1): the value starts in the low
// N bits of a byte whose high bits carry flags; if it does not fit, those N bits are all ones
// and the rest follows in 7-bit groups, least significant first, high bit = "more".

import type { ByteWriter } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import type { H3ErrorCode } from '../errors.ts';

/** A decoded prefixed integer and the offset just past it. */
export interface DecodedPrefixedInt {
  /** The value (always a safe integer). */
  value: number;
  /** Offset of the first byte after the integer. */
  next: number;
}

/**
 * Appends `value` with an `prefixBits`-bit prefix; `flags` fills the bits above the prefix
 * (given in place, e.g. 0x80 for the top bit).
 */
export function encodePrefixedInt(out: ByteWriter, value: number, prefixBits: number, flags: number): void {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new H3Error('H3_INTERNAL_ERROR', `cannot encode ${value} as a prefixed integer`);
  }
  const max = (1 << prefixBits) - 1;
  if (value < max) {
    out.byte(flags | value);
    return;
  }
  out.byte(flags | max);
  let rest = value - max;
  while (rest >= 128) {
    out.byte((rest % 128) + 128);
    rest = Math.floor(rest / 128);
  }
  out.byte(rest);
}

/**
 * Decodes a prefixed integer whose first byte is at `offset`. Returns null when `bytes` ends
 * first (streams: wait for more; complete blocks: the caller reports truncation).
 * Throws H3Error `code` for values above 2^53-1, which no table or string of ours can reach.
 */
export function decodePrefixedInt(bytes: Uint8Array, offset: number, prefixBits: number, code: H3ErrorCode): DecodedPrefixedInt | null {
  if (offset >= bytes.length) return null;
  const max = (1 << prefixBits) - 1;
  let value = (bytes[offset] as number) & max;
  let at = offset + 1;
  if (value < max) return { value, next: at };
  let scale = 1;
  for (;;) {
    if (at >= bytes.length) return null;
    const b = bytes[at++] as number;
    value += (b & 0x7f) * scale;
    if (value > Number.MAX_SAFE_INTEGER) throw new H3Error(code, 'prefixed integer above 2^53-1');
    if ((b & 0x80) === 0) return { value, next: at };
    scale *= 128;
    // Past 2^56 even zero continuation bytes are padding an attacker uses to stall us.
    if (scale > 2 ** 56) throw new H3Error(code, 'prefixed integer too long');
  }
}
