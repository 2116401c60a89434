// Startup failures as one coded line. Whatever stops `serve` from starting (a log file it cannot
// open, a port in use, a worker that dies at once) reaches the command as an error with a
// SERVICE_ERROR_CODES code and a message naming what failed and why in words and errno, which
// `serve` prints as `edge-proxy serve: CODE: message` before exiting 1: never a stack trace.
import type { ServiceErrorCode } from '../errors.ts';

/** An error carrying a service error code. */
export type CodedError = Error & { readonly code: ServiceErrorCode };

const WORDS: Record<string, string> = {
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ENOENT: 'no such file or directory',
  ENOTDIR: 'a path component is not a directory',
  EISDIR: 'is a directory',
  EEXIST: 'something else already exists there',
  EROFS: 'read-only file system',
  ENOSPC: 'no space left on device',
  EADDRINUSE: 'address already in use',
  EADDRNOTAVAIL: 'address not available',
};

/** An operating-system error as words and errno (`permission denied (EACCES)`); otherwise its message. */
export function describeSystemError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (typeof code === 'string' && WORDS[code] !== undefined) return `${WORDS[code]} (${code})`;
  return err instanceof Error ? err.message : String(err);
}

export function startupFailure(code: ServiceErrorCode, message: string): CodedError {
  return Object.assign(new Error(message), { code });
}

/** `fn()`; what it throws becomes a `code` failure whose message is `what: <why>`. */
export function orStartupFailure<T>(code: ServiceErrorCode, what: string, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw startupFailure(code, `${what}: ${describeSystemError(err)}`);
  }
}
