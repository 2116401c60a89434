// A log destination that goes away must not crash the service: `edge-proxy serve` with its stdout
// piped to a reader that dies (a `| tee` or a log shipper killed, a terminal closed). Before the
// fix, the supervisor's next log line threw an unhandled EPIPE (a stack trace, exit 1) in the
// middle of its shutdown. Now: one line on stderr says log lines are lost, the shutdown completes
// (exit 0) and no worker outlives it.
import t from 'tap';
import { spawn, execFileSync } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import readline from 'node:readline';
import { freePort } from '../scripts/lib/free-port.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import { writeFileSync } from 'node:fs';

const root = path.resolve(import.meta.dirname, '..');
const files = serviceFiles(t, 'edge-log-gone-');

/** The process ids whose parent is `pid`. */
function children(pid: number): number[] {
  try {
    return execFileSync('ps', ['--ppid', String(pid), '-o', 'pid='], { encoding: 'utf8' }).split('\n').map((s) => Number(s.trim())).filter((n) => n > 0);
  } catch {
    return []; // ps exits 1 when there is none
  }
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

t.test('stdout reader gone, then SIGTERM: no crash, one notice on stderr, exit 0, no worker left behind', async (t) => {
  const ports = await freePorts();
  const config = path.join(files.dir, 'c.yaml');
  writeFileSync(config, serviceConfig({ ports, cert: files.leaf, backendPort: await freePort(), token: { token: 'log-gone-token-0123456789abcdef', role: 'admin', actor: 'log-gone' }, performance: 'worker_threads: 2' }));
  const proc = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', config, '--state-dir', path.join(files.dir, 'state')], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => {
    if (proc.exitCode === null) proc.kill('SIGKILL');
  });
  let stderr = '';
  proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = once(proc, 'exit') as Promise<[number | null, string | null]>;
  const rl = readline.createInterface({ input: proc.stdout });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start:\n${stderr}`)), 60_000);
    rl.on('line', (line) => {
      if (line.includes('"edge-proxy serving"')) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const workers = children(proc.pid as number);
  t.equal(workers.length, 2, `two workers running (${workers.join(', ')})`);
  // The reader goes away: the supervisor's (and the workers') next write to stdout fails with EPIPE.
  rl.close();
  proc.stdout.destroy();
  proc.kill('SIGTERM');
  const deadline = setTimeout(() => proc.kill('SIGKILL'), 30_000);
  const [code, signal] = await exited;
  clearTimeout(deadline);
  t.same({ code, signal }, { code: 0, signal: null }, 'the shutdown completes: exit 0');
  t.notMatch(stderr, /Unhandled 'error' event|\n\s+at [\w.<>]+ \(/, 'no stack trace');
  t.match(stderr, /log destination stdout failed \(EPIPE\): log lines are lost from now on/, 'one notice on stderr');
  const notices = stderr.match(/log destination stdout failed/g)?.length ?? 0;
  t.ok(notices <= 1 + workers.length, `said at most once per process (${notices} notices, ${1 + workers.length} processes)`);
  // Workers leave when their supervisor does (disconnect), within their 5 s exit deadline.
  const until = Date.now() + 10_000;
  while (workers.some(alive) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
  t.same(workers.filter(alive), [], 'no worker outlives the supervisor');
});
