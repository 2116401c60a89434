import t from 'tap';
import fc from 'fast-check';
import { decodeExactVarint, decodeVarint, encodeVarint, varintLength } from '../src/varint.ts';
import { errorCodeOf, hex, onlyH3Errors, toHex } from './helpers.ts';

t.test('RFC 9000 §A.1 examples', async (t) => {
  t.same(decodeVarint(hex('9d7f3e7d')), { value: 494878333, length: 4 });
  t.same(decodeVarint(hex('7bbd')), { value: 15293, length: 2 });
  t.same(decodeVarint(hex('25')), { value: 37, length: 1 });
  t.same(decodeVarint(hex('4025')), { value: 37, length: 2 }, 'non-minimal encodings are accepted');
  t.equal(toHex(encodeVarint(494878333)), '9d7f3e7d');
  t.equal(toHex(encodeVarint(15293)), '7bbd');
  t.equal(toHex(encodeVarint(37)), '25');
});

t.test('RFC 9000 §A.1 eight-byte example 0xc2197c5eff14e88c exceeds 2^53', async (t) => {
  // 151,288,809,941,952,652 is legal on the wire but not exact as a number: the lenient decoder
  // returns an inexact value above MAX_SAFE_INTEGER, the exact decoder refuses it.
  const v = decodeVarint(hex('c2197c5eff14e88c'));
  t.equal(v?.length, 8);
  t.ok((v?.value ?? 0) > Number.MAX_SAFE_INTEGER);
  t.ok(Math.abs((v?.value ?? 0) - 151288809941952652) < 64, 'approximately the RFC value');
  t.equal(errorCodeOf(() => decodeExactVarint(hex('c2197c5eff14e88c'), 0, 'H3_FRAME_ERROR', 'test')), 'H3_FRAME_ERROR');
});

t.test('boundaries and lengths', async (t) => {
  const cases: Array<[number, number]> = [
    [0, 1], [63, 1], [64, 2], [16383, 2], [16384, 4], [2 ** 30 - 1, 4], [2 ** 30, 8], [Number.MAX_SAFE_INTEGER, 8],
  ];
  for (const [value, length] of cases) {
    t.equal(varintLength(value), length, `length of ${value}`);
    t.same(decodeVarint(encodeVarint(value)), { value, length });
  }
  t.equal(decodeVarint(hex('')), null);
  t.equal(decodeVarint(hex('40')), null, 'truncated two-byte varint');
  t.equal(decodeVarint(hex('c0000000000000')), null, 'truncated eight-byte varint');
  t.equal(errorCodeOf(() => encodeVarint(-1)), 'H3_INTERNAL_ERROR');
  t.equal(errorCodeOf(() => encodeVarint(1.5)), 'H3_INTERNAL_ERROR');
  t.equal(errorCodeOf(() => encodeVarint(2 ** 53)), 'H3_INTERNAL_ERROR');
  t.equal(errorCodeOf(() => decodeExactVarint(hex('40'), 0, 'H3_FRAME_ERROR', 'x')), 'H3_FRAME_ERROR');
});

t.test('property: encode/decode round trip', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.maxSafeNat(), fc.nat(8), (value, offset) => {
        const enc = encodeVarint(value);
        const buf = new Uint8Array(offset + enc.length);
        buf.set(enc, offset);
        const dec = decodeVarint(buf, offset);
        return dec !== null && dec.value === value && dec.length === enc.length;
      }),
      { numRuns: 2000 },
    );
  }, 'round trips');
});

t.test('property: arbitrary bytes never throw anything but H3Error', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 12 }), fc.nat(12), (bytes, offset) => {
        decodeVarint(bytes, offset);
        onlyH3Errors(() => decodeExactVarint(bytes, offset, 'H3_FRAME_ERROR', 'fuzz'));
      }),
      { numRuns: 1000 },
    );
  }, 'no foreign errors');
});
