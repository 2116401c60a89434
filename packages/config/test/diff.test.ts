// Table-driven unit test of diffConfigs: exact paths, kinds, activations, reasons, material flags,
// domains and per-pool backend policies, on configurations resolved from YAML with real certificates.
import t from 'tap';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { dump } from 'js-yaml';
import { diffConfigs, loadConfigText } from '../src/index.ts';
import type { ConfigDiff, FieldChange, ResolvedConfig } from '../src/index.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-config-diff-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

const ca = makeCa(dir);
const ca2 = makeCa(dir, 'ca2', '/CN=edge-proxy test CA two');
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const server2 = makeLeaf(dir, 'server2', ca, { sans: ['localhost', '127.0.0.1'] });
const client = makeLeaf(dir, 'client', ca, { sans: ['edge-proxy'], usage: 'client' });
const client2 = makeLeaf(dir, 'client2', ca, { sans: ['edge-proxy'], usage: 'client' });
mkdirSync(path.join(dir, 'secrets'));
const sec = (name: string): string => path.join(dir, 'secrets', name);
writeFileSync(sec('operator.token'), 'operator-token-0123456789-AAAA\n');
writeFileSync(sec('viewer.token'), 'viewer-token-0123456789-BBBBBBB\n');
copyFileSync(client2.cert, sec('client2.crt'));
copyFileSync(client2.key, sec('client2.key'));
// Files whose bytes a test swaps under an unchanged path.
const serverCert = path.join(dir, 'live-server.crt');
const serverKey = path.join(dir, 'live-server.key');
const caFile = path.join(dir, 'live-ca.pem');
function resetFiles(): void {
  copyFileSync(server.cert, serverCert);
  copyFileSync(server.key, serverKey);
  copyFileSync(ca.cert, caFile);
  copyFileSync(client.cert, sec('client.crt'));
  copyFileSync(client.key, sec('client.key'));
  writeFileSync(sec('operator.token'), 'operator-token-0123456789-AAAA\n');
}
resetFiles();

type Doc = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

function doc(): Doc {
  return {
    listen: { address: '127.0.0.1', port: 9889, tls: { cert: serverCert, key: serverKey } },
    secrets: { default_provider: 'local', providers: { local: { kind: 'file', base_dir: 'secrets' } } },
    upstream: {
      api: {
        route: { path_prefix: '/' },
        backends: [
          { id: 'a1', address: 'https://127.0.0.1:8443' },
          { id: 'a2', address: 'https://127.0.0.2:8443' },
        ],
        tls: { ca_file: caFile, client_certificate_ref: { ref: 'file://client.crt' }, client_key_ref: { ref: 'file://client.key' } },
      },
      web: { route: { path_prefix: '/web' }, backends: [{ id: 'w1', address: 'http://127.0.0.3:8080' }] },
    },
    observability: { control_api: { auth: { bearer_tokens: [{ token_ref: { ref: 'file://operator.token' }, role: 'operator', actor_id: 'ops' }] } } },
  };
}

async function resolve(d: Doc): Promise<ResolvedConfig> {
  const r = await loadConfigText(dump(d), dir);
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value;
}

const base = await resolve(doc());

interface Case {
  readonly name: string;
  /** Edits the candidate document. */
  readonly edit?: (d: Doc) => void;
  /** Edits the active document (default: the base document). */
  readonly editBefore?: (d: Doc) => void;
  /** Swaps file bytes between resolving the active and the candidate configuration. */
  readonly swap?: () => void;
}

const cases: Case[] = [
  { name: 'identical' },
  { name: 'backends reordered', edit: (d) => d.upstream.api.backends.reverse() },
  { name: 'backend weight', edit: (d) => (d.upstream.api.backends[1].weight = 5) },
  { name: 'backend added', edit: (d) => d.upstream.api.backends.push({ id: 'a3', address: 'https://127.0.0.4:8443' }) },
  { name: 'backend removed', edit: (d) => d.upstream.api.backends.splice(0, 1) },
  { name: 'pool health check', edit: (d) => (d.upstream.web.health_check = { path: '/healthz' }) },
  { name: 'route host', edit: (d) => (d.upstream.api.route.host = 'api.example.com') },
  { name: 'pool load balancing', edit: (d) => (d.upstream.web.load_balancing = { type: 'random' }) },
  { name: 'global load balancing', edit: (d) => (d.load_balancing = { type: 'random' }) },
  { name: 'pool added', edit: (d) => (d.upstream.extra = { route: { path_prefix: '/x' }, backends: [{ id: 'x1', address: 'http://127.0.0.5:8080' }] }) },
  { name: 'pool removed', edit: (d) => delete d.upstream.web },
  { name: 'pool server name', edit: (d) => (d.upstream.api.tls.server_name = 'api.internal') },
  { name: 'pool CA path', edit: (d) => (d.upstream.api.tls.ca_file = ca2.cert) },
  { name: 'pool CA bytes', swap: () => copyFileSync(ca2.cert, caFile) },
  { name: 'client identity reference', edit: (d) => ((d.upstream.api.tls.client_certificate_ref = { ref: 'file://client2.crt' }), (d.upstream.api.tls.client_key_ref = { ref: 'file://client2.key' })) },
  { name: 'client identity bytes', swap: () => (copyFileSync(client2.cert, sec('client.crt')), copyFileSync(client2.key, sec('client.key'))) },
  { name: 'listener port', edit: (d) => (d.listen.port = 9999) },
  { name: 'named listener port', editBefore: (d) => (d.listen.name = 'pub'), edit: (d) => ((d.listen.name = 'pub'), (d.listen.port = 9999)) },
  { name: 'listener added', edit: (d) => (d.listeners = [{ ...d.listen }, { ...d.listen, name: 'second', port: 9890 }]) },
  // The workers run as security.user by the time they would bind an added listener (activation.ts).
  { name: 'privileged listener added under security.user', editBefore: (d) => (d.security = { user: 'nobody' }), edit: (d) => ((d.security = { user: 'nobody' }), (d.listeners = [{ ...d.listen }, { ...d.listen, name: 'https', port: 443 }])) },
  { name: 'unprivileged listener added under security.user', editBefore: (d) => (d.security = { user: 'nobody' }), edit: (d) => ((d.security = { user: 'nobody' }), (d.listeners = [{ ...d.listen }, { ...d.listen, name: 'second', port: 1024 }])) },
  { name: 'privileged listener added as root', edit: (d) => (d.listeners = [{ ...d.listen }, { ...d.listen, name: 'https', port: 443 }]) },
  { name: 'listener removed', editBefore: (d) => (d.listeners = [{ ...d.listen }, { ...d.listen, name: 'second', port: 9890 }]) },
  { name: 'listener certificate bytes', swap: () => (copyFileSync(server2.cert, serverCert), copyFileSync(server2.key, serverKey)) },
  { name: 'listener client auth mode', edit: (d) => (d.listen.tls.client_auth = { mode: 'required', ca_file: ca.cert }) },
  { name: 'listener certificate path', edit: (d) => (d.listen.tls = { cert: server2.cert, key: server2.key }) },
  { name: 'secret providers', edit: (d) => (d.secrets.providers.other = { kind: 'file', base_dir: '/tmp' }) },
  { name: 'token bytes', swap: () => writeFileSync(sec('operator.token'), 'operator-token-rotated-9876543210\n') },
  { name: 'token reference', edit: (d) => (d.observability.control_api.auth.bearer_tokens[0].token_ref = { ref: 'file://viewer.token' }) },
  { name: 'token added', edit: (d) => d.observability.control_api.auth.bearer_tokens.push({ token_ref: { ref: 'file://viewer.token' }, role: 'viewer', actor_id: 'view' }) },
  { name: 'token removed', editBefore: (d) => d.observability.control_api.auth.bearer_tokens.push({ token_ref: { ref: 'file://viewer.token' }, role: 'viewer', actor_id: 'view' }) },
  { name: 'global client identity', edit: (d) => ((d.upstream_tls = { client_certificate_ref: { ref: 'file://client2.crt' }, client_key_ref: { ref: 'file://client2.key' } })) },
  { name: 'log level and format', edit: (d) => (d.log = { level: 'debug', format: 'plain' }) },
  { name: 'security', edit: (d) => (d.security = { user: 'nobody' }) },
  { name: 'performance', edit: (d) => (d.performance = { control_plane_threads: 8, timeouts: { connect_ms: 100 } }) },
  { name: 'tracing', edit: (d) => (d.observability.tracing = { sample_ratio: 0.5 }) },
];

async function run(c: Case): Promise<ConfigDiff> {
  const b = doc();
  c.editBefore?.(b);
  const before = c.editBefore === undefined && c.swap === undefined ? base : await resolve(b);
  c.swap?.();
  try {
    const a = doc();
    c.edit?.(a);
    return diffConfigs(before, await resolve(a));
  } finally {
    resetFiles();
  }
}

const live = (path: string, change: FieldChange['change'], material = false): FieldChange => ({ path, change, activation: 'live', ...(material ? { material: true as const } : {}) });
const restart = (path: string, change: FieldChange['change'], reason: string, material = false): FieldChange => ({ path, change, activation: 'restart_required', reason, ...(material ? { material: true as const } : {}) });

/** The exact diff of each case, keyed by case name. */
const expected: Record<string, ConfigDiff> = {
  'identical': {
    changed: false,
    restart_required: false,
    domains: {},
    backend_policies: [],
    rejected_changes: [],
  },
  'backends reordered': {
    changed: false,
    restart_required: false,
    domains: {},
    backend_policies: [],
    rejected_changes: [],
  },
  'backend weight': {
    changed: true,
    restart_required: false,
    domains: { backends: { activation: 'live', changes: [live('upstream.api.backends[a2].weight', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'backend added': {
    changed: true,
    restart_required: false,
    domains: { backends: { activation: 'live', changes: [live('upstream.api.backends[a3]', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'backend removed': {
    changed: true,
    restart_required: false,
    domains: { backends: { activation: 'live', changes: [live('upstream.api.backends[a1]', 'removed')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'pool health check': {
    changed: true,
    restart_required: false,
    domains: { backends: { activation: 'live', changes: [live('upstream.web.backends[w1].health_check', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'route host': {
    changed: true,
    restart_required: false,
    domains: { routes: { activation: 'live', changes: [live('upstream.api.route.host', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'pool load balancing': {
    changed: true,
    restart_required: false,
    domains: { load_balancing: { activation: 'live', changes: [live('upstream.web.load_balancing.type', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'global load balancing': {
    changed: true,
    restart_required: false,
    domains: { load_balancing: { activation: 'live', changes: [live('load_balancing.type', 'modified'), live('upstream.api.load_balancing.type', 'modified'), live('upstream.web.load_balancing.type', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'pool added': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.extra', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'pool removed': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.web', 'removed')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'pool server name': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.api.tls.server_name', 'added')] }, backend_policies: { activation: 'live', changes: [live('upstream.api.tls', 'modified')] } },
    backend_policies: [{ upstream: 'api', secret_material_changed: false, client_identity_changed: false, policy_changed: true }],
    rejected_changes: [],
  },
  'pool CA path': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.api.tls.ca_file', 'modified'), live('upstream.api.tls.ca', 'modified', true)] }, backend_policies: { activation: 'live', changes: [live('upstream.api.tls', 'modified', true)] } },
    backend_policies: [{ upstream: 'api', secret_material_changed: true, client_identity_changed: false, policy_changed: true }],
    rejected_changes: [],
  },
  'pool CA bytes': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.api.tls.ca', 'modified', true)] }, backend_policies: { activation: 'live', changes: [live('upstream.api.tls', 'modified', true)] } },
    backend_policies: [{ upstream: 'api', secret_material_changed: true, client_identity_changed: false, policy_changed: false }],
    rejected_changes: [],
  },
  'client identity reference': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.api.tls.client_certificate', 'modified'), live('upstream.api.tls.client_key', 'modified')] }, backend_policies: { activation: 'live', changes: [live('upstream.api.tls', 'modified', true)] } },
    backend_policies: [{ upstream: 'api', secret_material_changed: true, client_identity_changed: true, policy_changed: false }],
    rejected_changes: [],
  },
  'client identity bytes': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.api.tls.client_certificate', 'modified', true), live('upstream.api.tls.client_key', 'modified', true)] }, backend_policies: { activation: 'live', changes: [live('upstream.api.tls', 'modified', true)] } },
    backend_policies: [{ upstream: 'api', secret_material_changed: true, client_identity_changed: true, policy_changed: false }],
    rejected_changes: [],
  },
  'listener port': {
    changed: true,
    restart_required: true,
    domains: { listeners: { activation: 'restart_required', changes: [restart('listeners[127.0.0.1:9889]', 'removed', 'listener removal'), live('listeners[127.0.0.1:9999]', 'added')] } },
    backend_policies: [],
    rejected_changes: [restart('listeners[127.0.0.1:9889]', 'removed', 'listener removal')],
  },
  'named listener port': {
    changed: true,
    restart_required: true,
    domains: { listeners: { activation: 'restart_required', changes: [restart('listeners[pub].port', 'modified', 'listener bind port change')] } },
    backend_policies: [],
    rejected_changes: [restart('listeners[pub].port', 'modified', 'listener bind port change')],
  },
  'listener added': {
    changed: true,
    restart_required: false,
    domains: { listeners: { activation: 'live', changes: [live('listeners[second]', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'privileged listener added under security.user': {
    changed: true,
    restart_required: true,
    domains: { listeners: { activation: 'restart_required', changes: [restart('listeners[https]', 'added', 'listener on a port below 1024 added while the workers run as security.user (they dropped the capability to bind it)')] } },
    backend_policies: [],
    rejected_changes: [restart('listeners[https]', 'added', 'listener on a port below 1024 added while the workers run as security.user (they dropped the capability to bind it)')],
  },
  'unprivileged listener added under security.user': {
    changed: true,
    restart_required: false,
    domains: { listeners: { activation: 'live', changes: [live('listeners[second]', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'privileged listener added as root': {
    changed: true,
    restart_required: false,
    domains: { listeners: { activation: 'live', changes: [live('listeners[https]', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'listener removed': {
    changed: true,
    restart_required: true,
    domains: { listeners: { activation: 'restart_required', changes: [restart('listeners[second]', 'removed', 'listener removal')] } },
    backend_policies: [],
    rejected_changes: [restart('listeners[second]', 'removed', 'listener removal')],
  },
  // A listener's material is reported at the key it came from: new certificate bytes are live
  // (docs/operations.md "Certificate rotation"); only client_auth.mode needs a restart.
  'listener certificate bytes': {
    changed: true,
    restart_required: false,
    domains: { listeners: { activation: 'live', changes: [live('listeners[127.0.0.1:9889].tls.cert', 'modified', true)] } },
    backend_policies: [],
    rejected_changes: [],
  },
  // The CA bytes behind the added client_auth are not reported again as material.
  'listener client auth mode': {
    changed: true,
    restart_required: true,
    domains: { listeners: { activation: 'restart_required', changes: [restart('listeners[127.0.0.1:9889].tls.client_auth', 'added', 'listener client authentication mode change')] } },
    backend_policies: [],
    rejected_changes: [restart('listeners[127.0.0.1:9889].tls.client_auth', 'added', 'listener client authentication mode change')],
  },
  // New paths: the path changes carry it; the new bytes behind them are not reported twice.
  'listener certificate path': {
    changed: true,
    restart_required: false,
    domains: { listeners: { activation: 'live', changes: [live('listeners[127.0.0.1:9889].tls.cert', 'modified'), live('listeners[127.0.0.1:9889].tls.key', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'secret providers': {
    changed: true,
    restart_required: false,
    domains: { secrets: { activation: 'live', changes: [live('secrets.providers.other', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'token bytes': {
    changed: true,
    restart_required: false,
    domains: { observability: { activation: 'live', changes: [live('observability.control_api.auth.bearer_tokens[0].token', 'modified', true)] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'token reference': {
    changed: true,
    restart_required: false,
    domains: { observability: { activation: 'live', changes: [live('observability.control_api.auth.bearer_tokens[0].token', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'token added': {
    changed: true,
    restart_required: false,
    domains: { observability: { activation: 'live', changes: [live('observability.control_api.auth.bearer_tokens', 'modified'), live('observability.control_api.auth.bearer_tokens[1].token', 'added')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'token removed': {
    changed: true,
    restart_required: false,
    domains: { observability: { activation: 'live', changes: [live('observability.control_api.auth.bearer_tokens', 'modified'), live('observability.control_api.auth.bearer_tokens[1].token', 'removed')] } },
    backend_policies: [],
    rejected_changes: [],
  },
  'global client identity': {
    changed: true,
    restart_required: false,
    domains: { upstreams: { activation: 'live', changes: [live('upstream.web.tls.client_certificate_slot', 'added'), live('upstream.web.tls.client_key_slot', 'added')] }, upstream_tls: { activation: 'live', changes: [live('upstream_tls.client_certificate', 'added'), live('upstream_tls.client_key', 'added')] }, backend_policies: { activation: 'live', changes: [live('upstream.web.tls', 'modified', true)] } },
    backend_policies: [{ upstream: 'web', secret_material_changed: true, client_identity_changed: true, policy_changed: true }],
    rejected_changes: [],
  },
  'log level and format': {
    changed: true,
    restart_required: true,
    domains: { log: { activation: 'restart_required', changes: [live('log.level', 'modified'), restart('log.format', 'modified', 'log format change')] } },
    backend_policies: [],
    rejected_changes: [restart('log.format', 'modified', 'log format change')],
  },
  'security': {
    changed: true,
    restart_required: true,
    domains: { security: { activation: 'restart_required', changes: [restart('security.user', 'added', 'privilege-drop change')] } },
    backend_policies: [],
    rejected_changes: [restart('security.user', 'added', 'privilege-drop change')],
  },
  'performance': {
    changed: true,
    restart_required: true,
    domains: { performance: { activation: 'restart_required', changes: [restart('performance.control_plane_threads', 'modified', 'control-plane thread count change'), live('performance.timeouts.connect_ms', 'modified')] } },
    backend_policies: [],
    rejected_changes: [restart('performance.control_plane_threads', 'modified', 'control-plane thread count change')],
  },
  'tracing': {
    changed: true,
    restart_required: true,
    domains: { observability: { activation: 'restart_required', changes: [restart('observability.tracing.sample_ratio', 'modified', 'tracing startup configuration change')] } },
    backend_policies: [],
    rejected_changes: [restart('observability.tracing.sample_ratio', 'modified', 'tracing startup configuration change')],
  },
};

t.test('every case has exactly one expectation', async (t) => {
  t.strictSame(cases.map((c) => c.name).sort(), Object.keys(expected).sort());
});

for (const c of cases) {
  t.test(c.name, async (t) => {
    const diff = await run(c);
    t.strictSame(diff, expected[c.name]);
    // Paths only: the diff never carries a value (no key other than the FieldChange ones).
    const keys = new Set(Object.values(diff.domains).flatMap((d) => d.changes.flatMap((x) => Object.keys(x))));
    t.ok([...keys].every((k) => ['path', 'change', 'activation', 'reason', 'material'].includes(k)), `change keys ${[...keys].join(',')}`);
  });
}

t.test('the diff is directional: swapping active and candidate swaps added and removed', async (t) => {
  const a = await resolve(doc());
  const d = doc();
  d.upstream.api.backends.push({ id: 'a3', address: 'https://127.0.0.4:8443' });
  d.upstream.extra = { route: { path_prefix: '/x' }, backends: [{ id: 'x1', address: 'http://127.0.0.5:8080' }] };
  const b = await resolve(d);
  t.strictSame(diffConfigs(b, a).domains, {
    backends: { activation: 'live', changes: [live('upstream.api.backends[a3]', 'removed')] },
    upstreams: { activation: 'live', changes: [live('upstream.extra', 'removed')] },
  });
  t.strictSame(diffConfigs(a, b).domains, {
    backends: { activation: 'live', changes: [live('upstream.api.backends[a3]', 'added')] },
    upstreams: { activation: 'live', changes: [live('upstream.extra', 'added')] },
  });
});

t.test('a listener certificate changed by new paths is live-activatable (docs/operations.md "Certificate rotation")', async (t) => {
  const diff = await run(cases.find((c) => c.name === 'listener certificate path') as Case);
  t.equal(diff.restart_required, false, 'not rejected');
  t.same(diff.rejected_changes, []);
});

t.test('a key outside every domain falls to `secrets` (version 2 is refused by validation: built by hand)', async (t) => {
  const after: ResolvedConfig = { ...base, config: { ...base.config, version: 2 } };
  t.strictSame(diffConfigs(base, after), {
    changed: true,
    restart_required: false,
    domains: { secrets: { activation: 'live', changes: [live('version', 'modified')] } },
    backend_policies: [],
    rejected_changes: [],
  });
});
