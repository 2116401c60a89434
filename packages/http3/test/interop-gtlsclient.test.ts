// Interop with an independent HTTP/3 client: Debian's ngtcp2 `gtlsclient` (nghttp3 inside)
// against our echo server running as its own process. GET, HEAD, a 10 MiB upload (hashed and
// echoed), 200 concurrent streams on one connection, and session resumption with a ticket.
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';
import type { Test } from 'tap';
import { NODE, jsonLine, makePki, requireTool, spawnChild, tempDir } from './net-helpers.ts';

const gtlsclient = requireTool(t, 'gtlsclient', 'ngtcp2-client');
const pki = makePki(t);
const work = tempDir(t);
const echoServer = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../examples/echo-server.ts');

interface Described {
  method: string;
  path: string;
  authority: string;
  headers: Record<string, string>;
  bodyLength: number;
  bodySha256: string;
  connection: { serverName: string; resumed: boolean; connectionId: string };
}

const server = spawnChild(t, NODE, [echoServer, '--port', '0', '--host', '127.0.0.1', '--cert', pki.certFile, '--key', pki.keyFile, '--max-streams', '256', '--ticket-key', randomBytes(48).toString('hex')]);
const { port } = await jsonLine<{ event: string; port: number }>(server, (v) => v.event === 'listening');
const origin = `https://localhost:${port}`;

let runs = 0;
/** Runs gtlsclient once (bounded by its own timeouts) and returns its output and download dir. */
async function gtls(t: Test, args: string[], uris: string[]): Promise<{ code: number | string; out: string; dir: string }> {
  const dir = path.join(work, `dl-${runs++}`);
  mkdirSync(dir);
  const child = spawnChild(t, gtlsclient, ['--no-quic-dump', '--exit-on-all-streams-close', '--timeout=10s', '--handshake-timeout=5s', `--download=${dir}`, ...args, '127.0.0.1', String(port), ...uris]);
  const code = await child.exited;
  return { code, out: child.stdout() + child.stderr(), dir };
}

const described = (dir: string, name: string): Described => JSON.parse(readFileSync(path.join(dir, name), 'utf8')) as Described;
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

t.test('GET', async (t) => {
  const r = await gtls(t, [], [`${origin}/hello`]);
  t.equal(r.code, 0, 'gtlsclient exits cleanly');
  t.match(r.out, /\[:status: 200\]/);
  t.match(r.out, /\[content-type: application\/json\]/);
  const d = described(r.dir, 'hello');
  t.match(d, { method: 'GET', path: '/hello', authority: `localhost:${port}`, bodyLength: 0 });
  t.match(d.headers['user-agent'], /nghttp3/);
  t.equal(d.connection.serverName, 'localhost', 'SNI seen by the server');
});

t.test('HEAD', async (t) => {
  const r = await gtls(t, ['-m', 'HEAD'], [`${origin}/bytes/1000`]);
  t.equal(r.code, 0);
  t.match(r.out, /\[:status: 200\]/);
  t.match(r.out, /\[content-length: 1000\]/);
  const file = path.join(r.dir, '1000');
  t.ok(!existsSync(file) || readFileSync(file).length === 0, 'no body');
});

t.test('POST 10 MiB: hashed by the server, and echoed back', async (t) => {
  const upload = randomBytes(10 * 1024 * 1024);
  const file = path.join(work, 'upload.bin');
  writeFileSync(file, upload);
  const hashed = await gtls(t, ['-q', '-m', 'POST', `--data=${file}`], [`${origin}/upload`]);
  t.equal(hashed.code, 0);
  t.match(described(hashed.dir, 'upload'), { method: 'POST', bodyLength: upload.length, bodySha256: sha(upload) });
  const echoed = await gtls(t, ['-q', '-m', 'POST', `--data=${file}`], [`${origin}/echo`]);
  t.equal(echoed.code, 0);
  const back = readFileSync(path.join(echoed.dir, 'echo'));
  t.equal(back.length, upload.length, '10 MiB came back');
  t.equal(sha(back), sha(upload), 'byte for byte');
});

t.test('200 concurrent streams on one connection (the server allows 256 at once)', async (t) => {
  const uris = Array.from({ length: 200 }, (_, i) => `${origin}/s/${i}`);
  const r = await gtls(t, ['-q'], uris);
  t.equal(r.code, 0);
  const ids = new Set<string>();
  let ok = 0;
  for (let i = 0; i < 200; i++) {
    const d = described(r.dir, String(i));
    if (d.path === `/s/${i}`) ok++;
    ids.add(d.connection.connectionId);
  }
  t.equal(ok, 200, 'every stream got its own answer');
  t.equal(ids.size, 1, 'all on one QUIC connection');
});

t.test('resumption: the second connection resumes with the session ticket', async (t) => {
  const session = path.join(work, 'session.pem');
  const tp = path.join(work, 'tp.pem');
  const first = await gtls(t, [`--session-file=${session}`, `--tp-file=${tp}`], [`${origin}/first`]);
  t.equal(first.code, 0);
  t.equal(described(first.dir, 'first').connection.resumed, false, 'first connection: full handshake');
  t.ok(existsSync(session), 'gtlsclient saved the ticket');
  const second = await gtls(t, [`--session-file=${session}`, `--tp-file=${tp}`], [`${origin}/second`]);
  t.equal(second.code, 0);
  t.equal(described(second.dir, 'second').connection.resumed, true, 'second connection: resumed');
  t.match(second.out, /type=0RTT/, 'the client sent its request as 0-RTT');
  t.match(second.out, /\[:status: 200\]/);
});

t.test('the echo server is still up and shuts down gracefully', async (t) => {
  t.equal(server.proc.exitCode, null, 'still running after every test');
  server.proc.kill('SIGTERM');
  t.equal(await server.exited, 0, 'exit 0 after GOAWAY and drain');
});
