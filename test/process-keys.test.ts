// The process keys (issue 12 item 5), end to end with real `edge-proxy serve` processes (run as
// root, as the test suite is): `security.user`/`group` make every worker, re-forked ones
// included, run as that account once its listeners are bound while the supervisor stays root and
// traffic flows on HTTP/1.1, HTTP/2 and HTTP/3; `pin_workers` pins every thread of worker i to
// CPU i; `control_plane_threads` sizes the supervisor's libuv pool; `reuseport: false` binds
// sockets no other process can bind beside; a user that does not exist stops the start (and
// `edge-proxy -c`) with one coded line.
import t from 'tap';
import type { Test } from 'tap';
import dgram from 'node:dgram';
import net from 'node:net';
import { once } from 'node:events';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';
import { waitReady, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';

/** The drop and the probes need a root start (the suite runs as root). */
const asRoot = process.getuid?.() === 0 ? {} : { skip: 'needs a root start' };

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-process-keys-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-0123456789abcdef0123';
const bport = await namedBackend(t, 'ok');

/** A status line of a process or thread (`Uid`, `Gid`, `Groups`, `Cpus_allowed_list`), its fields. */
function status(file: string, key: string): string[] {
  const m = new RegExp(`^${key}:\\s*(.*)$`, 'm').exec(readFileSync(file, 'utf8'));
  return (m?.[1] ?? '').trim().split(/\s+/).filter((f) => f.length > 0);
}

const threads = (pid: number): string[] => readdirSync(`/proc/${pid}/task`);
const threadNames = (pid: number): string[] => threads(pid).map((tid) => readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim());

/** The CPUs of this process (the supervisor, started by it, has the same set). */
function ownCpus(): number[] {
  return (status('/proc/self/status', 'Cpus_allowed_list')[0] ?? '').split(',').flatMap((part) => {
    const [a, b] = part.split('-').map(Number) as [number, number | undefined];
    return b === undefined ? [a] : Array.from({ length: b - a + 1 }, (_, i) => a + i);
  });
}

/** `extra`: the keys under test (`performance`, `security`), top-level YAML. */
async function start(name: string, extra: string): Promise<{ served: Served; proxy: Proxy }> {
  const ports = await freePorts();
  const text = serviceConfig({ ports, cert: server, backendPort: bport, extra, token: { token: TOKEN, role: 'admin', actor: 'process-keys-test' } });
  const served = await serve(path.join(dir, `${name}.yaml`), text);
  t.teardown(() => served.stop());
  return { served, proxy: { lport: ports.l, cport: ports.c, ca: caPem, token: TOKEN } };
}

/** Binds `port` on 127.0.0.1 with SO_REUSEPORT beside the service; the error code, or 'bound'. */
async function probeBind(kind: 'tcp' | 'udp', port: number): Promise<string> {
  if (kind === 'tcp') {
    const s = net.createServer();
    return new Promise((resolve) => {
      s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
      s.listen({ host: '127.0.0.1', port, reusePort: true, exclusive: true } as net.ListenOptions, () => s.close(() => resolve('bound')));
    });
  }
  const u = dgram.createSocket({ type: 'udp4', reusePort: true } as dgram.SocketOptions);
  return new Promise((resolve) => {
    u.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'));
    u.bind(port, '127.0.0.1', () => u.close(() => resolve('bound')));
  });
}

/** Every worker's ids and CPU mask, checked against what the keys ask for. */
function checkWorker(t: Test, pid: number, index: number, cpus: number[]): void {
  const proc = `/proc/${pid}/status`;
  t.same(status(proc, 'Uid'), ['65534', '65534', '65534', '65534'], `worker ${index} (pid ${pid}): real, effective, saved and fs uid 65534 (nobody)`);
  t.same(status(proc, 'Gid'), ['65534', '65534', '65534', '65534'], `worker ${index}: every gid 65534 (nogroup)`);
  t.same(status(proc, 'Groups'), ['65534'], `worker ${index}: supplementary groups: nogroup only`);
  const want = String(cpus[index % cpus.length]);
  const masks = threads(pid).map((tid) => status(`/proc/${pid}/task/${tid}/status`, 'Cpus_allowed_list')[0]);
  t.ok(masks.length > 1, `worker ${index}: ${masks.length} threads`);
  t.same([...new Set(masks)], [want], `worker ${index}: every thread on CPU ${want}`);
}

t.test('security.user nobody, pin_workers, control_plane_threads 3: workers run as 65534 on their CPU, re-forks too; the supervisor stays root; traffic flows', asRoot, async (t) => {
  const cpus = ownCpus();
  const { served, proxy } = await start('drop', 'performance: { worker_threads: 2, pin_workers: true, control_plane_threads: 3 }\nsecurity: { user: nobody, group: nogroup }');
  const before = await workers(proxy);
  t.equal(before.length, 2, 'two workers');
  for (const w of before) checkWorker(t, w.pid, w.index, cpus);
  const sup = served.proc.pid as number;
  t.same(status(`/proc/${sup}/status`, 'Uid'), ['0', '0', '0', '0'], 'the supervisor stays root (it re-forks workers, which bind first, and re-reads key files)');
  t.equal(threadNames(sup).filter((n) => n === 'libuv-worker').length, 3, "the supervisor's libuv pool has control_plane_threads (3) threads, not libuv's 4");
  t.same(await servedBy(proxy), allFrom('ok'), 'HTTP/1.1, HTTP/2 and HTTP/3 answered by the dropped workers');
  // The sockets were bound as root with SO_REUSEPORT (reuseport: true): root may join the group.
  t.equal(await probeBind('tcp', proxy.lport), 'bound', 'reuseport true: another root socket can bind beside the TCP listeners');

  // A re-forked worker starts as root, binds, and drops too.
  const victim = before[0] as { pid: number; index: number };
  process.kill(victim.pid, 'SIGKILL');
  await served.waitFor((l) => l['msg'] === 'worker re-forked on the active generation' && l['worker'] === victim.index, 30_000);
  t.equal(await waitReady(proxy), 200, 'ready again');
  const after = (await workers(proxy)).find((w) => w.index === victim.index);
  t.ok(after !== undefined && after.pid !== victim.pid, `worker ${victim.index} re-forked (pid ${after?.pid})`);
  if (after !== undefined) checkWorker(t, after.pid, after.index, cpus);
  t.same(await servedBy(proxy), allFrom('ok'), 'traffic flows after the re-fork');
  t.equal(await served.stop(), 0, 'SIGTERM: exit 0');
});

t.test('reuseport false (one worker): no other socket can bind the listener port; a root start without security.user warns', asRoot, async (t) => {
  const { served, proxy } = await start('noreuse', 'performance: { worker_threads: 1, reuseport: false }');
  t.same(await servedBy(proxy, { perProtocol: 3 }), allFrom('ok', { perProtocol: 3 }), 'HTTP/1.1, HTTP/2 and HTTP/3 served');
  t.equal(await probeBind('tcp', proxy.lport), 'EADDRINUSE', 'TCP: the port is not shared');
  t.equal(await probeBind('udp', proxy.lport), 'EADDRINUSE', 'UDP: the port is not shared');
  const warn = served.lines.find((l) => l['msg'] === 'running as root without security.user: the workers keep root after binding (set security.user and security.group, or run the service as its own user)');
  t.equal(warn?.['level'] === 'warn', true, 'one warning line');
  const [w] = await workers(proxy);
  t.same(status(`/proc/${w?.pid}/status`, 'Uid'), ['0', '0', '0', '0'], 'without security.user the worker stays root');
  t.equal(await served.stop(), 0);
});

/** Runs the CLI to its end; exit code and output. */
async function cli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const p = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [code] = (await once(p, 'exit')) as [number | null];
  return { code, stdout, stderr };
}

t.test('a user or group that does not exist: `edge-proxy -c` and `serve` fail with one coded line each, no stack trace', async (t) => {
  const file = path.join(dir, 'nouser.yaml');
  writeFileSync(
    file,
    `listen: { address: 127.0.0.1, port: ${await freePort()}, tls: { cert: ${server.cert}, key: ${server.key} } }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${bport}" }] } }
observability: { metrics: { enabled: false }, control_api: { enabled: false } }
security: { user: no-such-user-x, group: no-such-group-x }
`,
  );
  const check = await cli(['-c', file]);
  t.equal(check.code, 1, '-c exits 1');
  t.match(check.stderr, /^security\.user: EDGE_STARTUP_ACCOUNT: no user 'no-such-user-x' on this host$/m);
  t.match(check.stderr, /^security\.group: EDGE_STARTUP_ACCOUNT: no group 'no-such-group-x' on this host$/m);
  const run = await cli(['serve', '-c', file, '--state-dir', path.join(dir, 'nouser-state')]);
  t.equal(run.code, 1, 'serve exits 1');
  t.equal(run.stderr.trim(), "edge-proxy serve: EDGE_STARTUP_ACCOUNT: security.user: no user 'no-such-user-x' on this host", 'one line on stderr');
  t.notMatch(run.stderr + run.stdout, /\n\s+at /, 'no stack trace');
});
