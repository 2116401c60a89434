// The HPACK/QPACK Huffman code (RFC 7541 Appendix B, reused by RFC 9204 §4.1.2).
//
// RFC 7541 §5.2 calls it a canonical Huffman code, so the code lengths alone define it: codes
// are handed out in order of (length, symbol), each one more than the previous, shifted left
// whenever the length grows. We therefore transcribe only the 257 lengths and derive the codes;
// tests check the derived codes against values printed in the RFC and that the code is complete.

import type { ByteWriter } from '../byte-writer.ts';

/** End-of-string symbol; its code (30 one-bits) must never appear in a decoded string. */
const EOS = 256;

/** Code length in bits of each symbol 0..256 (RFC 7541 Appendix B), 16 per row. */
// prettier-ignore
export const HUFFMAN_CODE_LENGTHS: readonly number[] = Object.freeze([
  13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //   0- 15
  28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //  16- 31
   6, 10, 10, 12, 13,  6,  8, 11, 10, 10,  8, 11,  8,  6,  6,  6, //  32- 47 ' '..'/'
   5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8, 15,  6, 12, 10, //  48- 63 '0'..'?'
  13,  6,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7, //  64- 79 '@'..'O'
   7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8, 13, 19, 13, 14,  6, //  80- 95 'P'..'_'
  15,  5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5, //  96-111 '`'..'o'
   6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7, 15, 11, 14, 13, 28, // 112-127 'p'..DEL
  20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128-143
  24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144-159
  22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160-175
  21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176-191
  26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192-207
  19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208-223
  20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224-239
  26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240-255
  30,                                                             // 256 EOS
]);

const MAX_CODE_LENGTH = 30;

/** Code of each symbol, right-aligned (the "as hex" column of the RFC table). */
export const HUFFMAN_CODES: readonly number[] = buildCodes();

// Canonical decoding tables: per length, the first code, how many codes, and where their
// symbols start in SORTED_SYMBOLS.
const FIRST_CODE: number[] = new Array<number>(MAX_CODE_LENGTH + 1).fill(0);
const COUNT: number[] = new Array<number>(MAX_CODE_LENGTH + 1).fill(0);
const OFFSET: number[] = new Array<number>(MAX_CODE_LENGTH + 1).fill(0);
const SORTED_SYMBOLS: number[] = sortedSymbols();
buildDecodeTables();

function sortedSymbols(): number[] {
  const symbols = HUFFMAN_CODE_LENGTHS.map((_, i) => i);
  symbols.sort((a, b) => (HUFFMAN_CODE_LENGTHS[a] as number) - (HUFFMAN_CODE_LENGTHS[b] as number) || a - b);
  return symbols;
}

function buildCodes(): number[] {
  const codes = new Array<number>(HUFFMAN_CODE_LENGTHS.length).fill(0);
  let code = 0;
  let prevLen = 0;
  for (const sym of sortedSymbols()) {
    const len = HUFFMAN_CODE_LENGTHS[sym] as number;
    if (prevLen !== 0) code = (code + 1) * 2 ** (len - prevLen);
    codes[sym] = code;
    prevLen = len;
  }
  return codes;
}

function buildDecodeTables(): void {
  SORTED_SYMBOLS.forEach((sym, i) => {
    const len = HUFFMAN_CODE_LENGTHS[sym] as number;
    if (COUNT[len] === 0) {
      FIRST_CODE[len] = HUFFMAN_CODES[sym] as number;
      OFFSET[len] = i;
    }
    COUNT[len] = (COUNT[len] as number) + 1;
  });
}

/** Bytes that `data` takes once Huffman-encoded (RFC 7541 §5.2: padded to a whole byte). */
export function huffmanEncodedLength(data: Uint8Array): number {
  let bits = 0;
  for (const b of data) bits += HUFFMAN_CODE_LENGTHS[b] as number;
  return Math.ceil(bits / 8);
}

/** Appends the Huffman encoding of `data` to `out`, padded with the most significant bits of EOS (one-bits). */
export function huffmanEncode(data: Uint8Array, out: ByteWriter): void {
  out.reserve(huffmanEncodedLength(data));
  let acc = 0; // pending bits, fewer than 8
  let accBits = 0;
  for (const b of data) {
    let code = HUFFMAN_CODES[b] as number;
    let len = HUFFMAN_CODE_LENGTHS[b] as number;
    // Codes reach 30 bits; feed them in pieces so `acc` stays within 32-bit bitwise range.
    while (len > 0) {
      const take = Math.min(len, 8 - accBits);
      const shift = len - take;
      const piece = Math.floor(code / 2 ** shift);
      code -= piece * 2 ** shift;
      len = shift;
      acc = (acc << take) | piece;
      accBits += take;
      if (accBits === 8) {
        out.byte(acc);
        acc = 0;
        accBits = 0;
      }
    }
  }
  if (accBits > 0) out.byte((acc << (8 - accBits)) | (0xff >> accBits));
}

/**
 * Decodes a Huffman-encoded string. Returns null when the output would exceed `maxOutput` bytes
 * (the caller raises its limit error); returns 'invalid' when the input breaks RFC 7541 §5.2:
 * it contains EOS, its padding is longer than 7 bits, or its padding is not a prefix of EOS.
 */
export function huffmanDecode(data: Uint8Array, maxOutput: number): Uint8Array | 'invalid' | null {
  // Each symbol is at least 5 bits, which bounds the output.
  const out = new Uint8Array(Math.min(Math.floor((data.length * 8) / 5), maxOutput + 1));
  let outLen = 0;
  let code = 0;
  let len = 0;
  for (const byte of data) {
    for (let bit = 7; bit >= 0; bit--) {
      code = code * 2 + ((byte >> bit) & 1);
      len++;
      const index = code - (FIRST_CODE[len] as number);
      if (index < (COUNT[len] as number)) {
        const sym = SORTED_SYMBOLS[(OFFSET[len] as number) + index] as number;
        if (sym === EOS) return 'invalid';
        if (outLen === maxOutput) return null;
        out[outLen++] = sym;
        code = 0;
        len = 0;
      } else if (len === MAX_CODE_LENGTH) {
        return 'invalid'; // unreachable for a complete code; kept so a bad table cannot loop
      }
    }
  }
  // Leftover bits are padding: at most 7, all ones.
  if (len > 7 || code !== 2 ** len - 1) return 'invalid';
  return out.subarray(0, outLen);
}
