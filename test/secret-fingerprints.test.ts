// Issue 11 item 12: a viewer reads fingerprints of every secret; they must not let anyone guess a
// secret offline. A real `edge-proxy serve` with a dictionary-word JWT-style secret and a token:
// the viewer's snapshot and history show keyed fingerprints that match no plain hash and no
// word-list HMAC; the key lives in the state directory, so after a restart the same secret has the
// same fingerprint, and a rotated file shows a new one.
import t from 'tap';
import { createHash, createHmac } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-fingerprints-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const ADMIN = 'admin-token-0123456789abcdef';
const VIEWER = 'viewer-token-0123456789abcdef';
// A weak secret, as operators choose them: the word list below holds it.
const WEAK = 'sunshine';
const WORDS = ['password', 'letmein', 'dragon', 'sunshine', 'monkey'];
writeFileSync(path.join(dir, 'redis.password'), `${WEAK}\n`);

// Two backends: the reload below also moves `app` to the second, so its effect on traffic shows.
const backend = (name: string): Promise<number> => namedBackend(t, name);
const [bport, bport2] = [await backend('one'), await backend('two')];
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
/** What answers on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections (one worker: 3 each). */
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 3 });

const configFor = (appPort: number): string => `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 1 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${appPort}" }] } }
resilience:
  quota: { backend: redis, redis: { address: "127.0.0.1:6379", auth_token_ref: { ref: "file://redis.password" } } }
secrets: { default_provider: local, providers: { local: { kind: file, base_dir: ${dir} } } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth: { bearer_tokens: [{ token: ${ADMIN}, role: admin, actor_id: ops }, { token: ${VIEWER}, role: viewer, actor_id: grafana }] }
`;
const configText = configFor(bport);
const configFile = path.join(dir, 'config.yaml');
const asViewer = (p: string) => api(cport, caPem, 'GET', p, { token: VIEWER });

interface Material {
  path: string;
  fingerprint: string;
}
async function fingerprints(): Promise<Map<string, string>> {
  const snap = await asViewer('/admin/runtime');
  t.equal(snap.status, 200);
  const material = (snap.body['secrets'] as { material: Material[] }).material;
  return new Map(material.map((m) => [m.path, m.fingerprint]));
}

const plain = (s: string): string => createHash('sha256').update(s).digest('hex');

t.test('a viewer sees keyed fingerprints that no word list or plain hash reverses', async (t) => {
  const served = await serve(configFile, configText);
  try {
    const fps = await fingerprints();
    const redis = fps.get('resilience.quota.redis.auth_token') ?? '';
    const admin = fps.get('observability.control_api.auth.bearer_tokens[0].token') ?? '';
    t.match(redis, /^hmac-sha256:[0-9a-f]{64}$/);
    t.match(admin, /^hmac-sha256:[0-9a-f]{64}$/);
    // The attack of the report: hash each word and compare. Neither plain SHA-256 nor an HMAC
    // keyed by any word (or by nothing) hits.
    const guesses = WORDS.flatMap((w) => [plain(w), createHmac('sha256', w).update(w).digest('hex'), createHmac('sha256', '').update(w).digest('hex')]);
    t.notOk(guesses.some((g) => redis.endsWith(g)), 'the weak secret is not found from its fingerprint');
    t.notOk(admin.endsWith(plain(ADMIN)), "the admin token's fingerprint is not the digest the authenticator compares");
    // The key: 32 bytes, 0600, in the state directory, and the snapshot says it persists.
    const keyFile = path.join(served.stateDir, 'fingerprint.key');
    t.equal(statSync(keyFile).mode & 0o777, 0o600);
    const key = readFileSync(keyFile);
    t.equal(redis, `hmac-sha256:${createHmac('sha256', key).update(WEAK).digest('hex')}`, 'HMAC-SHA256 under the node-local key');
    const snap = await asViewer('/admin/runtime');
    t.same(snap.body['state'], { dir: served.stateDir, fingerprint_key: 'persisted', generations: 'saved' });
    // History: the config file's fingerprint is keyed too (a file may hold inline tokens).
    const history = await asViewer('/admin/runtime/history');
    const text = JSON.stringify(history.body);
    t.notOk(text.includes(plain(readFileSync(configFile, 'utf8'))), 'no plain hash of the config file in history');
    t.notOk(served.text().includes(key.toString('hex')), 'the key is never logged');
  } finally {
    await served.stop();
  }
});

t.test('after a restart the same secret has the same fingerprint; a rotated one a new fingerprint', async (t) => {
  let served = await serve(configFile, configText);
  const before = await fingerprints();
  await served.stop();
  served = await serve(configFile, configText);
  try {
    const after = await fingerprints();
    t.same([...after.entries()], [...before.entries()], 'stable across a process restart');
    t.same(await answers(), allFrom('one', { perProtocol: 3 }), 'before the reload: backend one on every protocol');
    writeFileSync(path.join(dir, 'redis.password'), 'correct-horse-battery-staple\n');
    writeFileSync(configFile, configFor(bport2));
    const reload = await api(cport, caPem, 'POST', '/admin/runtime/reload', { token: ADMIN }, {});
    t.equal(reload.status, 202);
    t.same(await answers(), allFrom('two', { perProtocol: 3 }), 'the reloaded generation serves (backend two) on every protocol');
    const rotated = await fingerprints();
    t.not(rotated.get('resilience.quota.redis.auth_token'), before.get('resilience.quota.redis.auth_token'), 'rotation is visible');
    t.equal(rotated.get('observability.control_api.auth.bearer_tokens[0].token'), before.get('observability.control_api.auth.bearer_tokens[0].token'));
  } finally {
    await served.stop();
  }
});
