import t from 'tap';
import fc from 'fast-check';
import { ByteWriter } from '../src/byte-writer.ts';
import { H3Error } from '../src/errors.ts';
import { decodePrefixedInt, encodePrefixedInt } from '../src/qpack/prefixed-int.ts';
import { STATIC_TABLE, staticExactIndex, staticNameIndex } from '../src/qpack/static-table.ts';
import { decodeStringLiteral, fieldBytes, fieldText, stringLiteralBytes } from '../src/qpack/string-literal.ts';
import type { StringLiteralLimits } from '../src/qpack/string-literal.ts';
import { decodeRequiredInsertCount, encodeRequiredInsertCount } from '../src/qpack/field-section-prefix.ts';
import { errorCodeOf, hex, onlyH3Errors, toHex } from './helpers.ts';

const prefixed = (value: number, bits: number, flags = 0): string => {
  const w = new ByteWriter();
  encodePrefixedInt(w, value, bits, flags);
  return toHex(w.finish());
};

t.test('RFC 7541 Appendix C.1 integers', async (t) => {
  t.equal(prefixed(10, 5), '0a');
  t.equal(prefixed(1337, 5), '1f9a0a');
  t.equal(prefixed(42, 8), '2a');
  t.equal(prefixed(10, 5, 0xe0), 'ea', 'flags fill the high bits');
  t.same(decodePrefixedInt(hex('1f9a0a'), 0, 5, 'QPACK_DECOMPRESSION_FAILED'), { value: 1337, next: 3 });
  t.same(decodePrefixedInt(hex('ea'), 0, 5, 'QPACK_DECOMPRESSION_FAILED'), { value: 10, next: 1 });
  t.equal(decodePrefixedInt(hex('1f9a'), 0, 5, 'QPACK_DECOMPRESSION_FAILED'), null, 'truncated');
  t.equal(errorCodeOf(() => decodePrefixedInt(hex('1fffffffffffffffff7f'), 0, 5, 'QPACK_ENCODER_STREAM_ERROR')), 'QPACK_ENCODER_STREAM_ERROR', 'above 2^53');
  t.equal(errorCodeOf(() => decodePrefixedInt(hex('1f8080808080808080808000'), 0, 5, 'QPACK_DECOMPRESSION_FAILED')), 'QPACK_DECOMPRESSION_FAILED', 'endless zero continuation');
});

t.test('property: prefixed integers round trip', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.maxSafeNat(), fc.integer({ min: 1, max: 8 }), (value, bits) => {
        const bytes = hex(prefixed(value, bits));
        const back = decodePrefixedInt(bytes, 0, bits, 'QPACK_DECOMPRESSION_FAILED');
        return back !== null && back.value === value && back.next === bytes.length;
      }),
      { numRuns: 2000 },
    );
  }, 'the property holds');
});

t.test('static table is RFC 9204 Appendix A', async (t) => {
  t.equal(STATIC_TABLE.length, 99);
  t.same(STATIC_TABLE[0], [':authority', '']);
  t.same(STATIC_TABLE[17], [':method', 'GET']);
  t.same(STATIC_TABLE[25], [':status', '200']);
  t.same(STATIC_TABLE[31], ['accept-encoding', 'gzip, deflate, br']);
  t.same(STATIC_TABLE[63], [':status', '100']);
  t.same(STATIC_TABLE[85], ['content-security-policy', "script-src 'none'; object-src 'none'; base-uri 'none'"]);
  t.same(STATIC_TABLE[98], ['x-frame-options', 'sameorigin']);
  t.equal(staticExactIndex(':status', '404'), 27);
  t.equal(staticNameIndex(':status'), 24, 'first entry with the name');
  t.equal(staticExactIndex(':status', '999'), undefined);
});

t.test('string literals', async (t) => {
  const limits: StringLiteralLimits = { maxLength: 100, malformed: 'QPACK_DECOMPRESSION_FAILED', tooLong: () => new H3Error('H3_EXCESSIVE_LOAD', 'long') };
  t.equal(toHex(stringLiteralBytes('custom-key', 7, 0, 'never')), '0a637573746f6d2d6b6579');
  t.equal(toHex(stringLiteralBytes('custom-key', 7, 0, 'auto')), '8825a849e95ba97d7f', 'Huffman when shorter');
  t.equal(toHex(stringLiteralBytes('\u00ff', 7, 0, 'auto')), '01ff', 'literal when Huffman is longer');
  t.equal(toHex(stringLiteralBytes('x', 3, 0x20, 'never')), '2178', 'H bit sits above a 3-bit prefix');
  const back = decodeStringLiteral(hex('8825a849e95ba97d7f'), 0, 7, limits);
  t.equal(back && fieldText(back.bytes), 'custom-key');
  t.equal(decodeStringLiteral(hex('0a6375'), 0, 7, limits), null, 'truncated');
  t.equal(errorCodeOf(() => decodeStringLiteral(hex('7f0a'), 0, 7, { ...limits, maxLength: 10 })), 'H3_EXCESSIVE_LOAD', 'length checked before the bytes arrive');
  t.equal(errorCodeOf(() => decodeStringLiteral(hex('81ff'), 0, 7, limits)), 'QPACK_DECOMPRESSION_FAILED', 'bad Huffman');
  t.equal(toHex(fieldBytes('é')), 'e9', 'latin1 octets');
  t.equal(toHex(fieldBytes('€')), 'e282ac', 'UTF-8 above U+00FF');
});

t.test('property: arbitrary bytes into string literals only throw H3Error', async (t) => {
  const limits: StringLiteralLimits = { maxLength: 50, malformed: 'QPACK_DECOMPRESSION_FAILED', tooLong: () => new H3Error('H3_EXCESSIVE_LOAD', 'long') };
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 40 }), fc.integer({ min: 1, max: 7 }), (bytes, bits) =>
        onlyH3Errors(() => decodeStringLiteral(bytes, 0, bits, limits)),
      ),
      { numRuns: 1000 },
    );
  }, 'the property holds');
});

t.test('RFC 9204 §4.5.1.1 Required Insert Count wrapping', async (t) => {
  // MaxEntries = 100 / 32 = 3, FullRange = 6.
  // Every (count, inserts) pair in the window, checked together: one assertion listing each miss.
  const wrong: string[] = [];
  let pairs = 0;
  for (let total = 0; total < 40; total++) {
    for (let ric = Math.max(1, total - 2); ric <= total + 3; ric++) {
      pairs++;
      const back = decodeRequiredInsertCount(encodeRequiredInsertCount(ric, 100), total, 100);
      if (back !== ric) wrong.push(`ric ${ric} at ${total} inserts decoded as ${back}`);
    }
  }
  t.same(wrong, [], `all ${pairs} Required Insert Counts round trip`);
  t.equal(errorCodeOf(() => decodeRequiredInsertCount(7, 0, 100)), 'QPACK_DECOMPRESSION_FAILED', 'beyond FullRange');
  t.equal(errorCodeOf(() => decodeRequiredInsertCount(1, 0, 0)), 'QPACK_DECOMPRESSION_FAILED', 'no dynamic table');
  t.equal(errorCodeOf(() => decodeRequiredInsertCount(6, 0, 100)), 'QPACK_DECOMPRESSION_FAILED', 'would need more than MaxEntries ahead');
});
