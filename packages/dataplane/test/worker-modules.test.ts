// What a worker process loads of undici (packages/auth/src/undici-pool.ts): one copy, shared by the
// upstream pools, the health checks and the external authorizer, and only its Pool and `request`
// modules, never the package entry that brings fetch, WebSocket, the caches and the mock agent with
// it (5.3 MiB of heap against 2.5 in every worker); and no ioredis until a shared quota store is
// built (2 MiB; docs/performance.md "Worker memory"), and no jose until a generation with JWT auth is
// prepared (0.56 MiB; packages/auth/src/jose.ts); and of prom-client only its Registry, Counter and
// Gauge (0.56 MiB less, and with them no OpenTelemetry API). A fresh node imports the worker's
// modules and reports Node's CommonJS cache, which holds every module of undici and ioredis (they
// are CommonJS), and the URLs its module hooks saw resolved (jose is an ES module); then it builds
// a JWT verifier (a generation with JWT auth builds one as it is prepared) and reports again.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import path from 'node:path';

const repo = path.resolve(import.meta.dirname, '../../..');
const probe = `
import { createRequire, registerHooks } from 'node:module';
const resolved = [];
registerHooks({ resolve: (specifier, context, next) => { const r = next(specifier, context); resolved.push(r.url); return r; } });
await import('./packages/dataplane/src/worker/ipc-worker.ts');
const { JwtVerifier } = await import('@edge-proxy/auth');
const cached = Object.keys(createRequire(import.meta.url).cache);
const jose = () => resolved.filter((u) => u.includes('/node_modules/jose/'));
const before = jose();
new JwtVerifier({ audiences: ['a'], algorithms: ['RS256'], jwksTimeoutMs: 0, clockSkewMs: 0, header: 'authorization', cacheEntries: 0 }, undefined);
console.log(JSON.stringify({ undici: cached.filter((k) => k.includes('/undici/')), ioredis: cached.filter((k) => k.includes('/ioredis/')), promClient: cached.filter((k) => k.includes('/prom-client/')), otel: [...cached, ...resolved].filter((k) => k.includes('/@opentelemetry/')), jose: before, joseOnUse: jose() }));
`;

const report = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', probe], { cwd: repo, encoding: 'utf8', timeout: 60_000 }).trim().split('\n').at(-1) as string) as {
  undici: string[];
  ioredis: string[];
  promClient: string[];
  otel: string[];
  jose: string[];
  joseOnUse: string[];
};
const loaded = report.undici;
const roots = new Set(loaded.map((k) => k.slice(0, k.lastIndexOf('/node_modules/undici/') + '/node_modules/undici/'.length)));

t.ok(loaded.some((k) => k.endsWith('/undici/lib/dispatcher/pool.js')), 'the Pool is loaded');
t.same([...roots], [path.join(repo, 'node_modules/undici/')], 'from one copy of undici, at the repository root');
t.same(loaded.filter((k) => k.endsWith('/undici/index.js')), [], 'and never through the package entry');
t.ok(loaded.length <= 30, `${loaded.length} of undici's modules, its Pool's and request's own (23 with undici 8.12)`);
t.same(report.ioredis, [], 'ioredis waits for the first shared quota store (resilience/quota/redis-store.ts)');
t.same(report.jose, [], 'jose waits for a generation with JWT auth (auth/src/jose.ts)');
t.ok(report.joseOnUse.length > 0, `and is loaded by the first JWT verifier, as its generation is prepared (${report.joseOnUse.length} of its modules)`);
t.same(
  report.promClient.map((k) => k.slice(k.lastIndexOf('/prom-client/') + '/prom-client/'.length)).sort(),
  ['lib/counter.js', 'lib/exemplar.js', 'lib/gauge.js', 'lib/metric.js', 'lib/registry.js', 'lib/util.js', 'lib/validation.js'],
  "prom-client: its Registry, Counter and Gauge alone (telemetry's metrics/prom-client-core.ts), not the entry's default metrics, histograms or cluster",
);
t.same(report.otel, [], "no OpenTelemetry module with tracing off (prom-client's default metrics loaded its API)");
