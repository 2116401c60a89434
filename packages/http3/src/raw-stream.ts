// Raw access to one client-opened stream, bypassing HTTP/3 framing: what probes and robustness
// tests need to send truncated frames, forbidden frame sequences or bogus stream types, and to
// observe exactly how the server ended the stream (FIN, or RESET_STREAM with which code).

import { peerCodeOf } from './quic-adapter.ts';
import { H3Error } from './errors.ts';
import type { StreamIo } from './stream-io.ts';

/** How the peer ended its side of a raw stream. */
export interface RawStreamResult {
  /** Everything received before the end. */
  data: Buffer;
  /** True when the peer ended with FIN. */
  fin: boolean;
  /** The peer's RESET_STREAM code, when it reset the stream. */
  resetCode: number | undefined;
  /** True when the stream ended because the connection closed. */
  connectionClosed: boolean;
}

/** A client stream written and read as bytes. */
export class RawStream {
  readonly id: number;
  private readonly io: StreamIo;

  constructor(io: StreamIo) {
    this.io = io;
    this.id = io.id;
  }

  /** Writes bytes as they are. Rejects when the peer stopped the stream (see stopCode). */
  write(bytes: Uint8Array): Promise<void> {
    return this.io.write(bytes);
  }

  /** Ends our side with FIN. */
  end(): Promise<void> {
    return this.io.end();
  }

  /** Resets our side with `code` (RESET_STREAM) and stops reading with it (STOP_SENDING). */
  reset(code: number): void {
    this.io.abort(Object.assign(new H3Error('H3_REQUEST_CANCELLED', 'raw reset', { scope: 'stream' }), { wireCode: code }));
  }

  /** Reads until the peer ends its side; never rejects. */
  async readAll(): Promise<RawStreamResult> {
    const parts: Uint8Array[] = [];
    try {
      for (;;) {
        const chunk = await this.io.read();
        if (chunk === null) return { data: Buffer.concat(parts), fin: true, resetCode: undefined, connectionClosed: false };
        parts.push(chunk);
      }
    } catch (err) {
      const code = peerCodeOf(err);
      return { data: Buffer.concat(parts), fin: false, resetCode: code, connectionClosed: code === undefined };
    }
  }
}
