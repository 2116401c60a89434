// Failure paths an operator meets first, run for real: a certificate reload that cannot load its
// files, and a control API or metrics endpoint that cannot bind. Each must leave what serves
// untouched (or refuse to start with one clear line), be counted, and never print file content or
// a stack trace.
import t from 'tap';
import crypto from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { api, auditEvents, serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { getH3 } from './support/served-by.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const dir = mkdtempSync(path.join(tmpdir(), 'edge-failure-paths-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca1 = makeCa(path.join(dir, 'ca1'));
const ca2 = makeCa(path.join(dir, 'ca2'));
const leaf1 = makeLeaf(path.join(dir, 'ca1'), 'server', ca1, { sans: ['localhost', '127.0.0.1'] });
const leaf2 = makeLeaf(path.join(dir, 'ca2'), 'server', ca2, { sans: ['localhost', '127.0.0.1'] });
// The control API keeps its own identity (from CA 1) so the test can call it whatever the listener serves.
const adminCert = makeLeaf(path.join(dir, 'ca1'), 'admin', ca1, { sans: ['localhost', '127.0.0.1'] });
const ca1Pem = readFileSync(ca1.cert);
const ca2Pem = readFileSync(ca2.cert);
const TOKEN = 'operator-token-failure-paths-0123456789';

const backendPort = await namedBackend(t, 'backend');

const configText = (p: ServicePorts, cert: string, key: string): string =>
  serviceConfig({ ports: p, cert: { cert, key }, backendPort, performance: 'worker_threads: 2', controlApiTls: adminCert, token: { token: TOKEN, role: 'admin', actor: 'failure-paths' } });

/** SHA-256 fingerprint of the certificate the TLS bootstrap ingress presents on a new connection. */
async function presented(port: number): Promise<string> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] });
  await once(s, 'secureConnect');
  const fp = s.getPeerCertificate().fingerprint256;
  s.destroy();
  return fp;
}
const fingerprint = (file: string): string => new crypto.X509Certificate(readFileSync(file)).fingerprint256;

/** The sum of every series matching `pattern` (its group 1 is the value). */
async function metricSum(port: number, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  return [...text.matchAll(new RegExp(pattern.source, 'gm'))].reduce((sum, m) => sum + Number(m[1]), 0);
}

t.test('reload-certs with unloadable files: 500 cert_reload_failed, the old certificate keeps serving on TCP and QUIC, counted and audited; fixed files load', async (t) => {
  const p = await freePorts();
  const live = path.join(dir, 'live');
  mkdirSync(live);
  const cert = path.join(live, 'server.crt');
  const key = path.join(live, 'server.key');
  copyFileSync(leaf1.cert, cert);
  copyFileSync(leaf1.key, key);
  const served = await serve(path.join(dir, 'reload.yaml'), configText(p, cert, key));
  t.teardown(() => served.stop());
  const call = () => api(p.c, ca1Pem, 'POST', '/admin/runtime/reload-certs', { token: TOKEN });
  const failures = /^svc_control_plane_cert_reload_total\{result="failure",reason="[^"]*"\} (\d+)$/;
  t.equal(await presented(p.l), fingerprint(leaf1.cert), 'certificate 1 at start');

  // 1. Garbage in the certificate file (a secret-looking marker must never be echoed back).
  const marker = 'NOT-A-CERT-MARKER-5f2a91';
  writeFileSync(cert, `-----BEGIN CERTIFICATE-----\n${marker}\n-----END CERTIFICATE-----\n`);
  const bad = await call();
  t.equal(bad.status, 500, 'garbage certificate: 500');
  t.equal(bad.body['reason'], 'cert_reload_failed');
  t.notMatch(JSON.stringify(bad.body), marker, 'the file content is not echoed in the answer');
  // 2. A valid certificate with another certificate's key.
  copyFileSync(leaf2.cert, cert);
  const mismatched = await call();
  t.equal(mismatched.status, 500, 'certificate and key that do not match: 500');
  t.equal(mismatched.body['reason'], 'cert_reload_failed');

  t.equal(await metricSum(p.m, failures), 2, 'both failures counted in svc_control_plane_cert_reload_total{result="failure"}');
  t.equal(await presented(p.l), fingerprint(leaf1.cert), 'the TLS bootstrap ingress still presents certificate 1');
  t.equal(await getH3({ lport: p.l, ca: ca1Pem }), 'backend', 'QUIC still presents certificate 1 (a client trusting only CA 1 is served)');
  t.notMatch(served.text(), marker, 'the file content appears in no log line');
  const logged = served.lines.filter((l) => l['msg'] === 'certificate reload failed: nothing changed, the loaded certificates keep serving');
  t.same(logged.map((l) => l['level']), ['error', 'error'], 'one error line per failed reload');
  t.match(logged[1], { errors: [{ code: /^EDGE_/, path: /^listen/ }] }, 'naming the code and the key, not the content');
  t.notMatch(served.text(), /\n\s+at .+:\d+:\d+\)?\n/, 'no stack trace in the output');
  const audited = auditEvents(served).filter((e) => JSON.stringify(e).includes('reload-certs') || JSON.stringify(e).includes('reload_certs'));
  t.ok(audited.length >= 2, `the failed reloads are audited (${audited.length} events)`);

  // 3. Fixed: the new pair loads everywhere.
  copyFileSync(leaf2.key, key);
  const good = await call();
  t.equal(good.status, 200, 'matching certificate and key: 200');
  t.equal(await presented(p.l), fingerprint(leaf2.cert), 'the TLS bootstrap ingress presents certificate 2');
  t.equal(await getH3({ lport: p.l, ca: ca2Pem }), 'backend', 'QUIC presents certificate 2 (a client trusting CA 2 is served)');
  t.match(await getH3({ lport: p.l, ca: ca1Pem }), /^error: /, 'and a client trusting only CA 1 is refused');
  t.equal(await metricSum(p.m, /^svc_control_plane_cert_reload_total\{result="success",reason="[^"]*"\} (\d+)$/), 1, 'one success counted');
});

t.test('certificate rotation by new paths is a live activation (docs/operations.md): 202, and the new certificate is presented on TCP and QUIC', async (t) => {
  const p = await freePorts();
  const first = path.join(dir, 'rotate-1.yaml');
  const served = await serve(first, configText(p, leaf1.cert, leaf1.key));
  t.teardown(() => served.stop());
  t.equal(await presented(p.l), fingerprint(leaf1.cert), 'certificate 1 at start');
  const second = path.join(dir, 'rotate-2.yaml');
  writeFileSync(second, configText(p, leaf2.cert, leaf2.key));
  const r = await api(p.c, ca1Pem, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: second, expected_generation: 1 });
  t.match(r, { status: 202, body: { generation: 2 } }, 'accepted as live: not 409 restart_required');
  t.equal(await presented(p.l), fingerprint(leaf2.cert), 'the TLS bootstrap ingress presents certificate 2');
  t.equal(await getH3({ lport: p.l, ca: ca2Pem }), 'backend', 'QUIC presents certificate 2');
});

t.test('restart with restart_command: the workers drain first, then the command runs (argv, no shell) and can stop the service as systemctl would; serve exits 0', async (t) => {
  const p = await freePorts();
  const marker = path.join(dir, 'restart-command.json');
  // Stands in for `systemctl restart edge-proxy`: records its argv and whether the listener still
  // accepts (it must not: drained), then stops the service with SIGTERM, as systemd would.
  const script = path.join(dir, 'restart-command.mjs');
  writeFileSync(
    script,
    `import net from 'node:net';
import { writeFileSync } from 'node:fs';
const [marker, port, pid, ...rest] = process.argv.slice(2);
const s = net.connect({ host: '127.0.0.1', port: Number(port) });
const listener = await new Promise((resolve) => { s.on('connect', () => resolve('accepting')); s.on('error', (e) => resolve(e.code)); });
s.destroy();
writeFileSync(marker, JSON.stringify({ rest, listener }));
process.kill(Number(pid), 'SIGTERM');
`,
  );
  const file = path.join(dir, 'restart-command.yaml');
  const text = `${configText(p, leaf1.cert, leaf1.key)}resilience: { watchdog: { drain_grace_ms: 500, restart_command: [${process.execPath}, ${script}, ${marker}, "${p.l}", "PID", "a b", "$HOME;x"] } }
`;
  // The supervisor's pid is known only once it runs: write it in before the restart is asked for.
  const served = await serve(file, text.replace('"PID"', '"0"'));
  t.teardown(() => served.stop());
  writeFileSync(file, text.replace('"PID"', `"${served.proc.pid}"`));
  const reload = await api(p.c, ca1Pem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {});
  t.equal(reload.status, 202, 'the restart_command change is live (reload)');
  const exited = once(served.proc, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  const r = await api(p.c, ca1Pem, 'POST', '/admin/runtime/restart', { token: TOKEN }, {});
  t.match(r, { status: 202, body: { status: 'draining' } });
  t.same(await exited, [0, null], 'serve stopped by the command SIGTERM, exit 0');
  t.same(JSON.parse(readFileSync(marker, 'utf8')), { rest: ['a b', '$HOME;x'], listener: 'ECONNREFUSED' }, 'argv passed verbatim (no shell), and the listener was drained before the command ran');
  t.ok(served.lines.some((l) => l['msg'] === 'restart requested' && l['level'] === 'warn'), 'the restart is logged at warn');
});

/** `edge-proxy serve` expected to refuse to start: its exit code, signal and whole output. */
async function serveExpectingFailure(file: string): Promise<{ code: number | null; output: string }> {
  const proc = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', file, '--state-dir', path.join(dir, `state-${path.basename(file)}`)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout.on('data', (c: Buffer) => (output += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (output += c.toString()));
  const timer = setTimeout(() => proc.kill('SIGKILL'), 60_000); // bound: a hang is a failure below
  const [code] = (await once(proc, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, output };
}

for (const which of ['control API', 'metrics endpoint'] as const) {
  t.test(`a ${which} port already taken: serve exits 1 with one clear line, no stack trace, no process left on the listener port`, async (t) => {
    const p = await freePorts();
    const squatter = net.createServer();
    squatter.listen(which === 'control API' ? p.c : p.m, '127.0.0.1');
    await once(squatter, 'listening');
    t.teardown(() => new Promise<void>((r) => squatter.close(() => r())));
    const file = path.join(dir, `taken-${which.replace(' ', '-')}.yaml`);
    writeFileSync(file, configText(p, leaf1.cert, leaf1.key));
    const { code, output } = await serveExpectingFailure(file);
    t.equal(code, 1, 'exit code 1');
    t.match(output, /EADDRINUSE|address already in use|in use/i, 'the cause is named');
    t.match(output, new RegExp(String(which === 'control API' ? p.c : p.m)), 'the port is named');
    t.notMatch(output, /\n\s+at .+:\d+:\d+\)?\n/, 'no stack trace');
    // Nothing stays behind on the data-plane port: a worker left over would hold it. Workers of a
    // gone supervisor exit within their deadline (5 s): poll, bounded.
    const bindable = (): Promise<boolean> =>
      new Promise((resolve) => {
        const probe = net.createServer();
        probe.once('error', () => resolve(false));
        probe.listen(p.l, '127.0.0.1', () => probe.close(() => resolve(true)));
      });
    let free = false;
    for (let i = 0; i < 50 && !free; i++) {
      free = await bindable();
      if (!free) await new Promise((r) => setTimeout(r, 200));
    }
    t.equal(free, true, 'the listener port is free again (no worker left behind)');
  });
}
