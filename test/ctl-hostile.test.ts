// `edge-proxy ctl` against hostile answers and with hostile arguments (issue 38 item 10 and item 8's
// own pass), the real binary against real sockets: a control API that answers 100,000-deep JSON
// (it printed "Maximum call stack size exceeded"), a plain-HTTP server behind `--url`, a server
// that redirects elsewhere; huge arguments, generation numbers that are not ones (`../`, -1, 1.5,
// 2^31), control characters in a path, a timer-overflowing `--timeout`; token files that are a
// FIFO, a directory, huge, hold a NUL, or are readable by every user. Each is one line on stderr
// with its exit status, no stack trace, and nothing reaches a server the arguments were refused for.
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import https from 'node:https';
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { CTL_EXIT } from '../packages/cli/src/index.ts';

const bin = path.resolve(import.meta.dirname, '..', 'packages/cli/bin/edge-proxy');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-ctl-hostile-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const TOKEN = 'hostile-test-token-0123456789abcdef';
const STACK = /^\s+at .+|Maximum call stack|RangeError|TypeError/m;
const DEEP = 100_000;

/** Requests each fake server received (path and Authorization), to show what reached it. */
const received: { server: string; path: string; authorization?: string }[] = [];
async function listen(server: http.Server | https.Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as AddressInfo).port;
}
const deep = (open: string, close: string, core = '1'): string => `${open.repeat(DEEP)}${core}${close.repeat(DEEP)}`;
// The hostile control API: every answer by path.
const hostile = https.createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) }, (req, res) => {
  received.push({ server: 'hostile', path: req.url ?? '', ...(req.headers.authorization === undefined ? {} : { authorization: req.headers.authorization }) });
  const answers: Record<string, [number, string]> = {
    '/admin/runtime': [200, deep('[', ']')],
    '/admin/runtime/history/1': [200, `{"a":${deep('{"a":', '}')}}`],
    '/admin/runtime/history/2': [500, deep('[', ']')],
    '/admin/runtime/history/3': [200, `{"ok":"${'['.repeat(DEEP)}"}`],
  };
  const [status, body] = answers[req.url ?? ''] ?? [404, '{"reason":"not_found","message":"no such route"}'];
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(body);
});
const hport = await listen(hostile);
const plain = http.createServer((req, res) => {
  received.push({ server: 'plain', path: req.url ?? '', ...(req.headers.authorization === undefined ? {} : { authorization: req.headers.authorization }) });
  res.end('{}');
});
const pport = await listen(plain);
const redirecting = https.createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) }, (req, res) => {
  received.push({ server: 'redirecting', path: req.url ?? '' });
  res.writeHead(302, { location: `http://127.0.0.1:${pport}/steal` });
  res.end();
});
const rport = await listen(redirecting);
const url = `https://127.0.0.1:${hport}`;

const tokenFile = (name: string, content: string | Buffer, mode = 0o600): string => {
  const f = path.join(dir, name);
  writeFileSync(f, content);
  chmodSync(f, mode);
  return f;
};
const good = tokenFile('good.token', `${TOKEN}\n`);

interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}
/** The real binary, bounded: a run still going after 30 s is killed (exit code null: a failure). */
async function ctl(args: readonly string[]): Promise<Run> {
  const started = Date.now();
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('EDGE_PROXY_')));
  const proc = spawn(bin, ['ctl', ...args], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const timer = setTimeout(() => proc.kill('SIGKILL'), 30_000);
  const [code] = (await once(proc, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr, ms: Date.now() - started };
}
/** Exactly one stderr line, no stack trace; the line. */
function oneLine(t: Test, r: Run): string {
  t.equal(r.stderr.split('\n').filter((l) => l !== '').length, 1, `one stderr line: ${r.stderr.slice(0, 300)}`);
  t.notMatch(r.stderr + r.stdout, STACK, 'no stack trace, no stack overflow');
  return r.stderr.trimEnd();
}

t.test('hostile answers: 100,000-deep JSON is not read (one line, its exit status); deep text inside a string is fine', async (t) => {
  const conn = ['--url', url, '--ca', ca.cert, '--token-file', good];
  const cases: [string[], number, string][] = [
    [['status'], CTL_EXIT.unreachable, `edge-proxy ctl status: 200 invalid_response: the answer nests deeper than 64 levels: not read`],
    [['history', '1'], CTL_EXIT.unreachable, `edge-proxy ctl history: 200 invalid_response: the answer nests deeper than 64 levels: not read`],
    [['history', '2'], CTL_EXIT.server_error, `edge-proxy ctl history: 500 invalid_response: the answer nests deeper than 64 levels: not read`],
  ];
  for (const [args, exit, expected] of cases) {
    const r = await ctl([...args, ...conn]);
    t.equal(r.code, exit, `${args.join(' ')}: exit ${exit}`);
    t.equal(oneLine(t, r), expected);
    t.equal(r.stdout, '', 'nothing of it printed');
  }
  const ok = await ctl(['history', '3', ...conn]);
  t.equal(ok.code, CTL_EXIT.ok, 'brackets inside a string are text, not nesting');
  t.equal((JSON.parse(ok.stdout) as { ok: string }).ok.length, DEEP);
});

t.test('--url to a plain-HTTP server or to one that redirects: one line, exit 1, the token sent nowhere else', async (t) => {
  const before = received.length;
  const p = await ctl(['status', '--url', `https://127.0.0.1:${pport}`, '--ca', ca.cert, '--token-file', good]);
  t.equal(p.code, CTL_EXIT.unreachable);
  t.match(oneLine(t, p), new RegExp(`^edge-proxy ctl status: - tls_failed: https://127\\.0\\.0\\.1:${pport}: `), 'a TLS failure, not a request in clear');
  const r = await ctl(['status', '--url', `https://127.0.0.1:${rport}`, '--ca', ca.cert, '--token-file', good]);
  t.equal(r.code, CTL_EXIT.unreachable, 'a redirect is no answer');
  t.equal(oneLine(t, r), 'edge-proxy ctl status: 302 http_error: the answer carries no JSON error');
  t.same(received.slice(before), [{ server: 'redirecting', path: '/admin/runtime' }], 'the redirect was not followed: the plain server got nothing, the token went nowhere in clear');
});

t.test('hostile arguments: refused before any request, one line, exit 1', async (t) => {
  const conn = ['--url', url, '--ca', ca.cert, '--token-file', good];
  const gen = /must be a generation number \(a whole number from 1 to 2147483647\) \(see edge-proxy ctl --help\)$/;
  const cases: [string[], RegExp][] = [
    [['history', '../1'], /^edge-proxy ctl: N must be a generation number/],
    [['history', '1/../../restart'], /^edge-proxy ctl: N must be a generation number/],
    [['history', '0'], gen],
    [['history', '2147483648'], gen],
    [['rollback', '--to', '-1'], gen],
    [['rollback', '--to', '1.5'], gen],
    [['rollback', '--to', '1e309'], gen],
    [['rollback', '--to', '9007199254740993'], gen],
    [['rollback', '--to', '2', '--expected-active-generation', '-0'], gen],
    [['activate', '--expected-generation', '0x7fffffff1'], gen],
    [['activate', '--reason', 'r'.repeat(120_000)], /^edge-proxy ctl: --reason is longer than 4096 characters/],
    [['activate', '--requested-by', 'x'.repeat(5000)], /^edge-proxy ctl: --requested-by is longer than 4096 characters/],
    [['activate', '--config-path', `${dir}/a\nb.yaml`], /^edge-proxy ctl: --config-path must not contain control characters/],
    [['activate', '--config-path', `${dir}/a\u001b[31m.yaml`], /^edge-proxy ctl: --config-path must not contain control characters/],
    [['status', '--timeout', '1e12'], /^edge-proxy ctl: --timeout must be a whole number of ms from 1 to 2147483647/],
    [['status', '--timeout', '0'], /^edge-proxy ctl: --timeout must be a whole number of ms from 1 to 2147483647/],
    [['status', '--servername', 's'.repeat(5000)], /^edge-proxy ctl: --servername is longer than 4096 characters/],
  ];
  const before = received.length;
  const runs = await Promise.all(cases.map(([args]) => ctl([...args, ...conn])));
  cases.forEach(([args, expected], i) => {
    const r = runs[i] as Run;
    t.equal(r.code, CTL_EXIT.usage, `${args.join(' ').slice(0, 60)}: exit 1`);
    t.match(oneLine(t, r), expected);
    t.ok(r.stderr.length < 1000, 'the line does not echo a huge argument');
  });
  t.equal(received.length, before, `none of the ${cases.length} reached the server`);
  // NUL cannot be an argument at all: execve(2) ends a string at it (Node refuses to spawn one);
  // one argument is at most 128 KiB (MAX_ARG_STRLEN): the 120,000-character reason is near the most.
  t.throws(() => spawn(bin, ['ctl', 'status', '--reason', 'a\0b']), { code: 'ERR_INVALID_ARG_VALUE' });
});

t.test('token files: a FIFO, a directory, a huge one, one with a NUL, one every user may read or write: refused at once; group-readable is the operator\'s choice', async (t) => {
  const fifo = path.join(dir, 'fifo.token');
  execFileSync('mkfifo', [fifo]);
  const sub = path.join(dir, 'dir.token');
  mkdirSync(sub);
  const cases: [string, RegExp][] = [
    [fifo, /cannot read the token file \S+fifo\.token: not a regular file$/],
    [sub, /cannot read the token file \S+dir\.token: not a regular file$/],
    [tokenFile('huge.token', Buffer.alloc(10 * 1024 * 1024, 0x61)), /cannot read the token file \S+huge\.token: larger than 8192 bytes$/],
    [tokenFile('nul.token', `${TOKEN}\0\n`), /the token file \S+nul\.token must hold one token/],
    [tokenFile('world-readable.token', `${TOKEN}\n`, 0o644), /the token file \S+world-readable\.token is readable by every user \(mode 0644\): chmod o-rw it$/],
    [tokenFile('world-writable.token', `${TOKEN}\n`, 0o602), /the token file \S+world-writable\.token is writable by every user \(mode 0602\): chmod o-rw it$/],
  ];
  const before = received.length;
  for (const [file, expected] of cases) {
    const r = await ctl(['status', '--url', url, '--ca', ca.cert, '--token-file', file]);
    t.equal(r.code, CTL_EXIT.usage, `${path.basename(file)}: exit 1`);
    t.match(oneLine(t, r), expected);
    t.notOk(r.stderr.includes(TOKEN), 'the token is never printed');
    t.ok(r.ms < 15_000, `${path.basename(file)}: at once, never blocked (${r.ms} ms)`);
  }
  t.equal(received.length, before, 'no request was sent with any of them');
  const group = await ctl(['history', '3', '--url', url, '--ca', ca.cert, '--token-file', tokenFile('group.token', `${TOKEN}\n`, 0o640)]);
  t.equal(group.code, CTL_EXIT.ok, 'a group-readable token file is used');
  t.equal(received.at(-1)?.authorization, `Bearer ${TOKEN}`);
});
