// The QPACK dynamic table (RFC 9204 §3.2): a FIFO of field lines. Every entry ever inserted has
// an absolute index (0 for the first); eviction removes the oldest. Encoder and decoder each keep
// one, kept identical by the encoder stream.

/** One dynamic table entry. Names and values are byte strings (one character per octet). */
export interface TableEntry {
  readonly name: string;
  readonly value: string;
  /** RFC 9204 §3.2.1: name length + value length + 32. */
  readonly size: number;
}

/** RFC 9204 §3.2.1: the size of an entry. Strings are byte strings, so length = octets. */
export function entrySize(name: string, value: string): number {
  return name.length + value.length + 32;
}

/** A dynamic table with absolute indexing and eviction by capacity. */
export class DynamicTable {
  private entries: TableEntry[] = [];
  private head = 0; // entries before `head` were evicted and await compaction
  private evicted = 0; // absolute index of the oldest live entry
  private _size = 0;
  private _capacity = 0;
  private _insertCount = 0;

  /** Current capacity in bytes (set by Set Dynamic Table Capacity). */
  get capacity(): number {
    return this._capacity;
  }

  /** Sum of entry sizes. */
  get size(): number {
    return this._size;
  }

  /** Total number of insertions ever (RFC 9204 §3.2.4 "Insert Count"). */
  get insertCount(): number {
    return this._insertCount;
  }

  /** Absolute index of the oldest entry still present (equals insertCount when empty). */
  get oldestAbsolute(): number {
    return this.evicted;
  }

  /** Number of live entries. */
  get length(): number {
    return this.entries.length - this.head;
  }

  /** The entry at absolute index `abs`, or undefined when evicted or not yet inserted. */
  get(abs: number): TableEntry | undefined {
    if (abs < this.evicted || abs >= this._insertCount) return undefined;
    return this.entries[this.head + (abs - this.evicted)];
  }

  /** Sets the capacity, evicting the oldest entries until the table fits. The caller checks limits. */
  setCapacity(capacity: number): void {
    this._capacity = capacity;
    this.evictUntil(capacity);
  }

  /**
   * Inserts an entry, evicting the oldest entries to make room. Returns false (and changes
   * nothing) when the entry is larger than the capacity (RFC 9204 §3.2.2: an error for the caller).
   */
  insert(name: string, value: string): boolean {
    const size = entrySize(name, value);
    if (size > this._capacity) return false;
    this.evictUntil(this._capacity - size);
    this.entries.push({ name, value, size });
    this._size += size;
    this._insertCount++;
    return true;
  }

  /** Bytes that evicting every entry below absolute index `abs` frees. */
  sizeBelow(abs: number): number {
    let total = 0;
    for (let i = this.evicted; i < abs && i < this._insertCount; i++) total += (this.get(i) as TableEntry).size;
    return total;
  }

  private evictUntil(targetSize: number): void {
    while (this._size > targetSize && this.head < this.entries.length) {
      this._size -= (this.entries[this.head] as TableEntry).size;
      this.head++;
      this.evicted++;
    }
    // Compact now and then so evicted entries can be collected.
    if (this.head > 32 && this.head * 2 > this.entries.length) {
      this.entries = this.entries.slice(this.head);
      this.head = 0;
    }
  }
}
