// The QPACK encoder of one connection (RFC 9204 §2.1). By default it uses the static table
// only, which never blocks and needs no encoder stream. With `dynamicTable: true` it also inserts
// repeated field lines into the dynamic table, within the peer's advertised capacity and
// blocked-stream budget, and never evicts an entry the peer may still need (§2.1.1).

import { ByteWriter } from '../byte-writer.ts';
import { H3Error } from '../errors.ts';
import { parseDecoderInstruction } from './decoder-instructions.ts';
import type { DecoderInstruction } from './decoder-instructions.ts';
import { DynamicTable, entrySize } from './dynamic-table.ts';
import { writeInsertWithLiteralName, writeInsertWithNameRef, writeSetCapacity } from './encoder-instructions.ts';
import { writeFieldSectionPrefix } from './field-section-prefix.ts';
import { encodePrefixedInt } from './prefixed-int.ts';
import { staticExactIndex, staticNameIndex } from './static-table.ts';
import { encodeStringLiteral, fieldBytes, fieldText } from './string-literal.ts';
import type { HuffmanPolicy } from './string-literal.ts';

/** What the pending-bytes getters return when there is nothing to send (never written to). */
const NOTHING = new Uint8Array(0);

/** Options for {@link QpackEncoder}. */
export interface QpackEncoderOptions {
  /** Use the dynamic table when the peer allows one. Default false (static table only). */
  dynamicTable?: boolean;
  /** Most dynamic table bytes we use, however much the peer allows. Default 4096. */
  maxTableCapacity?: number;
  /** When to Huffman-code strings. Default 'auto' (when shorter). */
  huffman?: HuffmanPolicy;
  /** Insert a field line the first time it is seen rather than the second. Default false. */
  insertOnFirstUse?: boolean;
}

/** The peer's QPACK settings (its SETTINGS frame), which bound our dynamic table use. */
export interface QpackPeerSettings {
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY of the peer, bytes. */
  qpackMaxTableCapacity: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS of the peer. */
  qpackBlockedStreams: number;
}

interface OutstandingSection {
  requiredInsertCount: number;
  refs: number[];
}

type PlannedLine =
  | { kind: 'static'; index: number }
  | { kind: 'dynamic'; abs: number }
  | { kind: 'static-name'; index: number; name: string; value: string; never: boolean; cache: boolean }
  | { kind: 'dynamic-name'; abs: number; value: string; never: boolean }
  | { kind: 'literal'; name: string; value: string; never: boolean; cache: boolean };

/** RFC 9204 §7.1.3: values an intermediary must never put in a table (N bit set). */
const NEVER_INDEX: ReadonlySet<string> = new Set(['authorization', 'proxy-authorization']);
/** Names we do not insert: secrets, or values that rarely repeat. */
const DO_NOT_INSERT: ReadonlySet<string> = new Set(['authorization', 'proxy-authorization', 'cookie', 'set-cookie', ':path', 'content-length', 'date', 'etag', 'last-modified']);
const SEEN_LIMIT = 1024;
/** Encoded field lines kept per Huffman policy (see writeCached), and the longest name + value cached. */
const LINE_CACHE_ENTRIES = 512;
const LINE_CACHE_KEY_MAX = 256;
/** By Huffman policy, then name, then value. */
const LINE_CACHE: Record<HuffmanPolicy, Map<string, Map<string, Uint8Array>>> = { auto: new Map(), never: new Map(), always: new Map() };
const lineCacheSize: Record<HuffmanPolicy, number> = { auto: 0, never: 0, always: 0 };
/** Values not kept in a process-wide cache: credentials and session state (a superset of NEVER_INDEX). */
const NOT_CACHED: ReadonlySet<string> = new Set(['authorization', 'proxy-authorization', 'cookie', 'set-cookie']);

/** Encoder side of QPACK for one connection. */
export class QpackEncoder {
  private readonly dynamicEnabled: boolean;
  private readonly ownMaxCapacity: number;
  private readonly huffman: HuffmanPolicy;
  private readonly insertOnFirstUse: boolean;
  private peer: QpackPeerSettings | undefined;
  private readonly table = new DynamicTable();
  private readonly refCounts = new Map<number, number>();
  private readonly outstanding = new Map<number, OutstandingSection[]>();
  private readonly exactIndex = new Map<string, number>();
  private readonly nameIndex = new Map<string, number>();
  private readonly seen = new Set<string>();
  private knownReceivedCount = 0;
  private decoderStreamBuffer: Uint8Array = new Uint8Array(0);
  private out = new ByteWriter();

  constructor(options: QpackEncoderOptions = {}) {
    this.dynamicEnabled = options.dynamicTable ?? false;
    this.ownMaxCapacity = options.maxTableCapacity ?? 4096;
    this.huffman = options.huffman ?? 'auto';
    this.insertOnFirstUse = options.insertOnFirstUse ?? false;
  }

  /** Entries we have inserted. */
  get insertCount(): number {
    return this.table.insertCount;
  }

  /** Inserts the peer's decoder has confirmed (RFC 9204 §2.1.4 Known Received Count). */
  get knownReceived(): number {
    return this.knownReceivedCount;
  }

  /** Streams whose outstanding sections may currently be blocked at the peer. */
  get blockedStreamCount(): number {
    let count = 0;
    for (const sections of this.outstanding.values()) {
      if (sections.some((s) => s.requiredInsertCount > this.knownReceivedCount)) count++;
    }
    return count;
  }

  /**
   * Applies the peer's SETTINGS; call once, when they arrive. Until then only the static table is
   * used (RFC 9204 §3.2.3: the initial capacity is 0). With the dynamic table enabled this emits
   * Set Dynamic Table Capacity on the encoder stream.
   */
  setPeerSettings(settings: QpackPeerSettings): void {
    if (this.peer !== undefined) throw new H3Error('H3_INTERNAL_ERROR', 'peer QPACK settings applied twice');
    this.peer = { qpackMaxTableCapacity: settings.qpackMaxTableCapacity, qpackBlockedStreams: settings.qpackBlockedStreams };
    const capacity = this.dynamicEnabled ? Math.min(this.ownMaxCapacity, settings.qpackMaxTableCapacity) : 0;
    if (capacity > 0) {
      writeSetCapacity(this.out, capacity);
      this.table.setCapacity(capacity);
    }
  }

  /**
   * Encodes a field section (the payload of a HEADERS frame) for `streamId`. Names should already
   * be lowercase (RFC 9114 §4.2); order and duplicates are kept. Any encoder stream instructions
   * it needs are queued in pendingEncoderStreamBytes(), which must be sent no later than the section.
   */
  encodeFieldSection(streamId: number, headers: ReadonlyArray<readonly [string, string]>): Uint8Array {
    let blocking = false;
    const streamBlocked = this.isStreamBlocked(streamId);
    const refs: number[] = [];
    // Using an entry the peer has not acknowledged may block this stream (RFC 9204 §2.1.2).
    const usable = (abs: number): boolean => {
      if (abs < this.knownReceivedCount) return true;
      if (blocking || streamBlocked || this.blockedStreamCount < (this.peer?.qpackBlockedStreams ?? 0)) {
        blocking = true;
        return true;
      }
      return false;
    };
    const pin = (abs: number): void => {
      refs.push(abs);
      this.refCounts.set(abs, (this.refCounts.get(abs) ?? 0) + 1);
    };

    const plan: PlannedLine[] = [];
    for (const [rawName, rawValue] of headers) {
      const name = byteString(rawName);
      const value = byteString(rawValue);
      const exact = staticExactIndex(name, value);
      if (exact !== undefined) {
        plan.push({ kind: 'static', index: exact });
        continue;
      }
      const never = NEVER_INDEX.has(name);
      if (this.table.capacity > 0 && !never) {
        let abs = this.liveIndex(this.exactIndex, `${name}\0${value}`);
        if (abs === undefined && this.shouldInsert(name, value)) abs = this.tryInsert(name, value);
        if (abs !== undefined && usable(abs)) {
          pin(abs);
          plan.push({ kind: 'dynamic', abs });
          continue;
        }
      }
      const staticName = staticNameIndex(name);
      if (staticName !== undefined) {
        plan.push({ kind: 'static-name', index: staticName, name, value, never, cache: cacheable(name, value) });
        continue;
      }
      const dynName = this.table.capacity > 0 ? this.liveIndex(this.nameIndex, name) : undefined;
      if (dynName !== undefined && usable(dynName)) {
        pin(dynName);
        plan.push({ kind: 'dynamic-name', abs: dynName, value, never });
        continue;
      }
      plan.push({ kind: 'literal', name, value, never, cache: cacheable(name, value) });
    }

    const requiredInsertCount = refs.length === 0 ? 0 : Math.max(...refs) + 1;
    const base = this.table.insertCount;
    const w = sectionScratch();
    writeFieldSectionPrefix(w, requiredInsertCount, requiredInsertCount === 0 ? 0 : base, this.peer?.qpackMaxTableCapacity ?? 0);
    for (const line of plan) this.writeLine(w, line, base);
    if (refs.length > 0) {
      const list = this.outstanding.get(streamId) ?? [];
      list.push({ requiredInsertCount, refs });
      this.outstanding.set(streamId, list);
    }
    return w.finish();
  }

  /** Processes bytes from the peer's decoder stream. Throws QPACK_DECODER_STREAM_ERROR for bad instructions. */
  onDecoderStreamData(bytes: Uint8Array): void {
    const data = this.decoderStreamBuffer.length === 0 ? bytes : concat(this.decoderStreamBuffer, bytes);
    let at = 0;
    for (;;) {
      const parsed = parseDecoderInstruction(data, at);
      if (parsed === null) break;
      this.apply(parsed.instruction);
      at = parsed.next;
    }
    this.decoderStreamBuffer = data.slice(at);
  }

  /** Takes the bytes to send on our encoder stream (empty when there are none). */
  pendingEncoderStreamBytes(): Uint8Array {
    if (this.out.length === 0) return NOTHING;
    const bytes = this.out.finish();
    this.out = new ByteWriter();
    return bytes;
  }

  private apply(ins: DecoderInstruction): void {
    const code = 'QPACK_DECODER_STREAM_ERROR';
    switch (ins.type) {
      case 'section-ack': {
        // RFC 9204 §4.4.1: acknowledging a section that is not outstanding is an error.
        const section = this.outstanding.get(ins.streamId)?.shift();
        if (section === undefined) throw new H3Error(code, `Section Acknowledgment for stream ${ins.streamId} with nothing outstanding`);
        if (this.outstanding.get(ins.streamId)?.length === 0) this.outstanding.delete(ins.streamId);
        this.unpin(section.refs);
        this.knownReceivedCount = Math.max(this.knownReceivedCount, section.requiredInsertCount);
        return;
      }
      case 'stream-cancel': {
        for (const section of this.outstanding.get(ins.streamId) ?? []) this.unpin(section.refs);
        this.outstanding.delete(ins.streamId);
        return;
      }
      case 'insert-count-increment':
        // RFC 9204 §4.4.3: zero, or beyond what we inserted, is an error.
        if (ins.increment === 0 || this.knownReceivedCount + ins.increment > this.table.insertCount) {
          throw new H3Error(code, `invalid Insert Count Increment ${ins.increment}`);
        }
        this.knownReceivedCount += ins.increment;
        return;
    }
  }

  private unpin(refs: readonly number[]): void {
    for (const abs of refs) {
      const n = (this.refCounts.get(abs) ?? 1) - 1;
      if (n === 0) this.refCounts.delete(abs);
      else this.refCounts.set(abs, n);
    }
  }

  private isStreamBlocked(streamId: number): boolean {
    return (this.outstanding.get(streamId) ?? []).some((s) => s.requiredInsertCount > this.knownReceivedCount);
  }

  private liveIndex(index: Map<string, number>, key: string): number | undefined {
    const abs = index.get(key);
    return abs !== undefined && this.table.get(abs) !== undefined ? abs : undefined;
  }

  private shouldInsert(name: string, value: string): boolean {
    if (DO_NOT_INSERT.has(name)) return false;
    // Large entries would flush the table for one use.
    if (entrySize(name, value) > this.table.capacity / 4 && !this.insertOnFirstUse) return false;
    if (this.insertOnFirstUse) return true;
    const key = `${name}\0${value}`;
    if (this.seen.has(key)) return true;
    if (this.seen.size >= SEEN_LIMIT) this.seen.clear();
    this.seen.add(key);
    return false;
  }

  // RFC 9204 §2.1.1: only entries that are acknowledged and unreferenced may be evicted.
  private tryInsert(name: string, value: string): number | undefined {
    const size = entrySize(name, value);
    if (size > this.table.capacity) return undefined;
    let free = this.table.capacity - this.table.size;
    let abs = this.table.oldestAbsolute;
    while (free < size) {
      if (abs >= this.knownReceivedCount || this.refCounts.has(abs)) return undefined;
      free += (this.table.get(abs) as { size: number }).size;
      abs++;
    }
    const staticName = staticNameIndex(name);
    if (staticName !== undefined) writeInsertWithNameRef(this.out, true, staticName, latin1(value), this.huffman);
    else writeInsertWithLiteralName(this.out, latin1(name), latin1(value), this.huffman);
    this.table.insert(name, value);
    const inserted = this.table.insertCount - 1;
    this.exactIndex.set(`${name}\0${value}`, inserted);
    this.nameIndex.set(name, inserted);
    return inserted;
  }

  private writeLine(w: ByteWriter, line: PlannedLine, base: number): void {
    switch (line.kind) {
      case 'static': // §4.5.2: 1 T=1 Index(6+)
        encodePrefixedInt(w, line.index, 6, 0xc0);
        return;
      case 'dynamic': // §4.5.2: 1 T=0 relative Index(6+); all our references are below Base
        encodePrefixedInt(w, base - 1 - line.abs, 6, 0x80);
        return;
      case 'static-name': { // §4.5.4: 01 N T=1 NameIndex(4+)
        if (line.cache && this.writeCached(w, line.name, line.value)) return;
        const start = w.length;
        encodePrefixedInt(w, line.index, 4, 0x50 | (line.never ? 0x20 : 0));
        encodeStringLiteral(w, latin1(line.value), 7, 0, this.huffman);
        if (line.cache) this.remember(line.name, line.value, w, start);
        return;
      }
      case 'dynamic-name': // §4.5.4: 01 N T=0 relative NameIndex(4+)
        encodePrefixedInt(w, base - 1 - line.abs, 4, 0x40 | (line.never ? 0x20 : 0));
        encodeStringLiteral(w, latin1(line.value), 7, 0, this.huffman);
        return;
      case 'literal': { // §4.5.6: 001 N H NameLength(3+)
        if (line.cache && this.writeCached(w, line.name, line.value)) return;
        const start = w.length;
        encodeStringLiteral(w, latin1(line.name), 3, 0x20 | (line.never ? 0x10 : 0), this.huffman);
        encodeStringLiteral(w, latin1(line.value), 7, 0, this.huffman);
        if (line.cache) this.remember(line.name, line.value, w, start);
        return;
      }
    }
  }

  // A line that refers to no dynamic entry encodes the same in every section: responses repeat
  // most of theirs (content-type, server, cache-control, the date within a second), so the bytes
  // are kept, per Huffman policy, in a bounded cache shared by the process.
  private writeCached(w: ByteWriter, name: string, value: string): boolean {
    const bytes = LINE_CACHE[this.huffman].get(name)?.get(value);
    if (bytes === undefined) return false;
    w.bytes(bytes);
    return true;
  }

  private remember(name: string, value: string, w: ByteWriter, start: number): void {
    const cache = LINE_CACHE[this.huffman];
    if (lineCacheSize[this.huffman] >= LINE_CACHE_ENTRIES) {
      cache.clear();
      lineCacheSize[this.huffman] = 0;
    }
    let values = cache.get(name);
    if (values === undefined) cache.set(name, (values = new Map()));
    values.set(value, w.copyFrom(start));
    lineCacheSize[this.huffman]++;
  }
}

// Sections are written into one scratch buffer (encoding is synchronous) and copied out once;
// one that grew past 16 KiB for a huge section is dropped rather than kept.
let scratch = new ByteWriter(256);
function sectionScratch(): ByteWriter {
  if (scratch.capacity > 16384) scratch = new ByteWriter(256);
  scratch.reset();
  return scratch;
}

// Tables and sizes work on octets; a string with characters above U+00FF becomes its UTF-8 octets.
function byteString(text: string): string {
  for (let i = 0; i < text.length; i++) {
    if (text.charCodeAt(i) > 0xff) return fieldText(fieldBytes(text));
  }
  return text;
}

// Whether a line that refers to no dynamic entry may be kept in the line cache: not secrets
// (NOT_CACHED holds every NEVER_INDEX name), not long values.
function cacheable(name: string, value: string): boolean {
  return !NOT_CACHED.has(name) && name.length + value.length <= LINE_CACHE_KEY_MAX;
}

function latin1(byteStr: string): Uint8Array {
  return Buffer.from(byteStr, 'latin1');
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
