// A request body read once from the client and kept in memory (up to `request_buffer_bytes`, and
// within the worker's bound) so that a retry or a hedge sends exactly the same bytes
// (docs/retries.md). It streams: the first attempt gets each chunk as it arrives, with the
// client's backpressure intact, while a copy is kept. A retry opens a new reader that replays the
// kept chunks and then follows the client. A body that outgrows the limit stops being kept (its
// memory is given back at once) and can no longer be replayed; the reader in progress goes on.
//
// One reader reads at a time, except once the whole body has arrived and is kept (a hedge), when
// readers only replay the kept chunks. The source is consumed in paused mode: it flows only
// while the current reader asks for data and has replayed everything kept.
import { Readable } from 'node:stream';

/** Where the memory of kept chunks is reserved (resilience/retry-control.ts). */
export interface ReplayMemory {
  reserve(bytes: number): boolean;
  free(bytes: number): void;
}

export class ReplayBody {
  private readonly source: Readable;
  private readonly memory: ReplayMemory;
  private readonly limit: number;
  /** Chunks kept for replay; null once the body is not replayable. */
  private chunks: Buffer[] | null = [];
  /** Bytes kept (and reserved). */
  private kept = 0;
  private ended = false;
  private failed: Error | null = null;
  private reader: BodyReader | null = null;
  private attached = false;

  /**
   * @param limit bytes kept at most; a body declared larger than it (`declared`) is not kept at all.
   */
  constructor(source: Readable, memory: ReplayMemory, limit: number, declared: number) {
    this.source = source;
    this.memory = memory;
    this.limit = limit;
    if (declared > limit) this.chunks = null;
  }

  /** Whether a new reader can send the whole body again. */
  get replayable(): boolean {
    return this.chunks !== null;
  }

  /** Whether the whole body has arrived and is kept (several readers may read it at once). */
  get complete(): boolean {
    return this.ended && this.chunks !== null;
  }

  /** Bytes kept now. */
  get keptBytes(): number {
    return this.kept;
  }

  /**
   * A reader of the whole body from its first byte. The previous reader, if any, no longer gets
   * data from the client (its attempt is over). Only when `replayable`, or for the first reader.
   */
  open(): Readable {
    const r = new BodyReader(this);
    if (!this.complete) this.reader = r;
    if (!this.attached) {
      this.attached = true;
      this.source.on('data', this.onData);
      this.source.on('end', this.onEnd);
      this.source.on('error', this.onError);
      this.source.pause();
    }
    return r;
  }

  /** Drops what is kept (the response is committed, or the request is over): no more replays. */
  release(): void {
    this.drop();
    // Nobody will read the rest of the body: stop the client's upload.
    if (this.reader === null && !this.ended && this.failed === null) this.source.destroy();
  }

  private drop(): void {
    if (this.chunks === null) return;
    this.chunks = null;
    this.memory.free(this.kept);
    this.kept = 0;
  }

  /** Chunk `i` of those kept, for `reader`; undefined past the last. */
  chunk(i: number): Buffer | undefined {
    return this.chunks?.[i];
  }

  /** How many chunks are kept. */
  get count(): number {
    return this.chunks?.length ?? 0;
  }

  /** `reader` wants more than what is kept: the client's next chunks, or the end. */
  pull(reader: BodyReader): void {
    if (this.failed !== null) {
      reader.destroy(this.failed);
      return;
    }
    if (this.ended) {
      reader.push(null);
      return;
    }
    if (reader === this.reader) this.source.resume();
  }

  /** `reader` went away (its attempt ended): the client's body waits for the next one. */
  detach(reader: BodyReader): void {
    if (reader !== this.reader) return;
    this.reader = null;
    if (!this.ended) this.source.pause();
  }

  private readonly onData = (chunk: Buffer): void => {
    if (this.chunks !== null) {
      if (this.kept + chunk.length <= this.limit && this.memory.reserve(chunk.length)) {
        this.chunks.push(chunk);
        this.kept += chunk.length;
      } else {
        // Too large to keep (or the worker's bound is reached): stream from here on.
        this.drop();
      }
    }
    const r = this.reader;
    if (r === null) {
      this.source.pause();
      return;
    }
    r.cursor = this.count;
    if (!r.push(chunk)) this.source.pause();
  };

  private readonly onEnd = (): void => {
    this.ended = true;
    this.reader?.push(null);
  };

  private readonly onError = (err: Error): void => {
    this.failed = err;
    this.reader?.destroy(err);
  };
}

/** One attempt's view of the body. */
class BodyReader extends Readable {
  private readonly body: ReplayBody;
  /** Index of the next kept chunk to replay. */
  cursor = 0;

  constructor(body: ReplayBody) {
    super();
    this.body = body;
  }

  override _read(): void {
    const body = this.body;
    for (;;) {
      const c = body.chunk(this.cursor);
      if (c === undefined) break;
      this.cursor++;
      if (!this.push(c)) return;
    }
    body.pull(this);
  }

  override _destroy(err: Error | null, cb: (error?: Error | null) => void): void {
    this.body.detach(this);
    cb(err);
  }
}
