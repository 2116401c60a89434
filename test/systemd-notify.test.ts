// `edge-proxy serve` under a stand-in for systemd (issue 12 item 1): a notification socket of the
// test's own passed as NOTIFY_SOCKET with WATCHDOG_USEC, exactly what systemd sets for
// `Type=notify` with `WatchdogSec=`. READY=1 comes only once every worker has bound its listeners
// and committed generation 1 (one worker is held before its commit to prove it), and the service
// answers traffic and /ready at that moment; STATUS= tells generation and workers; WATCHDOG=1
// arrives at half the watchdog interval; RELOADING=1 / READY=1 frame every reload (SIGHUP
// accepted or rejected, API reload); STOPPING=1 on SIGTERM; workers do not inherit the socket.
// A start that cannot bind sends no READY=1.
import t from 'tap';
import type { Test } from 'tap';
import net from 'node:net';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';
import { api } from './support/serve.ts';
import { getFresh, workers } from './support/workers.ts';
import type { Proxy } from './support/workers.ts';
import { notifyReceiver } from './support/notify-socket.ts';
import type { Notification } from './support/notify-socket.ts';

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-sd-notify-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-sd-notify-0123456789ab';
/** WATCHDOG_USEC given to the service: pings are due every 400 ms (half of it). */
const WATCHDOG_USEC = 800_000;

const [pa, pb] = [await namedBackend(t, 'gen-a'), await namedBackend(t, 'gen-b')];

const configText = (ports: ServicePorts, backendPort: number): string =>
  serviceConfig({ ports, cert: server, backendPort, performance: 'worker_threads: 2', token: { token: TOKEN, role: 'admin', actor: 'sd-notify-test' } });

interface Run {
  readonly proc: ChildProcess;
  readonly lines: Record<string, unknown>[];
  line(predicate: (l: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  readonly exited: Promise<number | null>;
}

/** Starts `edge-proxy serve` (not waiting for it to serve: the test watches the start itself). */
function startServe(t: Test, file: string, env: Record<string, string>): Run {
  const proc = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', file, '--state-dir', path.join(dir, 'state')], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  const exited = once(proc, 'exit').then(([code]) => code as number | null);
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await exited;
    }
  });
  const lines: Record<string, unknown>[] = [];
  const waiters = new Set<() => void>();
  readline.createInterface({ input: proc.stdout! }).on('line', (text) => {
    try {
      lines.push(JSON.parse(text) as Record<string, unknown>);
    } catch {
      lines.push({ raw: text });
    }
    for (const w of [...waiters]) w();
  });
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  return {
    proc,
    lines,
    exited,
    line(predicate, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const check = (): void => {
          const found = lines.find(predicate);
          if (found === undefined) return;
          clearTimeout(timer);
          waiters.delete(check);
          resolve(found);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`no matching log line within ${timeoutMs} ms; stderr: ${stderr.slice(0, 500)}`));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
  };
}

const is = (key: string, value = '1') => (n: Notification) => n.fields[key] === value;
const KNOWN = /^(READY=1\nSTATUS=[^\n]+|RELOADING=1\nMONOTONIC_USEC=\d+\nSTATUS=[^\n]+|STATUS=[^\n]+|STOPPING=1\nSTATUS=[^\n]+|WATCHDOG=1)$/;

t.test('READY=1 after every worker bound and committed generation 1, STATUS, WATCHDOG=1 pings, RELOADING=1/READY=1 around reloads, STOPPING=1', async (t) => {
  const ports = await freePorts();
  const proxy: Proxy = { lport: ports.l, cport: ports.c, ca: caPem, token: TOKEN };
  const file = path.join(dir, 'notify.yaml');
  writeFileSync(file, configText(ports, pa));
  const receiver = notifyReceiver(path.join(dir, 'notify.sock'));
  t.teardown(() => receiver.close());
  // Worker 1 holds before committing generation 1 (test hook, resumed by SIGUSR2).
  const run = startServe(t, file, { NOTIFY_SOCKET: receiver.address, WATCHDOG_USEC: String(WATCHDOG_USEC), EDGE_TEST_PAUSE: 'commit:1:1' });

  const paused = await run.line((l) => l['msg'] === 'test hook: paused' && l['worker'] === 1);
  await run.line((l) => l['msg'] === 'test hook: step' && l['step'] === 'committed' && l['worker'] === 0 && l['generation'] === 1);
  t.same(receiver.received.filter(is('READY')), [], 'no READY=1 while worker 0 serves and worker 1 has not committed generation 1');
  process.kill(paused['pid'] as number, 'SIGUSR2');

  const ready = await receiver.next(is('READY'), 60_000);
  // Checked as soon as READY=1 arrives: the service answers traffic and /ready already.
  const [body, readiness] = await Promise.all([getFresh(proxy), api(ports.c, caPem, 'GET', '/ready')]);
  t.equal(body, 'gen-a', 'a request sent when READY=1 arrived is proxied (generation 1)');
  t.equal(readiness.status, 200, '/ready answers 200 when READY=1 arrives');
  t.equal(ready.fields['STATUS'], 'generation 1 active; 2/2 workers ready', 'READY=1 carries STATUS: generation and workers');
  t.equal(receiver.received.filter(is('READY')).length, 1, 'one READY=1 for the start');

  // Workers never notify: the variables are gone from their environment.
  for (const w of await workers(proxy)) {
    const environ = readFileSync(`/proc/${w.pid}/environ`, 'utf8').split('\0');
    t.ok(environ.some((v) => v.startsWith('EDGE_WORKER_INDEX=')), `worker ${w.index} environment read`);
    t.same(
      environ.filter((v) => /^(NOTIFY_SOCKET|WATCHDOG_USEC|WATCHDOG_PID)=/.test(v)),
      [],
      `worker ${w.index} (pid ${w.pid}) inherits no NOTIFY_SOCKET, WATCHDOG_USEC or WATCHDOG_PID`,
    );
  }

  // WATCHDOG=1 every WATCHDOG_USEC / 2 (400 ms): 6 pings, then the gaps between them.
  const readyIndex = receiver.received.indexOf(ready);
  const pingsFrom = (i: number) => receiver.received.slice(i).filter(is('WATCHDOG'));
  while (pingsFrom(readyIndex).length < 7) await receiver.next(is('WATCHDOG'), 10_000, receiver.received.length);
  const pings = pingsFrom(readyIndex).slice(0, 7);
  // Arrival times: a busy test process may read two pings in one turn (one short gap, a long one
  // before it), so the checks are on the mean and the median, not on each gap.
  const gaps = pings.slice(1).map((p, i) => p.at - (pings[i] as Notification).at);
  const mean = ((pings[6] as Notification).at - (pings[0] as Notification).at) / 6;
  const median = [...gaps].sort((a, b) => a - b)[3] as number;
  t.ok(mean >= 350 && mean < WATCHDOG_USEC / 1000, `mean gap ${mean.toFixed(0)} ms: about 400 ms, below WATCHDOG_USEC (${WATCHDOG_USEC / 1000} ms); gaps ${gaps.join(', ')} ms`);
  t.ok(median >= 300 && median < WATCHDOG_USEC / 1000, `median gap ${median} ms`);

  // SIGHUP with a changed file: RELOADING=1 (MONOTONIC_USEC now), then READY=1 on generation 2.
  writeFileSync(file, configText(ports, pb));
  let from = receiver.received.length;
  const before = process.hrtime.bigint() / 1000n;
  run.proc.kill('SIGHUP');
  const reloading = await receiver.next(is('RELOADING'), 30_000, from);
  const after = process.hrtime.bigint() / 1000n;
  const mono = BigInt(reloading.fields['MONOTONIC_USEC'] ?? '0');
  t.ok(mono >= before && mono <= after, `MONOTONIC_USEC ${mono} is CLOCK_MONOTONIC at the reload (between ${before} and ${after})`);
  t.match(reloading.fields['STATUS'], /^reloading; generation 1 active/, 'STATUS while reloading');
  const reloaded = await receiver.next(is('READY'), 30_000, receiver.received.indexOf(reloading) + 1);
  t.equal(reloaded.fields['STATUS'], 'generation 2 active; 2/2 workers ready', 'READY=1 after the SIGHUP reload: generation 2');
  t.equal(await getFresh(proxy), 'gen-b', 'generation 2 serves');

  // A rejected SIGHUP reload still ends the reloading state (READY=1), generation unchanged.
  writeFileSync(file, 'listen: { address: 127.0.0.1, port: [not a port] }\n');
  from = receiver.received.length;
  run.proc.kill('SIGHUP');
  const rejected = await receiver.next(is('RELOADING'), 30_000, from);
  const back = await receiver.next(is('READY'), 30_000, receiver.received.indexOf(rejected) + 1);
  t.equal(back.fields['STATUS'], 'generation 2 active; 2/2 workers ready', 'READY=1 after a rejected reload: generation 2 still');
  await run.line((l) => String(l['msg']).startsWith('SIGHUP reload rejected') && l['status'] === 400 && l['level'] === 'error');

  // The API reload (what `edge-proxy ctl reload`, the unit's ExecReload, calls) is framed the same way.
  writeFileSync(file, configText(ports, pa));
  from = receiver.received.length;
  const r = await api(ports.c, caPem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {});
  t.match(r, { status: 202, body: { generation: 3 } }, 'API reload: generation 3');
  const apiReloading = await receiver.next(is('RELOADING'), 10_000, from);
  const apiReady = await receiver.next(is('READY'), 10_000, receiver.received.indexOf(apiReloading) + 1);
  t.equal(apiReady.fields['STATUS'], 'generation 3 active; 2/2 workers ready', 'READY=1 after the API reload: generation 3');

  // SIGTERM: STOPPING=1, exit 0, no ping after it.
  from = receiver.received.length;
  run.proc.kill('SIGTERM');
  const stopping = await receiver.next(is('STOPPING'), 30_000, from);
  t.equal(await run.exited, 0, 'exit 0 after SIGTERM');
  t.same(receiver.received.slice(receiver.received.indexOf(stopping) + 1).filter(is('WATCHDOG')), [], 'no WATCHDOG=1 after STOPPING=1');
  t.same(receiver.received.filter((n) => !KNOWN.test(n.text)).map((n) => n.text), [], 'every datagram is a well-formed notification');
  t.same(receiver.received.filter((n) => n.fields['READY'] === '1').length, 4, 'READY=1: the start and the three reloads, nothing else');
});

t.test('a start whose workers cannot bind their port sends no READY=1 and exits non-zero', async (t) => {
  const taken = net.createServer();
  taken.listen(0, '127.0.0.1');
  await once(taken, 'listening');
  t.teardown(() => new Promise<void>((r) => taken.close(() => r())));
  const port = (taken.address() as net.AddressInfo).port;
  const file = path.join(dir, 'taken.yaml');
  writeFileSync(file, configText({ l: port, c: await freePort(), m: await freePort() }, pa));
  const receiver = notifyReceiver(path.join(dir, 'taken.sock'));
  t.teardown(() => receiver.close());
  const run = startServe(t, file, { NOTIFY_SOCKET: receiver.address, WATCHDOG_USEC: String(WATCHDOG_USEC) });
  t.not(await run.exited, 0, 'serve exits non-zero');
  t.same(receiver.received.filter(is('READY')), [], 'no READY=1');
  t.same(receiver.received.filter(is('WATCHDOG')), [], 'no WATCHDOG=1');
});
