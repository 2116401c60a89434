// Arbitrary and mutated bytes into every QPACK entry point: only H3Error may come out.
import t from 'tap';
import fc from 'fast-check';
import { QpackDecoder } from '../src/qpack/decoder.ts';
import { QpackEncoder } from '../src/qpack/encoder.ts';
import { hex, onlyH3Errors } from './helpers.ts';

const B2_INSERTS = hex('3fbd01 c00f 7777 772e 6578 616d 706c 652e 636f 6d c10c 2f73 616d 706c 652f 7061 7468 4a63 7573 746f 6d2d 6b65 790c 6375 7374 6f6d 2d76 616c 7565');
const VALID_SECTIONS = [hex('0000 510b 2f69 6e64 6578 2e68 746d 6c'), hex('0381 10 11'), hex('0400 80 c1 81'), hex('0000 2361 6263 8825a849e95ba97d7f')];

function primedDecoder(): QpackDecoder {
  const dec = new QpackDecoder({ maxTableCapacity: 220, maxBlockedStreams: 2, maxFieldSectionSize: 2000 });
  dec.onEncoderStreamData(B2_INSERTS);
  return dec;
}

/** A valid input with a few bytes overwritten, inserted or cut off. */
function mutated(bases: Uint8Array[]): fc.Arbitrary<Uint8Array> {
  return fc
    .tuple(fc.constantFrom(...bases), fc.array(fc.tuple(fc.nat(64), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }), fc.nat(64), fc.boolean())
    .map(([base, edits, cut, truncate]) => {
      const bytes = Uint8Array.from(base);
      for (const [at, value] of edits) bytes[at % bytes.length] = value;
      return truncate ? bytes.subarray(0, cut % (bytes.length + 1)) : bytes;
    });
}

t.test('field sections', async (t) => {
  const input = fc.oneof(fc.uint8Array({ maxLength: 64 }), mutated(VALID_SECTIONS));
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.array(input, { minLength: 1, maxLength: 4 }), (sections) => {
        const dec = primedDecoder();
        sections.forEach((s, i) => onlyH3Errors(() => dec.decodeFieldSection(i * 4, s)));
        onlyH3Errors(() => dec.onEncoderStreamData(hex('02 02')));
        dec.pendingDecoderStreamBytes();
      }),
      { numRuns: 2000 },
    );
  }, 'the property holds');
});

t.test('encoder stream', async (t) => {
  const input = fc.oneof(fc.uint8Array({ maxLength: 64 }), mutated([B2_INSERTS]));
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(input, fc.nat(64), (bytes, cut) => {
        const dec = new QpackDecoder({ maxTableCapacity: 220, maxBlockedStreams: 1 });
        onlyH3Errors(() => {
          dec.decodeFieldSection(0, hex('0400 80'));
          dec.onEncoderStreamData(bytes.subarray(0, cut));
          dec.onEncoderStreamData(bytes.subarray(cut));
        });
      }),
      { numRuns: 2000 },
    );
  }, 'the property holds');
});

t.test('decoder stream', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 32 }), (bytes) => {
        const enc = new QpackEncoder({ dynamicTable: true, insertOnFirstUse: true });
        enc.setPeerSettings({ qpackMaxTableCapacity: 1000, qpackBlockedStreams: 4 });
        enc.encodeFieldSection(0, [['x-a', '1']]);
        enc.encodeFieldSection(4, [['x-b', '2'], ['x-a', '1']]);
        onlyH3Errors(() => enc.onDecoderStreamData(bytes));
        // The encoder keeps working after whatever it accepted.
        onlyH3Errors(() => enc.encodeFieldSection(8, [['x-c', '3']]));
      }),
      { numRuns: 2000 },
    );
  }, 'the property holds');
});
