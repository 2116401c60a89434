// String literals (RFC 7541 §5.2, RFC 9204 §4.1.2): an H flag bit just above an N-bit prefixed
// length, then that many bytes, Huffman-coded when H is set.
//
// Field names and values are octet strings. We map them to JavaScript strings byte-for-byte
// (latin1), so any octets survive a decode/encode round trip. A string to encode with
// characters above U+00FF is sent as its UTF-8 bytes.

import { ByteWriter } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import type { H3ErrorCode } from '../errors.ts';
import { huffmanDecode, huffmanEncode, huffmanEncodedLength } from './huffman.ts';
import { decodePrefixedInt, encodePrefixedInt } from './prefixed-int.ts';

/** When to Huffman-code string literals. 'auto' (default) uses it when strictly shorter. */
export type HuffmanPolicy = 'auto' | 'never' | 'always';

/** The octets of a field string as we send them. */
export function fieldBytes(text: string): Uint8Array {
  // latin1 is lossless only for characters up to U+00FF.
  for (let i = 0; i < text.length; i++) {
    if (text.charCodeAt(i) > 0xff) return Buffer.from(text, 'utf8');
  }
  return Buffer.from(text, 'latin1');
}

/** A field string from its octets, one character per octet. */
export function fieldText(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('latin1');
}

/** Appends a string literal: flags above the H bit, the H bit at `1 << prefixBits`, the length, the bytes. */
export function encodeStringLiteral(out: ByteWriter, data: Uint8Array, prefixBits: number, flags: number, policy: HuffmanPolicy): void {
  const huffLen = policy === 'never' ? Infinity : huffmanEncodedLength(data);
  if (policy === 'always' || huffLen < data.length) {
    encodePrefixedInt(out, huffLen, prefixBits, flags | (1 << prefixBits));
    huffmanEncode(data, out);
  } else {
    encodePrefixedInt(out, data.length, prefixBits, flags);
    out.bytes(data);
  }
}

/** A decoded string literal. */
export interface DecodedString {
  /** The octets. */
  bytes: Uint8Array;
  /** Offset just past the literal. */
  next: number;
}

/** Limits and error codes for {@link decodeStringLiteral}. */
export interface StringLiteralLimits {
  /** Longest decoded string accepted, in bytes. */
  maxLength: number;
  /** Code for malformed input (bad Huffman, oversized integer). */
  malformed: H3ErrorCode;
  /** Raises the error for a string over `maxLength`. */
  tooLong: (length: number) => H3Error;
}

/**
 * Decodes a string literal whose first byte is at `offset`. Returns null when `bytes` ends
 * before the literal does. Throws H3Error for malformed input or a string over the limit;
 * the length check happens before any byte is copied or decoded.
 */
export function decodeStringLiteral(bytes: Uint8Array, offset: number, prefixBits: number, limits: StringLiteralLimits): DecodedString | null {
  if (offset >= bytes.length) return null;
  const huffman = ((bytes[offset] as number) & (1 << prefixBits)) !== 0;
  const len = decodePrefixedInt(bytes, offset, prefixBits, limits.malformed);
  if (len === null) return null;
  // Codes are at most 30 bits, so Huffman output holds at least 8/30 of a symbol per input byte.
  const minDecoded = huffman ? Math.floor((len.value * 8) / 30) : len.value;
  if (minDecoded > limits.maxLength) throw limits.tooLong(minDecoded);
  const end = len.next + len.value;
  if (end > bytes.length) return null;
  const raw = bytes.subarray(len.next, end);
  if (!huffman) return { bytes: raw, next: end };
  const decoded = huffmanDecode(raw, limits.maxLength);
  if (decoded === 'invalid') throw new H3Error(limits.malformed, 'invalid Huffman-coded string');
  if (decoded === null) throw limits.tooLong(limits.maxLength + 1);
  return { bytes: decoded, next: end };
}

/** Encodes one string literal on its own; a convenience for tests and tools. */
export function stringLiteralBytes(text: string, prefixBits: number, flags: number, policy: HuffmanPolicy): Uint8Array {
  const w = new ByteWriter();
  encodeStringLiteral(w, fieldBytes(text), prefixBits, flags, policy);
  return w.finish();
}
