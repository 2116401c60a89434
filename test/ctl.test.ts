// `edge-proxy ctl` end to end: the real binary (packages/cli/bin/edge-proxy) as a child process
// against a real `edge-proxy serve`. Every exit status from a real answer (0, 1 unreachable /
// timeout / usage / oversized answer, 2 invalid, 3 stale, 4 token and role, 5 not retained and
// unknown route, 6 a failed certificate reload), the JSON on stdout, the one stderr line with
// every configuration error, `-c FILE` resolution (wildcard address, pinned certificate, reload
// path), the environment fallbacks, mTLS, and that no token is ever printed.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { formatIssue } from '@edge-proxy/config';
import type { ConfigIssue } from '@edge-proxy/config';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';
import { CTL_EXIT, MAX_RESPONSE_BYTES } from '../packages/cli/src/index.ts';

const root = path.resolve(import.meta.dirname, '..');
const bin = path.join(root, 'packages/cli/bin/edge-proxy');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-ctl-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
// The control API presents its own certificate (a copy the certificate-reload test deletes).
const apiCert = path.join(dir, 'api.crt');
const apiKey = path.join(dir, 'api.key');
copyFileSync(server.cert, apiCert);
copyFileSync(server.key, apiKey);
const clientCa = makeCa(dir, 'client-ca', '/CN=edge-proxy test client CA');
const alice = makeLeaf(dir, 'alice', clientCa, { subject: '/CN=alice/OU=viewer', sans: ['alice'], usage: 'client' });

const TOKENS = { viewer: 'viewer-token-0123456789abcdef', operator: 'operator-token-0123456789abcdef', admin: 'admin-token-0123456789abcdef' };
const tokenFile = (name: string, text: string): string => {
  const f = path.join(dir, `${name}.token`);
  writeFileSync(f, text, { mode: 0o600 });
  return f;
};
const viewerFile = tokenFile('viewer', `${TOKENS.viewer}\n`);
const operatorFile = tokenFile('operator', `${TOKENS.operator}\n`);
const adminFile = tokenFile('admin', TOKENS.admin); // no trailing newline: read as is
const wrongFile = tokenFile('wrong', 'not-a-known-token-0123456789\n');

const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
const RELOAD_PATH = '/admin/runtime/reload-now';

// The backend of the served configuration: the rollout script's smoke request must get a 200.
const backend = http.createServer((_req, res) => res.end('backend'));
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
const appPort = (backend.address() as AddressInfo).port;

function configText(o: { apiAddress?: string; weight?: number; appPort?: number } = {}): string {
  return `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { level: info, format: json }
performance: { worker_threads: 1 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: a, address: "127.0.0.1:${o.appPort ?? appPort}", weight: ${o.weight ?? 1} }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: ${o.apiAddress ?? '127.0.0.1'}
    port: ${cport}
    reload_path: ${RELOAD_PATH}
    tls: { cert: ${apiCert}, key: ${apiKey}, client_auth: { mode: optional, ca_file: ${clientCa.cert} } }
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

const url = `https://127.0.0.1:${cport}`;
/** Every byte ctl printed in this file: no token may be among them. */
let printed = '';

interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** The test's own environment without its EDGE_PROXY_* variables, with `env` on top. */
function cleanEnv(env: Record<string, string>): Record<string, string | undefined> {
  return { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('EDGE_PROXY_'))), ...env };
}

/** Runs `command` in the test's directory to its exit; what it printed is added to `printed`. */
async function run(command: string, args: readonly string[], env: Record<string, string | undefined>): Promise<Run> {
  const proc = spawn(command, args, { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [code] = (await once(proc, 'exit')) as [number | null];
  printed += stdout + stderr;
  return { code, stdout, stderr };
}

/** Runs the real binary; the EDGE_PROXY_* variables of the test's own environment are removed. */
function ctl(args: readonly string[], env: Record<string, string> = {}): Promise<Run> {
  return run(bin, ['ctl', ...args], cleanEnv(env));
}

/** The usual connection options: explicit URL, the CA, a token file. */
const as = (file: string): string[] => ['--url', url, '--ca', ca.cert, '--token-file', file];
const json = (r: Run): Record<string, unknown> => JSON.parse(r.stdout) as Record<string, unknown>;
/** The failure line: exactly one line on stderr. */
function line(t: Test, r: Run): string {
  t.equal(r.stderr.split('\n').filter((l) => l !== '').length, 1, `one stderr line: ${r.stderr}`);
  t.ok(r.stderr.endsWith('\n'));
  return r.stderr.trimEnd();
}

const candidate = (name: string, text: string): string => {
  const f = path.join(dir, name);
  writeFileSync(f, text);
  return f;
};
const good = candidate('good.yaml', configText({ weight: 2 }));
const bad = candidate('bad.yaml', configText().replace(`port: ${lport}`, 'port: 70000').replace('weight: 1', 'weight: -3'));

t.test('status: 0, the snapshot JSON on stdout, nothing on stderr', async (t) => {
  const r = await ctl(['status', ...as(viewerFile)]);
  t.equal(r.code, CTL_EXIT.ok, r.stderr);
  t.equal(r.stderr, '');
  const snap = json(r);
  t.equal(snap['generation'], 1);
  t.equal(snap['readiness'], 'ready');
  t.equal(r.stdout.split('\n').filter((l) => l !== '').length, 1, 'one JSON document on one line');
});

t.test('-c FILE: address (a wildcard means loopback), port, the configured certificate pinned, reload path', async (t) => {
  // The served file itself: no --url, no --ca.
  const r = await ctl(['status', '-c', configFile, '--token-file', viewerFile]);
  t.equal(r.code, CTL_EXIT.ok, r.stderr);
  t.equal(json(r)['generation'], 1);
  // A copy binding 0.0.0.0 (not served): ctl connects to 127.0.0.1 on the same port.
  const wildcard = candidate('wildcard.yaml', configText({ apiAddress: '0.0.0.0' }));
  const w = await ctl(['status', '-c', wildcard, '--token-file', viewerFile]);
  t.equal(w.code, CTL_EXIT.ok, w.stderr);
  // The pin is the configured certificate: with a configuration naming another one, TLS fails.
  const other = makeLeaf(dir, 'other', ca, { sans: ['localhost', '127.0.0.1'] });
  const wrong = candidate('other-cert.yaml', configText().replace(`cert: ${apiCert}`, `cert: ${other.cert}`));
  const p = await ctl(['status', '-c', wrong, '--token-file', viewerFile]);
  t.equal(p.code, CTL_EXIT.unreachable);
  t.match(line(t, p), new RegExp(`^edge-proxy ctl status: - tls_failed: https://127\\.0\\.0\\.1:${cport}: `));
  // --ca replaces the pin with a CA bundle (the real issuer: passes).
  const withCa = await ctl(['status', '-c', wrong, '--ca', ca.cert, '--token-file', viewerFile]);
  t.equal(withCa.code, CTL_EXIT.ok, withCa.stderr);
  // reload goes to the configured reload_path with -c; the default path is not a route of this service.
  const reloadC = await ctl(['reload', '-c', configFile, '--token-file', operatorFile]);
  t.equal(reloadC.code, CTL_EXIT.ok, reloadC.stderr);
  t.equal(json(reloadC)['status'], 'active');
  const reloadUrl = await ctl(['reload', ...as(operatorFile)]);
  t.equal(reloadUrl.code, CTL_EXIT.not_found);
  t.equal(line(t, reloadUrl), 'edge-proxy ctl reload: 404 not_found: no such control API route');
  // An invalid -c file: usage (1), its errors on the line.
  const broken = candidate('broken.yaml', 'observability: { control_api: { port: 0 } }\n');
  const b = await ctl(['status', '-c', broken]);
  t.equal(b.code, CTL_EXIT.usage);
  t.match(line(t, b), /^edge-proxy ctl status: - usage: cannot use -c .*broken\.yaml: invalid configuration; .*observability\.control_api\.port: EDGE_CONFIG_RANGE: /);
});

t.test('environment fallbacks: EDGE_PROXY_URL, EDGE_PROXY_CA, EDGE_PROXY_TOKEN_FILE; options win', async (t) => {
  const env = { EDGE_PROXY_URL: url, EDGE_PROXY_CA: ca.cert, EDGE_PROXY_TOKEN_FILE: viewerFile };
  const r = await ctl(['history'], env);
  t.equal(r.code, CTL_EXIT.ok, r.stderr);
  t.ok(Array.isArray(json(r)['entries']));
  // --token-file beats the environment: the viewer of the environment would be refused a restart,
  // the wrong token of the option is refused as a token.
  const w = await ctl(['history', '--token-file', wrongFile], env);
  t.equal(w.code, CTL_EXIT.denied);
  t.match(line(t, w), /^edge-proxy ctl history: 401 invalid_bearer_token: /);
  // Without a CA the system store does not know the test CA.
  const noCa = await ctl(['history'], { EDGE_PROXY_URL: url, EDGE_PROXY_TOKEN_FILE: viewerFile });
  t.equal(noCa.code, CTL_EXIT.unreachable);
  t.match(line(t, noCa), /^edge-proxy ctl history: - tls_failed: /);
  // No address at all (the default /etc/edge-proxy/config.yaml does not exist here).
  const none = await ctl(['status']);
  t.equal(none.code, CTL_EXIT.usage);
  t.match(line(t, none), /give --url, EDGE_PROXY_URL or -c FILE/);
});

t.test('validate and activate an invalid candidate: 2, every config error on the one line', async (t) => {
  const v = await ctl(['validate', '--config-path', bad, ...as(operatorFile)]);
  t.equal(v.code, CTL_EXIT.invalid);
  const plan = json(v);
  t.equal(plan['candidate_status'], 'invalid');
  const errors = (plan['errors'] as ConfigIssue[]).map(formatIssue);
  t.ok(errors.length >= 2, 'two problems in the file');
  t.equal(line(t, v), `edge-proxy ctl validate: 200 invalid_config: the candidate configuration is invalid; ${errors.join('; ')}`);
  // A relative --config-path is sent absolute (the service has another working directory).
  t.equal((plan['candidate'] as { config_source: string }).config_source, bad);

  const a = await ctl(['activate', '--config-path', 'bad.yaml', '--reason', 'try a bad file', ...as(operatorFile)]);
  t.equal(a.code, CTL_EXIT.invalid);
  const body = json(a);
  t.equal(body['reason'], 'invalid_config');
  t.equal(line(t, a), `edge-proxy ctl activate: 400 invalid_config: the candidate configuration is invalid; ${errors.join('; ')}`);
});

t.test('a stale --expected-generation: 3; the right one activates (0); preview and history', async (t) => {
  const snap = json(await ctl(['status', ...as(viewerFile)]));
  const active = snap['generation'] as number;
  const p = await ctl(['preview', '--config-path', good, '--expected-generation', String(active), '--reason', 'plan', ...as(operatorFile)]);
  t.equal(p.code, CTL_EXIT.ok, p.stderr);
  t.equal(json(p)['candidate_status'], 'activatable');
  const stale = await ctl(['validate', '--config-path', good, '--expected-generation', '77', ...as(operatorFile)]);
  t.equal(stale.code, CTL_EXIT.conflict);
  t.equal(line(t, stale), `edge-proxy ctl validate: 200 stale_generation: expected_generation does not match the active generation; expected_generation: stale_generation: expected generation 77, active is ${active}`);
  const a409 = await ctl(['activate', '--config-path', good, '--expected-generation', '77', ...as(operatorFile)]);
  t.equal(a409.code, CTL_EXIT.conflict);
  t.equal(line(t, a409), `edge-proxy ctl activate: 409 stale_generation: expected_generation does not match the active generation; expected_generation: stale_generation: expected generation 77, active is ${active}`);

  const ok = await ctl(['activate', '--config-path', good, '--expected-generation', String(active), '--reason', 'rollout 42', '--requested-by', 'ctl-test', ...as(operatorFile)]);
  t.equal(ok.code, CTL_EXIT.ok, ok.stderr);
  const activated = json(ok);
  t.equal(activated['status'], 'active');
  t.ok((activated['generation'] as number) > active, 'a new generation');
  const h = await ctl(['history', String(activated['generation']), ...as(viewerFile)]);
  t.equal(h.code, CTL_EXIT.ok, h.stderr);
  const entries = json(h)['entries'] as { operation: string; reason?: string; requested_by: string; requested_by_note?: string }[];
  t.match(entries.find((e) => e.operation === 'activate'), { reason: 'rollout 42', requested_by: 'deploy-bot', requested_by_note: 'ctl-test' });

  const stale2 = await ctl(['rollback', '--to', '1', '--expected-active-generation', String(active), ...as(operatorFile)]);
  t.equal(stale2.code, CTL_EXIT.conflict);
  t.equal(line(t, stale2), `edge-proxy ctl rollback: 409 stale_generation: expected active generation ${active}, active is ${String(activated['generation'])}`);
  const back = await ctl(['rollback', '--to', '1', '--expected-active-generation', String(activated['generation']), '--reason', 'back', ...as(operatorFile)]);
  t.equal(back.code, CTL_EXIT.ok, back.stderr);
  t.equal(json(back)['generation'], 1);
});

t.test('authentication and role: 4', async (t) => {
  // A client certificate (OU=viewer) authenticates without a token: reads pass, an operation does not.
  const mtls = ['--url', url, '--ca', ca.cert, '--cert', alice.cert, '--key', alice.key];
  const [wrong, none, viewer, operator, m, mEnv] = await Promise.all([
    ctl(['status', ...as(wrongFile)]),
    ctl(['status', '--url', url, '--ca', ca.cert]),
    ctl(['restart', ...as(viewerFile)]),
    ctl(['restart', ...as(operatorFile)]),
    ctl(['status', ...mtls]),
    ctl(['activate', '--url', url, '--ca', ca.cert], { EDGE_PROXY_CERT: alice.cert, EDGE_PROXY_KEY: alice.key }),
  ]);
  t.equal(wrong.code, CTL_EXIT.denied);
  t.equal(line(t, wrong), 'edge-proxy ctl status: 401 invalid_bearer_token: authentication required');
  t.equal(none.code, CTL_EXIT.denied);
  t.equal(line(t, none), 'edge-proxy ctl status: 401 missing_authentication: authentication required');
  t.equal(viewer.code, CTL_EXIT.denied);
  t.equal(line(t, viewer), 'edge-proxy ctl restart: 403 insufficient_role: not permitted');
  t.same(json(viewer), { reason: 'insufficient_role', message: 'not permitted' }, 'the error answer on stdout too');
  t.equal(operator.code, CTL_EXIT.denied);
  t.equal(line(t, operator), 'edge-proxy ctl restart: 403 insufficient_role: not permitted');
  t.equal(m.code, CTL_EXIT.ok, m.stderr);
  t.equal(json(m)['readiness'], 'ready');
  t.equal(mEnv.code, CTL_EXIT.denied);
  t.equal(line(t, mEnv), 'edge-proxy ctl activate: 403 insufficient_role: not permitted');
});

t.test('not retained: 5', async (t) => {
  const r = await ctl(['rollback', '--to', '99', ...as(operatorFile)]);
  t.equal(r.code, CTL_EXIT.not_found);
  t.equal(line(t, r), 'edge-proxy ctl rollback: 404 generation_not_retained: generation 99 cannot be restored (generation not retained)');
  const h = await ctl(['history', '99', ...as(viewerFile)]);
  t.equal(h.code, CTL_EXIT.not_found);
  t.match(line(t, h), /^edge-proxy ctl history: 404 generation_not_retained: /);
});

t.test('no answer: 1 (refused, deadline, oversized answer)', async (t) => {
  const closed = await freePort();
  const r = await ctl(['status', '--url', `https://127.0.0.1:${closed}`, '--ca', ca.cert, '--token-file', viewerFile]);
  t.equal(r.code, CTL_EXIT.unreachable);
  t.equal(r.stdout, '');
  t.equal(line(t, r), `edge-proxy ctl status: - unreachable: https://127.0.0.1:${closed}: connect ECONNREFUSED 127.0.0.1:${closed}`);

  // Accepts and never answers (not even the TLS handshake).
  const silent = net.createServer(() => undefined);
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  t.teardown(() => {
    silent.close();
  });
  const sport = (silent.address() as AddressInfo).port;
  const started = Date.now();
  const s = await ctl(['status', '--url', `https://127.0.0.1:${sport}`, '--ca', ca.cert, '--timeout', '300']);
  t.equal(s.code, CTL_EXIT.unreachable);
  t.equal(line(t, s), `edge-proxy ctl status: - timeout: https://127.0.0.1:${sport}: no complete answer before the deadline`);
  t.ok(Date.now() - started < 20_000, 'the deadline ended the call');

  // An answer longer than the cap is not read to its end.
  const big = https.createServer({ cert: readFileSync(server.cert), key: readFileSync(server.key) }, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    const chunk = Buffer.alloc(1024 * 1024, 0x20);
    let sent = 0;
    const more = (): void => {
      while (sent <= MAX_RESPONSE_BYTES + chunk.length) {
        sent += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', more);
      }
      res.end();
    };
    more();
    res.on('error', () => undefined);
  });
  big.listen(0, '127.0.0.1');
  await once(big, 'listening');
  t.teardown(() => {
    big.closeAllConnections();
    big.close();
  });
  const bport = (big.address() as AddressInfo).port;
  const o = await ctl(['status', '--url', `https://127.0.0.1:${bport}`, '--ca', ca.cert]);
  t.equal(o.code, CTL_EXIT.unreachable);
  t.equal(o.stdout, '');
  t.equal(line(t, o), `edge-proxy ctl status: - response_too_large: https://127.0.0.1:${bport}: the answer exceeds ${MAX_RESPONSE_BYTES} bytes`);
});

t.test('usage: 1 with one line', async (t) => {
  const cases: [string[], RegExp][] = [
    [['frobnicate'], /^edge-proxy ctl: Unknown argument: frobnicate/],
    [[], /^edge-proxy ctl: name an operation/],
    [['rollback', '--url', url], /^edge-proxy ctl: Missing required argument: to/],
    [['rollback', '--to', 'two', '--url', url], /^edge-proxy ctl: --to must be a generation number \(a whole number from 1 to 2147483647\) \(see edge-proxy ctl --help\)$/],
    [['status', '--config-path', good, '--url', url], /^edge-proxy ctl: Unknown argument/],
    [['status', '--url', `http://127.0.0.1:${cport}`], /^edge-proxy ctl status: - usage: --url http:\/\/127\.0\.0\.1:\d+: the control API is HTTPS only$/],
    [['status', '--url', url, '--cert', alice.cert], /^edge-proxy ctl status: - usage: --cert and --key go together/],
    [['status', '--url', url, '--token-file', path.join(dir, 'missing.token')], /^edge-proxy ctl status: - usage: cannot read the token file .*missing\.token: no such file$/],
  ];
  // Independent runs: in parallel.
  const runs = await Promise.all(cases.map(([args]) => ctl(args)));
  cases.forEach(([args, expected], i) => {
    const r = runs[i] as Run;
    t.equal(r.code, CTL_EXIT.usage, args.join(' '));
    t.match(line(t, r), expected);
    t.equal(r.stdout, '');
  });
  // A token file with two lines is refused without quoting it.
  const twoLines = tokenFile('two-lines', `${TOKENS.admin}\nsecond-line\n`);
  const r = await ctl(['status', '--url', url, '--ca', ca.cert, '--token-file', twoLines]);
  t.equal(r.code, CTL_EXIT.usage);
  t.match(line(t, r), /must hold one token/);
});

t.test('a failed certificate reload: 6, its errors on the line; then 0 once the files are back', async (t) => {
  const saved = readFileSync(apiCert);
  unlinkSync(apiCert);
  const r = await ctl(['reload-certs', ...as(operatorFile)]);
  t.equal(r.code, CTL_EXIT.server_error);
  const body = json(r);
  t.equal(body['reason'], 'cert_reload_failed');
  const errors = (body['errors'] as ConfigIssue[]).map(formatIssue);
  t.match(errors.join('\n'), /^observability\.control_api\.tls/m);
  t.equal(line(t, r), `edge-proxy ctl reload-certs: 500 cert_reload_failed: certificate material could not be loaded; nothing changed; ${errors.join('; ')}`);
  writeFileSync(apiCert, saved);
  const ok = await ctl(['reload-certs', ...as(operatorFile)]);
  t.equal(ok.code, CTL_EXIT.ok, ok.stderr);
  t.ok(Array.isArray(json(ok)['reloaded_listeners']));
});

t.test('the rollout script of docs/operations.md, as written there', async (t) => {
  const doc = readFileSync(path.join(root, 'docs/operations.md'), 'utf8');
  const block = /### A rollout script\n[\s\S]*?```sh\n([\s\S]*?)```/.exec(doc);
  t.ok(block, 'the script is in the runbook');
  const script = path.join(dir, 'rollout.sh');
  writeFileSync(script, block?.[1] ?? '');
  const env = cleanEnv({
    EDGE_PROXY_BIN: bin,
    CONFIG: configFile,
    EDGE_PROXY_TOKEN_FILE: operatorFile,
    SMOKE_URL: `https://localhost:${lport}/`,
    CURL_CA_BUNDLE: ca.cert,
    CHECKS: '2',
    CHECK_INTERVAL: '1',
  });
  const rollout = (...args: string[]): Promise<Run> => run('sh', [script, ...args], env);
  const generation = async (): Promise<number> => json(await ctl(['status', ...as(viewerFile)]))['generation'] as number;

  // A candidate that serves: activated, checked, kept.
  const before = await generation();
  const ok = await rollout(good, 'weight 2');
  t.equal(ok.code, 0, ok.stderr);
  const after = await generation();
  t.ok(after > before, 'a new generation');
  t.equal(ok.stdout, `rollout: generation ${after} serves ${good}\n`);

  // An invalid candidate: ctl's exit status and line, nothing activated.
  const invalid = await rollout(bad);
  t.equal(invalid.code, CTL_EXIT.invalid);
  t.match(invalid.stderr, /^edge-proxy ctl validate: 200 invalid_config: /);
  t.equal(await generation(), after);

  // A candidate whose backend is gone: activated, the smoke request fails, rolled back.
  const dead = candidate('dead-backend.yaml', configText({ appPort: await freePort() }));
  const back = await rollout(dead, 'moves app to a dead port');
  t.equal(back.code, 10, back.stderr);
  const failed = after + 1;
  t.match(back.stderr, `rollout: generation ${failed} failed its checks; rolling back to ${after}\nrollout: generation ${after} serves again\n`);
  t.equal(await generation(), after);
  const entries = json(await ctl(['history', ...as(viewerFile)]))['entries'] as { operation: string; result: string; target_generation?: number; reason?: string }[];
  t.match(entries[0], { operation: 'rollback', result: 'succeeded', target_generation: after, reason: 'automatic rollback: moves app to a dead port' });
});

t.test('restart as admin: 0 with the restart id', async (t) => {
  const r = await ctl(['restart', ...as(adminFile)]);
  t.equal(r.code, CTL_EXIT.ok, r.stderr);
  t.match(json(r), { status: 'draining', restart_id: String });
});

t.test('no token was ever printed', async (t) => {
  t.ok(printed.length > 1000, 'the runs printed answers');
  for (const token of Object.values(TOKENS)) t.notOk(printed.includes(token), 'token absent from stdout and stderr');
  t.notOk(printed.includes('not-a-known-token'), 'a wrong token is not echoed either');
});
