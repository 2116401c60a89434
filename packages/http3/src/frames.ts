// HTTP/3 frame types and encoders (RFC 9114 §7). Every frame is
//   Type (varint) | Length (varint) | Payload (Length bytes).
// The incremental decoder lives in frame-reader.ts.

import { concatBytes } from './byte-writer.ts';
import { H3Error } from './errors.ts';
import { reservedCodepoint } from './reserved.ts';
import { encodeSettingsPayload } from './settings.ts';
import type { EncodeSettingsOptions, Http3Settings } from './settings.ts';
import { decodeVarint, varintLength, writeVarint } from './varint.ts';

/** Frame type code points (RFC 9114 §7.2, §11.2.1). */
export const FRAME_TYPE = {
  DATA: 0x00,
  HEADERS: 0x01,
  CANCEL_PUSH: 0x03,
  SETTINGS: 0x04,
  PUSH_PROMISE: 0x05,
  GOAWAY: 0x07,
  MAX_PUSH_ID: 0x0d,
} as const;

/**
 * RFC 9114 §7.2.8: frame types used in HTTP/2 (PRIORITY 0x02, PING 0x06, WINDOW_UPDATE 0x08,
 * CONTINUATION 0x09) are reserved; receiving one MUST be a connection error of type H3_FRAME_UNEXPECTED.
 */
export const HTTP2_ONLY_FRAME_TYPES: ReadonlySet<number> = new Set([0x02, 0x06, 0x08, 0x09]);

/** A decoded frame as yielded by the FrameReader. Unknown and reserved frames are never yielded. */
export type H3Frame =
  /** A piece of a DATA frame's payload; `end` marks the last piece of that frame. The bytes view the input chunk. */
  | { type: 'data'; data: Uint8Array; end: boolean }
  /** A complete HEADERS frame; `fieldSection` is the QPACK-encoded field section. */
  | { type: 'headers'; fieldSection: Uint8Array }
  /** The peer's SETTINGS, with defaults applied. */
  | { type: 'settings'; settings: Http3Settings }
  /** GOAWAY: a stream ID (from a server) or push ID (from a client). */
  | { type: 'goaway'; id: number }
  /** MAX_PUSH_ID (client to server). */
  | { type: 'max_push_id'; pushId: number }
  /** CANCEL_PUSH. */
  | { type: 'cancel_push'; pushId: number };

/** Encodes a frame header (type and length) for a payload of `payloadLength` bytes. */
export function encodeFrameHeader(type: number, payloadLength: number): Uint8Array {
  const out = new Uint8Array(varintLength(type) + varintLength(payloadLength));
  writeVarint(out, writeVarint(out, 0, type), payloadLength);
  return out;
}

/** Encodes a whole frame: header then payload, in one new array. */
export function encodeFrame(type: number, payload: Uint8Array): Uint8Array {
  return concatBytes([encodeFrameHeader(type, payload.length), payload]);
}

/**
 * The header of a DATA frame carrying `payloadLength` bytes. Send it followed by the body bytes
 * themselves, so large bodies are never copied into a frame buffer.
 */
export function encodeDataFrameHeader(payloadLength: number): Uint8Array {
  return encodeFrameHeader(FRAME_TYPE.DATA, payloadLength);
}

/** A complete DATA frame (copies `payload`; prefer encodeDataFrameHeader for large bodies). */
export function encodeDataFrame(payload: Uint8Array): Uint8Array {
  return encodeFrame(FRAME_TYPE.DATA, payload);
}

/** A HEADERS frame around a QPACK-encoded field section. */
export function encodeHeadersFrame(fieldSection: Uint8Array): Uint8Array {
  return encodeFrame(FRAME_TYPE.HEADERS, fieldSection);
}

/** A SETTINGS frame; only non-default values are sent (RFC 9114 §7.2.4.2). */
export function encodeSettingsFrame(settings: Partial<Http3Settings>, options: EncodeSettingsOptions = {}): Uint8Array {
  return encodeFrame(FRAME_TYPE.SETTINGS, encodeSettingsPayload(settings, options));
}

/** A GOAWAY frame (RFC 9114 §7.2.6): the stream or push ID from which requests will not be processed. */
export function encodeGoawayFrame(id: number): Uint8Array {
  return encodeSingleVarintFrame(FRAME_TYPE.GOAWAY, id);
}

/** A MAX_PUSH_ID frame (RFC 9114 §7.2.7); only clients send it. */
export function encodeMaxPushIdFrame(pushId: number): Uint8Array {
  return encodeSingleVarintFrame(FRAME_TYPE.MAX_PUSH_ID, pushId);
}

/** A CANCEL_PUSH frame (RFC 9114 §7.2.3). */
export function encodeCancelPushFrame(pushId: number): Uint8Array {
  return encodeSingleVarintFrame(FRAME_TYPE.CANCEL_PUSH, pushId);
}

/** A reserved frame (type 0x1f*n+0x21) for greasing (RFC 9114 §7.2.8); peers must ignore it. */
export function encodeReservedFrame(n: number, payload: Uint8Array = new Uint8Array(0)): Uint8Array {
  return encodeFrame(reservedCodepoint(n), payload);
}

function encodeSingleVarintFrame(type: number, value: number): Uint8Array {
  const payload = new Uint8Array(varintLength(value));
  writeVarint(payload, 0, value);
  return encodeFrame(type, payload);
}

/**
 * Decodes the payload of GOAWAY, MAX_PUSH_ID or CANCEL_PUSH: exactly one varint.
 * RFC 9114 §7.1: a payload that is longer or shorter than its contents is H3_FRAME_ERROR.
 * IDs above 2^53-1 are clamped: they name "every stream we could ever have".
 */
export function decodeSingleVarintPayload(payload: Uint8Array, frameName: string): number {
  const v = decodeVarint(payload, 0);
  if (v === null) throw new H3Error('H3_FRAME_ERROR', `${frameName}: truncated payload`);
  if (v.length !== payload.length) throw new H3Error('H3_FRAME_ERROR', `${frameName}: payload longer than its varint`);
  return Math.min(v.value, Number.MAX_SAFE_INTEGER);
}
