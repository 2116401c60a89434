// Table-driven: which malformed QPACK input produces which error code.
import t from 'tap';
import { QpackDecoder } from '../src/qpack/decoder.ts';
import type { QpackDecoderOptions } from '../src/qpack/decoder.ts';
import { QpackEncoder } from '../src/qpack/encoder.ts';
import { H3Error } from '../src/errors.ts';
import { errorCodeOf, hex, toHex } from './helpers.ts';

// The decoder state after RFC 9204 B.2: capacity 220, entries 0 (:authority) and 1 (:path).
const B2_INSERTS = '3fbd01 c00f 7777 772e 6578 616d 706c 652e 636f 6d c10c 2f73 616d 706c 652f 7061 7468';
function decoderAfterB2(options: QpackDecoderOptions = {}): QpackDecoder {
  const dec = new QpackDecoder({ maxTableCapacity: 220, maxBlockedStreams: 1, ...options });
  dec.onEncoderStreamData(hex(B2_INSERTS));
  return dec;
}

t.test('field sections', async (t) => {
  const cases: Array<[string, string, QpackDecoderOptions, string]> = [
    ['empty section', '', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['prefix without Base', '00', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['static index 99', '0000 ff24', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['dynamic reference with Required Insert Count 0', '0000 80', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['post-base reference with Required Insert Count 0', '0000 10', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['encoded insert count beyond 2*MaxEntries', '0e00', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['negative Base', '0382 c1', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['relative index below zero', '0300 82', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['post-base index at Required Insert Count', '0381 12', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['Required Insert Count larger than needed', '0300 c1', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['name reference to a missing dynamic entry', '0381 0200', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['truncated literal value', '0000 510b 2f', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['truncated literal name', '0000 2361', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['truncated index', '0000 ff', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['invalid Huffman value (8 bits of padding)', '0000 5181 ff', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['Huffman value containing EOS', '0000 5184 ffffffff', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['integer above 2^53', '0000 ffff ffff ffff ffff ff7f', {}, 'QPACK_DECOMPRESSION_FAILED'],
    ['blocking beyond SETTINGS_QPACK_BLOCKED_STREAMS', '0400 82', { maxBlockedStreams: 0 }, 'QPACK_DECOMPRESSION_FAILED'],
    ['field section over maxFieldSectionSize', '0000 d1 d1', { maxFieldSectionSize: 70 }, 'H3_EXCESSIVE_LOAD'],
    ['more lines than maxFieldLines', '0000 d1 d1 d1', { maxFieldLines: 2 }, 'H3_EXCESSIVE_LOAD'],
    ['string over maxStringLength', '0000 5105 2f2f2f2f2f', { maxStringLength: 4 }, 'H3_EXCESSIVE_LOAD'],
    ['Huffman string expanding over maxStringLength', '0000 5188 f1e3c2e5f23a6ba0', { maxStringLength: 5 }, 'H3_EXCESSIVE_LOAD'],
  ];
  for (const [name, bytes, options, code] of cases) {
    t.equal(errorCodeOf(() => decoderAfterB2(options).decodeFieldSection(0, hex(bytes))), code, name);
  }
});

t.test('a QPACK bomb is stopped by the field section limit', async (t) => {
  // One 200-byte entry referenced by one-byte lines: 32 KiB of headers from a few hundred bytes.
  const dec = new QpackDecoder({ maxTableCapacity: 4096, maxFieldSectionSize: 16384, maxFieldLines: 100000 });
  const name = 'x'.repeat(100);
  const value = 'y'.repeat(100);
  dec.onEncoderStreamData(hex(`3f e1 1f 5f 45 ${toHex(Buffer.from(name))} 64 ${toHex(Buffer.from(value))}`));
  t.equal(dec.insertCount, 1);
  const section = hex(`0200 ${'80'.repeat(200)}`);
  t.equal(errorCodeOf(() => dec.decodeFieldSection(0, section)), 'H3_EXCESSIVE_LOAD');
  t.equal(toHex(dec.pendingDecoderStreamBytes()), '4001', 'Stream Cancellation for stream 0, then the insert reported');
});

t.test('limit errors are stream-scoped and leave the decoder usable', async (t) => {
  const dec = decoderAfterB2({ maxFieldLines: 1 });
  try {
    dec.decodeFieldSection(4, hex('0381 10 11'));
    t.fail('should throw');
  } catch (err) {
    t.ok(err instanceof H3Error && err.code === 'H3_EXCESSIVE_LOAD' && err.scope === 'stream');
  }
  t.equal(toHex(dec.pendingDecoderStreamBytes()), '4402', 'Stream Cancellation(4), Insert Count Increment(2)');
  t.same(dec.decodeFieldSection(8, hex('0200 80')).blocked, false, 'next stream decodes');
});

t.test('a limit error in a section that was blocked comes back for its stream only', async (t) => {
  const dec = new QpackDecoder({ maxTableCapacity: 220, maxBlockedStreams: 2, maxFieldLines: 1 });
  t.same(dec.decodeFieldSection(4, hex('0381 10 11')), { blocked: true });
  t.same(dec.decodeFieldSection(8, hex('0200 80')), { blocked: true });
  const out = dec.onEncoderStreamData(hex(B2_INSERTS));
  t.equal(out.length, 2);
  t.equal(out[0]?.error?.code, 'H3_EXCESSIVE_LOAD');
  t.same(out[1], { streamId: 8, headers: [[':authority', 'www.example.com']] });
});

t.test('encoder stream', async (t) => {
  const cases: Array<[string, string, QpackDecoderOptions, string]> = [
    ['capacity above our maximum', '3fbe01', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['insert with static name index 99', '3fbd01 ff24 00', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['insert with dynamic name reference into an empty table', '3fbd01 8000', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['duplicate of a missing entry', '3fbd01 00', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['entry larger than the capacity', '3f09 4a 6162636465666768696a 00', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['insert before any capacity is set', '4000', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['insert into a table we never allowed', '3fbd01', { maxTableCapacity: 0 }, 'QPACK_ENCODER_STREAM_ERROR'],
    ['invalid Huffman value', '3fbd01 c081ff', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['string that could never fit', '3fbd01 c0 7f ff 0f', {}, 'QPACK_ENCODER_STREAM_ERROR'],
    ['integer above 2^53', '3fffffffffffffffffff7f', {}, 'QPACK_ENCODER_STREAM_ERROR'],
  ];
  for (const [name, bytes, options, code] of cases) {
    const dec = new QpackDecoder({ maxTableCapacity: 220, ...options });
    t.equal(errorCodeOf(() => dec.onEncoderStreamData(hex(bytes))), code, name);
  }
  const dec = new QpackDecoder({ maxTableCapacity: 220 });
  t.same(dec.onEncoderStreamData(hex('3fbd01 c00f 7777')), [], 'partial instruction waits');
  t.equal(dec.insertCount, 0);
  dec.onEncoderStreamData(hex('772e 6578 616d 706c 652e 636f 6d'));
  t.equal(dec.insertCount, 1, 'completed by the next chunk');
});

t.test('decoder stream', async (t) => {
  const fresh = (): QpackEncoder => {
    const enc = new QpackEncoder({ dynamicTable: true, insertOnFirstUse: true });
    enc.setPeerSettings({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 10 });
    enc.encodeFieldSection(4, [['x-a', '1']]);
    return enc;
  };
  const cases: Array<[string, string, string]> = [
    ['Section Acknowledgment with nothing outstanding', '88', 'QPACK_DECODER_STREAM_ERROR'],
    ['second Section Acknowledgment for one section', '8484', 'QPACK_DECODER_STREAM_ERROR'],
    ['Insert Count Increment of 0', '00', 'QPACK_DECODER_STREAM_ERROR'],
    ['Insert Count Increment beyond our inserts', '02', 'QPACK_DECODER_STREAM_ERROR'],
    ['integer above 2^53', 'ffffffffffffffffff7f', 'QPACK_DECODER_STREAM_ERROR'],
    ['Stream Cancellation of an unknown stream is fine', '4c', 'no error'],
    ['valid acknowledgment', '84', 'no error'],
    ['valid increment', '01', 'no error'],
  ];
  for (const [name, bytes, code] of cases) t.equal(errorCodeOf(() => fresh().onDecoderStreamData(hex(bytes))), code, name);
  t.equal(errorCodeOf(() => fresh().setPeerSettings({ qpackMaxTableCapacity: 1, qpackBlockedStreams: 1 })), 'H3_INTERNAL_ERROR', 'settings applied twice');
});
