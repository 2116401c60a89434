// RFC 9114 §7.2.8, §6.2.3, §7.2.4.1, §8.1: code points of the form 0x1f * N + 0x21 are reserved
// ("greased") so that peers exercise their handling of unknown values. The same formula covers
// frame types, unidirectional stream types, setting identifiers and error codes.

/** True for a reserved (grease) code point `0x1f * N + 0x21`. Accepts inexact numbers above 2^53 (returns false). */
export function isReservedCodepoint(value: number): boolean {
  return Number.isSafeInteger(value) && value >= 0x21 && (value - 0x21) % 0x1f === 0;
}

/** The reserved code point for `n`; used to grease what we send. `n` must keep the result below 2^53. */
export function reservedCodepoint(n: number): number {
  return 0x1f * n + 0x21;
}
