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
  makeLeaf(tls, 'default', ca, { sans: ['edge.example.com'] });
  makeLeaf(tls, 'api.example.com', ca, { sans: ['api.example.com'] });
  makeLeaf(tls, 'admin', ca, { sans: ['localhost', '127.0.0.1'] });
  const client = makeLeaf(secrets, 'edge-client', ca, { sans: ['edge-proxy'], usage: 'client' });
  t.ok(client.cert.endsWith('edge-client.crt'));
  writeFileSync(path.join(secrets, 'viewer.token'), 'viewer-token-0123456789abcdef\n');
  writeFileSync(path.join(secrets, 'deploy.token'), 'deploy-token-0123456789abcdef\n');
  const text = readFileSync(path.join(root, 'deploy/config.example.yaml'), 'utf8').replaceAll('/etc/edge-proxy', etc);
  const file = path.join(dir, 'config.yaml');
  writeFileSync(file, text);
  const r = await loadConfigFile(file);
  t.ok(r.ok, r.ok ? 'loads' : JSON.stringify(r.issues));
  if (!r.ok) return;
  t.same(Object.keys(r.value.config.upstream), ['api', 'static']);
  t.equal(r.value.config.upstream['api']?.tls.client_key_slot, 'upstream.api.tls.client_key');
  t.equal(r.value.material.listeners['public']?.certificates[0]?.server_name, 'api.example.com');
  t.ok(Object.isFrozen(r.value.config) && Object.isFrozen(r.value.config.upstream['api']?.backends[0]), 'the normalized config is deeply frozen');
  t.throws(() => {
    (r.value.config.log as { level: string }).level = 'trace';
  }, TypeError);
});
