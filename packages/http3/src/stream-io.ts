// One QUIC stream seen as plain reads and writes. The library exposes WHATWG streams whose
// promises reject when the peer resets or stops the stream; this wrapper reads and writes through
// the patched library's direct calls (tryRead, trySend, tryFinish, cancelRead, abortWrite) and
// takes the reader or the writer only when it must (a read that started too late for direct
// reads, a write QUIC cannot take at once), since the library builds those streams on first use
// (10–12 µs a pair). It observes every promise it creates (an unobserved rejection must never
// reach the process), and turns "cancel"/"abort" into the H3 codes we mean.

import type { QUICStream } from '@matrixai/quic';
import type { H3Error } from './errors.ts';
import type { FrameReader } from './frame-reader.ts';
import type { H3Frame } from './frames.ts';

const ignore = (): void => {};
const settled: Promise<void> = Promise.resolve();

/**
 * Runs `f`, ignoring what it throws, as the rejection of a reader's cancel or a writer's abort is
 * ignored: a failure to shut a side down is the library's to report (it dispatches its stream
 * error event either way).
 */
function quietly(f: () => void): void {
  try {
    f();
  } catch {
    // reported by the library
  }
}

/** Reads and writes of one QUIC stream (RFC 9000 §2). */
export class StreamIo {
  /** The QUIC stream ID (RFC 9000 §2.1). */
  readonly id: number;
  private readonly stream: QUICStream;
  /** The reader, when direct reads were not available. */
  private readonly reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  /** The writer, taken at the first write QUIC could not take at once (see `writerNow`). */
  private writer: WritableStreamDefaultWriter<Uint8Array> | undefined;
  private readStopped = false;
  private writeDone = false;
  /** Reads go through the library's tryRead/waitReadable instead of the reader. */
  private readonly direct: boolean = false;
  /** Writes handed to the writer and not settled: while any is, later writes queue behind it. */
  private queued = 0;
  private readonly dequeue = (): void => {
    this.queued--;
  };

  constructor(stream: QUICStream) {
    this.stream = stream;
    this.id = stream.streamId;
    const canRead = !(stream.type === 'uni' && stream.initiated === 'local');
    const canWrite = !(stream.type === 'uni' && stream.initiated === 'peer');
    if (canRead) {
      // The patched library's direct reads: bytes straight from QUIC, without the WHATWG
      // pull, queue and promises per chunk. Available until the ReadableStream first pulls.
      this.direct = stream.readDirect();
      if (!this.direct) {
        this.reader = stream.readable.getReader();
        this.reader.closed.catch(ignore);
      }
    } else {
      this.readStopped = true;
    }
    if (!canWrite) this.writeDone = true;
  }

  /** The writer, taken now if it was not (which builds the library's WritableStream). */
  private writerNow(): WritableStreamDefaultWriter<Uint8Array> {
    if (this.writer === undefined) {
      this.writer = this.stream.writable.getWriter();
      this.writer.closed.catch(ignore);
    }
    return this.writer;
  }

  /** True once the write side ended (FIN or reset). */
  get writeEnded(): boolean {
    return this.writeDone;
  }

  /** True once reading ended (FIN, reset by the peer, or stopped by us). */
  get readEnded(): boolean {
    return this.readStopped;
  }

  /**
   * The next chunk, or null at the end of the stream (FIN, or after stopReading()). Rejects with
   * the reason the library derived from the peer's RESET_STREAM code (see codeToReason).
   */
  async read(): Promise<Uint8Array | null> {
    if (this.readStopped) return null;
    if (this.direct) return this.readDirect();
    if (this.reader === undefined) return null;
    try {
      const r = await this.reader.read();
      if (r.done) {
        this.readStopped = true;
        return null;
      }
      return r.value;
    } catch (err) {
      this.readStopped = true;
      throw err;
    }
  }

  private async readDirect(): Promise<Uint8Array | null> {
    try {
      for (;;) {
        const chunk = this.stream.tryRead();
        if (chunk === null) {
          this.readStopped = true;
          return null;
        }
        if (chunk !== undefined) return chunk;
        await this.stream.waitReadable();
        // stopReading() while waiting: the end, as a cancelled reader reads it.
        if (this.readStopped) return null;
      }
    } catch (err) {
      if (this.readStopped) return null;
      this.readStopped = true;
      throw err;
    }
  }

  /**
   * Queues `bytes` for sending. Resolves when QUIC accepted them (flow control is the
   * backpressure); rejects when the peer stopped the stream or it was reset.
   */
  write(bytes: Uint8Array): Promise<void> {
    if (this.writeDone) return Promise.reject(new Error('stream write side is closed'));
    // Nothing queued in the writer: hand the bytes to QUIC now (the patched library's trySend),
    // which saves the WHATWG queue and its promises; what QUIC cannot take yet, and any failure,
    // goes through the writer, which waits for capacity and reports why.
    let rest = bytes;
    if (this.queued === 0) {
      const sent = this.stream.trySend(bytes);
      if (sent === bytes.byteLength) return settled;
      if (sent > 0) rest = bytes.subarray(sent);
    }
    this.queued++;
    const p = this.writerNow().write(rest);
    p.then(this.dequeue, this.dequeue);
    return p;
  }

  /** Ends the write side cleanly (FIN) once queued writes are sent. Never rejects. */
  async end(): Promise<void> {
    if (this.writeDone) return;
    this.writeDone = true;
    if (this.queued === 0 && this.stream.tryFinish()) return;
    await this.writerNow().close().catch(ignore);
  }

  /** Sends STOP_SENDING with `reason`'s wire code (RFC 9000 §3.5) and ends reading. */
  stopReading(reason: H3Error): void {
    if (this.readStopped) return;
    this.readStopped = true;
    if (this.reader !== undefined) this.reader.cancel(reason).catch(ignore);
    else quietly(() => this.stream.cancelRead(reason));
  }

  /** Sends RESET_STREAM with `reason`'s wire code (RFC 9000 §3.2) and ends writing. */
  reset(reason: H3Error): void {
    if (this.writeDone) return;
    this.writeDone = true;
    if (this.writer !== undefined) this.writer.abort(reason).catch(ignore);
    else quietly(() => this.stream.abortWrite(reason));
  }

  /** Resets both directions: the request is over (RFC 9114 §4.1.1). */
  abort(reason: H3Error): void {
    this.stopReading(reason);
    this.reset(reason);
  }

  /** Resolves when the library has closed both directions of the stream. */
  get closed(): Promise<void> {
    return this.stream.closedP;
  }
}

/**
 * Reads a request stream to its FIN, frame by frame: every chunk goes through `reader`, every frame
 * to `onFrame`; a promise from `onFrame` is awaited before reading on (body backpressure). Rejects
 * with what the reader or `onFrame` threw.
 */
export async function pumpFrames(io: StreamIo, reader: FrameReader, onFrame: (frame: H3Frame) => Promise<void> | undefined): Promise<void> {
  for (;;) {
    const chunk = await io.read();
    if (chunk === null) return;
    for (const frame of reader.push(chunk)) {
      const wait = onFrame(frame);
      if (wait !== undefined) await wait;
    }
  }
}
