// The access log and request ids end to end (issue 17, "Must show": access log lines for 200,
// 404, 429, 502, 503 and 504 answers): a real `edge-proxy serve` with one worker, real HTTP/1.1
// backends (test/support/controlled-backend.ts), clients over HTTP/1.1, HTTP/2 and HTTP/3. Each
// request names itself with `x-request-id`; its line is found by that id in the service's stdout
// and checked field by field, with the id the backend received. Then: ids the proxy refuses and
// replaces, the caller's trace id, and sampling changed by a live activation.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { pollUntil, request, snapshot, startProxy } from './support/overload.ts';
import { api } from './support/serve.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import type { Answer, StartedProxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-access-log-');
const refused = await freePort();
const ok = await controlledBackend(t, 'ok');
ok.set({ kind: 'slow', ms: 5000 }, '/slow');

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, retry_budget: { max_attempts: 1 }';
const LIMITS = 'rate_limits: [{ name: per-path, routes: [rl], key: path, requests_per_second: 1, burst: 1 }]';
const pool = (name: string, prefix: string, port: number, more = ''): string => `${name}: { route: { path_prefix: ${prefix} }, backends: [{ id: ${name}-1, address: "127.0.0.1:${port}" }]${more} }`;
const UPSTREAM = `{ ${[
  pool('app', '/ok', ok.port),
  pool('slow', '/slow', ok.port, ', timeouts: { backend_request_ms: 300 }'),
  pool('dead', '/dead', refused),
  pool('rl', '/rl', ok.port),
  pool('az', '/az', ok.port, `, auth: { external: { url: "http://127.0.0.1:${refused}/authz", timeout_ms: 1000, failure_mode: deny } }`),
].join(', ')} }`;

function start(name: string, accessLog: string, routing = false): Promise<StartedProxy> {
  return startProxy(
    t,
    files,
    name,
    {
      performance: 'global_inflight_limit: 100',
      upstream: UPSTREAM,
      resilience: `{ ${QUIET}, ${LIMITS} }`,
      observability: `  access_log: ${accessLog}\n  routing: { enabled: ${routing} }\n`,
    },
    'operator',
  );
}

/** The access line of request `id` (waits for the worker's buffered log). */
function accessLine(p: StartedProxy, id: string): Promise<Record<string, unknown>> {
  return p.served.waitFor((l) => l['log_type'] === 'access' && l['request_id'] === id, 10_000);
}

const VERSION = { h1: '1.1', h2: '2', h3: '3' } as const;

t.test('one access line per request for 200, 404, 429, 502, 503 and 504 answers, over h1, h2 and h3', async (t) => {
  const p = await start('answers', '{ enabled: true }');
  for (const protocol of PROTOCOLS) {
    const id = (what: string): string => `al-${protocol}-${what}`;
    const ask = (what: string, urlPath: string): Promise<Answer> => request(p, protocol, { path: urlPath, headers: { 'x-request-id': id(what) } });
    const common = { log_type: 'access', protocol: VERSION[protocol], listener: '127.0.0.1:' + String(p.lport), generation: 1, method: 'GET' };

    const a200 = await ask('200', `/ok/${protocol}?token=SECRET-QUERY`);
    t.equal(a200.status, 200, `${protocol}: 200`);
    const seen = ok.arrivals.find((a) => a.path.startsWith(`/ok/${protocol}`));
    t.equal(seen?.headers['x-request-id'], id('200'), `${protocol}: the backend received the client's request id`);
    t.match(await accessLine(p, id('200')), { ...common, path: `/ok/${protocol}`, status: 200, upstream: 'app', backend: 'app-1', attempts: 1, outcome: 'success', code: null, reason: null, bytes_in: 0, bytes_out: Buffer.byteLength(a200.body), duration_ms: Number }, `${protocol}: 200 logged, the path without its query string`);

    const a404 = await ask('404', '/nothing');
    t.same([a404.status, a404.headers['x-request-id']], [404, id('404')], `${protocol}: 404 answered with the request id`);
    t.match(await accessLine(p, id('404')), { ...common, path: '/nothing', status: 404, upstream: null, backend: null, attempts: 0, outcome: 'failure', code: 'EDGE_ROUTE_NOT_FOUND', reason: 'not_found', failure_class: 'route', bytes_out: Buffer.byteLength(a404.body) }, `${protocol}: 404 logged`);

    // key: path, burst 1: the second request of the path finds its bucket empty.
    t.equal((await ask('429-first', `/rl/${protocol}`)).status, 200, `${protocol}: the first /rl request passes`);
    const a429 = await ask('429', `/rl/${protocol}`);
    t.same([a429.status, a429.headers['x-request-id']], [429, id('429')], `${protocol}: 429 answered with the request id`);
    t.match(await accessLine(p, id('429')), { ...common, status: 429, upstream: 'rl', backend: null, attempts: 0, outcome: 'rate_limited', code: 'EDGE_RATE_LIMITED', failure_class: 'limited' }, `${protocol}: 429 logged`);

    const a502 = await ask('502', '/dead/x');
    t.same([a502.status, a502.headers['x-request-id']], [502, id('502')], `${protocol}: 502 answered with the request id`);
    t.match(await accessLine(p, id('502')), { ...common, status: 502, upstream: 'dead', backend: 'dead-1', attempts: 1, outcome: 'backend_error', code: 'EDGE_UPSTREAM_TRANSPORT', reason: 'transport', failure_class: 'transport' }, `${protocol}: 502 logged with its backend and reason`);

    const a503 = await ask('503', '/az/x');
    t.same([a503.status, a503.headers['x-request-id']], [503, id('503')], `${protocol}: 503 answered with the request id`);
    t.match(await accessLine(p, id('503')), { ...common, status: 503, upstream: 'az', attempts: 0, code: 'EDGE_AUTH_UNAVAILABLE', reason: 'authorization_unavailable', failure_class: 'auth' }, `${protocol}: 503 logged`);

    const a504 = await ask('504', '/slow/x');
    t.same([a504.status, a504.headers['x-request-id']], [504, id('504')], `${protocol}: 504 answered with the request id`);
    const l504 = await accessLine(p, id('504'));
    t.match(l504, { ...common, status: 504, upstream: 'slow', backend: 'slow-1', attempts: 1, outcome: 'timeout', code: 'EDGE_UPSTREAM_HEADERS_TIMEOUT', reason: 'headers_timeout', failure_class: 'timeout' }, `${protocol}: 504 logged`);
    t.ok((l504['duration_ms'] as number) >= 290, `${protocol}: the 504's duration covers backend_request_ms (${String(l504['duration_ms'])} ms)`);
  }
  t.notOk(p.served.text().includes('SECRET-QUERY'), 'no query string reached the log');
});

t.test('request ids: a well-formed one is kept, anything else is replaced by a UUID; the caller\'s trace id is logged', async (t) => {
  const p = await start('ids', '{ enabled: true }');
  const cases: Array<[string, Record<string, string>]> = [
    ['kept', { 'x-request-id': 'client:7f3a/B=9@x+y_z.1-2' }],
    ['too-long', { 'x-request-id': 'a'.repeat(129) }],
    ['space', { 'x-request-id': 'has space' }],
    ['quote', { 'x-request-id': 'a"b' }],
    ['none', {}],
  ];
  for (const [what, headers] of cases) {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const a = await request(p, 'h2', { path: `/ok/id-${what}`, headers: { ...headers, traceparent } });
    t.equal(a.status, 200, `${what}: 200`);
    const arrival = ok.arrivals.find((x) => x.path === `/ok/id-${what}`);
    const sent = arrival?.headers['x-request-id'] as string;
    if (what === 'kept') t.equal(sent, headers['x-request-id'], 'a well-formed id reaches the backend as it is');
    else t.match(sent, UUID, `${what}: the backend received a UUID the proxy made`);
    t.equal(arrival?.headers['traceparent'], traceparent, `${what}: traceparent passes through untouched while tracing is off`);
    const line = await accessLine(p, sent);
    t.match(line, { path: `/ok/id-${what}`, trace_id: '4bf92f3577b34da6a3ce929d0e0e4736' }, `${what}: the line carries the id the backend got and the caller's trace id`);
  }
  const a = await request(p, 'h1', { path: '/nothing', headers: { 'x-request-id': 'x'.repeat(200) } });
  t.match(a.headers['x-request-id'], UUID, 'an error answer to a refused id carries the id the proxy made');
  t.match(await accessLine(p, a.headers['x-request-id'] as string), { status: 404, trace_id: null }, 'and that id is the one logged; no traceparent: trace_id null');
});

t.test('sampling: sample_ratio 0 keeps only failures, and log_failures false drops them too (activated live)', async (t) => {
  // Route decisions are logged for every request, in order with the access lines of the same
  // worker: a decision line of a later request proves an earlier request wrote no access line.
  const p = await start('sampling', '{ enabled: true, sample_ratio: 0 }', true);
  const decided = (id: string): Promise<Record<string, unknown>> => p.served.waitFor((l) => l['decision'] !== undefined && l['request_id'] === id, 10_000);
  const accessOf = (id: string): Record<string, unknown>[] => p.served.lines.filter((l) => l['log_type'] === 'access' && l['request_id'] === id);

  t.equal((await request(p, 'h1', { path: '/ok/s1', headers: { 'x-request-id': 's1-ok' } })).status, 200, 'generation 1: a success');
  t.equal((await request(p, 'h1', { path: '/dead/s1', headers: { 'x-request-id': 's1-dead' } })).status, 502, 'generation 1: a failure');
  t.match(await accessLine(p, 's1-dead'), { status: 502 }, 'sample_ratio 0, log_failures true: the 502 is logged');
  t.same(accessOf('s1-ok'), [], 'sample_ratio 0: the success is not (it was answered before the 502)');

  const file = path.join(files.dir, 'sampling-2.yaml');
  writeFileSync(file, p.configText.replace('access_log: { enabled: true, sample_ratio: 0 }', 'access_log: { enabled: true, sample_ratio: 0, log_failures: false }'));
  const r = await api(p.cport, p.ca, 'POST', '/admin/runtime/activate', { token: p.token }, { config_path: file, expected_generation: 1, reason: 'sampling' });
  t.match(r, { status: 202, body: { generation: 2 } }, 'log_failures false activated');
  await pollUntil(async () => (await snapshot(p))['generation'], (g) => g === 2, 10_000);
  // The worker may take the generation a moment after the supervisor: until a request is decided on generation 2.
  await pollUntil(
    async () => {
      const id = `probe-${Date.now()}`;
      await request(p, 'h1', { path: '/ok/probe', headers: { 'x-request-id': id } });
      return (await decided(id))['generation'];
    },
    (g) => g === 2,
    10_000,
  );
  t.equal((await request(p, 'h1', { path: '/dead/s2', headers: { 'x-request-id': 's2-dead' } })).status, 502, 'generation 2: a failure');
  await request(p, 'h1', { path: '/ok/marker', headers: { 'x-request-id': 's2-marker' } });
  await decided('s2-marker');
  t.same(accessOf('s2-dead'), [], 'log_failures false: the 502 is not logged either (a later request\'s decision line is)');
});
