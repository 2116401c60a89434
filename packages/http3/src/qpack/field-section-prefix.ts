// The encoded field section prefix (RFC 9204 §4.5.1):
//   Encoded Required Insert Count (8+) | S DeltaBase (7+)

import type { ByteWriter } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import { decodePrefixedInt, encodePrefixedInt } from './prefixed-int.ts';

/** RFC 9204 §4.5.1.1: MaxEntries, the most entries a table of `maxTableCapacity` bytes can hold. */
export function maxEntries(maxTableCapacity: number): number {
  return Math.floor(maxTableCapacity / 32);
}

/** RFC 9204 §4.5.1.1: Required Insert Count is sent modulo 2 * MaxEntries, plus one (0 stays 0). */
export function encodeRequiredInsertCount(requiredInsertCount: number, maxTableCapacity: number): number {
  if (requiredInsertCount === 0) return 0;
  return (requiredInsertCount % (2 * maxEntries(maxTableCapacity))) + 1;
}

/**
 * RFC 9204 §4.5.1.1: reconstructs the Required Insert Count from its encoding, the decoder's
 * total number of inserts and the maximum table capacity the decoder advertised.
 * Throws QPACK_DECOMPRESSION_FAILED for values no conformant encoder could produce.
 */
export function decodeRequiredInsertCount(encoded: number, totalInserts: number, maxTableCapacity: number): number {
  if (encoded === 0) return 0;
  const entries = maxEntries(maxTableCapacity);
  const fullRange = 2 * entries;
  if (encoded > fullRange) throw new H3Error('QPACK_DECOMPRESSION_FAILED', 'Required Insert Count out of range');
  const maxValue = totalInserts + entries;
  const maxWrapped = Math.floor(maxValue / fullRange) * fullRange;
  let ric = maxWrapped + encoded - 1;
  if (ric > maxValue) {
    if (ric <= fullRange) throw new H3Error('QPACK_DECOMPRESSION_FAILED', 'Required Insert Count out of range');
    ric -= fullRange;
  }
  if (ric === 0) throw new H3Error('QPACK_DECOMPRESSION_FAILED', 'Required Insert Count decodes to zero');
  return ric;
}

/** The decoded prefix of a field section. */
export interface FieldSectionPrefix {
  /** Required Insert Count: how many inserts the section needs. */
  requiredInsertCount: number;
  /** Base for relative and post-base indexes. */
  base: number;
  /** Offset of the first field line. */
  next: number;
}

/** Parses the prefix of a complete field section. Throws QPACK_DECOMPRESSION_FAILED when malformed. */
export function parseFieldSectionPrefix(bytes: Uint8Array, totalInserts: number, maxTableCapacity: number): FieldSectionPrefix {
  const code = 'QPACK_DECOMPRESSION_FAILED';
  const ric = decodePrefixedInt(bytes, 0, 8, code);
  if (ric === null) throw new H3Error(code, 'field section prefix truncated');
  const requiredInsertCount = decodeRequiredInsertCount(ric.value, totalInserts, maxTableCapacity);
  if (ric.next >= bytes.length) throw new H3Error(code, 'field section prefix truncated');
  const negative = ((bytes[ric.next] as number) & 0x80) !== 0;
  const delta = decodePrefixedInt(bytes, ric.next, 7, code);
  if (delta === null) throw new H3Error(code, 'field section prefix truncated');
  // RFC 9204 §4.5.1.2: Base = RIC + DeltaBase, or RIC - DeltaBase - 1 when the sign bit is set.
  let base: number;
  if (negative) {
    if (delta.value >= requiredInsertCount) throw new H3Error(code, 'negative Base');
    base = requiredInsertCount - delta.value - 1;
  } else {
    base = requiredInsertCount + delta.value;
    if (!Number.isSafeInteger(base)) throw new H3Error(code, 'Base out of range');
  }
  return { requiredInsertCount, base, next: delta.next };
}

/** Appends a field section prefix for `requiredInsertCount` and `base`. */
export function writeFieldSectionPrefix(out: ByteWriter, requiredInsertCount: number, base: number, maxTableCapacity: number): void {
  encodePrefixedInt(out, encodeRequiredInsertCount(requiredInsertCount, maxTableCapacity), 8, 0);
  if (base >= requiredInsertCount) encodePrefixedInt(out, base - requiredInsertCount, 7, 0);
  else encodePrefixedInt(out, requiredInsertCount - base - 1, 7, 0x80);
}
