// QUIC variable-length integers (RFC 9000 §16): the two high bits of the first byte give the
// length (1, 2, 4 or 8 bytes); the remaining bits, big-endian, give the value (up to 2^62-1).
//
// We stay bigint-free: values are JavaScript numbers. Values up to 2^53-1 decode exactly.
// Larger values (legal on the wire) decode to an inexact number above Number.MAX_SAFE_INTEGER,
// which keeps ordering and "is it a known code point?" questions answerable: unknown frame
// types, setting identifiers and "unlimited" setting values still work. Where exactness matters
// (lengths, stream and push IDs) the caller checks `Number.isSafeInteger` and raises a
// protocol error: no stream, frame or table of ours can reach 2^53.

import { H3Error } from './errors.ts';
import type { H3ErrorCode } from './errors.ts';

/** Largest value a QUIC varint can carry, 2^62 - 1 (inexact as a number). */
export const VARINT_MAX = 2 ** 62 - 1;

/** A decoded varint: its value and how many bytes it took. */
export interface DecodedVarint {
  /** The value; exact when `Number.isSafeInteger(value)`, else an approximation above 2^53. */
  value: number;
  /** Encoded length in bytes: 1, 2, 4 or 8. */
  length: number;
}

/** Encoded length of the varint starting with byte `first`. */
export function varintLengthFromFirstByte(first: number): number {
  return 1 << (first >> 6);
}

/**
 * Decodes one varint at `offset`; returns null when `bytes` ends before the varint does
 * (the caller waits for more data). Never throws.
 */
export function decodeVarint(bytes: Uint8Array, offset = 0): DecodedVarint | null {
  if (offset >= bytes.length) return null;
  const first = bytes[offset] as number;
  const length = varintLengthFromFirstByte(first);
  if (offset + length > bytes.length) return null;
  let value = first & 0x3f;
  for (let i = 1; i < length; i++) {
    // Multiplication, not shifts: bitwise operators truncate to 32 bits.
    value = value * 256 + (bytes[offset + i] as number);
  }
  return { value, length };
}

/**
 * Decodes a varint that must be exact (a length or an ID) and must be complete.
 * Throws H3Error `code` when truncated or above 2^53-1.
 */
export function decodeExactVarint(bytes: Uint8Array, offset: number, code: H3ErrorCode, what: string): DecodedVarint {
  const v = decodeVarint(bytes, offset);
  if (v === null) throw new H3Error(code, `${what}: truncated varint`);
  if (!Number.isSafeInteger(v.value)) throw new H3Error(code, `${what}: value above 2^53-1 is not supported`);
  return v;
}

/** Number of bytes `value` takes as a varint (the shortest encoding). */
export function varintLength(value: number): number {
  checkEncodable(value);
  if (value < 0x40) return 1;
  if (value < 0x4000) return 2;
  if (value < 0x40000000) return 4;
  return 8;
}

/** Writes `value` at `offset` in its shortest encoding; returns the offset after it. */
export function writeVarint(out: Uint8Array, offset: number, value: number): number {
  const length = varintLength(value);
  if (offset + length > out.length) throw new H3Error('H3_INTERNAL_ERROR', 'varint does not fit in the output buffer');
  let rest = value;
  for (let i = length - 1; i > 0; i--) {
    out[offset + i] = rest % 256;
    rest = Math.floor(rest / 256);
  }
  const lengthBits = [0x00, 0x40, 0, 0x80, 0, 0, 0, 0xc0][length - 1] as number;
  out[offset] = rest | lengthBits;
  return offset + length;
}

/** Encodes `value` (a safe, non-negative integer) as a varint in its shortest form. */
export function encodeVarint(value: number): Uint8Array {
  const out = new Uint8Array(varintLength(value));
  writeVarint(out, 0, value);
  return out;
}

function checkEncodable(value: number): void {
  // Encoding is our own doing, so a bad value is an internal error, not a peer's fault.
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new H3Error('H3_INTERNAL_ERROR', `cannot encode ${value} as a varint: need an integer in [0, 2^53-1]`);
  }
}
