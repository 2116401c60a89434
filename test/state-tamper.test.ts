// Issue 38 item 8 (own pass): permission and ownership tampering of the state directory, with
// `edge-proxy serve` run AS THE SERVICE USER (nobody), not root: root reads and writes through
// modes, so a test run as root would show nothing. A first run activates generation 2; each case
// then starts from a copy of that state directory, tampered: not writable, generations.json a
// symbolic link, a directory, 0444, owned by root, larger than its bound; fingerprint.key a
// directory; serve.lock a directory; watchdog.json a FIFO. Each start serves, says what happened
// in at most one coded line (none where nothing is lost), never a stack trace, and stops with 0.
import t from 'tap';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, chownSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { namedBackend } from './support/backends.ts';
import { api } from './support/serve.ts';
import { getH1 } from './support/served-by.ts';
import { freePorts, serviceConfig } from './support/service-config.ts';

const NOBODY = { uid: 65534, gid: 65534 };
const main = path.resolve(import.meta.dirname, '..', 'packages/cli/src/main.ts');
const STACK = /^\s+at .+:\d+:\d+\)?$/m;

if (process.getuid?.() !== 0) {
  t.comment('needs root to run serve as nobody; skipped');
  process.exit(0);
}

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-tamper-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
chmodSync(dir, 0o755);
const ca = makeCa(path.join(dir, 'ca'));
const leaf = makeLeaf(path.join(dir, 'ca'), 'server', ca, { sans: ['localhost', '127.0.0.1'] });
chmodSync(path.join(dir, 'ca'), 0o755);
chownSync(leaf.key, NOBODY.uid, NOBODY.gid);
const caPem = readFileSync(ca.cert);
const TOKEN = 'admin-token-state-tamper-0123456789';
const [blue, green] = [await namedBackend(t, 'blue'), await namedBackend(t, 'green')];
const p = await freePorts();
const text = (backend: number): string => serviceConfig({ ports: p, cert: leaf, backendPort: backend, performance: 'worker_threads: 1', controlApiTls: leaf, token: { token: TOKEN, role: 'admin', actor: 'ops' } });
const configFile = path.join(dir, 'config.yaml');
writeFileSync(configFile, text(blue));
const greenFile = path.join(dir, 'green.yaml');
writeFileSync(greenFile, text(green));

interface Run {
  readonly proc: ChildProcess;
  readonly lines: Record<string, unknown>[];
  readonly all: () => string;
}
/** `serve` as nobody on `stateDir`; resolves once it serves (rejects with its output if it exits first). */
async function serveAsNobody(stateDir: string): Promise<Run> {
  // No compile cache: the suite's is root's; nobody's workers compile for themselves.
  const proc = spawn(process.execPath, [main, 'serve', '-c', configFile, '--state-dir', stateDir], { ...NOBODY, cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_COMPILE_CACHE: '', NODE_DISABLE_COMPILE_CACHE: '1' } });
  const lines: Record<string, unknown>[] = [];
  let all = '';
  proc.stderr?.on('data', (d: Buffer) => (all += d.toString()));
  const rl = readline.createInterface({ input: proc.stdout! });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`not serving in time:\n${all}`)), 60_000);
    rl.on('line', (l) => {
      all += `${l}\n`;
      let parsed: Record<string, unknown>;
      try {
        parsed = JSON.parse(l) as Record<string, unknown>;
      } catch {
        parsed = { raw: l };
      }
      lines.push(parsed);
      if (parsed['msg'] === 'edge-proxy serving') {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`serve exited ${code}:\n${all}`));
    });
  }).catch(async (err: unknown) => {
    if (proc.exitCode === null) {
      proc.kill('SIGKILL');
      await once(proc, 'exit');
    }
    throw err;
  });
  return { proc, lines, all: () => all };
}
async function stop(r: Run): Promise<number | null> {
  if (r.proc.exitCode !== null || r.proc.signalCode !== null) return r.proc.exitCode;
  r.proc.kill('SIGTERM');
  const [code] = (await once(r.proc, 'exit')) as [number | null];
  return code;
}
const levelOf = (l: Record<string, unknown>): string => ({ 30: 'info', 40: 'warn', 50: 'error' } as Record<string, string>)[String(l['level'])] ?? String(l['level']);
const coded = (r: Run) => r.lines.filter((l) => levelOf(l) === 'error' || (levelOf(l) === 'warn' && typeof l['code'] === 'string' && String(l['code']).startsWith('EDGE_STATE')));
const call = (method: string, q: string, body?: unknown) => api(p.c, caPem, method, q, { token: TOKEN }, body);

// The good state: generation 2 (green) active, made by nobody.
const good = path.join(dir, 'state-good');
mkdirSync(good, { mode: 0o700 });
chownSync(good, NOBODY.uid, NOBODY.gid);
t.test('setup: generation 2 activated by serve as nobody', async (t) => {
  const first = await serveAsNobody(good);
  t.match(await call('POST', '/admin/runtime/activate', { config_path: greenFile, expected_generation: 1 }), { status: 202, body: { generation: 2 } }, 'setup: generation 2 activated as nobody');
  t.equal(await stop(first), 0, 'setup: stopped');
  t.equal(execFileSync('stat', ['-c', '%U', path.join(good, 'generations.json')], { encoding: 'utf8' }).trim(), 'nobody', 'setup: the state is nobody\'s');
});

interface Case {
  readonly name: string;
  readonly tamper: (d: string) => void;
  /** What serves after the start: the resumed generation 2 (green), or the -c file as generation 1 (blue). */
  readonly serves: 'green' | 'blue';
  /** The one coded line expected (undefined: none). */
  readonly line?: Record<string, unknown>;
  readonly saved?: 'saved' | 'write_failed';
}
const file = (d: string, n: string): string => path.join(d, n);
const cases: Case[] = [
  { name: 'the state directory not writable (0500)', tamper: (d) => chmodSync(d, 0o500), serves: 'green', line: { code: 'EDGE_STATE_WRITE_FAILED', errno: 'EACCES' }, saved: 'write_failed' },
  {
    name: 'generations.json replaced by a symbolic link to another (valid) file',
    tamper: (d) => {
      const elsewhere = path.join(dir, `elsewhere-${path.basename(d)}.json`);
      cpSync(file(d, 'generations.json'), elsewhere);
      unlinkSync(file(d, 'generations.json'));
      symlinkSync(elsewhere, file(d, 'generations.json'));
    },
    serves: 'blue',
    line: { code: 'EDGE_STATE_INVALID', problem: 'a symbolic link (not followed)' },
    saved: 'saved',
  },
  {
    name: 'a directory in place of generations.json',
    tamper: (d) => {
      unlinkSync(file(d, 'generations.json'));
      mkdirSync(file(d, 'generations.json'));
      chownSync(file(d, 'generations.json'), NOBODY.uid, NOBODY.gid);
    },
    serves: 'blue',
    line: { code: 'EDGE_STATE_INVALID', problem: 'not a regular file' },
    saved: 'saved',
  },
  { name: 'generations.json made 0444', tamper: (d) => chmodSync(file(d, 'generations.json'), 0o444), serves: 'green', saved: 'saved' },
  { name: 'generations.json owned by root, 0600', tamper: (d) => chownSync(file(d, 'generations.json'), 0, 0), serves: 'blue', line: { code: 'EDGE_STATE_INVALID', problem: 'permission denied' }, saved: 'saved' },
  { name: 'generations.json larger than its bound (64 MiB + 1, sparse)', tamper: (d) => truncateSync(file(d, 'generations.json'), 64 * 1024 * 1024 + 1), serves: 'blue', line: { code: 'EDGE_STATE_INVALID', problem: 'larger than 67108864 bytes' }, saved: 'saved' },
  {
    name: 'fingerprint.key replaced by a directory',
    tamper: (d) => {
      unlinkSync(file(d, 'fingerprint.key'));
      mkdirSync(file(d, 'fingerprint.key'));
      chownSync(file(d, 'fingerprint.key'), NOBODY.uid, NOBODY.gid);
    },
    serves: 'green',
    line: { code: 'EDGE_STATE_KEY_INVALID' },
    saved: 'saved',
  },
  {
    name: 'serve.lock a directory',
    tamper: (d) => {
      mkdirSync(file(d, 'serve.lock'));
      chownSync(file(d, 'serve.lock'), NOBODY.uid, NOBODY.gid);
    },
    serves: 'green',
    saved: 'saved',
  },
  {
    name: 'watchdog.json a FIFO',
    tamper: (d) => {
      execFileSync('mkfifo', [file(d, 'watchdog.json')]);
      chownSync(file(d, 'watchdog.json'), NOBODY.uid, NOBODY.gid);
    },
    serves: 'green',
    line: { code: 'EDGE_STATE_INVALID', problem: 'not a regular file' },
    saved: 'saved',
  },
];

for (const [i, c] of cases.entries()) {
  t.test(`as nobody: ${c.name}`, async (t) => {
    const d = path.join(dir, `state-case-${i}`);
    cpSync(good, d, { recursive: true, preserveTimestamps: true });
    execFileSync('chown', ['-R', 'nobody:nogroup', d]);
    c.tamper(d);
    const started = Date.now();
    const r = await serveAsNobody(d);
    t.ok(Date.now() - started < 60_000, 'started, never blocked');
    t.equal(await getH1({ lport: p.l, ca: caPem }), c.serves, `serves ${c.serves === 'green' ? 'the resumed generation 2' : 'the -c file'}`);
    const lines = coded(r);
    if (c.line === undefined) t.same(lines, [], 'no error or state warning line: nothing was lost');
    else {
      t.equal(lines.length, 1, `one coded line: ${JSON.stringify(lines).slice(0, 400)}`);
      t.match(lines[0], c.line);
    }
    const snap = await call('GET', '/admin/runtime');
    t.match(snap.body, { state: { generations: c.saved } }, `the snapshot says the state is ${c.saved}`);
    t.notMatch(r.all(), STACK, 'no stack trace');
    t.equal(await stop(r), 0, 'SIGTERM: exit 0');
    chmodSync(d, 0o700);
  });
}
