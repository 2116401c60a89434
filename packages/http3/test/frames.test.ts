import assert from 'node:assert/strict';
import t from 'tap';
import fc from 'fast-check';
import { concatBytes } from '../src/byte-writer.ts';
import { FrameReader } from '../src/frame-reader.ts';
import type { FrameReaderOptions } from '../src/frame-reader.ts';
import {
  encodeCancelPushFrame,
  encodeDataFrame,
  encodeDataFrameHeader,
  encodeFrame,
  encodeGoawayFrame,
  encodeHeadersFrame,
  encodeMaxPushIdFrame,
  encodeReservedFrame,
  encodeSettingsFrame,
} from '../src/frames.ts';
import type { H3Frame } from '../src/frames.ts';
import { DEFAULT_SETTINGS } from '../src/settings.ts';
import { errorCodeOf, hex, onlyH3Errors, toHex } from './helpers.ts';

/** Feeds `bytes` split at `cuts`, gathers frames, merges DATA pieces per frame, then signals FIN. */
function readAll(bytes: Uint8Array, options: FrameReaderOptions = {}, cuts: number[] = []): H3Frame[] {
  const reader = new FrameReader(options);
  const frames: H3Frame[] = [];
  let prev = 0;
  for (const cut of [...cuts.filter((c) => c > 0 && c < bytes.length).sort((a, b) => a - b), bytes.length]) {
    frames.push(...reader.push(bytes.subarray(prev, cut)));
    prev = cut;
  }
  reader.end();
  return mergeData(frames);
}

function mergeData(frames: H3Frame[]): H3Frame[] {
  const merged: H3Frame[] = [];
  let pending: Uint8Array[] = [];
  for (const f of frames) {
    if (f.type !== 'data') {
      merged.push(f);
      continue;
    }
    pending.push(f.data.slice());
    if (f.end) {
      merged.push({ type: 'data', data: concatBytes(pending), end: true });
      pending = [];
    }
  }
  return merged;
}

t.test('encoders produce RFC 9114 §7.2 layouts', async (t) => {
  t.equal(toHex(encodeDataFrame(hex('aabb'))), '0002aabb');
  t.equal(toHex(encodeDataFrameHeader(70000)), `00${'80011170'}`);
  t.equal(toHex(encodeHeadersFrame(hex('0000d1'))), '01030000d1');
  t.equal(toHex(encodeSettingsFrame({})), '0400');
  t.equal(toHex(encodeSettingsFrame({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 16 })), '0405015000' + '0710');
  t.equal(toHex(encodeGoawayFrame(4)), '070104');
  t.equal(toHex(encodeMaxPushIdFrame(300)), '0d02412c');
  t.equal(toHex(encodeCancelPushFrame(1)), '030101');
  t.equal(toHex(encodeReservedFrame(0, hex('ff'))), '2101ff');
});

t.test('reader decodes a request stream in any chunking', async (t) => {
  const body = new Uint8Array(3000).map((_, i) => i & 0xff);
  const stream = concatBytes([
    encodeHeadersFrame(hex('0000d1d7')),
    encodeReservedFrame(3, hex('0102030405')),
    encodeFrame(0x7fff, new Uint8Array(20)),
    encodeDataFrame(body),
    encodeDataFrame(new Uint8Array(0)),
    encodeHeadersFrame(hex('0000')),
  ]);
  const expected: H3Frame[] = [
    { type: 'headers', fieldSection: hex('0000d1d7') },
    { type: 'data', data: body, end: true },
    { type: 'headers', fieldSection: hex('0000') },
  ];
  t.same(readAll(stream), expected, 'one chunk');
  const byteAtATime = Array.from({ length: stream.length }, (_, i) => i);
  t.same(readAll(stream, {}, byteAtATime), expected, 'one byte at a time');
});

t.test('DATA is streamed, not buffered', async (t) => {
  const reader = new FrameReader({ maxFramePayload: 16 });
  const header = encodeDataFrameHeader(1_000_000); // far above maxFramePayload: DATA is not limited
  const first = reader.push(concatBytes([header, new Uint8Array(10)]));
  t.same(first.map((f) => f.type === 'data' && [f.data.length, f.end]), [[10, false]]);
  const chunk = new Uint8Array(999_990);
  const rest = reader.push(chunk);
  t.equal(rest.length, 1);
  const piece = rest[0];
  t.ok(piece?.type === 'data' && piece.end && piece.data.buffer === chunk.buffer, 'piece is a view of the input');
  t.ok(reader.atFrameBoundary);
});

t.test('control stream frames', async (t) => {
  const stream = concatBytes([
    encodeSettingsFrame({ qpackMaxTableCapacity: 100 }),
    encodeReservedFrame(1),
    encodeGoawayFrame(8),
    encodeMaxPushIdFrame(3),
    encodeCancelPushFrame(2),
  ]);
  t.same(readAll(stream, { stream: 'control' }), [
    { type: 'settings', settings: { ...DEFAULT_SETTINGS, qpackMaxTableCapacity: 100 } },
    { type: 'goaway', id: 8 },
    { type: 'max_push_id', pushId: 3 },
    { type: 'cancel_push', pushId: 2 },
  ]);
  // GOAWAY with an ID above 2^53 ("everything") is clamped, not rejected.
  const big = concatBytes([encodeSettingsFrame({}), hex('0708'), hex('ffffffffffffffff')]);
  t.same(readAll(big, { stream: 'control' })[1], { type: 'goaway', id: Number.MAX_SAFE_INTEGER });
});

t.test('error mapping', async (t) => {
  const settings = encodeSettingsFrame({});
  const cases: Array<[string, Uint8Array, FrameReaderOptions, string]> = [
    ['HTTP/2 PRIORITY 0x02', hex('0200'), {}, 'H3_FRAME_UNEXPECTED'],
    ['HTTP/2 PING 0x06', hex('0600'), {}, 'H3_FRAME_UNEXPECTED'],
    ['HTTP/2 WINDOW_UPDATE 0x08', hex('0800'), {}, 'H3_FRAME_UNEXPECTED'],
    ['HTTP/2 CONTINUATION 0x09', hex('0900'), {}, 'H3_FRAME_UNEXPECTED'],
    ['HTTP/2 type on control stream', concatBytes([settings, hex('0600')]), { stream: 'control' }, 'H3_FRAME_UNEXPECTED'],
    ['SETTINGS on request stream', settings, {}, 'H3_FRAME_UNEXPECTED'],
    ['GOAWAY on request stream', encodeGoawayFrame(0), {}, 'H3_FRAME_UNEXPECTED'],
    ['MAX_PUSH_ID on request stream', encodeMaxPushIdFrame(0), {}, 'H3_FRAME_UNEXPECTED'],
    ['CANCEL_PUSH on request stream', encodeCancelPushFrame(0), {}, 'H3_FRAME_UNEXPECTED'],
    ['PUSH_PROMISE at a server', hex('0502000000'), {}, 'H3_FRAME_UNEXPECTED'],
    ['PUSH_PROMISE at a client (no MAX_PUSH_ID sent)', hex('0502000000'), { role: 'client' }, 'H3_ID_ERROR'],
    ['control stream not starting with SETTINGS', encodeGoawayFrame(0), { stream: 'control' }, 'H3_MISSING_SETTINGS'],
    ['control stream starting with a reserved frame', encodeReservedFrame(0), { stream: 'control' }, 'H3_MISSING_SETTINGS'],
    ['second SETTINGS', concatBytes([settings, settings]), { stream: 'control' }, 'H3_FRAME_UNEXPECTED'],
    ['DATA on control stream', concatBytes([settings, encodeDataFrame(hex('00'))]), { stream: 'control' }, 'H3_FRAME_UNEXPECTED'],
    ['HEADERS on control stream', concatBytes([settings, encodeHeadersFrame(hex('0000'))]), { stream: 'control' }, 'H3_FRAME_UNEXPECTED'],
    ['MAX_PUSH_ID sent by a server', concatBytes([settings, encodeMaxPushIdFrame(1)]), { stream: 'control', role: 'client' }, 'H3_FRAME_UNEXPECTED'],
    ['GOAWAY with a non-request stream ID at a client', concatBytes([settings, encodeGoawayFrame(2)]), { stream: 'control', role: 'client' }, 'H3_ID_ERROR'],
    ['GOAWAY payload too long', concatBytes([settings, hex('07020400')]), { stream: 'control' }, 'H3_FRAME_ERROR'],
    ['GOAWAY payload truncated varint', concatBytes([settings, hex('070140')]), { stream: 'control' }, 'H3_FRAME_ERROR'],
    ['GOAWAY empty payload', concatBytes([settings, hex('0700')]), { stream: 'control' }, 'H3_FRAME_ERROR'],
    ['MAX_PUSH_ID declares 9 bytes', concatBytes([settings, hex('0d09')]), { stream: 'control' }, 'H3_FRAME_ERROR'],
    ['SETTINGS with a duplicate', hex('04 04 0101 0102'), { stream: 'control' }, 'H3_SETTINGS_ERROR'],
    ['HEADERS above maxFramePayload', hex('01410000'), { maxFramePayload: 64 }, 'H3_EXCESSIVE_LOAD'],
    ['SETTINGS above maxFramePayload', hex('044100'), { stream: 'control', maxFramePayload: 32 }, 'H3_EXCESSIVE_LOAD'],
    ['frame length above 2^53', hex('00ffffffffffffffff'), {}, 'H3_EXCESSIVE_LOAD'],
    ['stream ends inside a frame header', hex('0140'), {}, 'H3_FRAME_ERROR'],
    ['stream ends inside a HEADERS payload', hex('010300'), {}, 'H3_FRAME_ERROR'],
    ['stream ends inside a DATA payload', hex('000300'), {}, 'H3_FRAME_ERROR'],
    ['stream ends inside an unknown frame', hex('21050102'), {}, 'H3_FRAME_ERROR'],
  ];
  for (const [name, bytes, options, code] of cases) {
    t.equal(errorCodeOf(() => readAll(bytes, options)), code, name);
  }
});

t.test('limit scope follows the stream', async (t) => {
  const scopeOf = (options: FrameReaderOptions, bytes: Uint8Array): string => {
    try {
      new FrameReader(options).push(bytes);
      return 'none';
    } catch (err) {
      return (err as { scope: string }).scope;
    }
  };
  t.equal(scopeOf({ maxFramePayload: 1 }, hex('0102')), 'stream', 'oversized HEADERS ends the request');
  t.equal(scopeOf({ stream: 'control', maxFramePayload: 1 }, hex('0402')), 'connection');
});

const frameArb: fc.Arbitrary<Uint8Array> = fc.oneof(
  fc.uint8Array({ maxLength: 300 }).map(encodeDataFrame),
  fc.uint8Array({ maxLength: 300 }).map(encodeHeadersFrame),
  fc.tuple(fc.nat(1000), fc.uint8Array({ maxLength: 20 })).map(([n, p]) => encodeReservedFrame(n, p)),
);

t.test('property: request stream frames survive any chunking', async (t) => {
  // One assertion for the 500 runs (node:assert throws, so fast-check also shrinks a failure).
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(fc.array(frameArb, { maxLength: 8 }), fc.array(fc.nat(3000), { maxLength: 10 }), (frames, cuts) => {
        const stream = concatBytes(frames);
        const whole = readAll(stream);
        assert.deepStrictEqual(readAll(stream, {}, cuts), whole);
        const expectedCount = frames.filter((f) => (f[0] as number) <= 1 && !(f[0] === 0 && f.length === 2)).length;
        return whole.length === expectedCount;
      }),
      { numRuns: 500 },
    );
  }, 'any chunking reads the same frames as the whole stream');
});

t.test('property: arbitrary bytes only throw H3Error', async (t) => {
  for (const stream of ['request', 'control'] as const) {
    t.doesNotThrow(() => {
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 80 }), fc.array(fc.nat(80), { maxLength: 4 }), (bytes, cuts) =>
          onlyH3Errors(() => readAll(bytes, { stream, maxFramePayload: 40 }, cuts)),
        ),
        { numRuns: 1000 },
      );
    }, `${stream} stream: the property holds`);
  }
});
