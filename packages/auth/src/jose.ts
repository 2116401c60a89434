// jose, loaded by its first use: in a worker, as the first generation with JWT auth is prepared
// (the verifier's constructor); in the supervisor, by the first key a JWKS source imports. A
// worker whose routes have no JWT auth never holds its 0.56 MiB of heap (docs/performance.md
// "jose on first use, prom-client's core alone"). jose is an ES module; Node 24 requires one
// synchronously (it has no top-level await).
import { createRequire } from 'node:module';
import type * as Jose from 'jose';

const require = createRequire(import.meta.url);
// Kept here, not asked of `require` each time: the verifier calls this on every token it checks,
// and a lookup by name resolves the package path first.
let loaded: typeof Jose | undefined;

/** jose's API. */
export function jose(): typeof Jose {
  return (loaded ??= require('jose') as typeof Jose);
}
