// deploy/config.example.yaml must load completely: its /etc/edge-proxy paths are re-rooted into a
// temp dir holding generated certificates, keys and secret files, then the real loader resolves it.
import t from 'tap';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfigFile } from '@edge-proxy/config';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-example-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

t.test('deploy/config.example.yaml loads with real files behind every path', async (t) => {
  const etc = path.join(dir, 'etc');
  const tls = path.join(etc, 'tls');
  const secrets = path.join(etc, 'secrets');
  mkdirSync(secrets, { recursive: true });
  const ca = makeCa(tls, 'internal-ca');
  copyFileSync(ca.cert, path.join(tls, 'internal-ca.pem'));
  const def = makeLeaf(tls, 'default', ca, { sans: ['edge.example.com'] });
  const api = makeLeaf(tls, 'api.example.com', ca, { sans: ['api.example.com'] });
  const admin = makeLeaf(tls, 'admin', ca, { sans: ['localhost', '127.0.0.1'] });
  const client = makeLeaf(secrets, 'edge-client', ca, { sans: ['edge-proxy'], usage: 'client' });
  writeFileSync(path.join(secrets, 'viewer.token'), 'viewer-token-0123456789abcdef\n');
  writeFileSync(path.join(secrets, 'deploy.token'), 'deploy-token-0123456789abcdef\n');
  writeFileSync(path.join(secrets, 'reload.token'), 'reload-token-0123456789abcdef\n');
  const text = readFileSync(path.join(root, 'deploy/config.example.yaml'), 'utf8').replaceAll('/etc/edge-proxy', etc);
  const file = path.join(dir, 'config.yaml');
  writeFileSync(file, text);
  const r = await loadConfigFile(file);
  t.ok(r.ok, r.ok ? 'loads' : JSON.stringify(r.issues));
  if (!r.ok) return;
  t.same(Object.keys(r.value.config.upstream), ['api', 'static']);
  // The loader read the very files behind each path and reference (relative `file://` ones under
  // the provider's base_dir), not merely accepted the paths: the material holds their bytes.
  const { material } = r.value;
  const pem = (f: string): string => readFileSync(f, 'utf8');
  const slot = (p: string | undefined) => (p === undefined ? undefined : material.secrets[p]);
  const api0 = r.value.config.upstream['api'];
  t.has(slot(api0?.tls.client_certificate_slot), { path: 'upstream.api.tls.client_certificate', kind: 'certificate', value: pem(client.cert) }, 'the upstream client certificate is secrets/edge-client.crt');
  t.has(slot(api0?.tls.client_key_slot), { path: 'upstream.api.tls.client_key', kind: 'private_key', value: pem(client.key) }, 'and its key secrets/edge-client.key');
  const tokens = Object.values(material.secrets).filter((s) => s.kind === 'value').map((s) => s.value).sort();
  t.same(tokens, ['deploy-token-0123456789abcdef', 'reload-token-0123456789abcdef', 'viewer-token-0123456789abcdef'], 'the three bearer tokens read from their files, the trailing newline trimmed');
  const listener = material.listeners['public'];
  t.equal(listener?.default?.cert_pem, pem(def.cert), 'the default certificate is tls/default.crt');
  t.same(listener?.certificates.map((c) => [c.server_name, c.identity.cert_pem === pem(api.cert)]), [['api.example.com', true]], 'the SNI certificate is tls/api.example.com.crt');
  t.equal(material.control_api.identity?.cert_pem, pem(admin.cert), 'the control API certificate is tls/admin.crt');
  t.same(material.upstream_ca['api']?.pems.map((p) => p.trim()), [pem(ca.cert).trim()], 'the upstream CA bundle is tls/internal-ca.pem');
  t.ok(Object.isFrozen(r.value.config) && Object.isFrozen(r.value.config.upstream['api']?.backends[0]), 'the normalized config is deeply frozen');
  t.throws(() => {
    (r.value.config.log as { level: string }).level = 'trace';
  }, TypeError);
});
