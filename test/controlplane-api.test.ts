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
import { api, auditEvents, serve } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import type { Credentials } from './support/serve.ts';

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

const backend = http.createServer((req, res) => res.end(`backend ${req.url}`));
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
const call = (method: string, p: string, creds: Credentials = {}, body?: unknown) => api(cport, caPem, method, p, creds, body);

t.test('the snapshot reports backend health from the workers', async (t) => {
  let summary: { healthy: number; unhealthy: number; reported_by_workers: number } | undefined;
  for (let i = 0; i < 20 && (summary?.reported_by_workers ?? 0) === 0; i++) {
    const body = (await call('GET', '/admin/runtime', { token: TOKENS.viewer })).body as { observability: { backend_health_summary: typeof summary } };
    summary = body.observability.backend_health_summary;
    if ((summary?.reported_by_workers ?? 0) === 0) await new Promise((r) => setTimeout(r, 250)); // heartbeats come once a second from another process
  }
  t.same(summary, { healthy: 2, unhealthy: 0, reported_by_workers: 1 }, 'two backends, both eligible, as the one worker sees them');
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
  const endpoints: [string, string, 'none' | 'viewer' | 'operator' | 'admin', unknown][] = [
    ['GET', '/health', 'none', undefined],
    ['GET', '/ready', 'none', undefined],
    ['GET', '/admin/runtime', 'viewer', undefined],
    ['GET', '/admin/runtime/history', 'viewer', undefined],
    ['GET', '/admin/runtime/history/1', 'viewer', undefined],
    ['POST', '/admin/runtime/validate', 'operator', {}],
    ['POST', '/admin/runtime/preview', 'operator', { reason: 'matrix' }],
    ['POST', '/admin/runtime/activate', 'operator', { expected_generation: 999999 }],
    ['POST', '/admin/runtime/rollback', 'operator', { target_generation: 999999 }],
    ['POST', '/admin/runtime/reload', 'operator', { expected_generation: 999999 }],
    ['POST', '/admin/runtime/reload-certs', 'operator', undefined],
    ['POST', '/admin/runtime/restart', 'admin', undefined],
  ];
  const rank = { none: 0, invalid: 0, viewer: 1, operator: 2, admin: 3 };
  for (const [method, p, need, body] of endpoints) {
    for (const [name, { c, role }] of Object.entries(creds)) {
      if (p === '/admin/runtime/restart' && role === 'admin') continue; // exercised on its own below
      const r = await call(method, p, c, body);
      const label = `${name} ${method} ${p} → ${r.status} ${String(r.body['reason'] ?? '')}`;
      if (need === 'none') t.equal(r.status, 200, label);
      else if (role === 'none') t.same([r.status, r.body['reason']], [401, 'missing_authentication'], label);
      else if (role === 'invalid') t.same([r.status, r.body['reason']], [401, 'invalid_bearer_token'], label);
      else if (rank[role] < rank[need]) t.same([r.status, r.body['reason']], [403, 'insufficient_role'], label);
      else t.ok(r.status !== 401 && r.status !== 403, label);
    }
  }
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
  t.match(r, { status: 400, body: { reason: 'invalid_config', plan: { errors: [{ code: 'EDGE_CONFIG_SECRET_UNREADABLE', path: 'upstream.missing.tls.client_certificate' }] } } });
  t.match(await served.waitFor((e) => e['audit'] === true && e['action'] === 'secret_resolution_failed'), { event_type: 'material', result: 'failed', target: /^upstream\.missing\.tls\.client_(certificate|key)$/, reason: 'EDGE_CONFIG_SECRET_UNREADABLE' });
  t.match(await served.waitFor((e) => e['audit'] === true && e['action'] === 'upstream_mtls_material_invalid'), { result: 'failed' });
});

t.test('audit events: every stable field, attempt/result correlated, no credentials anywhere in the log', async (t) => {
  const events = auditEvents(served);
  const fields = ['schema_version', 'event_id', 'event_type', 'time_unix_ms', 'request_id', 'trace_id', 'span_id', 'listener', 'actor', 'action', 'target', 'generation', 'result', 'reason', 'failure_class', 'peer_addr', 'authn'];
  t.ok(events.length > 100, `${events.length} audit events`);
  for (const e of events.slice(0, 50)) for (const f of fields) t.ok(f in e, `${String(e['action'])} has ${f}`);
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
  t.match(m.text, /^svc_runtime_activation_total\{result="success",reason="activated"\} \d+$/m);
  t.match(m.text, /^svc_control_plane_cert_reload_total\{result="success",reason="reloaded"\} \d+$/m);
  t.match(m.text, /^svc_requests_total \d+$/m, 'worker metrics merged in');
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
  t.match(await served.waitFor((l) => l['msg'] === 'SIGHUP reload' && l['status'] !== 202), { status: 400, reason: 'invalid_config', generation: next });
  t.same(await answers(), allAnswer('backend /'), 'the rejected SIGHUP changed nothing that serves');
});

t.test('SIGTERM: serve drains and exits 0', async (t) => {
  t.equal(await served.stop(), 0);
});
