// The control API with required mTLS and a source-address allowlist, end to end: a client without a
// certificate (or with one from an unknown CA) fails the TLS handshake and gets no HTTP answer; the
// role comes from the certificate's OU; a source outside the allowlist is reset at accept (no TLS, no
// HTTP answer; docs/decisions.md).
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-cp-mtls-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1', '127.0.0.2'] });
const clientCa = makeCa(dir, 'client-ca', '/CN=client CA');
const otherCa = makeCa(dir, 'other-ca', '/CN=unknown CA');
const viewer = makeLeaf(dir, 'alice', clientCa, { subject: '/CN=alice/OU=viewer', sans: ['alice'], usage: 'client' });
const operator = makeLeaf(dir, 'bob', clientCa, { subject: '/CN=bob/OU=operator', sans: ['bob'], usage: 'client' });
const stranger = makeLeaf(dir, 'mallory', otherCa, { subject: '/CN=mallory/OU=admin', sans: ['mallory'], usage: 'client' });
const caPem = readFileSync(ca.cert);

const backend = http.createServer((_req, res) => res.end('ok'));
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];

const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json }
performance: { worker_threads: 1 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    tls: { client_auth: { mode: required, ca_file: ${clientCa.cert} } }
    auth: { identity_source: { kind: mtls_subject_cn, role_attribute: OU } }
    ip_allowlist: { cidrs: [127.0.0.2/32] }
`,
);
t.teardown(() => served.stop());

function call(p: string, o: { cert?: { cert: string; key: string }; from?: string; method?: string }): Promise<{ status: number; reason?: string } | { error: string }> {
  return new Promise((resolve) => {
    const req = https.request(
      { host: '127.0.0.1', port: cport, path: p, method: o.method ?? 'GET', ca: caPem, servername: 'localhost', agent: false, localAddress: o.from ?? '127.0.0.2', ...(o.cert === undefined ? {} : { cert: readFileSync(o.cert.cert), key: readFileSync(o.cert.key) }) },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => {
          const reason = text.startsWith('{') ? (JSON.parse(text) as { reason?: string }).reason : undefined;
          resolve({ status: res.statusCode ?? 0, ...(reason === undefined ? {} : { reason }) });
        });
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) => resolve({ error: err.code ?? err.message }));
    req.end();
  });
}

t.test('without a client certificate the handshake fails: no HTTP status at all', async (t) => {
  const r = await call('/admin/runtime', {});
  t.ok('error' in r, `no HTTP answer (${JSON.stringify(r)})`);
  const bad = await call('/admin/runtime', { cert: stranger });
  t.ok('error' in bad, `a certificate from an unknown CA fails the handshake too (${JSON.stringify(bad)})`);
  const handshake = (reason: string) => (e: Record<string, unknown>): boolean => e['audit'] === true && e['failure_class'] === 'tls_handshake' && e['reason'] === reason;
  t.match(await served.waitFor(handshake('missing_client_cert')), { event_type: 'authentication', action: 'authenticate', result: 'denied', authn: 'mtls', peer_addr: '127.0.0.2' });
  // TLS 1.3 sends the client certificate after the client's side of the handshake is done: when the
  // server refuses an unknown-CA certificate, Node reports the connection as reset, so the audited
  // reason is the generic `handshake` (the attempt is still audited, and no HTTP answer is given).
  const second = await served.waitFor((e) => e['audit'] === true && e['failure_class'] === 'tls_handshake' && e['reason'] !== 'missing_client_cert');
  t.match(second, { event_type: 'authentication', result: 'denied', reason: /^(invalid_client_cert|unknown_issuer|handshake)$/ });
});

t.test('the role comes from the certificate OU', async (t) => {
  t.same(await call('/admin/runtime', { cert: viewer }), { status: 200 });
  t.same(await call('/admin/runtime/validate', { cert: viewer, method: 'POST' }), { status: 403, reason: 'insufficient_role' });
  t.same(await call('/admin/runtime/validate', { cert: operator, method: 'POST' }), { status: 200 });
});

t.test('the allowlist is checked before anything else: a connection from 127.0.0.1 is reset at accept', async (t) => {
  t.same(await call('/admin/runtime', { cert: operator, from: '127.0.0.1' }), { error: 'ECONNRESET' });
  t.same(await call('/health', { cert: operator, from: '127.0.0.1' }), { error: 'ECONNRESET' });
  t.same(await call('/health', { cert: operator, from: '127.0.0.2' }), { status: 200 });
});
