// The test suite's one compile cache (NODE_COMPILE_CACHE): `npm test` (scripts/test.ts) gives it to
// every node process of the run, and the end-to-end harness (test/support/serve.ts) to every
// `serve` it starts, so only the first process to load a TypeScript file strips it. Node checks
// each entry against its source, so an edited file is compiled again.
import { mkdirSync } from 'node:fs';
import path from 'node:path';

/** `.tap/compile-cache` in the project (ignored by git). */
export const SUITE_COMPILE_CACHE = path.resolve(import.meta.dirname, '..', '..', '.tap', 'compile-cache');

/** Creates the directory (0700) if it is missing; returns its path. */
export function suiteCompileCache(): string {
  mkdirSync(SUITE_COMPILE_CACHE, { recursive: true, mode: 0o700 });
  return SUITE_COMPILE_CACHE;
}
