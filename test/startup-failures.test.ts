// Startup failures an operator meets first (issue 12, "Failure paths"), with real `edge-proxy serve`
// processes: an unwritable `log.file`, an unreadable certificate, a listener port in use. Each is
// one coded line on stderr and exit 1, never a Node stack trace, and nothing is left running.
// `edge-proxy -c` reports what it can know beforehand (`log.file`'s directory missing, a directory
// as the file). An unusable state directory costs persistence, not the start: one error line.
import t from 'tap';
import type { Test } from 'tap';
import dgram from 'node:dgram';
import net from 'node:net';
import { once } from 'node:events';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { serve } from './support/serve.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import type { CommandRun } from './support/edge-proxy-command.ts';
import { namedBackend } from './support/backends.ts';
import { getH1 } from './support/served-by.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const { dir, ca, leaf } = serviceFiles(t, 'edge-startup-failures-');
const TOKEN = 'admin-token-startup-failures-0123456789';
const backendPort = await namedBackend(t, 'backend');
const STACK = /^\s+at .+/m;

/** A log line's level as a name, whether the logger writes pino's numbers or labels. */
const levelOf = (l: Record<string, unknown>): unknown => ({ 30: 'info', 40: 'warn', 50: 'error' } as Record<string, string>)[String(l['level'])] ?? l['level'];

/** `cert`: another listener certificate file (with the leaf's key); the control API keeps the leaf. */
function configText(p: ServicePorts, o: { logFile?: string; cert?: string } = {}): string {
  return serviceConfig({
    ports: p,
    cert: { cert: o.cert ?? leaf.cert, key: leaf.key },
    log: o.logFile === undefined ? undefined : `file: ${JSON.stringify(o.logFile)}`,
    performance: 'worker_threads: 1',
    backendPort,
    controlApiTls: leaf,
    token: { token: TOKEN, role: 'admin', actor: 'startup' },
  });
}

/** Runs `edge-proxy <args>` to its end (bounded: a hang is a failure). */
const run = (args: readonly string[]): Promise<CommandRun> => runEdgeProxy(args);

const serveArgs = (file: string): string[] => ['serve', '-c', file, '--state-dir', path.join(dir, `state-${path.basename(file)}`)];
const lines = (text: string): string[] => text.split('\n').filter((l) => l.length > 0);

/** Whether `port` can be bound on 127.0.0.1 again, polled (bounded) while leftover workers would exit. */
async function freeAgain(port: number): Promise<boolean> {
  const bindable = (): Promise<boolean> =>
    new Promise((resolve) => {
      const probe = net.createServer();
      probe.once('error', () => resolve(false));
      probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
    });
  for (let i = 0; i < 50; i++) {
    if (await bindable()) return true;
    await new Promise((r) => setTimeout(r, 200)); // another process's exit: poll, bounded
  }
  return false;
}

// EACCES even for root (sysfs refuses new files); a missing directory; a directory as the file.
const unwritable = [
  { name: 'a file the service may not create (EACCES)', file: `/sys/edge-proxy-test-${process.pid}.log`, errno: /permission denied \(EACCES\)/ },
  { name: 'a missing directory (ENOENT)', file: path.join(dir, 'no-such-dir', 'edge.log'), errno: /no such file or directory \(ENOENT\)/ },
  { name: 'a directory (EISDIR)', file: dir, errno: /is a directory \(EISDIR\)/ },
];

for (const u of unwritable) {
  t.test(`log.file is ${u.name}: serve prints exactly one coded line on stderr and exits 1, no stack trace`, async (t) => {
    const p = await freePorts();
    const file = path.join(dir, `log-${u.errno.source.replace(/\W/g, '')}.yaml`);
    writeFileSync(file, configText(p, { logFile: u.file }));
    const r = await run(serveArgs(file));
    t.equal(r.code, 1, 'exit 1');
    t.same(lines(r.stderr).length, 1, `exactly one stderr line: ${r.stderr}`);
    t.match(r.stderr, new RegExp(`^edge-proxy serve: EDGE_STARTUP_LOG_FILE: log\\.file ${u.file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}: ${u.errno.source}\\n$`), 'the code, the file and the errno');
    t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace');
    t.equal(r.stdout, '', 'nothing else printed');
    t.equal(await freeAgain(p.l), true, 'nothing holds the listener port');
  });
}

t.test('edge-proxy -c reports a log.file it can tell is unusable: missing directory, a directory, a path through a file', async (t) => {
  const p = await freePorts();
  const cases = [
    { logFile: path.join(dir, 'missing', 'edge.log'), want: `log.file: EDGE_CONFIG_LOG_FILE: directory ${path.join(dir, 'missing')} does not exist` },
    { logFile: dir, want: `log.file: EDGE_CONFIG_LOG_FILE: ${dir} is a directory` },
    { logFile: path.join(leaf.cert, 'edge.log'), want: `log.file: EDGE_CONFIG_LOG_FILE: ${path.join(leaf.cert, 'edge.log')} cannot be reached (a path component is not a directory: ENOTDIR)` },
  ];
  for (const [i, c] of cases.entries()) {
    const file = path.join(dir, `validate-${i}.yaml`);
    writeFileSync(file, configText(p, { logFile: c.logFile }));
    const r = await run(['-c', file]);
    t.equal(r.code, 1, `${c.logFile}: exit 1`);
    t.same(lines(r.stderr), [c.want, `${file}: invalid (1 error)`], 'one coded line, then the summary');
  }
  // A writable place validates (the file is not created by the check).
  const ok = path.join(dir, 'logs');
  mkdirSync(ok);
  const file = path.join(dir, 'validate-ok.yaml');
  writeFileSync(file, configText(p, { logFile: path.join(ok, 'edge.log') }));
  const r = await run(['-c', file]);
  t.equal(r.code, 0, 'a writable directory: valid');
  t.throws(() => readFileSync(path.join(ok, 'edge.log')), { code: 'ENOENT' }, 'and the check created nothing');
});

/** Binds `port` on 127.0.0.1 (TCP or UDP) until the test ends, so that the service finds it taken. */
async function occupy(t: Test, protocol: 'tcp' | 'udp', port: number): Promise<void> {
  const squatter = protocol === 'tcp' ? net.createServer().listen(port, '127.0.0.1') : dgram.createSocket('udp4').bind(port, '127.0.0.1');
  await once(squatter, 'listening');
  t.teardown(() => new Promise<void>((r) => squatter.close(() => r())));
}

t.test('an unreadable certificate: coded lines naming the key and the file, exit 1, no stack trace', async (t) => {
  const p = await freePorts();
  const file = path.join(dir, 'bad-cert.yaml');
  const missing = path.join(dir, 'missing.crt');
  writeFileSync(file, configText(p, { cert: missing }));
  const r = await run(serveArgs(file));
  t.equal(r.code, 1, 'exit 1');
  t.same(lines(r.stderr), [`listen.tls.cert: EDGE_CONFIG_TLS_UNREADABLE: certificate ${missing}: no such file`, `edge-proxy serve: EDGE_STARTUP_CONFIG: ${file}: invalid configuration`], 'the error line, then the coded startup line');
  t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace');
});

t.test('the listener port in use: one coded line naming the port, exit 1 without waiting for re-forks, nothing left behind', async (t) => {
  const p = await freePorts();
  await occupy(t, 'tcp', p.l);
  const file = path.join(dir, 'port-taken.yaml');
  writeFileSync(file, configText(p));
  const r = await run(serveArgs(file));
  t.equal(r.code, 1, 'exit 1');
  t.equal(lines(r.stderr).length, 1, `one stderr line: ${r.stderr}`);
  // The supervisor's probe bind (listener-probe.ts) finds it before any worker binds.
  t.match(r.stderr, new RegExp(`^edge-proxy serve: EDGE_STARTUP_PORT_IN_USE: listener \\S+ \\(127\\.0\\.0\\.1:${p.l}\\) could not be bound: EADDRINUSE: its TCP port is already bound by another process`), 'the code, the cause and the port');
  t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace');
  // Before, the failed first activation waited 2 × 30 s for replacements that had nothing to serve.
  t.ok(r.ms < 30_000, `exits without waiting for re-forks (${r.ms} ms)`);
  t.equal(await freeAgain(p.c), true, 'the control API port is free (nothing left running)');
});

t.test('the listener UDP (QUIC) port in use: one coded line naming the listener, protocol and port', async (t) => {
  const p = await freePorts();
  await occupy(t, 'udp', p.l);
  const file = path.join(dir, 'udp-taken.yaml');
  writeFileSync(file, configText(p));
  const r = await run(serveArgs(file));
  t.equal(r.code, 1, 'exit 1');
  t.equal(lines(r.stderr).length, 1, `one stderr line: ${r.stderr}`);
  t.match(r.stderr, new RegExp(`^edge-proxy serve: EDGE_STARTUP_PORT_IN_USE: listener \\S+ \\(127\\.0\\.0\\.1:${p.l}\\) could not be bound: EADDRINUSE: its UDP port is already bound by another process`), 'the code, the listener, UDP and the port');
  t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace');
});

t.test('the metrics port in use: one coded line', async (t) => {
  const p = await freePorts();
  await occupy(t, 'tcp', p.m);
  const file = path.join(dir, 'metrics-taken.yaml');
  writeFileSync(file, configText(p));
  const r = await run(serveArgs(file));
  t.equal(r.code, 1, 'exit 1');
  t.same(lines(r.stderr), [`edge-proxy serve: EDGE_STARTUP_METRICS: metrics endpoint 127.0.0.1:${p.m}: address already in use (EADDRINUSE)`]);
  t.equal(await freeAgain(p.l), true, 'the listener port is free (no worker left behind)');
});

t.test('a state directory that is a file: one error line, and the service starts and serves', async (t) => {
  const p = await freePorts();
  const sub = path.join(dir, 'bad-state');
  mkdirSync(sub);
  // serve() puts the state directory beside the config file (`state-<file>`): make that path a regular file.
  writeFileSync(path.join(sub, 'state-config.yaml'), 'not a directory');
  const served = await serve(path.join(sub, 'config.yaml'), configText(p));
  t.teardown(() => served.stop());
  const errors = served.lines.filter((l) => levelOf(l) === 'error');
  t.equal(errors.length, 1, 'one error line');
  t.match(errors[0], { state_dir: path.join(sub, 'state-config.yaml'), code: /^E[A-Z_]+$/ }, 'naming the directory and why');
  t.equal(await getH1({ lport: p.l, ca: readFileSync(ca.cert) }), 'backend', 'and it serves');
  t.notMatch(served.text(), STACK, 'no stack trace');
});
