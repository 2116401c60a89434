import assert from 'node:assert/strict';
import t from 'tap';
import fc from 'fast-check';
import { DEFAULT_SETTINGS, decodeSettings, encodeSettingsPayload } from '../src/settings.ts';
import type { Http3Settings } from '../src/settings.ts';
import { classifyStreamType, encodeStreamType, parseStreamType } from '../src/stream-types.ts';
import { encodeVarint } from '../src/varint.ts';
import { concatBytes } from '../src/byte-writer.ts';
import { errorCodeOf, hex, onlyH3Errors, toHex } from './helpers.ts';

const pairs = (...values: number[]): Uint8Array => concatBytes(values.map((v) => encodeVarint(v)));

t.test('decodes known settings and applies defaults', async (t) => {
  t.same(decodeSettings(new Uint8Array(0)), DEFAULT_SETTINGS);
  t.same(decodeSettings(pairs(0x01, 4096, 0x06, 16384, 0x07, 16, 0x08, 1, 0x33, 1)), {
    qpackMaxTableCapacity: 4096,
    maxFieldSectionSize: 16384,
    qpackBlockedStreams: 16,
    enableConnectProtocol: true,
    h3Datagram: true,
  });
});

t.test('unknown and reserved identifiers are ignored', async (t) => {
  const s = decodeSettings(pairs(0x21, 7, 0x40, 1, 0x1f * 5 + 0x21, 9, 0x01, 100));
  t.equal(s.qpackMaxTableCapacity, 100);
  // An identifier and a value above 2^53 (legal on the wire) are tolerated.
  const big = decodeSettings(concatBytes([hex('c2197c5eff14e88c'), hex('c2197c5eff14e88c'), pairs(0x06), hex('ffffffffffffffff')]));
  t.equal(big.maxFieldSectionSize, Number.MAX_SAFE_INTEGER, 'huge value clamps to "unlimited"');
});

t.test('error mapping', async (t) => {
  const cases: Array<[string, Uint8Array, string]> = [
    ['duplicate identifier', pairs(0x01, 1, 0x01, 2), 'H3_SETTINGS_ERROR'],
    ['duplicate unknown identifier', pairs(0x40, 1, 0x40, 2), 'H3_SETTINGS_ERROR'],
    ['HTTP/2 ENABLE_PUSH 0x02', pairs(0x02, 0), 'H3_SETTINGS_ERROR'],
    ['HTTP/2 MAX_CONCURRENT_STREAMS 0x03', pairs(0x03, 100), 'H3_SETTINGS_ERROR'],
    ['HTTP/2 INITIAL_WINDOW_SIZE 0x04', pairs(0x04, 100), 'H3_SETTINGS_ERROR'],
    ['HTTP/2 MAX_FRAME_SIZE 0x05', pairs(0x05, 16384), 'H3_SETTINGS_ERROR'],
    ['ENABLE_CONNECT_PROTOCOL = 2', pairs(0x08, 2), 'H3_SETTINGS_ERROR'],
    ['H3_DATAGRAM = 7', pairs(0x33, 7), 'H3_SETTINGS_ERROR'],
    ['identifier without value', pairs(0x01), 'H3_FRAME_ERROR'],
    ['truncated value varint', hex('0140'), 'H3_FRAME_ERROR'],
  ];
  for (const [name, payload, code] of cases) t.equal(errorCodeOf(() => decodeSettings(payload)), code, name);
});

t.test('encoding omits defaults and can grease', async (t) => {
  t.equal(toHex(encodeSettingsPayload({})), '');
  t.equal(toHex(encodeSettingsPayload({ qpackMaxTableCapacity: 0, maxFieldSectionSize: Infinity })), '');
  const payload = encodeSettingsPayload({ qpackMaxTableCapacity: 4096, enableConnectProtocol: true }, { greaseN: 1 });
  t.equal(toHex(payload), `01${toHex(encodeVarint(4096))}0801${toHex(encodeVarint(0x40))}00`);
  t.equal(decodeSettings(payload).qpackMaxTableCapacity, 4096);
});

t.test('property: settings round trip', async (t) => {
  const settingsArb: fc.Arbitrary<Http3Settings> = fc.record({
    qpackMaxTableCapacity: fc.nat(2 ** 30),
    maxFieldSectionSize: fc.oneof(fc.constant(Infinity), fc.maxSafeNat()),
    qpackBlockedStreams: fc.nat(1000),
    enableConnectProtocol: fc.boolean(),
    h3Datagram: fc.boolean(),
  });
  // One assertion for the 500 runs (node:assert throws, so fast-check also shrinks a failure).
  t.doesNotThrow(() => {
    fc.assert(
      fc.property(settingsArb, fc.option(fc.nat(1000), { nil: undefined }), (s, greaseN) => {
        assert.deepStrictEqual(decodeSettings(encodeSettingsPayload(s, greaseN === undefined ? {} : { greaseN })), { ...s }); // fc.record objects have no prototype
      }),
      { numRuns: 500 },
    );
  }, 'every settings record decodes to itself');
});

t.test('property: arbitrary payloads only throw H3Error', async (t) => {
  t.doesNotThrow(() => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => onlyH3Errors(() => decodeSettings(bytes))), { numRuns: 1000 });
  }, 'the property holds');
});

t.test('unidirectional stream types (RFC 9114 §6.2)', async (t) => {
  t.equal(classifyStreamType(0x00), 'control');
  t.equal(classifyStreamType(0x01), 'push');
  t.equal(classifyStreamType(0x02), 'qpack-encoder');
  t.equal(classifyStreamType(0x03), 'qpack-decoder');
  t.equal(classifyStreamType(0x21), 'unknown', 'reserved');
  t.equal(classifyStreamType(0x54), 'unknown');
  t.same(parseStreamType(hex('00ff'), 'server'), { type: 0, kind: 'control', length: 1 });
  t.same(parseStreamType(hex('4021'), 'server'), { type: 0x21, kind: 'unknown', length: 2 });
  t.equal(parseStreamType(hex('40'), 'server'), null, 'waits for the whole varint');
  t.equal(parseStreamType(hex(''), 'client'), null);
  t.equal(errorCodeOf(() => parseStreamType(hex('01'), 'server')), 'H3_STREAM_CREATION_ERROR', 'clients cannot push');
  t.same(parseStreamType(hex('01'), 'client'), { type: 1, kind: 'push', length: 1 });
  t.equal(toHex(encodeStreamType(0x02)), '02');
});
