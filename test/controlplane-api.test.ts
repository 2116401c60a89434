// The control API end to end: `edge-proxy serve` as a real process, real HTTPS with bearer tokens
// and client certificates. Every role against every endpoint, every 401/403 reason, the generation
// flows with their statuses, audit events checked field by field, the metrics endpoint, restart.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { AddressInfo } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { toolPath } from '../scripts/system-tools.ts';
import { auditSchemaErrors } from './support/audit-schema.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { heldRequest, refusedWithin } from './support/drain.ts';
import { api, auditEvents, serve } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import type { ApiResponse, Credentials } from './support/serve.ts';

const run = promisify(execFile);
const dir = mkdtempSync(path.join(tmpdir(), 'edge-cp-api-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const clientCa = makeCa(dir, 'client-ca', '/CN=edge-proxy test client CA');
const otherCa = makeCa(dir, 'other-ca', '/CN=unknown CA');
const mtls = (name: string, ou: string, issuer = clientCa) => makeLeaf(dir, name, issuer, { subject: `/CN=${name}/OU=${ou}`, sans: [name], usage: 'client' });
const mViewer = mtls('alice', 'viewer');
const mOperator = mtls('bob', 'operator');
const mAdmin = mtls('carol', 'admin');
const mStranger = mtls('mallory', 'admin', otherCa);
const caPem = readFileSync(ca.cert);
await run('openssl', ['req', '-x509', '-newkey', 'rsa:512', '-nodes', '-subj', '/CN=weak', '-keyout', path.join(dir, 'weak.key'), '-out', path.join(dir, 'weak.crt'), '-days', '3']);
const secret = path.join(dir, 'client-secret.crt');
const secretKey = path.join(dir, 'client-secret.key');
const upstreamClient = makeLeaf(dir, 'upstream-client', ca, { usage: 'client', sans: ['edge'] });
const upstreamClient2 = makeLeaf(dir, 'upstream-client2', ca, { usage: 'client', sans: ['edge'] });
writeFileSync(secret, readFileSync(upstreamClient.cert));
writeFileSync(secretKey, readFileSync(upstreamClient.key));

const TOKENS = { viewer: 'viewer-token-0123456789abcdef', operator: 'operator-token-0123456789abcdef', admin: 'admin-token-0123456789abcdef', legacy: 'legacy-admin-token-0123456789' };

// `/hold` answers its head and first bytes at once and the rest when the test calls `release`: a
// request held in flight across SIGTERM.
let release: () => void = () => undefined;
const backend = http.createServer((req, res) => {
  if (req.url !== '/hold') return void res.end(`backend ${req.url}`);
  res.writeHead(200, { 'content-type': 'text/plain' }).write('held ');
  release = () => res.end('released');
});
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
const bport = (backend.address() as AddressInfo).port;
// A second backend: configurations that point `app` at it are told apart by what answers.
const other = http.createServer((req, res) => res.end(`other ${req.url}`));
other.listen(0, '127.0.0.1');
await once(other, 'listening');
t.teardown(() => new Promise<void>((r) => other.close(() => r())));
const oport = (other.address() as AddressInfo).port;
/** What answers `/` on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections (one worker: 3 each). */
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 3 });
const allAnswer = (body: string) => allFrom(body, { perProtocol: 3 });
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];

function configText(o: { listenPort?: number; extraUpstream?: string; weight?: number; appPort?: number } = {}): string {
  return `
listen: { address: 127.0.0.1, port: ${o.listenPort ?? lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { level: info, format: json }
performance: { worker_threads: 1 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: a, address: "127.0.0.1:${o.appPort ?? bport}", weight: ${o.weight ?? 1} }]
  secure:
    route: { path_prefix: /secure }
    tls: { client_certificate_ref: { ref: "file://${secret}" }, client_key_ref: { ref: "file://${secretKey}" } }
    backends: [{ id: s, address: "https://127.0.0.1:${bport}" }]
${o.extraUpstream ?? ''}
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth_token: ${TOKENS.legacy}
    tls: { client_auth: { mode: optional, ca_file: ${clientCa.cert} } }
    auth:
      identity_source: { kind: mtls_subject_cn, role_attribute: OU }
      bearer_tokens:
        - { token: ${TOKENS.viewer}, role: viewer, actor_id: grafana }
        - { token: ${TOKENS.operator}, role: operator, actor_id: deploy-bot }
        - { token: ${TOKENS.admin}, role: admin, actor_id: sre }
`;
}

const configFile = path.join(dir, 'config.yaml');
const served = await serve(configFile, configText());
t.teardown(() => served.stop());
/** Every control API answer this file got: the independent count counters are compared with. */
const calls: { method: string; path: string; status: number; reason: unknown }[] = [];
const call = async (method: string, p: string, creds: Credentials = {}, body?: unknown): Promise<ApiResponse> => {
  const r = await api(cport, caPem, method, p, creds, body);
  calls.push({ method, path: p, status: r.status, reason: r.body['reason'] });
  return r;
};
const answered = (method: string, paths: readonly string[], status: number, reason?: string): number =>
  calls.filter((c) => c.method === method && paths.includes(c.path) && c.status === status && (reason === undefined || c.reason === reason)).length;

t.test('the snapshot reports backend health, admission and circuit breakers from the workers', async (t) => {
  let summary: { healthy: number; unhealthy: number; reported_by_workers: number } | undefined;
  let body: Record<string, unknown> = {};
  // Until the worker's first heartbeat, and its first lease asks (sent as its pools are
  // provisioned) answered by the supervisor's ledger.
  const settled = (): boolean => (summary?.reported_by_workers ?? 0) > 0 && ((body['admission'] as { leases?: { granted: number }[] } | undefined)?.leases ?? []).every((l) => l.granted > 0);
  for (let i = 0; i < 20 && (i === 0 || !settled()); i++) {
    body = (await call('GET', '/admin/runtime', { token: TOKENS.viewer })).body;
    summary = (body as { observability: { backend_health_summary: typeof summary } }).observability.backend_health_summary;
    if (!settled()) await new Promise((r) => setTimeout(r, 250)); // heartbeats come once a second from another process
  }
  t.same(summary, { healthy: 2, unhealthy: 0, reported_by_workers: 1 }, 'two backends, both eligible, as the one worker sees them');
  // The same heartbeat carries the worker's admission view and its breakers (docs/control-api.md).
  // Defaults: adaptive admission on, max_limit = global_inflight_limit 4096, min_limit 64; nothing
  // queued, no brownout; both backends closed in the one worker.
  type LeaseEntry = { key: string; limit: number; granted: number; free: number; contended: boolean; block: number; workers: { worker: number; granted: number; in_use: number; waiting: number }[] };
  type TokenEntry = { budget: string; rate: number; burst: number; keys: number; held: number; workers: { worker: number; held: number }[] };
  const { leases, lease_messages: leaseMessages, token_budgets: tokenBudgets, token_messages: tokenMessages, window_budgets: windowBudgets, ...admission } = body['admission'] as {
    inflight: number; workers: { pid: number; inflight: number }[]; leases: LeaseEntry[]; lease_messages: { from_workers: number; to_workers: number }; token_budgets: TokenEntry[]; token_messages: { from_workers: number; to_workers: number }; window_budgets: { budget: string; base: number; ratio_percent: number; window_ms: number }[];
  };
  // The token budgets: no scoped rate limit here, so the three connection caps and the route
  // queues' places (global_cap 2048, default_cap 512 for each pool) at their defaults; no
  // data-plane connection is open (the control API has its own listener) and nothing waits, so
  // nothing is held.
  t.same(
    tokenBudgets.map((b) => ({ budget: b.budget, rate: b.rate, burst: b.burst, held: b.held, workers: b.workers })),
    [
      { budget: 'conn', rate: 0, burst: 16384, held: 0, workers: [] },
      { budget: 'conn-src', rate: 0, burst: 256, held: 0, workers: [] },
      { budget: 'conn-rate', rate: 2000, burst: 4000, held: 0, workers: [] },
      { budget: 'rq-global', rate: 0, burst: 2048, held: 0, workers: [] },
      { budget: 'rq:app', rate: 0, burst: 512, held: 0, workers: [] },
      { budget: 'rq:secure', rate: 0, burst: 512, held: 0, workers: [] },
    ],
    "admission.token_budgets: the connection caps and the queues' places, nothing held",
  );
  t.ok(tokenMessages.from_workers >= tokenMessages.to_workers, `every grant answers an ask (${tokenMessages.from_workers} from, ${tokenMessages.to_workers} to)`);
  // The window budgets: each route's retry budget at the defaults (floor 30 a 10 s window, ratio 10 %).
  t.same(
    windowBudgets.map((b) => ({ budget: b.budget, base: b.base, ratio_percent: b.ratio_percent, window_ms: b.window_ms })),
    [
      { budget: 'retry:app', base: 30, ratio_percent: 10, window_ms: 10_000 },
      { budget: 'retry:secure', base: 30, ratio_percent: 10, window_ms: 10_000 },
    ],
    'admission.window_budgets: one retry budget per route',
  );
  const worker = admission.workers[0];
  t.type(worker?.pid, 'number', 'the worker entry names its process');
  // The in-flight limits are the node's (the supervisor's lease ledger): global 4096 and, the
  // default per_upstream_inflight_limit 2048 being below it, one budget per pool, and the default
  // per_backend_inflight_limit 512 being below both, one per backend; blocks are a quarter of the
  // one worker's even share; whatever is granted is the one worker's, the rest free.
  t.same(
    leases.map((l) => ({ key: l.key, limit: l.limit, block: l.block, contended: l.contended, workers: l.workers.map((w) => w.worker), conserved: l.granted + l.free === l.limit && l.granted === l.workers[0]?.granted })),
    [
      { key: 'backend:app/a', limit: 512, block: 128, contended: false, workers: [0], conserved: true },
      { key: 'backend:secure/s', limit: 512, block: 128, contended: false, workers: [0], conserved: true },
      { key: 'global', limit: 4096, block: 1024, contended: false, workers: [0], conserved: true },
      { key: 'upstream:app', limit: 2048, block: 512, contended: false, workers: [0], conserved: true },
      { key: 'upstream:secure', limit: 2048, block: 512, contended: false, workers: [0], conserved: true },
    ],
    'admission.leases: the node ledger\'s budgets, each granted to the one worker or free',
  );
  for (const l of leases) t.ok(l.granted >= l.block && (l.workers[0]?.waiting ?? -1) === 0 && (l.workers[0]?.in_use ?? -1) <= l.granted, `${l.key}: the worker holds at least a block (${l.granted} granted, ${l.workers[0]?.in_use} in use), nothing waits`);
  t.ok(leaseMessages.from_workers >= 1 && leaseMessages.to_workers >= 1, `admission.lease_messages: the worker asked and was answered (${leaseMessages.from_workers} from, ${leaseMessages.to_workers} to)`);
  // The adaptive limit, its range, node_inflight and brownout at the top are the node's (the
  // supervisor's one limit and state, limits/node-admission.ts); the worker's entry shows what it
  // last heard of them. Nothing is proxied here: nothing in flight on the node.
  t.same(admission, {
    adaptive_enabled: true, adaptive_limit: 4096, min_limit: 64, max_limit: 4096, inflight: admission.inflight, node_inflight: 0, queued: 0, brownout_active: false, global_inflight_limit: 4096,
    workers: [{ worker: 0, pid: worker?.pid, adaptive_limit: 4096, min_limit: 64, max_limit: 4096, inflight: worker?.inflight, queued: 0, queued_by_route: {}, brownout_active: false }],
  }, "admission: the node's figures at the top, the one worker's in its entry");
  t.equal(admission.inflight, worker?.inflight, 'the top-level in-flight count is the sum over the one worker');
  t.ok(Number.isInteger(admission.inflight) && admission.inflight >= 0, 'a count');
  t.same(body['circuit_breakers'], {
    enabled: true,
    backends: [
      { upstream: 'app', backend: 'a', state: 'closed', workers: { closed: 1, open: 0, half_open: 0 }, open_until_unix_ms: null },
      { upstream: 'secure', backend: 's', state: 'closed', workers: { closed: 1, open: 0, half_open: 0 }, open_until_unix_ms: null },
    ],
  }, 'circuit_breakers: each backend of the active generation, the worst state and how many workers see each');
});

t.test('every role against every endpoint', async (t) => {
  const creds: Record<string, { c: Credentials; role: 'none' | 'invalid' | 'viewer' | 'operator' | 'admin' }> = {
    none: { c: {}, role: 'none' },
    invalid: { c: { token: 'not-a-valid-token-at-all-xxxxxxxx' }, role: 'invalid' },
    viewer: { c: { token: TOKENS.viewer }, role: 'viewer' },
    operator: { c: { token: TOKENS.operator }, role: 'operator' },
    admin: { c: { token: TOKENS.admin }, role: 'admin' },
    legacy: { c: { token: TOKENS.legacy }, role: 'admin' },
    mtlsViewer: { c: { cert: readFileSync(mViewer.cert), key: readFileSync(mViewer.key) }, role: 'viewer' },
    mtlsOperator: { c: { cert: readFileSync(mOperator.cert), key: readFileSync(mOperator.key) }, role: 'operator' },
    mtlsAdmin: { c: { cert: readFileSync(mAdmin.cert), key: readFileSync(mAdmin.key) }, role: 'admin' },
    mtlsViewerWithOperatorToken: { c: { cert: readFileSync(mViewer.cert), key: readFileSync(mViewer.key), token: TOKENS.operator }, role: 'operator' },
  };
  // Harmless bodies: each call is authorized or not, but changes nothing (stale or unknown targets).
  // An authorised call gets the exact answer docs/control-api.md gives for that body, checked by
  // status and by the shape of its body: a 500, or a 200 with an error body, fails.
  const gen1 = { generation: 1, status: 'active', rollback_candidate: false, has_bundle: true };
  const plan = { candidate: { generation: Number, config_source: configFile, config_fingerprint: /^hmac-sha256:[0-9a-f]{64}$/ }, candidate_status: 'unchanged', active_generation: 1, rejected_changes: [] };
  const endpoints: [string, string, 'none' | 'viewer' | 'operator' | 'admin', unknown, number, Record<string, unknown>][] = [
    ['GET', '/health', 'none', undefined, 200, { status: 'ok', watchdog: { restart_requested: false, degraded: false } }],
    ['GET', '/ready', 'none', undefined, 200, { status: 'ready', generation: 1 }],
    ['GET', '/admin/runtime', 'viewer', undefined, 200, { generation: 1, readiness: 'ready', config_source: configFile, observability: { contract_version: 'v1' }, workers: { expected: 1, list: [{ index: 0, generation: 1, state: 'serving' }] } }],
    ['GET', '/admin/runtime/history', 'viewer', undefined, 200, { active_generation: 1, retained_generations: [gen1], entries: Array }],
    ['GET', '/admin/runtime/history/1', 'viewer', undefined, 200, { generation: 1, retained_generation: gen1, entries: Array }],
    ['POST', '/admin/runtime/validate', 'operator', {}, 200, plan],
    ['POST', '/admin/runtime/preview', 'operator', { reason: 'matrix' }, 200, plan],
    ['POST', '/admin/runtime/activate', 'operator', { expected_generation: 999999 }, 409, { reason: 'stale_generation', message: String }],
    ['POST', '/admin/runtime/rollback', 'operator', { target_generation: 999999 }, 404, { reason: 'generation_not_retained', message: String }],
    ['POST', '/admin/runtime/reload', 'operator', { expected_generation: 999999 }, 409, { reason: 'stale_generation', message: String }],
    ['POST', '/admin/runtime/reload-certs', 'operator', undefined, 200, { reloaded_listeners: [`127.0.0.1:${lport}`], tls_generation: Number, loaded_at_unix_ms: Number }],
    ['POST', '/admin/runtime/restart', 'admin', undefined, 202, {}],
  ];
  const rank = { none: 0, invalid: 0, viewer: 1, operator: 2, admin: 3 };
  const tlsGenerations: number[] = [];
  let previews = 0;
  for (const [method, p, need, body, status, shape] of endpoints) {
    for (const [name, { c, role }] of Object.entries(creds)) {
      if (p === '/admin/runtime/restart' && role === 'admin') continue; // exercised on its own below
      const r = await call(method, p, c, body);
      const label = `${name} ${method} ${p} → ${r.status} ${String(r.body['reason'] ?? '')}`;
      if (need !== 'none' && role === 'none') t.same([r.status, r.body['reason']], [401, 'missing_authentication'], label);
      else if (need !== 'none' && role === 'invalid') t.same([r.status, r.body['reason']], [401, 'invalid_bearer_token'], label);
      else if (rank[role] < rank[need]) t.same([r.status, r.body['reason']], [403, 'insufficient_role'], label);
      else {
        t.match(r, { status, body: shape }, label);
        if (p.endsWith('/reload-certs')) tlsGenerations.push(r.body['tls_generation'] as number);
        if (p.endsWith('/preview')) previews++;
      }
    }
  }
  // Effects an authorised call must have: each certificate reload is one more TLS generation, and
  // each preview one more history record.
  const first = tlsGenerations[0] ?? 0;
  t.same(tlsGenerations, tlsGenerations.map((_, i) => first + i), `six reloads, six consecutive TLS generations: ${tlsGenerations.join(',')}`);
  t.equal(tlsGenerations.length, 6, 'operator, admin, legacy and three certificate identities may reload certificates');
  const history = (await call('GET', '/admin/runtime/history', { token: TOKENS.viewer })).body['entries'] as { operation: string; reason?: string; result: string }[];
  t.equal(history.filter((e) => e.operation === 'preview' && e.reason === 'matrix' && e.result === 'recorded').length, previews, `${previews} authorised previews, as many preview records`);
});

t.test('malformed Authorization headers are invalid, not missing; unknown CA certificates carry no role', async (t) => {
  for (const authorization of ['Bearer', 'Basic dXNlcjpwYXNz', `Bearer ${TOKENS.viewer} extra`, 'bearer']) {
    const r = await call('GET', '/admin/runtime', { authorization });
    t.same([r.status, r.body['reason']], [401, 'invalid_bearer_token'], authorization);
  }
  const stranger = await call('GET', '/admin/runtime', { cert: readFileSync(mStranger.cert), key: readFileSync(mStranger.key) });
  t.same([stranger.status, stranger.body['reason']], [401, 'missing_authentication'], 'an unverified certificate grants nothing (optional mTLS)');
});

t.test('request limits: bodies are bounded, unknown fields and bad JSON are 400', async (t) => {
  const big = await call('POST', '/admin/runtime/validate', { token: TOKENS.operator }, { reason: 'x'.repeat(70_000) });
  t.same([big.status, big.body['reason']], [413, 'body_too_large']);
  t.match(await call('POST', '/admin/runtime/validate', { token: TOKENS.operator }, { surprise: 1 }), { status: 400, body: { reason: 'invalid_request' } });
  t.match(await call('POST', '/admin/runtime/rollback', { token: TOKENS.operator }, {}), { status: 400, body: { reason: 'invalid_request', message: /target_generation/ } });
  t.match(await call('POST', '/admin/runtime/activate', { token: TOKENS.operator }, { expected_generation: 'one' }), { status: 400 });
  t.match(await call('GET', '/admin/runtime/nope', { token: TOKENS.admin }), { status: 404, body: { reason: 'not_found' } });
  t.match(await call('DELETE', '/admin/runtime', { token: TOKENS.admin }), { status: 405 });
});

t.test('HTTP/2 is refused: a client offering only h2 fails the handshake', async (t) => {
  const session = http2.connect(`https://localhost:${cport}`, { ca: caPem });
  const [err] = (await once(session, 'error')) as [Error];
  t.match(String((err as { code?: string }).code ?? err.message), /ERR_SSL|ALPN|ECONNRESET|ERR_HTTP2/);
  session.destroy();
});

t.test('flows: validate, preview, activate, history, stale and restart-required 409, invalid 400, failed_prepare 500, rollback', async (t) => {
  const op = { token: TOKENS.operator };
  const v = await call('POST', '/admin/runtime/validate', op, {});
  t.match(v, { status: 200, body: { candidate_status: 'unchanged', active_generation: 1 } });
  const heavier = path.join(dir, 'heavier.yaml');
  writeFileSync(heavier, configText({ weight: 4, appPort: oport }));
  const pv = await call('POST', '/admin/runtime/preview', op, { config_path: heavier, requested_by: 'alice', reason: 'try weights' });
  t.match(pv, { status: 200, body: { candidate_status: 'activatable', diff: { domains: { backends: {} } } } });
  const act = await call('POST', '/admin/runtime/activate', op, { config_path: heavier, expected_generation: 1, requested_by: 'alice', reason: 'weights' });
  t.match(act, { status: 202, body: { generation: 2, status: 'active', config_source: heavier } });
  t.match(act.body['history_entry'], { requested_by: 'deploy-bot', requested_by_note: 'alice' }, 'the record names the token holder; the claimed name is a note');
  t.same(await answers(), allAnswer('other /'), 'generation 2 (app on the other backend) is what serves, on every protocol');
  t.match(await call('POST', '/admin/runtime/activate', op, { expected_generation: 1 }), { status: 409, body: { reason: 'stale_generation' } });
  const moved = path.join(dir, 'moved.yaml');
  writeFileSync(moved, configText({ listenPort: lport + 1 === 65536 ? lport - 1 : lport + 1 }));
  const restart = await call('POST', '/admin/runtime/activate', op, { config_path: moved });
  t.match(restart, { status: 409, body: { reason: 'restart_required', plan: { rejected_changes: [{ activation: 'restart_required' }] } } });
  const broken = path.join(dir, 'broken.yaml');
  writeFileSync(broken, 'listen: { tls: { cert: x } }\nupstream: {}\n');
  t.match(await call('POST', '/admin/runtime/activate', op, { config_path: broken }), { status: 400, body: { reason: 'invalid_config', plan: { errors: [{ code: 'EDGE_CONFIG_TLS_PARTIAL_PAIR' }] } } });
  const weak = path.join(dir, 'weak.yaml');
  writeFileSync(weak, configText({ extraUpstream: `  weak:\n    route: { path_prefix: /weak }\n    tls: { client_certificate_ref: { ref: "file://${path.join(dir, 'weak.crt')}" }, client_key_ref: { ref: "file://${path.join(dir, 'weak.key')}" } }\n    backends: [{ id: w, address: "https://127.0.0.1:${bport}" }]` }));
  const failed = await call('POST', '/admin/runtime/activate', op, { config_path: weak });
  t.match(failed, { status: 500, body: { reason: 'prepare_failed', generation: 3, message: /TLS material cannot be used/ } });
  const h = await call('GET', '/admin/runtime/history', { token: TOKENS.viewer });
  t.match(h.body, { active_generation: 2, retained_generations: [{ generation: 3, status: 'failed_prepare', has_bundle: false, rollback_candidate: false, note: /TLS material cannot be used/ }, { generation: 2, status: 'active' }, { generation: 1, status: 'previous', rollback_candidate: true }] });
  t.match(await call('GET', '/admin/runtime/history/3', { token: TOKENS.viewer }), { status: 200, body: { generation: 3, retained_generation: { status: 'failed_prepare' } } });
  t.match(await call('GET', '/admin/runtime/history/77', { token: TOKENS.viewer }), { status: 404 });
  t.same(await answers(), allAnswer('other /'), 'after the stale, restart-required, invalid and failed activations generation 2 still serves, on every protocol');
  // Same-path secret rotation: the content behind an unchanged file:// reference changed. The
  // source itself moves app back to the first backend, so that generations 4 and 2 are told apart.
  writeFileSync(secret, readFileSync(upstreamClient2.cert));
  writeFileSync(secretKey, readFileSync(upstreamClient2.key));
  writeFileSync(heavier, configText({ weight: 4 }));
  const rotated = await call('POST', '/admin/runtime/activate', op, { requested_by: 'cert-bot' });
  t.match(rotated, { status: 202, body: { generation: 4, diff: { backend_policies: [{ upstream: 'secure', secret_material_changed: true }] } } });
  t.same(await answers(), allAnswer('backend /'), 'generation 4 serves, on every protocol');
  t.match(await call('POST', '/admin/runtime/rollback', op, { target_generation: 1, expected_active_generation: 2 }), { status: 409, body: { reason: 'stale_generation' } });
  t.match(await call('POST', '/admin/runtime/rollback', op, { target_generation: 3 }), { status: 409, body: { reason: 'not_rollback_candidate' } });
  t.match(await call('POST', '/admin/runtime/rollback', op, { target_generation: 42 }), { status: 404 });
  t.same(await answers(), allAnswer('backend /'), 'refused rollbacks leave generation 4 serving, on every protocol');
  const rb = await call('POST', '/admin/runtime/rollback', op, { target_generation: 2, expected_active_generation: 4, requested_by: 'oncall', reason: 'undo rotation' });
  t.match(rb, { status: 202, body: { generation: 2, status: 'active' } });
  t.same(await answers(), allAnswer('other /'), 'the rollback to generation 2 is what serves, on every protocol');
  t.match((await call('GET', '/admin/runtime/history', { token: TOKENS.viewer })).body, { active_generation: 2, retained_generations: [{ generation: 4, status: 'rolled_back' }] });
});

t.test('an unresolvable upstream secret: 400, and secret_resolution_failed / upstream_mtls_material_invalid audited', async (t) => {
  const missing = path.join(dir, 'missing-secret.yaml');
  writeFileSync(missing, configText({ extraUpstream: `  missing:\n    route: { path_prefix: /missing }\n    tls: { client_certificate_ref: { ref: "file://${path.join(dir, 'absent.crt')}" }, client_key_ref: { ref: "file://${path.join(dir, 'absent.key')}" } }\n    backends: [{ id: m, address: "https://127.0.0.1:${bport}" }]` }));
  const r = await call('POST', '/admin/runtime/activate', { token: TOKENS.operator }, { config_path: missing });
  t.match(r, { status: 400, body: { reason: 'invalid_config', plan: { errors: [{ code: 'EDGE_CONFIG_SECRET_UNREADABLE', path: 'upstream.missing.tls.client_certificate_ref' }] } } });
  t.match(await served.waitFor((e) => e['audit'] === true && e['action'] === 'secret_resolution_failed'), { event_type: 'material', result: 'failed', target: /^upstream\.missing\.tls\.client_(certificate|key)_ref$/, reason: 'EDGE_CONFIG_SECRET_UNREADABLE' });
  t.match(await served.waitFor((e) => e['audit'] === true && e['action'] === 'upstream_mtls_material_invalid'), { result: 'failed' });
});

t.test('audit events: every stable field, attempt/result correlated, no credentials anywhere in the log', async (t) => {
  const events = auditEvents(served);
  t.ok(events.length > 100, `${events.length} audit events`);
  // Every event, every stable field with its type, nothing else: one check, every deviation listed.
  t.same(auditSchemaErrors(events).slice(0, 20), [], `all ${events.length} audit events match the v1 event schema`);
  t.equal(new Set(events.map((e) => e['event_id'])).size, events.length, 'event ids are unique');
  const result = events.find((e) => e['event_type'] === 'operation_result' && e['action'] === 'activate' && e['generation'] === 2);
  t.ok(result, 'the activation of generation 2 has a result event');
  const attempt = events.find((e) => e['event_id'] === result?.['attempt_event_id']);
  t.match(attempt, { event_type: 'operation_attempt', action: 'activate', result: 'attempted', actor: { id: 'deploy-bot', roles: ['operator'], requested_by_note: 'alice' }, authn: 'bearer', peer_addr: '127.0.0.1', schema_version: 'v1' });
  t.match(result, { result: 'succeeded', actor: { id: 'deploy-bot' }, request_id: attempt?.['request_id'] });
  t.ok(events.some((e) => e['event_type'] === 'authentication' && e['result'] === 'denied' && e['reason'] === 'invalid_bearer_token'));
  t.ok(events.some((e) => e['event_type'] === 'authorization' && e['result'] === 'denied' && e['reason'] === 'insufficient_role' && (e['actor'] as { id: string }).id === 'grafana'));
  t.ok(events.some((e) => e['authn'] === 'mtls' && (e['actor'] as { id?: string } | null)?.id === 'carol'), 'client-certificate identity');
  t.ok(events.some((e) => e['action'] === 'upstream_mtls_material_changed' && e['target'] === 'upstream.secure'));
  t.ok(events.some((e) => e['action'] === 'cert_reload_applied' && e['result'] === 'succeeded'));
  t.ok(events.some((e) => e['action'] === 'rollback' && e['result'] === 'succeeded' && e['generation'] === 2));
  const log = served.text();
  for (const token of Object.values(TOKENS)) t.notOk(log.includes(token), `the log never contains a token (${token.slice(0, 6)}…)`);
  t.notOk(log.includes('BEGIN PRIVATE KEY'), 'nor key material');
});

t.test('metrics endpoint: configured path only; promtool accepts the exposition', async (t) => {
  const get = (p: string): Promise<{ status: number; text: string }> =>
    new Promise((resolve, reject) => {
      http.get({ host: '127.0.0.1', port: mport, path: p }, (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
      }).on('error', reject);
    });
  t.equal((await get('/other')).status, 404);
  const m = await get('/metrics');
  t.equal(m.status, 200);
  t.match(m.text, /^svc_runtime_active_generation 2$/m);
  // Counters against what this file did, counted from the answers it got (every call goes through `call`).
  const activations = ['/admin/runtime/activate', '/admin/runtime/reload'];
  t.equal(metricValue(m.text, 'svc_runtime_activation_total', { result: 'success', reason: 'activated' }), answered('POST', activations, 202), 'one success per 202 answered by activate and reload');
  t.equal(metricValue(m.text, 'svc_runtime_activation_total', { result: 'rejected', reason: 'stale_generation' }), answered('POST', activations, 409, 'stale_generation'), 'one rejection per 409 stale_generation');
  t.equal(metricValue(m.text, 'svc_control_plane_cert_reload_total', { result: 'success', reason: 'reloaded' }), answered('POST', ['/admin/runtime/reload-certs'], 200), 'one success per 200 answered by reload-certs');
  // Worker metrics merged in: the proxied requests this test makes are each counted once.
  const before = metricValue(m.text, 'svc_requests_total');
  const proxied = 5;
  for (let i = 0; i < proxied; i++) t.match((await run('curl', ['-sS', '--cacert', ca.cert, '--resolve', `localhost:${lport}:127.0.0.1`, `https://localhost:${lport}/counted/${i}`])).stdout, new RegExp(`^(backend|other) /counted/${i}$`)); // which backend is not the point here
  let after = before;
  // The worker counts a request when its response ends, which may be just after the client read it: poll, bounded.
  for (let i = 0; i < 50 && after < before + proxied; i++) {
    after = metricValue(await scrape(mport), 'svc_requests_total');
    if (after < before + proxied) await new Promise((r) => setTimeout(r, 100));
  }
  t.equal(after - before, proxied, `svc_requests_total grew by the ${proxied} requests made (${before} → ${after})`);
  const promtool = toolPath('promtool');
  if (promtool === undefined) return void t.fail('promtool missing: install the Debian package prometheus');
  const file = path.join(dir, 'metrics.txt');
  writeFileSync(file, m.text);
  const check = await run('sh', ['-c', `${promtool} check metrics < ${file}`]).then(
    (r) => ({ code: 0, out: r.stdout + r.stderr }),
    (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? 1, out: `${e.stdout ?? ''}${e.stderr ?? ''}` }),
  );
  // promtool also lints naming conventions, and some names are the specification's own (counters
  // without `_total`, a `days` unit): those lint lines are accepted; anything else (a parse error,
  // a duplicate, a malformed line) fails.
  const lint = /^svc_[a-z0-9_]+ (counter metrics should have "_total" suffix|use base unit "[a-z]+" instead of "[a-z]+"|non-histogram and non-summary metrics should not have "_count" suffix|metric names should not contain abbreviated units)$/;
  const errors = check.out.split('\n').map((l) => l.trim()).filter((l) => l.length > 0 && !lint.test(l));
  t.same(errors, [], `promtool check metrics: ${check.out.slice(0, 400)}`);
});

t.test('the control API negotiates HTTP/1.1 over TLS', async (t) => {
  const s = tls.connect({ host: '127.0.0.1', port: cport, servername: 'localhost', ca: caPem, ALPNProtocols: ['h2', 'http/1.1'] });
  await once(s, 'secureConnect');
  t.equal(s.alpnProtocol, 'http/1.1', 'h2 offered first, http/1.1 chosen');
  s.end();
});

t.test('restart (admin): 202, /ready 503 while draining, then ready again on the same generation', async (t) => {
  const r = await call('POST', '/admin/runtime/restart', { token: TOKENS.admin });
  t.match(r, { status: 202, body: { status: 'draining' } });
  t.match(await call('POST', '/admin/runtime/restart', { token: TOKENS.admin }), { status: 409, body: { reason: 'restart_in_progress' } });
  t.equal((await call('GET', '/ready')).status, 503);
  let ready = 0;
  for (let i = 0; i < 120 && ready !== 200; i++) {
    ready = (await call('GET', '/ready')).status;
    if (ready !== 200) await new Promise((res) => setTimeout(res, 250)); // the restart runs in other processes: poll, bounded
  }
  t.equal(ready, 200);
  t.match(await call('GET', '/admin/runtime', { token: TOKENS.viewer }), { body: { generation: 2, readiness: 'ready', watchdog: { restart_requested: false } } });
  t.match((await run('curl', ['-sS', '--cacert', ca.cert, '--resolve', `localhost:${lport}:127.0.0.1`, `https://localhost:${lport}/after-restart`])).stdout, /^other \/after-restart$/);
  t.same(await answers(), allAnswer('other /'), 'the re-forked workers serve generation 2, on every protocol');
});

t.test('reload: the edited configuration source takes effect; a rejected reload leaves traffic where it was', async (t) => {
  const source = (await call('GET', '/admin/runtime', { token: TOKENS.viewer })).body['config_source'] as string;
  t.equal(source, path.join(dir, 'heavier.yaml'), 'the source of generation 2, restored by the rollback');
  t.same(await answers(), allAnswer('other /'), 'before: generation 2 serves');
  writeFileSync(source, configText({ appPort: bport }));
  const r = await call('POST', '/admin/runtime/reload', { token: TOKENS.operator }, {});
  t.match(r, { status: 202, body: { status: 'active', config_source: source } });
  t.same(await answers(), allAnswer('backend /'), `the reloaded generation ${String(r.body['generation'])} serves, on every protocol`);
  writeFileSync(source, 'listen: { tls: { cert: x } }\nupstream: {}\n');
  t.match(await call('POST', '/admin/runtime/reload', { token: TOKENS.operator }, {}), { status: 400, body: { reason: 'invalid_config' } });
  t.match(await call('GET', '/admin/runtime', { token: TOKENS.viewer }), { body: { generation: r.body['generation'] } });
  t.same(await answers(), allAnswer('backend /'), 'the rejected reload changed nothing that serves');
});

t.test('SIGHUP reloads the active configuration source: traffic moves; a rejected SIGHUP leaves it where it was', async (t) => {
  const source = (await call('GET', '/admin/runtime', { token: TOKENS.viewer })).body['config_source'] as string;
  // Twice, to the other backend and back: traffic must follow each signal, not stay where one
  // generation (the one the restart above handed the workers, say) left it.
  let next = 0;
  for (const [appPort, body] of [[oport, 'other /'], [bport, 'backend /']] as const) {
    writeFileSync(source, configText({ appPort }));
    // Generation numbers are never reused (failed and rolled-back ones included): ask for the next.
    next = ((await call('POST', '/admin/runtime/validate', { token: TOKENS.operator }, {})).body['candidate'] as { generation: number }).generation;
    served.proc.kill('SIGHUP');
    const line = await served.waitFor((l) => l['msg'] === 'SIGHUP reload' && l['generation'] === next);
    t.match(line, { status: 202, generation: next });
    t.match((await call('GET', '/admin/runtime/history', { token: TOKENS.viewer })).body, { active_generation: next, entries: [{ operation: 'reload', requested_by: 'SIGHUP', result: 'succeeded' }] });
    t.same(await answers(), allAnswer(body), `generation ${next} from the edited source serves, on every protocol`);
  }
  writeFileSync(source, 'listen: { tls: { cert: x } }\nupstream: {}\n');
  served.proc.kill('SIGHUP');
  const rejected = await served.waitFor((l) => String(l['msg']).startsWith('SIGHUP reload rejected'));
  t.equal(({ 50: 'error' } as Record<string, string>)[String(rejected['level'])] ?? rejected['level'], 'error', 'a rejected SIGHUP is logged at error (pino number or label)');
  t.match(rejected, { status: 400, reason: 'invalid_config', active_generation: next, config_source: source }, 'with its status, reason, active generation and source');
  t.ok((rejected['errors'] as unknown[]).length >= 2, 'with every error line');
  for (const e of rejected['errors'] as Record<string, unknown>[]) t.match(e, { path: /^(listen|upstream)/, code: /^EDGE_CONFIG_/, message: /\w/ }, 'each with its path, code and message');
  t.match(rejected['msg'], /EDGE_CONFIG_/, 'the message itself lists them');
  t.same(await answers(), allAnswer('backend /'), 'the rejected SIGHUP changed nothing that serves');
});

t.test('SIGTERM: serve drains (the request in flight completes, new connections are refused) and exits 0', async (t) => {
  const held = heldRequest(lport, caPem);
  t.equal(await held.started, 'held ', 'a request is in flight: head and first bytes through the proxy');
  const exited = once(served.proc, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  served.proc.kill('SIGTERM');
  t.equal(await refusedWithin(lport, 30_000), 'ECONNREFUSED', 'after SIGTERM the listener refuses new connections');
  t.equal(served.proc.exitCode, null, 'and serve is still running: the request in flight holds the drain open');
  release();
  t.same(await held.done, { status: 200, body: 'held released' }, 'the request in flight completes after SIGTERM');
  t.same(await exited, [0, null], 'serve exits by itself with code 0, not by a signal');
});
