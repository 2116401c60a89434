import t from 'tap';
import fc from 'fast-check';
import { ByteWriter } from '../src/byte-writer.ts';
import { HUFFMAN_CODES, HUFFMAN_CODE_LENGTHS, huffmanDecode, huffmanEncode, huffmanEncodedLength } from '../src/qpack/huffman.ts';
import { hex, toHex } from './helpers.ts';

const encode = (text: string): string => {
  const w = new ByteWriter();
  huffmanEncode(Buffer.from(text, 'latin1'), w);
  return toHex(w.finish());
};
const decode = (h: string, max = 1000): string | null => {
  const out = huffmanDecode(hex(h), max);
  if (out === 'invalid') return 'invalid';
  return out === null ? null : Buffer.from(out).toString('latin1');
};

t.test('the derived canonical code matches RFC 7541 Appendix B', async (t) => {
  t.equal(HUFFMAN_CODE_LENGTHS.length, 257);
  let kraft = 0;
  for (const len of HUFFMAN_CODE_LENGTHS) kraft += 2 ** -len;
  t.equal(kraft, 1, 'a complete prefix code');
  // [symbol, code as hex, length] rows from the RFC table.
  const rows: Array<[number, number, number]> = [
    [0, 0x1ff8, 13], [1, 0x7fffd8, 23], [9, 0xffffea, 24], [10, 0x3ffffffc, 30], [22, 0x3ffffffe, 30],
    [32, 0x14, 6], [48, 0x0, 5], [58, 0x5c, 7], [60, 0x7ffc, 15], [92, 0x7fff0, 19], [97, 0x3, 5],
    [122, 0x7b, 7], [127, 0xffffffc, 28], [128, 0xfffe6, 20], [195, 0x7fff1, 19], [200, 0x3ffffe2, 26],
    [220, 0xffffffd, 28], [249, 0xffffffe, 28], [254, 0x7fffff0, 27], [255, 0x3ffffee, 26], [256, 0x3fffffff, 30],
  ];
  for (const [sym, code, len] of rows) {
    t.equal(HUFFMAN_CODES[sym], code, `code of ${sym}`);
    t.equal(HUFFMAN_CODE_LENGTHS[sym], len, `length of ${sym}`);
  }
});

t.test('RFC 7541 Appendix C.4 and C.6 strings', async (t) => {
  const examples: Array<[string, string]> = [
    ['www.example.com', 'f1e3c2e5f23a6ba0ab90f4ff'],
    ['no-cache', 'a8eb10649cbf'],
    ['custom-key', '25a849e95ba97d7f'],
    ['custom-value', '25a849e95bb8e8b4bf'],
    ['302', '6402'],
    ['private', 'aec3771a4b'],
    ['Mon, 21 Oct 2013 20:13:21 GMT', 'd07abe941054d444a8200595040b8166e082a62d1bff'],
    ['https://www.example.com', '9d29ad171863c78f0b97c8e9ae82ae43d3'],
  ];
  for (const [text, coded] of examples) {
    t.equal(encode(text), coded, `encode ${text}`);
    t.equal(decode(coded), text, `decode ${text}`);
    t.equal(huffmanEncodedLength(Buffer.from(text)), coded.length / 2);
  }
});

t.test('RFC 7541 §5.2 padding and EOS rules', async (t) => {
  t.equal(decode(''), '');
  t.equal(decode('1f'), 'a', "'a' (00011) + 3 one-bits of padding");
  t.equal(decode('18'), 'invalid', 'padding that is not all ones');
  t.equal(decode('1fff'), 'invalid', 'padding longer than 7 bits');
  t.equal(decode('ff'), 'invalid', 'a whole byte of padding');
  t.equal(decode('ffffffff'), 'invalid', 'the EOS symbol itself');
  t.equal(decode('f1e3c2e5f23a6ba0ab90f4ff', 14), null, 'output over the limit');
  t.equal(decode('f1e3c2e5f23a6ba0ab90f4ff', 15), 'www.example.com', 'output at the limit');
});

t.test('property: round trip of any bytes', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (data) => {
        const w = new ByteWriter();
        huffmanEncode(data, w);
        const coded = w.finish();
        const back = huffmanDecode(coded, data.length);
        return coded.length === huffmanEncodedLength(data) && back instanceof Uint8Array && toHex(back) === toHex(data);
      }),
      { numRuns: 1000 },
    );
  }, 'the property holds');
});

t.test('property: arbitrary input never throws', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), fc.nat(200), (data, max) => {
        huffmanDecode(data, max);
      }),
      { numRuns: 1000 },
    );
  }, 'the property holds');
});
