// Issue 38 finding 6 (config_path): a YAML-shaped file inside the allowed `config_path` directory,
// such as a copy of /etc/shadow, had each of its lines echoed as an "unknown key" name into the
// history viewers read. Against a real `edge-proxy serve`: the operator who asks sees the names in
// the immediate answer (that is how a typo is found); the history (as a viewer reads it, and the
// entry inside the answer), the service log and the audit stream keep codes and the paths of known
// keys only, `<unknown key>` for the rest.
import t from 'tap';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { api, auditEvents, serve } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-unknown-keys-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKENS = { viewer: 'viewer-token-unknown-keys-0123456789', operator: 'operator-token-unknown-keys-0123456789' };
const backend = await namedBackend(t, 'one');
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
const configText = `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 1 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backend}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth:
      bearer_tokens:
        - { token: ${TOKENS.viewer}, role: viewer, actor_id: grafana }
        - { token: ${TOKENS.operator}, role: operator, actor_id: deploy-bot }
`;
// Shaped as /etc/shadow: every line parses as one top-level key with a null value.
const SALT = 'Qx7saltW2';
const HASH = 'Hh3hashKk9';
const shadowLines = [`root:$6$${SALT}$${HASH}:19000:0:99999:7:::`, `daemon:*:19000:0:99999:7:::`, `deploy:$y$j9T$${SALT}2$${HASH}2:19500:0:99999:7:::`];
const secrets = [SALT, HASH, 'root:', 'daemon:', 'deploy:'];

const served = await serve(path.join(dir, 'config.yaml'), configText);
t.teardown(() => served.stop());
const shadow = path.join(dir, 'shadow-copy');
writeFileSync(shadow, `${shadowLines.join('\n')}\n`);
// The same lines under a known key: the path keeps `listen`, the names go.
const nested = path.join(dir, 'nested.yaml');
writeFileSync(nested, configText.replace(`port: ${lport},`, `port: ${lport}, "${shadowLines[0] as string}": 1,`));

const as = (role: keyof typeof TOKENS, method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKENS[role] }, body);
const leaks = (text: string): string[] => secrets.filter((s) => text.includes(s));

t.test('activate, preview and validate of a shadow-shaped file: the operator sees the names, nothing stored does', async (t) => {
  const r = await as('operator', 'POST', '/admin/runtime/activate', { config_path: shadow });
  t.match(r, { status: 400, body: { reason: 'invalid_config', plan: { candidate_status: 'invalid' } } });
  const plan = r.body['plan'] as { errors: { path: string; code: string }[] };
  const unknown = plan.errors.filter((e) => e.code === 'EDGE_CONFIG_UNKNOWN_KEY');
  t.equal(unknown.length, 3, 'three unknown keys');
  t.ok(unknown.some((e) => e.path.includes(SALT)), "the operator's immediate answer names them (how a typo is found)");
  const entry = r.body['history_entry'] as { rejected_changes: { path: string; code: string }[] };
  t.same(entry.rejected_changes.filter((c) => c.code === 'EDGE_CONFIG_UNKNOWN_KEY').map((c) => c.path), ['<unknown key>', '<unknown key>', '<unknown key>'], 'the history entry (inside the answer too) keeps codes and <unknown key>');
  t.same(leaks(JSON.stringify(entry)), [], 'the stored entry holds no line of the file');

  const n = await as('operator', 'POST', '/admin/runtime/activate', { config_path: nested });
  t.match(n, { status: 400 });
  t.same((n.body['history_entry'] as { rejected_changes: { path: string; code: string }[] }).rejected_changes.filter((c) => c.code === 'EDGE_CONFIG_UNKNOWN_KEY').map((c) => c.path), ['listen.<unknown key>'], 'under a known key: the known path kept');

  const p = await as('operator', 'POST', '/admin/runtime/preview', { config_path: shadow });
  t.match(p, { status: 200, body: { candidate_status: 'invalid' } });
  t.same(leaks(JSON.stringify(p.body['history_entry'])), [], 'the preview entry holds no line');
  const v = await as('operator', 'POST', '/admin/runtime/validate', { config_path: shadow });
  t.ok((v.body['errors'] as { path: string }[]).some((e) => e.path.includes(HASH)), 'validate answers the operator with the names');
});

t.test('what viewers and the journal read holds no line of the file', async (t) => {
  const h = await as('viewer', 'GET', '/admin/runtime/history');
  t.equal(h.status, 200);
  const text = JSON.stringify(h.body);
  t.same(leaks(text), [], 'history, as a viewer reads it');
  t.ok(text.includes('<unknown key>') && text.includes('EDGE_CONFIG_UNKNOWN_KEY'), 'codes and the mark are there');
  const snap = await as('viewer', 'GET', '/admin/runtime');
  t.same(leaks(JSON.stringify(snap.body)), [], 'the runtime snapshot');
  const rejected = served.lines.filter((l) => l['msg'] === undefined ? false : String(l['msg']).startsWith('activate rejected'));
  t.equal(rejected.length, 2, 'two rejected activations logged');
  const logged = (rejected[0]?.['errors'] ?? []) as { path: string; code: string }[];
  t.same(logged.filter((e) => e.code === 'EDGE_CONFIG_UNKNOWN_KEY').map((e) => e.path), ['<unknown key>', '<unknown key>', '<unknown key>'], 'the log line keeps codes and the mark');
  t.same(leaks(served.text()), [], 'the service log, audit events included');
  t.ok(auditEvents(served).some((e) => e['action'] === 'activate' && e['result'] === 'denied' && e['reason'] === 'invalid_config'), 'the refusal is audited by reason');
  t.same(await servedBy({ lport, ca: caPem }, { perProtocol: 2 }), allFrom('one', { perProtocol: 2 }), 'generation 1 still serves');
});
