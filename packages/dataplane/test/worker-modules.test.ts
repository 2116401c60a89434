// What a worker process loads of undici (packages/auth/src/undici-pool.ts): one copy, shared by the
// upstream pools, the health checks and the external authorizer, and only its Pool and `request`
// modules, never the package entry that brings fetch, WebSocket, the caches and the mock agent with
// it (5.3 MiB of heap against 2.5 in every worker); and no ioredis until a shared quota store is
// built (2 MiB; docs/performance.md "Worker memory"). A fresh node imports the worker's modules
// and reports Node's CommonJS cache, which holds every module of both (they are CommonJS).
import t from 'tap';
import { execFileSync } from 'node:child_process';
import path from 'node:path';

const repo = path.resolve(import.meta.dirname, '../../..');
const probe = `
import { createRequire } from 'node:module';
await import('./packages/dataplane/src/worker/ipc-worker.ts');
await import('@edge-proxy/auth');
const cached = Object.keys(createRequire(import.meta.url).cache);
console.log(JSON.stringify({ undici: cached.filter((k) => k.includes('/undici/')), ioredis: cached.filter((k) => k.includes('/ioredis/')) }));
`;

const report = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', probe], { cwd: repo, encoding: 'utf8', timeout: 60_000 }).trim().split('\n').at(-1) as string) as { undici: string[]; ioredis: string[] };
const loaded = report.undici;
const roots = new Set(loaded.map((k) => k.slice(0, k.lastIndexOf('/node_modules/undici/') + '/node_modules/undici/'.length)));

t.ok(loaded.some((k) => k.endsWith('/undici/lib/dispatcher/pool.js')), 'the Pool is loaded');
t.same([...roots], [path.join(repo, 'node_modules/undici/')], 'from one copy of undici, at the repository root');
t.same(loaded.filter((k) => k.endsWith('/undici/index.js')), [], 'and never through the package entry');
t.ok(loaded.length <= 30, `${loaded.length} of undici's modules, its Pool's and request's own (23 with undici 8.12)`);
t.same(report.ioredis, [], 'ioredis waits for the first shared quota store (resilience/quota/redis-store.ts)');
