import t from 'tap';
import { H3Error, H3_ERROR_CODES, errorCodeFromWire, isH3Error } from '../src/errors.ts';
import type { H3ErrorCode } from '../src/errors.ts';

t.test('wire codes match RFC 9114 §8.1 and RFC 9204 §6', async (t) => {
  const expected: Partial<Record<H3ErrorCode, number>> = {
    H3_NO_ERROR: 0x100,
    H3_GENERAL_PROTOCOL_ERROR: 0x101,
    H3_INTERNAL_ERROR: 0x102,
    H3_STREAM_CREATION_ERROR: 0x103,
    H3_CLOSED_CRITICAL_STREAM: 0x104,
    H3_FRAME_UNEXPECTED: 0x105,
    H3_FRAME_ERROR: 0x106,
    H3_EXCESSIVE_LOAD: 0x107,
    H3_ID_ERROR: 0x108,
    H3_SETTINGS_ERROR: 0x109,
    H3_MISSING_SETTINGS: 0x10a,
    H3_REQUEST_REJECTED: 0x10b,
    H3_REQUEST_CANCELLED: 0x10c,
    H3_REQUEST_INCOMPLETE: 0x10d,
    H3_MESSAGE_ERROR: 0x10e,
    H3_CONNECT_ERROR: 0x10f,
    H3_VERSION_FALLBACK: 0x110,
    QPACK_DECOMPRESSION_FAILED: 0x200,
    QPACK_ENCODER_STREAM_ERROR: 0x201,
    QPACK_DECODER_STREAM_ERROR: 0x202,
  };
  for (const [code, wire] of Object.entries(expected)) {
    t.equal(H3_ERROR_CODES[code as H3ErrorCode].wireCode, wire, code);
    t.equal(errorCodeFromWire(wire), code);
  }
  const local = Object.entries(H3_ERROR_CODES).filter(([, info]) => 'local' in info && info.local === true).map(([code]) => code);
  t.same(local.sort(), ['EDGE_H3_CONNECTION_LOST', 'EDGE_H3_CONTENT_LENGTH_MISMATCH', 'EDGE_H3_FIELD_SECTION_TOO_LARGE', 'EDGE_H3_GOAWAY', 'EDGE_H3_INVALID_USE', 'EDGE_H3_TIMEOUT']);
  t.equal(Object.keys(H3_ERROR_CODES).length, Object.keys(expected).length + local.length, 'no undeclared extra codes');
  for (const code of local) t.not(errorCodeFromWire(H3_ERROR_CODES[code as H3ErrorCode].wireCode), code, `${code} is never decoded from the wire`);
  t.equal(errorCodeFromWire(0x21), undefined, 'reserved codes are unknown');
});

t.test('H3Error carries code, wire code and scope', async (t) => {
  const e = new H3Error('H3_FRAME_ERROR', 'bad frame');
  t.equal(e.code, 'H3_FRAME_ERROR');
  t.equal(e.wireCode, 0x106);
  t.equal(e.scope, 'connection');
  t.equal(new H3Error('H3_MESSAGE_ERROR', 'x').scope, 'stream');
  t.equal(new H3Error('H3_EXCESSIVE_LOAD', 'x', { scope: 'stream' }).scope, 'stream', 'scope can be narrowed');
  t.ok(isH3Error(e));
  t.ok(isH3Error({ code: 'QPACK_DECOMPRESSION_FAILED', message: 'crossed IPC' }), 'plain objects from IPC');
  t.notOk(isH3Error(new RangeError('x')));
  t.notOk(isH3Error({ code: 'ECONNRESET' }));
  const cause = new Error('root');
  t.equal(new H3Error('H3_INTERNAL_ERROR', 'wrapped', { cause }).cause, cause);
});

t.test('every code has a description', async (t) => {
  for (const [code, info] of Object.entries(H3_ERROR_CODES)) t.ok(info.description.length > 10, code);
});
