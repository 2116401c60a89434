// Decoder stream instructions (RFC 9204 §4.4): how a decoder tells the encoder what it has seen.
//
//   Section Acknowledgment   1 StreamID(7+)
//   Stream Cancellation      01 StreamID(6+)
//   Insert Count Increment   00 Increment(6+)

import type { ByteWriter } from '../byte-writer.ts';
import { decodePrefixedInt, encodePrefixedInt } from './prefixed-int.ts';

/** A parsed decoder stream instruction. */
export type DecoderInstruction =
  | { type: 'section-ack'; streamId: number }
  | { type: 'stream-cancel'; streamId: number }
  | { type: 'insert-count-increment'; increment: number };

/** Parses one instruction at `offset`; returns null when more bytes are needed. */
export function parseDecoderInstruction(bytes: Uint8Array, offset: number): { instruction: DecoderInstruction; next: number } | null {
  if (offset >= bytes.length) return null;
  const first = bytes[offset] as number;
  const code = 'QPACK_DECODER_STREAM_ERROR';
  if (first & 0x80) {
    const id = decodePrefixedInt(bytes, offset, 7, code);
    return id === null ? null : { instruction: { type: 'section-ack', streamId: id.value }, next: id.next };
  }
  const n = decodePrefixedInt(bytes, offset, 6, code);
  if (n === null) return null;
  if (first & 0x40) return { instruction: { type: 'stream-cancel', streamId: n.value }, next: n.next };
  return { instruction: { type: 'insert-count-increment', increment: n.value }, next: n.next };
}

/** Appends Section Acknowledgment (RFC 9204 §4.4.1). */
export function writeSectionAck(out: ByteWriter, streamId: number): void {
  encodePrefixedInt(out, streamId, 7, 0x80);
}

/** Appends Stream Cancellation (RFC 9204 §4.4.2). */
export function writeStreamCancel(out: ByteWriter, streamId: number): void {
  encodePrefixedInt(out, streamId, 6, 0x40);
}

/** Appends Insert Count Increment (RFC 9204 §4.4.3). */
export function writeInsertCountIncrement(out: ByteWriter, increment: number): void {
  encodePrefixedInt(out, increment, 6, 0x00);
}
