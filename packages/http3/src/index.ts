// @edge-proxy/http3: pure codecs for HTTP/3 (RFC 9114) and QPACK (RFC 9204).
// No sockets and no QUIC: a session layer feeds bytes in and sends the bytes that come out.
//
// Typical use on a server connection:
//   - control stream: `new FrameReader({ stream: 'control' })`, first frame is the peer's SETTINGS;
//   - request streams: `new FrameReader()`, HEADERS field sections go to `QpackDecoder.decodeFieldSection`;
//   - QPACK streams: peer encoder stream bytes to `QpackDecoder.onEncoderStreamData`, peer decoder
//     stream bytes to `QpackEncoder.onDecoderStreamData`; send `pending*StreamBytes()` on ours.
// Every failure is an `H3Error`; branch on `err.code`, close per `err.scope` with `err.wireCode`.

export { H3Error, H3_ERROR_CODES, errorCodeFromWire, isH3Error } from './errors.ts';
export type { H3ErrorCode, H3ErrorCodeInfo, H3ErrorOptions, H3ErrorScope } from './errors.ts';

export { VARINT_MAX, decodeVarint, encodeVarint, varintLength, writeVarint } from './varint.ts';
export type { DecodedVarint } from './varint.ts';

export { isReservedCodepoint, reservedCodepoint } from './reserved.ts';

export {
  FRAME_TYPE,
  HTTP2_ONLY_FRAME_TYPES,
  encodeCancelPushFrame,
  encodeDataFrame,
  encodeDataFrameHeader,
  encodeFrame,
  encodeFrameHeader,
  encodeGoawayFrame,
  encodeHeadersFrame,
  encodeMaxPushIdFrame,
  encodeReservedFrame,
  encodeSettingsFrame,
} from './frames.ts';
export type { H3Frame } from './frames.ts';

export { FrameReader } from './frame-reader.ts';
export type { FrameReaderOptions, FrameStreamKind } from './frame-reader.ts';

export { DEFAULT_SETTINGS, SETTING_ID, decodeSettings, encodeSettingsPayload } from './settings.ts';
export type { EncodeSettingsOptions, Http3Settings } from './settings.ts';

export { STREAM_TYPE, classifyStreamType, encodeStreamType, parseStreamType } from './stream-types.ts';
export type { Http3Role, ParsedStreamType, UniStreamKind } from './stream-types.ts';

export { QpackDecoder } from './qpack/decoder.ts';
export type { DecodeResult, Header, QpackDecoderOptions, UnblockedSection } from './qpack/decoder.ts';

export { QpackEncoder } from './qpack/encoder.ts';
export type { QpackEncoderOptions, QpackPeerSettings } from './qpack/encoder.ts';

export { STATIC_TABLE } from './qpack/static-table.ts';
export { huffmanDecode, huffmanEncode, huffmanEncodedLength } from './qpack/huffman.ts';
export type { HuffmanPolicy } from './qpack/string-literal.ts';
