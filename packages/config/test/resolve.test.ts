// Resolution against real files: certificates made by openssl in a temp dir, secret files,
// PEM and SAN checks, fingerprints, and the guarantee that no secret byte reaches any output.
import t from 'tap';
import { createHash, createHmac } from 'node:crypto';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { dump } from 'js-yaml';
import { diffConfigs, formatIssue, inactiveFeatures, loadConfigFile, loadConfigText, parseConfigText, publicSecretMaterial, resolveConfig, validateConfig } from '../src/index.ts';
import type { ConfigIssue } from '../src/index.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-config-resolve-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const api = makeLeaf(dir, 'api', ca, { sans: ['api.example.com'] });
const other = makeLeaf(dir, 'other', ca, { sans: ['other.example.com'] });
const client = makeLeaf(dir, 'client', ca, { sans: ['edge-proxy'], usage: 'client' });
const client2 = makeLeaf(dir, 'client2', ca, { sans: ['edge-proxy'], usage: 'client' });
mkdirSync(path.join(dir, 'secrets'));
mkdirSync(path.join(dir, 'ca.d'));
writeFileSync(path.join(dir, 'ca.d', 'one.pem'), readFileSync(ca.cert));
const TOKEN = 'operator-token-0123456789-SECRET';
const JWT_SECRET = 'jwt-hmac-secret-XYZ-987654321';
writeFileSync(path.join(dir, 'secrets', 'operator.token'), `${TOKEN}\n`);
writeFileSync(path.join(dir, 'secrets', 'client.crt'), readFileSync(client.cert));
writeFileSync(path.join(dir, 'secrets', 'client.key'), readFileSync(client.key));
writeFileSync(path.join(dir, 'secrets', 'empty.token'), '');
writeFileSync(path.join(dir, 'secrets', 'garbage.pem'), '-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n');

type Doc = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

function doc(): Doc {
  return {
    listen: {
      address: '127.0.0.1',
      port: 9889,
      tls: { cert: server.cert, key: server.key, certificates: [{ server_name: 'api.example.com', cert: api.cert, key: api.key }] },
    },
    secrets: { default_provider: 'local', providers: { local: { kind: 'file', base_dir: 'secrets' } } },
    upstream: {
      api: {
        route: { path_prefix: '/' },
        backends: [{ id: 'a1', address: 'https://127.0.0.1:8443' }],
        tls: { ca_file: ca.cert, client_certificate_ref: { ref: 'file://client.crt' }, client_key_ref: { ref: 'file://client.key' } },
      },
    },
    // A literal secret in a store block (request JWT auth, the obvious carrier, is refused until built).
    resilience: { quota: { backend: 'redis', redis: { address: '127.0.0.1:6379', auth_token_ref: { ref: `literal:${JWT_SECRET}` } } } },
    observability: { control_api: { auth: { bearer_tokens: [{ token_ref: { ref: 'file://operator.token' }, role: 'operator', actor_id: 'ops' }] } } },
  };
}

async function load(d: Doc) {
  return loadConfigText(dump(d), dir);
}

function codes(issues: ConfigIssue[]): string[] {
  return issues.map((i) => `${i.path} ${i.code}`);
}

t.test('a realistic config resolves with fingerprints and expiry', async (t) => {
  const r = await load(doc());
  t.ok(r.ok, r.ok ? 'resolved' : JSON.stringify(r.issues));
  if (!r.ok) return;
  const m = r.value.material;
  const l = m.listeners['127.0.0.1:9889'];
  t.ok(l?.default, 'default identity');
  t.equal(l?.certificates[0]?.server_name, 'api.example.com');
  t.match(m.secrets['observability.control_api.auth.bearer_tokens[0].token']?.fingerprint, /^hmac-sha256:[0-9a-f]{64}$/);
  t.equal(m.secrets['observability.control_api.auth.bearer_tokens[0].token']?.value, TOKEN, 'trailing newline of a token file is dropped');
  t.ok((m.secrets['upstream.api.tls.client_certificate']?.not_after_unix_seconds ?? 0) > Date.now() / 1000, 'client certificate expiry');
  t.ok(m.upstream_ca['api']?.pems.length === 1, 'CA trust');
  t.ok(m.control_api.identity, 'control API falls back to the first listener identity');
  t.equal(r.value.config.upstream['api']?.tls.client_key_slot, 'upstream.api.tls.client_key');
});

t.test('ca_dir trusts every *.pem in the directory', async (t) => {
  const d = doc();
  d.upstream.api.tls = { ca_dir: path.join(dir, 'ca.d') };
  const r = await load(d);
  t.ok(r.ok && r.value.material.upstream_ca['api']?.pems.length === 1);
});

const failures: { name: string; change: (d: Doc) => void; code: string; path: string }[] = [
  { name: 'server_name not covered by SANs', change: (d) => (d.listen.tls.certificates[0].cert = other.cert, d.listen.tls.certificates[0].key = other.key), code: 'EDGE_CONFIG_TLS_SAN_MISMATCH', path: 'listen.tls.certificates[0].server_name' },
  { name: 'unreadable certificate', change: (d) => (d.listen.tls.cert = path.join(dir, 'missing.crt')), code: 'EDGE_CONFIG_TLS_UNREADABLE', path: 'listen.tls.cert' },
  { name: 'certificate file without PEM', change: (d) => (d.listen.tls.cert = path.join(dir, 'secrets', 'operator.token')), code: 'EDGE_CONFIG_TLS_INVALID_MATERIAL', path: 'listen.tls.cert' },
  { name: 'key of another certificate', change: (d) => (d.listen.tls.key = other.key), code: 'EDGE_CONFIG_TLS_KEY_MISMATCH', path: 'listen.tls.key' },
  { name: 'unreadable CA file', change: (d) => (d.upstream.api.tls.ca_file = path.join(dir, 'nope.pem')), code: 'EDGE_CONFIG_TLS_UNREADABLE', path: 'upstream.api.tls.ca_file' },
  { name: 'missing secret file', change: (d) => (d.upstream.api.tls.client_key_ref = { ref: 'file://absent.key' }), code: 'EDGE_CONFIG_SECRET_UNREADABLE', path: 'upstream.api.tls.client_key_ref' },
  { name: 'empty secret file', change: (d) => (d.observability.control_api.auth.bearer_tokens[0].token_ref = { ref: 'file://empty.token' }), code: 'EmptySecret', path: 'observability.control_api.auth.bearer_tokens[0].token_ref' },
  { name: 'malformed PEM certificate', change: (d) => (d.upstream.api.tls.client_certificate_ref = { ref: 'file://garbage.pem' }), code: 'MalformedPemCertificate', path: 'upstream.api.tls.client_certificate_ref' },
  { name: 'malformed PEM key', change: (d) => (d.upstream.api.tls.client_key_ref = { ref: 'file://operator.token' }), code: 'MalformedPemPrivateKey', path: 'upstream.api.tls.client_key_ref' },
  { name: 'client key of another certificate', change: (d) => (d.upstream.api.tls.client_key_ref = { ref: `file://${client2.key}` }), code: 'EDGE_CONFIG_SECRET_KEY_MISMATCH', path: 'upstream.api.tls.client_key_ref' },
  { name: 'client certificate without key', change: (d) => delete d.upstream.api.tls.client_key_ref, code: 'EDGE_CONFIG_TLS_PARTIAL_PAIR', path: 'upstream.api.tls' },
];

for (const f of failures) {
  t.test(f.name, async (t) => {
    const d = doc();
    f.change(d);
    const r = await load(d);
    t.notOk(r.ok, 'rejected');
    if (!r.ok) t.ok(r.issues.some((i) => i.code === f.code && i.path === f.path), `${f.code} at ${f.path}; got ${JSON.stringify(codes(r.issues))}`);
  });
}

t.test('file errors: missing config, YAML syntax and duplicate keys', async (t) => {
  const missing = await loadConfigFile(path.join(dir, 'no-such.yaml'));
  t.equal(missing.ok ? '' : missing.issues[0]?.code, 'EDGE_CONFIG_READ');
  const bad = await loadConfigText('listen: [unclosed\n', dir);
  t.equal(bad.ok ? '' : bad.issues[0]?.code, 'EDGE_CONFIG_YAML_SYNTAX');
  t.match(bad.ok ? '' : bad.issues[0]?.message, /line \d+, column \d+/);
  const dup = await loadConfigText('upstream: {}\nupstream: {}\n', dir);
  t.equal(dup.ok ? '' : dup.issues[0]?.code, 'EDGE_CONFIG_YAML_SYNTAX');
});

t.test('no secret byte appears in any error, normalized config, diff or public material', async (t) => {
  const secrets = [TOKEN, JWT_SECRET, readFileSync(client.key, 'utf8').split('\n')[1] as string];
  const inline = doc();
  inline.observability.control_api.auth_token = 'inline-admin-token-SECRET-1234';
  secrets.push('inline-admin-token-SECRET-1234');
  const ok = await load(inline);
  t.ok(ok.ok);
  if (!ok.ok) return;
  // Failures carrying secrets in the document: a weak inline token, a mutually exclusive pair, a bad key.
  const broken = doc();
  broken.observability.control_api.auth_token = 'shortSECRETtok';
  broken.observability.control_api.auth_token_ref = { ref: 'literal:another-SECRET-value-xyz' };
  broken.resilience.quota.redis.auth_token = JWT_SECRET;
  broken.upstream.api.tls.client_key_ref = { ref: 'file://operator.token' };
  secrets.push('shortSECRETtok', 'another-SECRET-value-xyz');
  const failed = await load(broken);
  const weak = doc();
  weak.observability.control_api.auth_token = 'shortSECRETtok';
  const weakResult = await load(weak);
  const rotated = doc();
  rotated.observability.control_api.auth_token = 'inline-admin-token-SECRET-1234';
  rotated.resilience.quota.redis.auth_token_ref = { ref: 'literal:new-jwt-SECRET-000000000' };
  secrets.push('new-jwt-SECRET-000000000');
  const r2 = await load(rotated);
  t.ok(r2.ok);
  const outputs = [
    JSON.stringify(ok.value.config),
    JSON.stringify(publicSecretMaterial(ok.value.material)),
    failed.ok ? '' : failed.issues.map(formatIssue).join('\n'),
    weakResult.ok ? '' : weakResult.issues.map(formatIssue).join('\n'),
    r2.ok ? JSON.stringify(diffConfigs(ok.value, r2.value)) : '',
  ];
  t.notOk(failed.ok, 'the broken document is rejected');
  t.notOk(weakResult.ok, 'the weak token is rejected');
  for (const out of outputs) for (const s of secrets) t.notOk(out.includes(s), `output does not contain ${s.slice(0, 6)}…`);
  t.ok(ok.value.config.secret_slots.every((s) => !('value' in s)), 'slots carry no values');
  t.equal(ok.value.config.secret_slots.find((s) => s.path === 'resilience.quota.redis.auth_token')?.reference, 'literal:<redacted>');
  t.equal(ok.value.config.secret_slots.find((s) => s.path.endsWith('client_key'))?.reference, 'file://local/client.key');
});

t.test('secret fingerprints are keyed: stable under one key, unrelated to a plain hash, different under another key', async (t) => {
  const parsed = parseConfigText(dump(doc()));
  if (!parsed.ok) return t.fail('parses');
  const v = validateConfig(parsed.value, dir);
  t.ok(v.ok);
  if (!v.ok) return;
  const key = Buffer.alloc(32, 7);
  const [a, b, other] = await Promise.all([resolveConfig(v.value, { fingerprintKey: key }), resolveConfig(v.value, { fingerprintKey: Buffer.from(key) }), resolveConfig(v.value, { fingerprintKey: Buffer.alloc(32, 8) })]);
  if (!a.ok || !b.ok || !other.ok) return t.fail('resolves');
  const at = 'observability.control_api.auth.bearer_tokens[0].token';
  const fp = a.value.material.secrets[at]?.fingerprint;
  t.equal(fp, `hmac-sha256:${createHmac('sha256', key).update(TOKEN).digest('hex')}`, 'HMAC-SHA256 of the value under the key');
  t.equal(b.value.material.secrets[at]?.fingerprint, fp, 'the same key gives the same fingerprint (rotation stays visible)');
  t.not(other.value.material.secrets[at]?.fingerprint, fp, 'another key gives another fingerprint');
  t.notOk(fp?.includes(createHash('sha256').update(TOKEN).digest('hex')), 'not the plain SHA-256 a word list reverses');
  const identity = a.value.material.listeners['127.0.0.1:9889']?.default?.fingerprint;
  t.match(identity, /^hmac-sha256:/, 'a listener identity covers a private key: keyed too');
  t.match(a.value.material.upstream_ca['api']?.fingerprint, /^sha256:/, 'public CA material keeps a plain hash');
});

t.test('same-path rotation: secret_material_changed with no config change', async (t) => {
  const before = await load(doc());
  writeFileSync(path.join(dir, 'secrets', 'client.crt'), readFileSync(client2.cert));
  writeFileSync(path.join(dir, 'secrets', 'client.key'), readFileSync(client2.key));
  t.teardown(() => {
    writeFileSync(path.join(dir, 'secrets', 'client.crt'), readFileSync(client.cert));
    writeFileSync(path.join(dir, 'secrets', 'client.key'), readFileSync(client.key));
  });
  const after = await load(doc());
  t.ok(before.ok && after.ok);
  if (!before.ok || !after.ok) return;
  const d = diffConfigs(before.value, after.value);
  t.equal(d.changed, true);
  t.equal(d.restart_required, false);
  t.same(d.backend_policies, [{ upstream: 'api', secret_material_changed: true, client_identity_changed: true, policy_changed: false }]);
  t.ok(d.domains.backend_policies, 'backend_policies domain present');
  const unchanged = diffConfigs(after.value, after.value);
  t.equal(unchanged.changed, false, 'identical configs: no change');
  t.same(unchanged.backend_policies, []);
});

t.test('diff classification: live vs restart-required (SPEC 7 and 8)', async (t) => {
  const a = await load(doc());
  t.ok(a.ok);
  if (!a.ok) return;
  const variants: { name: string; change: (d: Doc) => void; domain: string; restart: boolean }[] = [
    { name: 'log.level', change: (d) => (d.log = { level: 'debug' }), domain: 'log', restart: false },
    { name: 'log.format', change: (d) => (d.log = { format: 'plain' }), domain: 'log', restart: true },
    { name: 'backend weight', change: (d) => (d.upstream.api.backends[0].weight = 5), domain: 'backends', restart: false },
    { name: 'backend added', change: (d) => d.upstream.api.backends.push({ id: 'a2', address: 'https://127.0.0.2:8443' }), domain: 'backends', restart: false },
    { name: 'route host', change: (d) => (d.upstream.api.route.host = 'api.example.com'), domain: 'routes', restart: false },
    { name: 'load balancing', change: (d) => (d.load_balancing = { type: 'random' }), domain: 'load_balancing', restart: false },
    { name: 'resilience policy', change: (d) => (d.resilience = { protocol: { denied_path_prefixes: ['/internal'] } }), domain: 'resilience', restart: false },
    { name: 'timeouts', change: (d) => (d.performance = { timeouts: { connect_ms: 100 } }), domain: 'performance', restart: false },
    { name: 'listener port', change: (d) => (d.listen.port = 9999), domain: 'listeners', restart: true },
    { name: 'named listener address', change: (d) => ((d.listen.name = 'pub'), (d.listen.address = '127.0.0.2')), domain: 'listeners', restart: true },
    { name: 'listener added', change: (d) => (d.listeners = [{ ...d.listen }, { ...d.listen, port: 9890 }]), domain: 'listeners', restart: false },
    { name: 'control API port', change: (d) => (d.observability.control_api.port = 9444), domain: 'observability', restart: true },
    { name: 'metrics port', change: (d) => (d.observability.metrics = { port: 9101 }), domain: 'observability', restart: true },
    { name: 'metrics path', change: (d) => (d.observability.metrics = { path: '/stats' }), domain: 'observability', restart: false },
    { name: 'tracing', change: (d) => (d.observability.tracing = { sample_ratio: 0.5 }), domain: 'observability', restart: true },
    { name: 'control plane threads', change: (d) => (d.performance = { control_plane_threads: 8 }), domain: 'performance', restart: true },
    { name: 'QUIC idle timeout (new connections take it)', change: (d) => (d.performance = { timeouts: { quic_idle_ms: 10_000 } }), domain: 'performance', restart: false },
    { name: 'connection timeouts and per-source cap', change: (d) => (d.performance = { max_connections_per_source: 8, timeouts: { tls_handshake_ms: 5000, client_header_ms: 5000, client_idle_ms: 5000, client_send_idle_ms: 5000, client_body_idle_ms: 5000, client_body_total_ms: 5000 }, body: { client_body_min_bytes_per_s: 10 } }), domain: 'performance', restart: false },
    { name: 'secret providers', change: (d) => (d.secrets.providers.other = { kind: 'file', base_dir: '/tmp' }), domain: 'secrets', restart: false },
    { name: 'upstream TLS verify', change: (d) => (d.upstream_tls = { verify_certificates: false }), domain: 'upstream_tls', restart: false },
  ];
  for (const v of variants) {
    const d = doc();
    if (v.name === 'named listener address') {
      // Same listener name before and after: the bind address changed.
      const base = doc();
      base.listen.name = 'pub';
      const b = await load(base);
      v.change(d);
      const c = await load(d);
      t.ok(b.ok && c.ok, v.name);
      if (b.ok && c.ok) {
        const diff = diffConfigs(b.value, c.value);
        t.equal(diff.restart_required, true, `${v.name}: restart required`);
        t.match(diff.rejected_changes[0], { path: 'listeners[pub].address', reason: 'listener bind address change' });
      }
      continue;
    }
    v.change(d);
    const b = await load(d);
    t.ok(b.ok, `${v.name} resolves${b.ok ? '' : JSON.stringify(b.issues)}`);
    if (!b.ok) continue;
    const diff = diffConfigs(a.value, b.value);
    t.ok(diff.domains[v.domain as keyof typeof diff.domains], `${v.name}: domain ${v.domain}; got ${Object.keys(diff.domains).join(',')}`);
    t.equal(diff.restart_required, v.restart, `${v.name}: restart_required ${v.restart}`);
  }
});

t.test('a change to the retry budget is a live change of the resilience domain, and reported as nothing inactive', async (t) => {
  // The retry budget is enforced (issue 14): the change is planned as any live key, and nothing is
  // reported "not active yet" any longer (features.ts).
  const a = await load(doc());
  const d = doc();
  d.resilience = { retry_budget: { ratio_percent: 20 } };
  const b = await load(d);
  t.ok(a.ok && b.ok);
  if (!a.ok || !b.ok) return;
  const diff = diffConfigs(a.value, b.value);
  t.ok(diff.domains.resilience, 'the change is seen');
  t.equal(diff.restart_required, false, 'and it is live');
  t.same(inactiveFeatures(b.value.config), [], 'no feature is reported not active');
});

t.test('errors come in the order the configuration declares them, whichever file read finishes first', async (t) => {
  // The certificate file is large (a slow read) and the key file absent (a fast ENOENT): read
  // concurrently, the key's error used to be listed first on some runs.
  writeFileSync(path.join(dir, 'secrets', 'large-garbage.crt'), 'x'.repeat(900_000));
  const d = doc();
  d.upstream.api.tls.client_certificate_ref = { ref: 'file://large-garbage.crt' };
  d.upstream.api.tls.client_key_ref = { ref: 'file://absent.key' };
  d.listen.tls.certificates = [
    { server_name: 'api.example.com', cert: path.join(dir, 'secrets', 'large-garbage.crt'), key: api.key },
    { server_name: 'other.example.com', cert: path.join(dir, 'missing.crt'), key: other.key },
  ];
  for (let round = 0; round < 5; round++) {
    const r = await load(d);
    t.notOk(r.ok);
    if (r.ok) return;
    t.same(codes(r.issues), [
      'upstream.api.tls.client_certificate_ref MalformedPemCertificate',
      'upstream.api.tls.client_key_ref EDGE_CONFIG_SECRET_UNREADABLE',
      'listen.tls.certificates[0].cert EDGE_CONFIG_TLS_INVALID_MATERIAL',
      'listen.tls.certificates[1].cert EDGE_CONFIG_TLS_UNREADABLE',
    ], `round ${round}: declaration order`);
  }
});
