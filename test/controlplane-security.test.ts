// Attacks on the control API, end to end against a real `edge-proxy serve` over real HTTPS and TCP:
// - config_path naming files outside the allowed directories (a shadow-like file, a symlink to it,
//   /etc/shadow), a directory, /dev/zero and a FIFO: refused fast, nothing of the file anywhere;
//   hostile content inside the allowed directory comes back as codes and bounded paths only;
// - an operation whose caller disconnects while it waits is never carried out; one whose deadline
//   passes while it waits gets 503 and is never carried out;
// - 300 idle TCP connections do not lock an administrator out; a source outside the allowlist is
//   reset at accept before any TLS byte; handshake and idle timeouts close silent connections;
// - requested_by cannot impersonate (the authenticated actor is recorded, the text is a note), and
//   `__proto__` / `constructor` / `prototype` body keys are unknown fields.
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { auditEvents, serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const run = promisify(execFile);
const dir = mkdtempSync(path.join(tmpdir(), 'edge-cp-sec-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const etc = path.join(dir, 'etc');
const outside = path.join(dir, 'outside');
mkdirSync(etc);
mkdirSync(outside);
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

// A secret-looking marker: it must never appear in an answer, the history or the log.
const MARK = 'Zq7SHADOWHASHx9';
const shadow = path.join(outside, 'shadow');
writeFileSync(shadow, `root: "$6$${MARK}$0123456789abcdef:19000:0:99999:7:::"\n${MARK}daemon: "*:19000:0:99999:7:::"\n`);

const TOKENS = { viewer: 'viewer-token-0123456789abcdef', operator: 'operator-token-0123456789abcdef', admin: 'admin-token-0123456789abcdef' };
// Two backends: which one answers tells which generation serves (refused operations change nothing).
const backend = (name: string): Promise<number> => namedBackend(t, name);
const ports = { one: await backend('one'), two: await backend('two') };
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
/** What answers on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections (one worker: 3 each). */
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 3 });
const allAnswer = (body: string) => allFrom(body, { perProtocol: 3 });

function configText(o: { weight?: number; controlApiExtra?: string; app?: 'one' | 'two' } = {}): string {
  return `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { level: info, format: json }
performance: { worker_threads: 1 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: a, address: "127.0.0.1:${ports[o.app ?? 'one']}", weight: ${o.weight ?? 1} }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    ip_allowlist: { cidrs: [127.0.0.1/32, 127.0.0.2/32] }
    handshake_timeout_ms: 1500
    idle_timeout_ms: 4000
    auth:
      bearer_tokens:
        - { token: ${TOKENS.viewer}, role: viewer, actor_id: grafana }
        - { token: ${TOKENS.operator}, role: operator, actor_id: deploy-bot }
        - { token: ${TOKENS.admin}, role: admin, actor_id: sre }
${o.controlApiExtra ?? ''}`;
}

const served = await serve(path.join(etc, 'config.yaml'), configText());
t.teardown(() => served.stop());

interface Answer {
  readonly status: number;
  readonly body: Record<string, unknown>;
  readonly text: string;
  readonly ms: number;
  /** The client's port: the same port means the same connection. */
  readonly localPort: number;
}

/** One HTTPS call; `raw` sends the body bytes as given (JSON that JSON.stringify cannot produce). */
function call(method: string, p: string, o: { token?: string; body?: unknown; raw?: string; from?: string; agent?: https.Agent; signal?: AbortSignal } = {}): Promise<Answer> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const payload = o.raw ?? (o.body === undefined ? undefined : JSON.stringify(o.body));
    const headers: Record<string, string> = {};
    if (o.token !== undefined) headers['authorization'] = `Bearer ${o.token}`;
    if (payload !== undefined) Object.assign(headers, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(payload)) });
    const req = https.request(
      { host: '127.0.0.1', port: cport, path: p, method, ca: caPem, servername: 'localhost', headers, agent: o.agent ?? false, localAddress: o.from ?? '127.0.0.1', ...(o.signal === undefined ? {} : { signal: o.signal }) },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        const localPort = res.socket.localPort ?? 0;
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text.startsWith('{') ? (JSON.parse(text) as Record<string, unknown>) : {}, text, ms: Date.now() - started, localPort }));
      },
    );
    req.setTimeout(60_000, () => req.destroy(new Error('control API call timed out')));
    req.on('error', reject);
    req.end(payload);
  });
}
const op = (p: string, body: unknown) => call('POST', p, { token: TOKENS.operator, body });

/** The metrics endpoint's exposition. */
function scrape(): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve(text));
    }).on('error', reject);
  });
}

/** Resident memory of a process in KiB (/proc/<pid>/status VmRSS). */
function rssKiB(pid: number): number {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);
}

async function activeGeneration(): Promise<number> {
  return (await call('GET', '/admin/runtime', { token: TOKENS.viewer })).body['generation'] as number;
}

t.test('item 4: config_path outside the allowed directories is refused; nothing of the file comes back', async (t) => {
  const link = path.join(etc, 'innocent.yaml');
  symlinkSync(shadow, link);
  const targets: [string, string][] = [
    [shadow, 'a shadow-like file outside'],
    [link, 'a symlink inside pointing outside'],
    [`${etc}/../outside/shadow`, 'a dot-dot path'],
  ];
  if (existsSync('/etc/shadow')) targets.push(['/etc/shadow', '/etc/shadow itself']);
  for (const [target, label] of targets) {
    for (const route of ['validate', 'preview', 'activate', 'reload']) {
      const r = await op(`/admin/runtime/${route}`, { config_path: target });
      t.same([r.status, r.body['reason']], [403, 'config_path_not_allowed'], `${label}: ${route}`);
      t.notOk(r.text.includes(MARK) || r.text.includes('$6$'), `${label}: ${route} answer holds no file content`);
    }
  }
  const sub = path.join(etc, 'a-directory');
  mkdirSync(sub);
  t.match(await op('/admin/runtime/activate', { config_path: sub }), { status: 400, body: { reason: 'config_path_not_regular_file' } }, 'a directory');
  t.same(await answers(), allAnswer('one'), 'the refused activations and reloads changed nothing that serves, on any protocol');
});

t.test('item 4: hostile content inside the allowed directory comes back as codes and bounded paths only', async (t) => {
  // YAML double-quoted escapes: BEL and ESC in the key name itself.
  // Key names are reported (as JSON paths), bounded: this one is 300 characters long.
  const longKey = `${'k'.repeat(300)}\\a\\e[31m`;
  const hostile = path.join(etc, 'hostile.yaml');
  writeFileSync(hostile, `${configText()}root: "$6$${MARK}$abc"\n"${longKey}": 1\n`.replace('cidrs: [127.0.0.1/32, 127.0.0.2/32]', `cidrs: ["${MARK}"]`));
  const r = await op('/admin/runtime/activate', { config_path: hostile });
  t.match(r, { status: 400, body: { reason: 'invalid_config', plan: { candidate_status: 'invalid' } } });
  const errors = (r.body['plan'] as { errors: { path: string; code: string; message: string }[] }).errors;
  t.ok(errors.some((e) => e.code === 'EDGE_CONFIG_UNKNOWN_KEY'), 'unknown keys are reported by code');
  t.ok(errors.some((e) => e.code === 'EDGE_CONFIG_CIDR'), 'a rule that quotes the value in its own message is reported by code');
  t.notOk(r.text.includes(MARK), 'no value of the file anywhere in the answer');
  for (const e of errors) {
    t.notOk(e.message.includes(MARK), `${e.code}: the message quotes nothing of the file`);
    t.ok(e.path.split('.').every((s) => s.length <= 64), `${e.code}: key names in the path are bounded`);
    t.notOk(/[\u0000-\u001f\u007f]/.test(e.path), `${e.code}: no control characters in the path`);
  }
  const version = path.join(etc, 'version.yaml');
  writeFileSync(version, `version: "${MARK}"\n`);
  const v = await op('/admin/runtime/validate', { config_path: version });
  t.match(v, { status: 200, body: { candidate_status: 'invalid', errors: [{ code: 'EDGE_CONFIG_UNSUPPORTED_VERSION', path: 'version' }] } });
  t.notOk(v.text.includes(MARK), 'a rule message quoting a value is not passed on');
  const tag = path.join(etc, 'tag.yaml');
  writeFileSync(tag, `listen: !<tag:${MARK}> x\n`);
  const syntax = await op('/admin/runtime/validate', { config_path: tag });
  t.match(syntax, { status: 200, body: { candidate_status: 'invalid', errors: [{ code: 'EDGE_CONFIG_YAML_SYNTAX', message: /^line 1, column \d+: / }] } });
  t.notOk(syntax.text.includes(MARK), 'a YAML parser message quoting a tag is not passed on');
  t.same(await answers(), allAnswer('one'), 'the refused hostile activation changed nothing that serves, on any protocol');
});

t.test('item 4: neither the history a viewer reads nor the log (audit included) holds file content', async (t) => {
  const h = await call('GET', '/admin/runtime/history', { token: TOKENS.viewer });
  t.equal(h.status, 200);
  t.notOk(h.text.includes(MARK), 'history');
  t.notOk(served.text().includes(MARK), 'service log and audit events');
  t.ok(auditEvents(served).some((e) => e['action'] === 'activate' && e['result'] === 'denied' && e['reason'] === 'config_path_not_allowed'), 'the refusal is audited by reason');
});

t.test('item 5: /dev/zero is refused at once and the supervisor does not grow', async (t) => {
  const pid = served.proc.pid as number;
  const before = rssKiB(pid);
  const r = await op('/admin/runtime/activate', { config_path: '/dev/zero' });
  t.same([r.status, r.body['reason']], [403, 'config_path_not_allowed'], '/dev is not an allowed directory');
  // With /dev allowed, the regular-file check refuses it before it is opened.
  const devAllowed = path.join(etc, 'dev-allowed.yaml');
  writeFileSync(devAllowed, configText({ app: 'two', controlApiExtra: `    config_path_allowed_dirs: [${etc}, /dev]` }));
  t.match(await op('/admin/runtime/activate', { config_path: devAllowed }), { status: 202 });
  t.same(await answers(), allAnswer('two'), 'the activation took effect on every protocol');
  for (const route of ['validate', 'preview', 'activate', 'reload']) {
    const z = await op(`/admin/runtime/${route}`, { config_path: '/dev/zero' });
    t.same([z.status, z.body['reason']], [400, 'config_path_not_regular_file'], `${route} /dev/zero: not a regular file`);
    t.ok(z.ms < 2000, `${route} answered in ${z.ms} ms`);
  }
  const after = rssKiB(pid);
  t.ok(after - before < 64 * 1024, `supervisor VmRSS ${before} KiB → ${after} KiB`);
  t.comment(`supervisor VmRSS before ${before} KiB, after ${after} KiB`);
  t.same(await answers(), allAnswer('two'), 'the refused /dev/zero operations changed nothing that serves');
});

t.test('item 5: a FIFO is refused at once and does not block later operations', async (t) => {
  const fifo = path.join(etc, 'candidate.fifo');
  await run('mkfifo', [fifo]);
  for (const route of ['validate', 'preview', 'activate', 'reload']) {
    const r = await op(`/admin/runtime/${route}`, { config_path: fifo });
    t.same([r.status, r.body['reason']], [400, 'config_path_not_regular_file'], `${route}: FIFO refused`);
    t.ok(r.ms < 2000, `${route} answered in ${r.ms} ms`);
  }
  t.same(await answers(), allAnswer('two'), 'the refused FIFO operations changed nothing that serves');
  const valid = path.join(etc, 'after-fifo.yaml');
  writeFileSync(valid, configText({ weight: 2 }));
  const next = await op('/admin/runtime/activate', { config_path: valid });
  t.match(next, { status: 202, body: { status: 'active', config_source: valid } });
  t.ok(next.ms < 10_000, `the next activation ran at once (${next.ms} ms)`);
  t.same(await answers(), allAnswer('one'), 'the next activation took effect on every protocol');
});

/** Operation attempts of `action` audited so far. */
const attempts = (action: string): number => auditEvents(served).filter((e) => e['event_type'] === 'operation_attempt' && e['action'] === action).length;

/** Stops the worker so an activation waits in prepare; returns a function that resumes it. */
async function holdWorker(): Promise<() => void> {
  const snap = await call('GET', '/admin/runtime', { token: TOKENS.viewer });
  const pid = ((snap.body['workers'] as { list: { pid: number }[] }).list[0] as { pid: number }).pid;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  const resume = (): void => {
    if (resumed) return;
    resumed = true;
    process.kill(pid, 'SIGCONT');
  };
  t.teardown(resume);
  return resume;
}

t.test('item 5: an activation whose caller disconnects while it waits is never applied', async (t) => {
  const first = path.join(etc, 'first.yaml');
  const second = path.join(etc, 'second.yaml');
  writeFileSync(first, configText({ weight: 3, app: 'two' }));
  writeFileSync(second, configText({ weight: 4 }));
  const resume = await holdWorker();
  // An attempt is audited once its body is read, just before it joins the queue.
  let seen = attempts('activate');
  const a = op('/admin/runtime/activate', { config_path: first, reason: 'runs first' });
  await served.waitFor(() => attempts('activate') > seen);
  seen = attempts('activate');
  const ac = new AbortController();
  const b = call('POST', '/admin/runtime/activate', { token: TOKENS.operator, body: { config_path: second, reason: 'queued then abandoned' }, signal: ac.signal }).catch((e: Error) => e);
  await served.waitFor(() => attempts('activate') > seen);
  ac.abort();
  t.ok((await b) instanceof Error, 'the second caller is gone');
  const abandoned = await served.waitFor((e) => e['msg'] === 'control operation abandoned: not carried out' && e['reason'] === 'caller_gone');
  t.match(abandoned, { phase: 'queued', action: 'activate' });
  resume();
  const done = await a;
  t.match(done, { status: 202, body: { config_source: first } });
  const generation = done.body['generation'] as number;
  t.equal(await activeGeneration(), generation, 'the first activation is active, the abandoned one never ran');
  const h = await call('GET', '/admin/runtime/history', { token: TOKENS.viewer });
  t.notOk(h.text.includes(second), 'the abandoned candidate left no history entry');
  t.same(await answers(), allAnswer('two'), 'the first activation serves on every protocol; the abandoned one (backend one) nowhere');
  t.match(await served.waitFor((e) => e['audit'] === true && e['event_type'] === 'operation_result' && e['reason'] === 'caller_gone'), { action: 'activate', result: 'failed', failure_class: 'abandoned' });
});

t.test('item 5: an operation whose deadline passes while it waits gets 503 and is never applied', async (t) => {
  const short = path.join(etc, 'short-deadline.yaml');
  writeFileSync(short, configText({ weight: 5, controlApiExtra: '    operation_timeout_ms: 1500' }));
  t.match(await op('/admin/runtime/activate', { config_path: short }), { status: 202 });
  t.same(await answers(), allAnswer('one'), 'the activation took effect on every protocol');
  const later = path.join(etc, 'later.yaml');
  writeFileSync(later, configText({ weight: 6, app: 'two', controlApiExtra: '    operation_timeout_ms: 1500' }));
  const resume = await holdWorker();
  const seen = attempts('reload');
  const a = op('/admin/runtime/reload', { reason: 'holds the queue' });
  await served.waitFor(() => attempts('reload') > seen);
  const b = await op('/admin/runtime/activate', { config_path: later });
  t.same([b.status, b.body['reason']], [503, 'control_plane_busy'], 'the waiting activation is answered at its deadline');
  t.ok(b.ms >= 1000 && b.ms < 10_000, `after ${b.ms} ms`);
  const rc = await op('/admin/runtime/reload-certs', {});
  t.same([rc.status, rc.body['reason']], [503, 'control_plane_busy'], 'reload-certs waits in the same queue under the same deadline');
  served.proc.kill('SIGHUP');
  t.match(await served.waitFor((e) => e['msg'] === 'SIGHUP reload abandoned: not carried out'), { reason: 'deadline_exceeded', phase: 'queued' }, 'SIGHUP waits under the same deadline');
  resume();
  const held = await a;
  t.equal(held.status, 202, 'the running reload completes');
  t.equal(await activeGeneration(), held.body['generation'], 'the late activation was not carried out afterwards');
  t.notOk((await call('GET', '/admin/runtime/history', { token: TOKENS.viewer })).text.includes(later));
  t.same(await answers(), allAnswer('one'), 'the reload serves; the late activation (backend two) nowhere, on any protocol');
  const metrics = await scrape();
  t.match(metrics, /^svc_runtime_rejections_total\{reason="control_plane_busy"\} 3$/m, 'activate, reload-certs and SIGHUP counted');
  t.match(metrics, /^svc_runtime_rejections_total\{reason="caller_gone"\} 1$/m, 'the abandoned activation of the test before counted');
  // Back to the default deadline for the tests below.
  const restore = path.join(etc, 'restore.yaml');
  writeFileSync(restore, configText({ app: 'two' }));
  t.match(await op('/admin/runtime/activate', { config_path: restore }), { status: 202 });
  t.same(await answers(), allAnswer('two'), 'the restoring activation took effect on every protocol');
});

t.test('item 13: requested_by cannot impersonate; __proto__, constructor and prototype are unknown fields', async (t) => {
  for (const key of ['__proto__', 'constructor', 'prototype', 'toString', 'hasOwnProperty']) {
    for (const route of ['validate', 'activate', 'rollback']) {
      const r = await call('POST', `/admin/runtime/${route}`, { token: TOKENS.operator, raw: `{"${key}": {"config_path": "/etc/shadow"}, "target_generation": 1}` });
      t.same([r.status, r.body['reason']], [400, 'invalid_request'], `${route} with '${key}'`);
    }
  }
  const nul = await op('/admin/runtime/validate', { config_path: `${etc}/config.yaml\u0000/etc/shadow` });
  t.same([nul.status, nul.body['reason']], [400, 'invalid_request'], 'a config_path with a NUL byte');
  const claimed = `sre-lead\u001b[2J\u0000${'x'.repeat(1000)}`;
  const p = await op('/admin/runtime/preview', { requested_by: claimed, reason: 'note\u0007 test' });
  t.equal(p.status, 200);
  const entry = p.body['history_entry'] as { requested_by: string; requested_by_note: string; reason: string };
  t.equal(entry.requested_by, 'deploy-bot', 'the record names the authenticated actor');
  t.ok(entry.requested_by_note.startsWith('sre-lead[2J') && entry.requested_by_note.length <= 256, 'the supplied name is a bounded note');
  t.notOk(/[\u0000-\u001f]/.test(entry.requested_by_note + entry.reason), 'without control characters');
  const attempt = auditEvents(served).findLast((e) => e['event_type'] === 'operation_attempt' && e['action'] === 'preview');
  t.match(attempt, { actor: { id: 'deploy-bot', roles: ['operator'], requested_by_note: /^sre-lead/ } });
  t.notOk('requested_by' in ((attempt?.['actor'] as object | undefined) ?? {}), 'the audit actor carries no unauthenticated requested_by');
});

/** A raw TCP connection from `from`; resolves once connected, with a count of the bytes received. */
async function rawConnect(from: string): Promise<{ socket: net.Socket; received: () => number; closed: Promise<void> }> {
  const socket = net.connect({ host: '127.0.0.1', port: cport, localAddress: from });
  let bytes = 0;
  socket.on('data', (d: Buffer) => (bytes += d.length));
  socket.on('error', () => undefined);
  // Not events.once: it rejects on 'error', and a reset is an expected outcome here.
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  await Promise.race([new Promise<void>((resolve) => socket.once('connect', () => resolve())), closed]);
  return { socket, received: () => bytes, closed };
}

t.test('item 10: a source outside the allowlist is reset at accept, before any TLS byte', async (t) => {
  const c = await rawConnect('127.0.0.3');
  c.socket.write(Buffer.from('160301', 'hex')); // the start of a ClientHello
  await c.closed;
  t.equal(c.received(), 0, 'not one byte from the server');
  t.match(await served.waitFor((e) => e['audit'] === true && e['reason'] === 'source_ip_not_allowed' && e['failure_class'] === 'connection'), { event_type: 'authentication', result: 'denied', peer_addr: '127.0.0.3' });
});

t.test('item 10: 300 idle connections do not lock an administrator out', async (t) => {
  // An administrator's keep-alive connection that has authenticated keeps its place.
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1 });
  t.teardown(() => agent.destroy());
  const proven = await call('GET', '/admin/runtime', { token: TOKENS.admin, agent });
  t.equal(proven.status, 200);
  const handshakeEvents = () => auditEvents(served).filter((e) => e['failure_class'] === 'tls_handshake').length;
  const eventsBefore = handshakeEvents();
  const idle = await Promise.all(Array.from({ length: 300 }, () => rawConnect('127.0.0.1')));
  t.teardown(() => idle.forEach((c) => c.socket.destroy()));
  const fromSame = await call('GET', '/admin/runtime', { token: TOKENS.admin });
  t.equal(fromSame.status, 200, `a new admin connection from the flooding address gets in (${fromSame.ms} ms)`);
  t.ok(fromSame.ms < 5000);
  const fromOther = await call('GET', '/admin/runtime', { token: TOKENS.admin, from: '127.0.0.2' });
  t.equal(fromOther.status, 200, `an admin from another allowed address gets in (${fromOther.ms} ms)`);
  const kept = await call('GET', '/admin/runtime', { token: TOKENS.admin, agent });
  t.same([kept.status, kept.localPort], [200, proven.localPort], 'the proven keep-alive connection kept its place');
  const open = idle.filter((c) => !c.socket.destroyed && c.socket.readyState === 'open').length;
  t.ok(open <= 32, `at most max_connections_per_source idle connections stay (${open})`);
  const metrics = await scrape();
  t.ok(Number(/^svc_control_api_connection_limit_drops (\d+)$/m.exec(metrics)?.[1] ?? 0) >= 268, 'the displaced connections are counted');
  const flood = handshakeEvents() - eventsBefore;
  t.ok(flood <= 10, `the flood is audited at a rate, not once per connection (${flood} handshake events)`);
});

t.test('item 10: silent connections are closed at the handshake and idle timeouts', async (t) => {
  const raw = await rawConnect('127.0.0.1');
  const started = Date.now();
  await raw.closed;
  const waited = Date.now() - started;
  t.ok(waited >= 1000 && waited < 10_000, `no ClientHello: closed after ${waited} ms (handshake_timeout_ms 1500)`);
  const tlsSocket = (await import('node:tls')).connect({ host: '127.0.0.1', port: cport, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  tlsSocket.on('error', () => undefined);
  await once(tlsSocket, 'secureConnect');
  const secured = Date.now();
  await once(tlsSocket, 'close');
  const idleFor = Date.now() - secured;
  t.ok(idleFor >= 3500 && idleFor < 15_000, `handshake done, no request: closed after ${idleFor} ms (idle_timeout_ms 4000)`);
});
