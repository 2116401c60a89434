// Encoder stream instructions (RFC 9204 §4.3): how an encoder changes the decoder's dynamic table.
//
//   Set Dynamic Table Capacity   001 Capacity(5+)
//   Insert With Name Reference   1 T NameIndex(6+) | H ValueLength(7+) Value
//   Insert With Literal Name     01 H NameLength(5+) Name | H ValueLength(7+) Value
//   Duplicate                    000 Index(5+)

import type { ByteWriter } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import { decodePrefixedInt, encodePrefixedInt } from './prefixed-int.ts';
import { decodeStringLiteral, encodeStringLiteral } from './string-literal.ts';
import type { HuffmanPolicy, StringLiteralLimits } from './string-literal.ts';

/** A parsed encoder stream instruction. Indexes are as sent (relative for the dynamic table). */
export type EncoderInstruction =
  | { type: 'set-capacity'; capacity: number }
  | { type: 'insert-name-ref'; isStatic: boolean; nameIndex: number; value: Uint8Array }
  | { type: 'insert-literal-name'; name: Uint8Array; value: Uint8Array }
  | { type: 'duplicate'; relativeIndex: number };

/**
 * Parses one instruction at `offset`; returns null when more bytes are needed. Strings longer
 * than `maxStringLength` (they could never fit the table) raise QPACK_ENCODER_STREAM_ERROR
 * before they are buffered in full.
 */
export function parseEncoderInstruction(
  bytes: Uint8Array,
  offset: number,
  maxStringLength: number,
): { instruction: EncoderInstruction; next: number } | null {
  if (offset >= bytes.length) return null;
  const first = bytes[offset] as number;
  const code = 'QPACK_ENCODER_STREAM_ERROR';
  const limits: StringLiteralLimits = {
    maxLength: maxStringLength,
    malformed: code,
    tooLong: (n) => new H3Error(code, `encoder stream string of ${n} bytes cannot fit the dynamic table`),
  };
  if (first & 0x80) {
    const index = decodePrefixedInt(bytes, offset, 6, code);
    if (index === null) return null;
    const value = decodeStringLiteral(bytes, index.next, 7, limits);
    if (value === null) return null;
    return { instruction: { type: 'insert-name-ref', isStatic: (first & 0x40) !== 0, nameIndex: index.value, value: value.bytes }, next: value.next };
  }
  if (first & 0x40) {
    const name = decodeStringLiteral(bytes, offset, 5, limits);
    if (name === null) return null;
    const value = decodeStringLiteral(bytes, name.next, 7, limits);
    if (value === null) return null;
    return { instruction: { type: 'insert-literal-name', name: name.bytes, value: value.bytes }, next: value.next };
  }
  const n = decodePrefixedInt(bytes, offset, 5, code);
  if (n === null) return null;
  if (first & 0x20) return { instruction: { type: 'set-capacity', capacity: n.value }, next: n.next };
  return { instruction: { type: 'duplicate', relativeIndex: n.value }, next: n.next };
}

/** Appends Set Dynamic Table Capacity (RFC 9204 §4.3.1). */
export function writeSetCapacity(out: ByteWriter, capacity: number): void {
  encodePrefixedInt(out, capacity, 5, 0x20);
}

/** Appends Insert With Name Reference (RFC 9204 §4.3.2); a dynamic `nameIndex` is relative. */
export function writeInsertWithNameRef(out: ByteWriter, isStatic: boolean, nameIndex: number, value: Uint8Array, huffman: HuffmanPolicy): void {
  encodePrefixedInt(out, nameIndex, 6, isStatic ? 0xc0 : 0x80);
  encodeStringLiteral(out, value, 7, 0, huffman);
}

/** Appends Insert With Literal Name (RFC 9204 §4.3.3). */
export function writeInsertWithLiteralName(out: ByteWriter, name: Uint8Array, value: Uint8Array, huffman: HuffmanPolicy): void {
  encodeStringLiteral(out, name, 5, 0x40, huffman);
  encodeStringLiteral(out, value, 7, 0, huffman);
}

/** Appends Duplicate (RFC 9204 §4.3.4) of the entry at `relativeIndex`. */
export function writeDuplicate(out: ByteWriter, relativeIndex: number): void {
  encodePrefixedInt(out, relativeIndex, 5, 0x00);
}
