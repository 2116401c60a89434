// Shared test helpers: hex conversion and "throws an H3Error with this code" assertions.

import { H3Error } from '../src/errors.ts';
import type { H3ErrorCode } from '../src/errors.ts';

/** Bytes from a hex string; whitespace is ignored so RFC dumps can be pasted as-is. */
export function hex(text: string): Uint8Array {
  return new Uint8Array(Buffer.from(text.replace(/\s+/g, ''), 'hex'));
}

/** Hex of bytes, for readable assertions. */
export function toHex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString('hex');
}

/** Runs `fn` and returns the H3Error code it throws, 'no error', or 'non-H3Error: ...'. */
export function errorCodeOf(fn: () => unknown): H3ErrorCode | 'no error' | string {
  try {
    fn();
    return 'no error';
  } catch (err) {
    if (err instanceof H3Error) return err.code;
    return `non-H3Error: ${String(err)}`;
  }
}

/** Runs `fn`; rethrows anything that is not an H3Error (fast-check then reports the input). */
export function onlyH3Errors(fn: () => unknown): void {
  try {
    fn();
  } catch (err) {
    if (!(err instanceof H3Error)) throw err;
  }
}
