// @edge-proxy/http3: HTTP/3 (RFC 9114) and QPACK (RFC 9204) codecs, and server and client
// sessions over `@matrixai/quic`.
//
// Sessions: `new Http3Server(options)` emits 'request' (req, res) shaped like Node's http2
// compatibility API; `Http3ClientSession.connect(options)` sends requests on one connection.
//
// Codecs (pure: no sockets, no QUIC):
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

export { Http3Server, SERVER_DEFAULTS } from './server.ts';
export type { Http3ServerEvents, Http3ServerOptions, Http3ServerStats, ListenOptions } from './server.ts';
export type { IngressCounts } from './quic-adapter.ts';
export { Http3ServerSession } from './server-session.ts';
export type { SessionCloseInfo } from './server-session.ts';
export { Http3ServerRequest } from './server-request.ts';
export { Http3ServerResponse } from './server-response.ts';
export { Http3ClientSession } from './client-session.ts';
export type { ClientConnectOptions, ClientRequestOptions } from './client-session.ts';
export { Http3ClientResponse } from './client-request.ts';
export type { InformationalResponse, RequestBody } from './client-request.ts';
export { RawStream } from './raw-stream.ts';
export type { RawStreamResult } from './raw-stream.ts';
export type { Http3ConnectionInfo, TransportLogRecord } from './quic-adapter.ts';
export type { IncomingHeaders, OutgoingHeaders } from './header-object.ts';
export { CONNECTION_SPECIFIC_FIELDS, validateRequestHeaders, validateResponseHeaders, validateTrailers } from './message-validation.ts';
export type { RequestHead, ResponseHead } from './message-validation.ts';
