// The QPACK decoder of one connection (RFC 9204 §2.2): decodes field sections, mirrors the
// peer encoder's dynamic table from the encoder stream, queues blocked sections, and produces
// the decoder stream instructions the peer encoder needs.

import { ByteWriter, concatBytes } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import { writeInsertCountIncrement, writeSectionAck, writeStreamCancel } from './decoder-instructions.ts';
import { DynamicTable } from './dynamic-table.ts';
import type { TableEntry } from './dynamic-table.ts';
import { parseEncoderInstruction } from './encoder-instructions.ts';
import type { EncoderInstruction } from './encoder-instructions.ts';
import { parseFieldSectionPrefix } from './field-section-prefix.ts';
import type { FieldSectionPrefix } from './field-section-prefix.ts';
import { decodePrefixedInt } from './prefixed-int.ts';
import { STATIC_TABLE } from './static-table.ts';
import { decodeStringLiteral, fieldText } from './string-literal.ts';
import type { StringLiteralLimits } from './string-literal.ts';

/** What the pending-bytes getters return when there is nothing to send (never written to). */
const NOTHING = new Uint8Array(0);

/** A field line: [name, value]. Lists keep wire order and may repeat names. */
export type Header = [name: string, value: string];

/** Options for {@link QpackDecoder}; the first two are what we advertise in SETTINGS. */
export interface QpackDecoderOptions {
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY we advertise, in bytes. Default 0 (static table only). */
  maxTableCapacity?: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS we advertise. Default 0. */
  maxBlockedStreams?: number;
  /** Largest decoded field section, in bytes counted as RFC 9114 §4.2.2 does (name + value + 32 per line). Default 65536. */
  maxFieldSectionSize?: number;
  /** Most field lines in one section. Default 1024. */
  maxFieldLines?: number;
  /** Longest decoded name or value, in bytes. Default: maxFieldSectionSize. */
  maxStringLength?: number;
}

/** Result of decoding a field section: its field lines, or "blocked until more inserts arrive". */
export type DecodeResult = { blocked: false; headers: Header[] } | { blocked: true };

/**
 * A blocked field section resolved by encoder stream data: its field lines, or the stream-scope
 * error (a limit exceeded) that ends that stream only. Connection errors are thrown instead.
 */
export type UnblockedSection = { streamId: number; headers: Header[]; error?: undefined } | { streamId: number; error: H3Error };

interface PendingSection {
  bytes: Uint8Array;
  prefix: FieldSectionPrefix;
}

const DECOMPRESSION = 'QPACK_DECOMPRESSION_FAILED';

/** Decoder side of QPACK for one connection. */
export class QpackDecoder {
  private readonly maxTableCapacity: number;
  private readonly maxBlockedStreams: number;
  private readonly maxFieldSectionSize: number;
  private readonly maxFieldLines: number;
  private readonly maxStringLength: number;
  private readonly table = new DynamicTable();
  /** Insert count the encoder has learnt from us (acks and increments), RFC 9204 §2.2.2. */
  private knownReceivedCount = 0;
  private readonly blocked = new Map<number, PendingSection[]>();
  private encoderStreamBuffer: Uint8Array = new Uint8Array(0);
  private out = new ByteWriter();

  constructor(options: QpackDecoderOptions = {}) {
    this.maxTableCapacity = options.maxTableCapacity ?? 0;
    this.maxBlockedStreams = options.maxBlockedStreams ?? 0;
    this.maxFieldSectionSize = options.maxFieldSectionSize ?? 65536;
    this.maxFieldLines = options.maxFieldLines ?? 1024;
    this.maxStringLength = options.maxStringLength ?? this.maxFieldSectionSize;
  }

  /** Entries inserted so far by the peer's encoder. */
  get insertCount(): number {
    return this.table.insertCount;
  }

  /** Current dynamic table capacity, in bytes, as set by the peer's encoder. */
  get tableCapacity(): number {
    return this.table.capacity;
  }

  /** Current dynamic table size, in bytes (RFC 9204 §3.2.1). */
  get tableSize(): number {
    return this.table.size;
  }

  /** The dynamic table entry at absolute index `abs`, if still present; for diagnostics and tests. */
  dynamicEntry(abs: number): Header | undefined {
    const e = this.table.get(abs);
    return e === undefined ? undefined : [e.name, e.value];
  }

  /** Streams with a field section waiting for inserts. */
  get blockedStreamCount(): number {
    return this.blocked.size;
  }

  /**
   * Decodes the field section of a HEADERS frame on `streamId`. Returns `{ blocked: true }` when
   * it needs inserts that have not arrived (RFC 9204 §2.1.2); it is then delivered by a later
   * `onEncoderStreamData` call. Sections of one stream are delivered in order.
   * Throws QPACK_DECOMPRESSION_FAILED (connection) for malformed input or too many blocked
   * streams, and H3_EXCESSIVE_LOAD with scope 'stream' when a configured limit is exceeded (a
   * server may answer 431); the decoder stays usable after a stream-scope error and has already
   * emitted the Stream Cancellation the peer encoder needs.
   */
  decodeFieldSection(streamId: number, bytes: Uint8Array): DecodeResult {
    const queued = this.blocked.get(streamId);
    const prefix = parseFieldSectionPrefix(bytes, this.table.insertCount, this.maxTableCapacity);
    if (queued !== undefined) {
      queued.push({ bytes: bytes.slice(), prefix });
      return { blocked: true };
    }
    if (prefix.requiredInsertCount > this.table.insertCount) {
      // RFC 9204 §2.1.2: blocking more streams than we advertised is a connection error.
      if (this.blocked.size >= this.maxBlockedStreams) {
        throw new H3Error(DECOMPRESSION, `field section would block stream ${streamId} beyond the ${this.maxBlockedStreams} blocked streams allowed`);
      }
      this.blocked.set(streamId, [{ bytes: bytes.slice(), prefix }]);
      return { blocked: true };
    }
    return { blocked: false, headers: this.decodeReady(streamId, bytes, prefix) };
  }

  /**
   * Processes bytes from the peer's encoder stream, in any chunking. Returns the blocked field
   * sections that became decodable, in order (a section failing a limit comes back with its
   * stream-scope error). Throws QPACK_ENCODER_STREAM_ERROR for bad instructions and
   * QPACK_DECOMPRESSION_FAILED for a malformed section that was waiting.
   */
  onEncoderStreamData(bytes: Uint8Array): UnblockedSection[] {
    const data = this.encoderStreamBuffer.length === 0 ? bytes : concatBytes([this.encoderStreamBuffer, bytes]);
    // RFC 9204 §3.2.1: no string may exceed the table it is inserted into.
    const maxString = Math.max(0, this.maxTableCapacity - 32);
    let at = 0;
    for (;;) {
      const parsed = parseEncoderInstruction(data, at, maxString);
      if (parsed === null) break;
      this.apply(parsed.instruction);
      at = parsed.next;
    }
    this.encoderStreamBuffer = data.slice(at);
    return this.drainUnblocked();
  }

  /**
   * Call when a request stream is reset or its reading abandoned: drops its blocked sections
   * and, RFC 9204 §4.4.2, emits Stream Cancellation (omitted when our table capacity is 0).
   */
  cancelStream(streamId: number): void {
    this.blocked.delete(streamId);
    if (this.maxTableCapacity > 0) writeStreamCancel(this.out, streamId);
  }

  /**
   * Takes the bytes to send on our decoder stream (empty when there are none). RFC 9204 §4.4.3:
   * inserts that no Section Acknowledgment covered are reported here with one coalesced Insert
   * Count Increment, so call this after handling a batch of stream data, not per instruction.
   */
  pendingDecoderStreamBytes(): Uint8Array {
    if (this.table.insertCount > this.knownReceivedCount) {
      writeInsertCountIncrement(this.out, this.table.insertCount - this.knownReceivedCount);
      this.knownReceivedCount = this.table.insertCount;
    }
    if (this.out.length === 0) return NOTHING;
    const bytes = this.out.finish();
    this.out = new ByteWriter();
    return bytes;
  }

  private apply(ins: EncoderInstruction): void {
    const code = 'QPACK_ENCODER_STREAM_ERROR';
    switch (ins.type) {
      case 'set-capacity':
        // RFC 9204 §4.3.1: above our advertised maximum is an encoder stream error.
        if (ins.capacity > this.maxTableCapacity) throw new H3Error(code, `capacity ${ins.capacity} exceeds the ${this.maxTableCapacity} we allow`);
        this.table.setCapacity(ins.capacity);
        return;
      case 'insert-name-ref': {
        const name = ins.isStatic ? STATIC_TABLE[ins.nameIndex]?.[0] : this.relativeEntry(ins.nameIndex)?.name;
        if (name === undefined) throw new H3Error(code, `insert references missing name index ${ins.nameIndex}`);
        this.insert(name, fieldText(ins.value));
        return;
      }
      case 'insert-literal-name':
        this.insert(fieldText(ins.name), fieldText(ins.value));
        return;
      case 'duplicate': {
        const entry = this.relativeEntry(ins.relativeIndex);
        if (entry === undefined) throw new H3Error(code, `duplicate of missing entry ${ins.relativeIndex}`);
        this.insert(entry.name, entry.value);
        return;
      }
    }
  }

  // RFC 9204 §3.2.5: on the encoder stream, relative index 0 is the newest entry.
  private relativeEntry(relative: number): TableEntry | undefined {
    return this.table.get(this.table.insertCount - 1 - relative);
  }

  private insert(name: string, value: string): void {
    if (!this.table.insert(name, value)) {
      throw new H3Error('QPACK_ENCODER_STREAM_ERROR', 'inserted entry is larger than the dynamic table capacity');
    }
  }

  private drainUnblocked(): UnblockedSection[] {
    const ready: UnblockedSection[] = [];
    for (const [streamId, queue] of this.blocked) {
      while (queue.length > 0 && (queue[0] as PendingSection).prefix.requiredInsertCount <= this.table.insertCount) {
        const section = queue.shift() as PendingSection;
        try {
          ready.push({ streamId, headers: this.decodeReady(streamId, section.bytes, section.prefix) });
        } catch (err) {
          if (!(err instanceof H3Error) || err.scope !== 'stream') throw err;
          ready.push({ streamId, error: err });
          queue.length = 0; // the stream is over; decodeReady already cancelled it
        }
      }
      if (queue.length === 0) this.blocked.delete(streamId);
    }
    return ready;
  }

  private decodeReady(streamId: number, bytes: Uint8Array, prefix: FieldSectionPrefix): Header[] {
    let headers: Header[];
    try {
      headers = this.decodeLines(bytes, prefix);
    } catch (err) {
      if (err instanceof H3Error && err.scope === 'stream') this.cancelStream(streamId);
      throw err;
    }
    // RFC 9204 §4.4.1: acknowledge sections that referenced the dynamic table.
    if (prefix.requiredInsertCount > 0) {
      writeSectionAck(this.out, streamId);
      this.knownReceivedCount = Math.max(this.knownReceivedCount, prefix.requiredInsertCount);
    }
    return headers;
  }

  private decodeLines(bytes: Uint8Array, prefix: FieldSectionPrefix): Header[] {
    const { requiredInsertCount: ric, base } = prefix;
    const headers: Header[] = [];
    const limits: StringLiteralLimits = {
      maxLength: this.maxStringLength,
      malformed: DECOMPRESSION,
      tooLong: (n) => tooLarge(`a field string of ${n} bytes exceeds the limit of ${this.maxStringLength}`),
    };
    let sectionSize = 0;
    let largestRef = -1;
    // RFC 9204 §2.2.3: a reference at or above the Required Insert Count, or to an evicted entry, is an error.
    const dynamic = (abs: number): TableEntry => {
      const entry = abs >= 0 && abs < ric ? this.table.get(abs) : undefined;
      if (entry === undefined) throw new H3Error(DECOMPRESSION, `invalid dynamic table reference ${abs}`);
      largestRef = Math.max(largestRef, abs);
      return entry;
    };
    const staticEntry = (index: number): readonly [string, string] => {
      const entry = STATIC_TABLE[index];
      if (entry === undefined) throw new H3Error(DECOMPRESSION, `static table index ${index} out of range`);
      return entry;
    };
    const int = (offset: number, bits: number): { value: number; next: number } => {
      const v = decodePrefixedInt(bytes, offset, bits, DECOMPRESSION);
      if (v === null) throw new H3Error(DECOMPRESSION, 'field line truncated');
      return v;
    };
    const str = (offset: number, bits: number): { text: string; next: number } => {
      const s = decodeStringLiteral(bytes, offset, bits, limits);
      if (s === null) throw new H3Error(DECOMPRESSION, 'field line truncated');
      return { text: fieldText(s.bytes), next: s.next };
    };

    let at = prefix.next;
    while (at < bytes.length) {
      if (headers.length >= this.maxFieldLines) throw tooLarge(`more than ${this.maxFieldLines} field lines`);
      const first = bytes[at] as number;
      let name: string;
      let value: string;
      if (first & 0x80) {
        // §4.5.2 Indexed Field Line: 1 T Index(6+)
        const idx = int(at, 6);
        at = idx.next;
        [name, value] = first & 0x40 ? staticEntry(idx.value) : entryPair(dynamic(base - 1 - idx.value));
      } else if (first & 0x40) {
        // §4.5.4 Literal Field Line with Name Reference: 01 N T NameIndex(4+) | H Value(7+)
        const idx = int(at, 4);
        name = first & 0x10 ? staticEntry(idx.value)[0] : dynamic(base - 1 - idx.value).name;
        const v = str(idx.next, 7);
        value = v.text;
        at = v.next;
      } else if (first & 0x20) {
        // §4.5.6 Literal Field Line with Literal Name: 001 N H NameLength(3+) | H Value(7+)
        const n = str(at, 3);
        const v = str(n.next, 7);
        name = n.text;
        value = v.text;
        at = v.next;
      } else if (first & 0x10) {
        // §4.5.3 Indexed Field Line with Post-Base Index: 0001 Index(4+)
        const idx = int(at, 4);
        at = idx.next;
        [name, value] = entryPair(dynamic(base + idx.value));
      } else {
        // §4.5.5 Literal Field Line with Post-Base Name Reference: 0000 N NameIndex(3+) | H Value(7+)
        const idx = int(at, 3);
        name = dynamic(base + idx.value).name;
        const v = str(idx.next, 7);
        value = v.text;
        at = v.next;
      }
      // RFC 9114 §4.2.2: the size of a field section counts name + value + 32 per line.
      sectionSize += name.length + value.length + 32;
      if (sectionSize > this.maxFieldSectionSize) {
        throw tooLarge(`field section exceeds the limit of ${this.maxFieldSectionSize} bytes`);
      }
      headers.push([name, value]);
    }
    // RFC 9204 §4.5.1.1: a Required Insert Count larger than the references need is not what a
    // conformant encoder sends.
    if (ric > 0 && largestRef + 1 !== ric) {
      throw new H3Error(DECOMPRESSION, `Required Insert Count ${ric} does not match the largest reference ${largestRef}`);
    }
    return headers;
  }
}

function entryPair(entry: TableEntry): [string, string] {
  return [entry.name, entry.value];
}

function tooLarge(message: string): H3Error {
  return new H3Error('H3_EXCESSIVE_LOAD', message, { scope: 'stream' });
}
