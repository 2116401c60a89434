// undici's Pool and its `request` call, and nothing else of undici: the one HTTP client of a worker,
// for the external authorizer here and for the data plane's upstream pools and health checks
// (exported as UndiciPool). The package's entry (`import { Pool } from 'undici'`) loads all of
// undici: fetch, WebSocket, EventSource, the caches and the mock agent, 109 modules and 5.3 MiB of
// heap in every worker; these two need 23 modules and 2.5 MiB. The repository root depends on the
// same undici as the packages, so npm installs one copy, and a worker loads it once
// (packages/dataplane/test/worker-modules.test.ts; docs/performance.md "Worker memory").
import { createRequire } from 'node:module';
import type { Dispatcher, Pool as UndiciPool } from 'undici';

const require = createRequire(import.meta.url);
// The entry assigns its call APIs to every dispatcher's prototype; `request` is the one we call.
const dispatcher = require('undici/lib/dispatcher/dispatcher.js') as { prototype: Partial<Dispatcher> };
dispatcher.prototype.request ??= require('undici/lib/api/api-request.js') as Dispatcher['request'];

export const Pool = require('undici/lib/dispatcher/pool.js') as typeof UndiciPool;
export type Pool = UndiciPool;
