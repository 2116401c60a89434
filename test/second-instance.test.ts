// Issue 38 finding 11: a second instance joined silently. Listeners bind with SO_REUSEPORT, so a
// second `serve` of the same user on an occupied port started without error and took a share of
// the connections; and on the same state directory it resumed the other one's generations. With
// real `edge-proxy serve` processes: a second serve on the same port exits 1 with one coded line
// and the first keeps every connection; on the same state directory (other ports) it exits 1
// naming the holder's pid, also when both start at the same instant; after the holder is
// SIGKILLed its stale lock is taken over (one warning) and the generations resume; an activation
// that adds a listener on a port another serve holds fails in prepare; and the service's own
// rebinding (a rolling restart, SIGHUP) is not refused.
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import { namedBackend } from './support/backends.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';
import { api, SUITE_COMPILE_CACHE } from './support/serve.ts';

const main = path.join(import.meta.dirname, '..', 'packages/cli/src/main.ts');

/** `edge-proxy serve` as a child process: resolves with 'serving' once it logs so, or its exit code. */
function startServe(args: readonly string[]) {
  const proc = spawn(process.execPath, [main, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_COMPILE_CACHE: SUITE_COMPILE_CACHE } });
  let stderr = '';
  proc.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const outcome = new Promise<'serving' | number | null>((resolve) => {
    let out = '';
    proc.stdout.on('data', (c: Buffer) => {
      out += c.toString();
      if (out.includes('"msg":"edge-proxy serving"')) resolve('serving');
    });
    proc.once('exit', (code) => resolve(code));
  });
  return { proc, outcome, stderr: () => stderr };
}

const { dir, leaf, caPem } = serviceFiles(t, 'edge-second-instance-');
const TOKEN = 'admin-token-second-instance-0123456789';
const [first, second] = [await namedBackend(t, 'first'), await namedBackend(t, 'second')];
const STACK = /^\s+at .+/m;
const lines = (text: string): string[] => text.split('\n').filter((l) => l.length > 0);

/** `listeners` (named ones, with the `b` on port `extra` when given) instead of `listen`, when `named`. */
const configText = (p: ServicePorts, backendPort: number, o: { named?: boolean; extra?: number } = {}): string => {
  const text = serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 2', controlApiTls: leaf, token: { token: TOKEN, role: 'admin', actor: 'ops' } });
  if (o.named !== true) return text;
  const listener = (name: string, port: number): string => `\n  - { name: ${name}, address: 127.0.0.1, port: ${port}, tls: { cert: ${leaf.cert}, key: ${leaf.key} } }`;
  return text.replace(/^listen: (.*)$/m, `listeners:${listener('a', p.l)}${o.extra === undefined ? '' : listener('b', o.extra)}`);
};
const serveArgs = (file: string, stateDir: string): string[] => ['serve', '-c', file, '--state-dir', stateDir];

/** Whether `port` can be bound on 127.0.0.1 (TCP, without SO_REUSEPORT), polled while another process's workers exit. */
async function freeAgain(port: number): Promise<boolean> {
  const bindable = (): Promise<boolean> =>
    new Promise((resolve) => {
      const probe = net.createServer();
      probe.once('error', () => resolve(false));
      probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
    });
  for (let i = 0; i < 100; i++) {
    if (await bindable()) return true;
    await new Promise((r) => setTimeout(r, 100)); // another process's exit: poll, bounded
  }
  return false;
}

/** The first serve: it lives across the subtests (the last one stops it). */
let held: Served | undefined;
let pa: ServicePorts;
t.teardown(() => held?.stop());
const first_ = (): Served => {
  if (held === undefined) throw new Error('the first serve did not start');
  return held;
};

t.test('a second serve on the same listener port (other state directory, other API ports) exits 1 with one coded line; the first keeps every connection', async (t) => {
  pa = await freePorts();
  held = await serve(path.join(dir, 'a.yaml'), configText(pa, first));
  const pb = { ...(await freePorts()), l: pa.l };
  const fileB = path.join(dir, 'b.yaml');
  writeFileSync(fileB, configText(pb, second));
  const r = await runEdgeProxy(serveArgs(fileB, path.join(dir, 'state-b')));
  t.equal(r.code, 1, 'exit 1');
  t.equal(lines(r.stderr).length, 1, `one stderr line: ${r.stderr}`);
  t.match(r.stderr, new RegExp(`^edge-proxy serve: EDGE_STARTUP_PORT_IN_USE: listener \\S+ \\(127\\.0\\.0\\.1:${pa.l}\\) could not be bound: EADDRINUSE: its TCP port is already bound by another process`), 'the code, the listener and the port');
  t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace');
  t.equal(await freeAgain(pb.c), true, "nothing of the second is left (its control API port is free)");
  // 12 fresh connections per protocol over the first's two workers: every one answered by the first.
  t.same(await servedBy({ lport: pa.l, ca: caPem }, { perProtocol: 12 }), allFrom('first', { perProtocol: 12 }), 'every connection on every protocol reaches the first');
});

t.test('a second serve on the same state directory (other ports) exits 1 naming the holder; the first keeps serving', async (t) => {
  const pb = await freePorts();
  const fileB = path.join(dir, 'b2.yaml');
  writeFileSync(fileB, configText(pb, second));
  const r = await runEdgeProxy(serveArgs(fileB, first_().stateDir));
  t.equal(r.code, 1, 'exit 1');
  t.same(lines(r.stderr), [`edge-proxy serve: EDGE_STARTUP_STATE_LOCKED: state directory ${first_().stateDir} is held by another running edge-proxy serve (pid ${first_().proc.pid})`], 'one coded line naming the directory and the pid');
  t.equal(await freeAgain(pb.l), true, 'it bound nothing');
  const lock = JSON.parse(readFileSync(path.join(first_().stateDir, 'serve.lock'), 'utf8')) as { pid: number };
  t.equal(lock.pid, first_().proc.pid, 'serve.lock still names the first');
  t.same(await servedBy({ lport: pa.l, ca: caPem }, { perProtocol: 2 }), allFrom('first', { perProtocol: 2 }));
});

t.test("the service's own rebinding is not refused: a rolling restart and a SIGHUP reload", async (t) => {
  const r = await api(pa.c, caPem, 'POST', '/admin/runtime/restart', { token: TOKEN }, {});
  t.equal(r.status, 202, `restart accepted: ${JSON.stringify(r.body)}`);
  await first_().waitFor((l) => l['msg'] === 'workers restarted', 60_000);
  t.same(await servedBy({ lport: pa.l, ca: caPem }, { perProtocol: 4 }), allFrom('first', { perProtocol: 4 }), 'the re-forked workers serve');
  first_().proc.kill('SIGHUP');
  await first_().waitFor((l) => l['msg'] === 'SIGHUP reload');
  t.notOk(first_().lines.some((l) => l['code'] === 'EDGE_LISTENER_BIND_FAILED'), 'no bind refused');
});

t.test('an activation adding a listener on a port another serve holds fails in prepare; nothing changes', async (t) => {
  const pb = await freePorts();
  const fileB = path.join(dir, 'c.yaml');
  const b = await serve(fileB, configText(pb, second, { named: true }));
  t.teardown(() => b.stop());
  const candidate = path.join(dir, 'c-plus.yaml');
  writeFileSync(candidate, configText(pb, second, { named: true, extra: pa.l }));
  const r = await api(pb.c, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: candidate, expected_generation: 1 });
  t.match(r, { status: 500, body: { reason: 'prepare_failed', code: 'EDGE_LISTENER_BIND_FAILED', message: new RegExp(`listener b \\(127\\.0\\.0\\.1:${pa.l}\\) could not be bound: EADDRINUSE: its TCP port is already bound by another process`) } });
  t.match(await b.waitFor((l) => l['code'] === 'EDGE_LISTENER_BIND_FAILED'), { level: 'error', phase: 'prepare', generation: 2 });
  t.same(await servedBy({ lport: pa.l, ca: caPem }, { perProtocol: 8 }), allFrom('first', { perProtocol: 8 }), 'port a is still the first serve\'s alone');
  t.equal(await b.stop(), 0);
});

t.test('the holder SIGKILLed: its stale lock is taken over with one warning and its generations resume', async (t) => {
  const pid = first_().proc.pid as number;
  first_().proc.kill('SIGKILL');
  await once(first_().proc, 'exit');
  t.ok(existsSync(path.join(first_().stateDir, 'serve.lock')), 'the killed service left its serve.lock');
  t.equal(await freeAgain(pa.l), true, 'its workers left with it');
  held = await serve(path.join(dir, 'a.yaml'), configText(pa, first));
  const warn = first_().lines.filter((l) => l['code'] === 'EDGE_STATE_LOCK_STALE');
  t.match(warn, [{ state_dir: first_().stateDir, stale_pid: pid }], 'one warning naming the old pid');
  t.ok(first_().lines.some((l) => typeof l['msg'] === 'string' && /^resumed generation 2 from the state directory$/.test(l['msg'])), 'the generations resume (2: the SIGHUP reload above)');
  t.equal((JSON.parse(readFileSync(path.join(first_().stateDir, 'serve.lock'), 'utf8')) as { pid: number }).pid, first_().proc.pid, 'serve.lock names the new holder');
  t.equal(await first_().stop(), 0);
  t.notOk(existsSync(path.join(first_().stateDir, 'serve.lock')), 'a clean stop removes serve.lock');
});

t.test('two serves started at the same instant on one state directory: exactly one serves, the other exits 1 naming it', async (t) => {
  const stateDir = path.join(dir, 'state-race');
  for (let round = 0; round < 2; round++) {
    const [p1, p2] = [await freePorts(), await freePorts()];
    const [f1, f2] = [path.join(dir, `race-${round}-1.yaml`), path.join(dir, `race-${round}-2.yaml`)];
    writeFileSync(f1, configText(p1, first));
    writeFileSync(f2, configText(p2, second));
    const runs = [startServe(serveArgs(f1, stateDir)), startServe(serveArgs(f2, stateDir))];
    t.teardown(() => runs.forEach((r) => r.proc.exitCode === null && r.proc.signalCode === null && r.proc.kill('SIGKILL')));
    const outcomes = await Promise.all(runs.map((r) => r.outcome));
    t.same([...outcomes].sort(), [1, 'serving'], `round ${round}: one serves, the other exits 1`);
    const refused = runs[outcomes.indexOf(1)];
    t.match(refused?.stderr() ?? '', /^edge-proxy serve: EDGE_STARTUP_STATE_LOCKED: state directory \S+ is held by another running edge-proxy serve \(pid \d+\)\n$/, `round ${round}: the refusal is one coded line`);
    const winner = runs[outcomes.indexOf('serving')];
    winner?.proc.kill('SIGTERM');
    t.same(winner === undefined ? [] : await once(winner.proc, 'exit'), [0, null], `round ${round}: the one that served stops with 0`);
  }
});
