// Unidirectional stream types (RFC 9114 §6.2, RFC 9204 §4.2): each unidirectional stream begins
// with a varint naming its type.

import { H3Error } from './errors.ts';
import { decodeVarint, encodeVarint } from './varint.ts';

/** Unidirectional stream type code points. */
export const STREAM_TYPE = {
  /** RFC 9114 §6.2.1 */
  CONTROL: 0x00,
  /** RFC 9114 §6.2.2 */
  PUSH: 0x01,
  /** RFC 9204 §4.2 */
  QPACK_ENCODER: 0x02,
  /** RFC 9204 §4.2 */
  QPACK_DECODER: 0x03,
} as const;

/** What a unidirectional stream is for; 'unknown' covers reserved and unrecognised types. */
export type UniStreamKind = 'control' | 'push' | 'qpack-encoder' | 'qpack-decoder' | 'unknown';

/** Which side of the connection we are. */
export type Http3Role = 'server' | 'client';

/** A parsed stream-type prefix. */
export interface ParsedStreamType {
  /** The raw type; inexact above 2^53, which only unknown types can be. */
  type: number;
  /** The classification. */
  kind: UniStreamKind;
  /** Bytes the prefix took; the stream's payload starts there. */
  length: number;
}

/**
 * Reads the stream-type prefix of a unidirectional stream. Returns null until the whole varint
 * has arrived. Throws H3_STREAM_CREATION_ERROR when the receiving
 * `role` may not accept the type: RFC 9114 §6.2.2, only servers push, so a server receiving a
 * push stream treats it as a connection error of type H3_STREAM_CREATION_ERROR.
 * Unknown and reserved types are returned as 'unknown': RFC 9114 §6.2 says the recipient
 * SHOULD abort reading them (STOP_SENDING with H3_STREAM_CREATION_ERROR), never fail the connection.
 */
export function parseStreamType(bytes: Uint8Array, role: Http3Role): ParsedStreamType | null {
  const v = decodeVarint(bytes, 0);
  if (v === null) return null;
  const kind = classifyStreamType(v.value);
  if (kind === 'push' && role === 'server') {
    throw new H3Error('H3_STREAM_CREATION_ERROR', 'a client must not open a push stream');
  }
  return { type: v.value, kind, length: v.length };
}

/** Classifies a stream type code point. */
export function classifyStreamType(type: number): UniStreamKind {
  switch (type) {
    case STREAM_TYPE.CONTROL:
      return 'control';
    case STREAM_TYPE.PUSH:
      return 'push';
    case STREAM_TYPE.QPACK_ENCODER:
      return 'qpack-encoder';
    case STREAM_TYPE.QPACK_DECODER:
      return 'qpack-decoder';
    default:
      return 'unknown';
  }
}

/** The bytes that open a unidirectional stream of `type`. */
export function encodeStreamType(type: number): Uint8Array {
  return encodeVarint(type);
}
