// A growable output buffer: encoders append bytes without computing sizes up front.

/** Appends bytes to a buffer that doubles when full. */
export class ByteWriter {
  private buf: Uint8Array;
  private len = 0;

  constructor(initialCapacity = 64) {
    this.buf = new Uint8Array(Math.max(16, initialCapacity));
  }

  /** Number of bytes written so far. */
  get length(): number {
    return this.len;
  }

  /** Bytes the buffer holds before it must grow. */
  get capacity(): number {
    return this.buf.length;
  }

  /** Forgets what was written, keeping the buffer. */
  reset(): void {
    this.len = 0;
  }

  /** Makes room for `extra` more bytes. */
  reserve(extra: number): void {
    const need = this.len + extra;
    if (need <= this.buf.length) return;
    let cap = this.buf.length * 2;
    while (cap < need) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
  }

  /** Appends one byte (the low 8 bits of `value`). */
  byte(value: number): void {
    this.reserve(1);
    this.buf[this.len++] = value & 0xff;
  }

  /** Appends a byte sequence. */
  bytes(data: Uint8Array): void {
    this.reserve(data.length);
    this.buf.set(data, this.len);
    this.len += data.length;
  }

  /** ORs `bits` into an already written byte; used to set flag bits in front of a prefixed integer. */
  orAt(index: number, bits: number): void {
    this.buf[index] = ((this.buf[index] ?? 0) | bits) & 0xff;
  }

  /** A copy of the bytes written from offset `start` on. */
  copyFrom(start: number): Uint8Array {
    return this.buf.slice(start, this.len);
  }

  /** A copy of the bytes written, sized exactly. */
  finish(): Uint8Array {
    return this.buf.slice(0, this.len);
  }
}

/** Concatenates byte arrays into one new array. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const p of parts) total += p.length;
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
