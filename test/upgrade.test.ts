// HTTP/1.1 Upgrade (WebSocket) end to end on a real worker (the standalone worker: the upgrade path
// lives in it): what the client gets and what each backend saw. Beyond 101 and 404
// (dataplane-e2e, request-path-security): a denied path in every spelling never reaches a
// backend; routing by host and method picks the route the normal path picks; a backend that
// refuses or drops the connection is a 502; bytes after the 101 cross exactly, both ways, including
// those that arrive in the same packet as the heads; the pool's host_policy and the forwarding
// headers apply as on the normal path.
import t from 'tap';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Socket } from 'node:net';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { listeningLine } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-upgrade-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

// --- backends -------------------------------------------------------------------------------
interface Seen {
  readonly backend: string;
  readonly upgrade: boolean;
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
}
/** Every request any backend received, in order. */
const seen: Seen[] = [];
const listen = (s: net.Server): Promise<number> => listenTracked(t, s);

/** Bytes each tunnel's backend side received after the 101, per request URL. */
const tunnelled = new Map<string, Buffer[]>();

/**
 * A WebSocket-style backend named `id`: switches to `websocket`, sends `hello from <id>` in the
 * same write as its 101 head, then echoes every byte unchanged and records it. Plain requests get
 * 426 (and are recorded too, for host_policy on the normal path).
 */
function wsBackend(id: string): http.Server {
  const s = http.createServer((req, res) => {
    seen.push({ backend: id, upgrade: false, method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    res.writeHead(426, { 'x-backend': id }).end();
  });
  s.on('upgrade', (req: http.IncomingMessage, socket: Socket, head: Buffer) => {
    seen.push({ backend: id, upgrade: true, method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    const got: Buffer[] = [];
    tunnelled.set(req.url ?? '', got);
    if (head.length > 0) got.push(Buffer.from(head));
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nx-backend: ${id}\r\n\r\nhello from ${id}`);
    if (head.length > 0) socket.write(head);
    socket.on('data', (d: Buffer) => {
      got.push(Buffer.from(d));
      socket.write(d);
    });
    socket.on('end', () => socket.end());
    socket.on('error', () => socket.destroy());
  });
  return s;
}
const wsPort = await listen(wsBackend('ws'));
const hostPort = await listen(wsBackend('ws-host'));
const postPort = await listen(wsBackend('ws-post'));
const hashPorts = [await listen(wsBackend('hash-a')), await listen(wsBackend('hash-b')), await listen(wsBackend('hash-c'))];
// Accepts, then closes without a byte: a backend that drops the upgrade.
const dropPort = await listen(
  net.createServer((c) => {
    seen.push({ backend: 'drop', upgrade: true, method: '', url: '', headers: {} });
    c.destroy();
  }),
);
// A port with nothing listening (drawn below the ephemeral range, so no client socket takes it):
// a backend that refuses the connection.
const refusedPort = await freePort();

// --- the worker -----------------------------------------------------------------------------
const configFile = path.join(dir, 'config.yaml');
writeFileSync(
  configFile,
  `
listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${server.cert}, key: ${server.key} } }
resilience:
  protocol: { denied_path_prefixes: [/private, /admin/secret] }
upstream:
  ws:
    route: { path_prefix: /, methods: [GET, POST] }
    backends: [{ id: ws, address: "127.0.0.1:${wsPort}" }]
  ws-host:
    route: { host: ws.example, path_prefix: /chat, methods: [GET] }
    host_policy: { mode: rewrite, host: chat.internal }
    backends: [{ id: ws-host, address: "127.0.0.1:${hostPort}" }]
  ws-post:
    route: { host: ws.example, path_prefix: /chat, methods: [POST] }
    backends: [{ id: ws-post, address: "127.0.0.1:${postPort}" }]
  sticky:
    route: { path_prefix: /sticky }
    load_balancing: { type: consistent-hash, key: "header:x-user" }
    backends:
      - { id: hash-a, address: "127.0.0.1:${hashPorts[0]}" }
      - { id: hash-b, address: "127.0.0.1:${hashPorts[1]}" }
      - { id: hash-c, address: "127.0.0.1:${hashPorts[2]}" }
  drop:
    route: { path_prefix: /drop }
    backends: [{ id: drop, address: "127.0.0.1:${dropPort}" }]
  refused:
    route: { path_prefix: /refused }
    backends: [{ id: refused, address: "127.0.0.1:${refusedPort}" }]
`,
);
const worker: ChildProcess = spawn(process.execPath, [path.join(root, 'packages/dataplane/src/worker/standalone.ts'), '-c', configFile, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
t.teardown(() => {
  if (worker.exitCode === null) worker.kill('SIGKILL');
});
const port = (JSON.parse((await listeningLine(worker)).toString().split('\n')[0] ?? '{}') as { listeners: { tcp: number }[] }).listeners[0]?.tcp as number;

// --- client -----------------------------------------------------------------------------------
const UPGRADE = 'upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n';

interface Tunnel {
  readonly socket: tls.TLSSocket;
  /** Everything received so far (head included). */
  received(): Buffer;
  /** Resolves once `pred` holds for what was received (bounded). */
  until(pred: (b: Buffer) => boolean, what: string): Promise<Buffer>;
}

/** A TLS connection that sends `bytes` in one write and collects what comes back. */
async function open(bytes: string | Buffer): Promise<Tunnel> {
  const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  t.teardown(() => socket.destroy());
  await once(socket, 'secureConnect');
  let buf = Buffer.alloc(0);
  const waiters = new Set<() => void>();
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    for (const w of waiters) w();
  });
  socket.on('close', () => {
    for (const w of waiters) w();
  });
  socket.on('error', () => {});
  socket.write(bytes);
  return {
    socket,
    received: () => buf,
    until: (pred, what) =>
      new Promise((resolve, reject) => {
        const check = (): void => {
          if (pred(buf)) {
            waiters.delete(check);
            clearTimeout(timer);
            resolve(buf);
          } else if (socket.destroyed) {
            waiters.delete(check);
            clearTimeout(timer);
            reject(new Error(`closed before ${what}; got ${JSON.stringify(buf.subarray(0, 200).toString('latin1'))}`));
          }
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`no ${what} within 30 s; got ${JSON.stringify(buf.subarray(0, 200).toString('latin1'))}`));
        }, 30_000);
        waiters.add(check);
        check();
      }),
  };
}

/** One request on its own connection; everything until the proxy closes it. */
async function exchange(head: string): Promise<string> {
  const c = await open(`${head}\r\n`);
  if (!c.socket.destroyed) await once(c.socket, 'close');
  return c.received().toString('latin1');
}
const statusOf = (answer: string): number => Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0);
const headEnd = (b: Buffer): number => b.indexOf('\r\n\r\n');

// --- tests ------------------------------------------------------------------------------------
t.test('an upgrade to a denied path, in any spelling, is refused with its status and reaches no backend', async (t) => {
  const before = seen.length;
  const table: [string, number][] = [
    ['/private/ws', 403],
    ['/PRIVATE', 403],
    ['/%70rivate/ws', 403],
    ['//private', 403],
    ['/x/../private', 403],
    ['/private;x', 403],
    ['/admin;x/secret', 403],
    ['/admin%3bx/secret/ws', 403],
    ['/x/%C0%AE%C0%AE/private', 400],
    ['/admin%2fsecret', 400],
    ['/public/..;/private', 400],
    ['http://localhost/./private', 403],
  ];
  for (const [target, status] of table) {
    const answer = await exchange(`GET ${target} HTTP/1.1\r\nhost: localhost\r\n${UPGRADE}`);
    t.equal(statusOf(answer), status, target);
    t.match(answer, /\r\nconnection: close\r\n/, `${target}: the connection closes`);
  }
  t.same(seen.slice(before), [], 'no backend saw any of them');
});

t.test('upgrades are routed by host and method as plain requests are', async (t) => {
  // By host: ws.example/chat is the ws-host pool, any other host the catch-all ws pool.
  let before = seen.length;
  const c = await open(`GET /chat/room HTTP/1.1\r\nhost: ws.example\r\n${UPGRADE}\r\n`);
  const got = await c.until((b) => b.includes('hello from'), 'the greeting');
  t.match(got.toString('latin1'), /^HTTP\/1\.1 101 [^]*\r\nx-backend: ws-host\r\n\r\nhello from ws-host$/);
  c.socket.destroy();
  t.match(seen.slice(before), [{ backend: 'ws-host', upgrade: true, method: 'GET', url: '/chat/room' }]);
  before = seen.length;
  const d = await open(`GET /chat/room HTTP/1.1\r\nhost: localhost\r\n${UPGRADE}\r\n`);
  t.match((await d.until((b) => b.includes('hello from'), 'the greeting')).toString('latin1'), /\r\n\r\nhello from ws$/);
  d.socket.destroy();
  t.match(seen.slice(before), [{ backend: 'ws', upgrade: true, url: '/chat/room' }]);
  // By method: on ws.example/chat, GET is ws-host's and POST ws-post's; the upgrade path picks
  // the backend the normal path picks for the same request.
  for (const [method, id] of [['GET', 'ws-host'], ['POST', 'ws-post']] as const) {
    before = seen.length;
    const u = await open(`${method} /chat/m HTTP/1.1\r\nhost: ws.example\r\ncontent-length: 0\r\n${UPGRADE}\r\n`);
    t.match((await u.until((b) => b.includes('hello from'), 'the greeting')).toString('latin1'), new RegExp(`\r\n\r\nhello from ${id}$`), `${method} upgrade`);
    u.socket.destroy();
    t.equal(statusOf(await exchange(`${method} /chat/m HTTP/1.1\r\nhost: ws.example\r\ncontent-length: 0\r\nconnection: close\r\n`)), 426, `${method} plain`);
    t.same(
      seen.slice(before).map((x) => `${x.backend} ${x.upgrade ? 'upgrade' : 'plain'} ${x.method}`),
      [`${id} upgrade ${method}`, `${id} plain ${method}`],
      `${method}: both reached ${id}`,
    );
  }
  // A method no route on the path accepts: 405 with the same Allow on both paths.
  before = seen.length;
  const upgradeAnswer = await exchange(`PUT /chat/room HTTP/1.1\r\nhost: ws.example\r\ncontent-length: 0\r\n${UPGRADE}`);
  const plainAnswer = await exchange('PUT /chat/room HTTP/1.1\r\nhost: ws.example\r\ncontent-length: 0\r\nconnection: close\r\n');
  t.equal(statusOf(plainAnswer), 405, 'the normal path: 405');
  t.equal(statusOf(upgradeAnswer), 405, 'the upgrade path: 405 too');
  const allow = (a: string): string | undefined => /\r\nallow: ([^\r]*)\r\n/i.exec(a)?.[1];
  t.ok(allow(plainAnswer), 'the normal path sends Allow');
  t.equal(allow(upgradeAnswer), allow(plainAnswer), 'the same Allow');
  t.same(seen.slice(before), [], 'no backend saw either');
});

t.test('a backend that refuses or drops the upgrade connection: 502, and the client connection closes', async (t) => {
  const refusedAnswer = await exchange(`GET /refused/ws HTTP/1.1\r\nhost: localhost\r\n${UPGRADE}`);
  t.equal(statusOf(refusedAnswer), 502, 'connection refused');
  t.match(refusedAnswer, /backend unreachable/);
  const before = seen.length;
  const droppedAnswer = await exchange(`GET /drop/ws HTTP/1.1\r\nhost: localhost\r\n${UPGRADE}`);
  t.equal(statusOf(droppedAnswer), 502, 'closed without an answer');
  t.match(droppedAnswer, /invalid answer from backend/);
  t.match(seen.slice(before), [{ backend: 'drop' }], 'the dropping backend was reached once');
});

t.test('after the 101, bytes cross exactly both ways, including those sent with the heads', async (t) => {
  // The client sends the upgrade request and its first tunnel bytes in one write; the backend its
  // 101 head and greeting in one write (upgrade.ts's `head` and `upgradeHead`).
  const early = Buffer.from([0x00, 0xff, 0x0d, 0x0a, 0x0d, 0x0a, 0x81, 0x7f]);
  const c = await open(Buffer.concat([Buffer.from(`GET /tunnel/exact HTTP/1.1\r\nhost: localhost\r\n${UPGRADE}\r\n`, 'latin1'), early]));
  const greeting = Buffer.from('hello from ws');
  // The backend echoes `early` as soon as it has it (possibly before the greeting reaches us).
  const afterHead = async (n: number): Promise<Buffer> => {
    const b = await c.until((x) => headEnd(x) >= 0 && x.length - headEnd(x) - 4 >= n, `${n} tunnel bytes`);
    return b.subarray(headEnd(b) + 4);
  };
  const first = await afterHead(greeting.length + early.length);
  t.match(c.received().subarray(0, headEnd(c.received())).toString('latin1'), /^HTTP\/1\.1 101 /);
  t.same(first, Buffer.concat([greeting, early]), 'the greeting, then the early bytes echoed');
  // 1 MiB of every byte value, in 64 KiB writes; the echo must come back byte for byte.
  const payload = randomBytes(1 << 20);
  for (let i = 0; i < payload.length; i += 1 << 16) c.socket.write(payload.subarray(i, i + (1 << 16)));
  const all = await afterHead(greeting.length + early.length + payload.length);
  t.equal(all.length, greeting.length + early.length + payload.length, 'no byte more, none missing');
  t.ok(all.subarray(greeting.length + early.length).equals(payload), 'the echo equals the payload');
  t.ok(Buffer.concat(tunnelled.get('/tunnel/exact') ?? []).equals(Buffer.concat([early, payload])), 'the backend received exactly the early bytes and the payload');
  // Closing one side closes the other.
  c.socket.end();
  if (!c.socket.destroyed) await once(c.socket, 'close');
});

t.test("the pool's host_policy and the forwarding headers apply to an upgrade as to a plain request", async (t) => {
  const forged = 'x-forwarded-for: 6.6.6.6\r\nx-forwarded-host: evil.example\r\nforwarded: for=6.6.6.6\r\n';
  let before = seen.length;
  const c = await open(`GET /chat/hp HTTP/1.1\r\nhost: ws.example\r\n${forged}${UPGRADE}\r\n`);
  await c.until((b) => b.includes('hello from'), 'the greeting');
  c.socket.destroy();
  const up = seen.slice(before);
  before = seen.length;
  t.equal(statusOf(await exchange(`GET /chat/hp HTTP/1.1\r\nhost: ws.example\r\n${forged}connection: close\r\n`)), 426);
  const plain = seen.slice(before);
  t.equal(up.length, 1);
  t.equal(plain.length, 1);
  for (const [name, s] of [['upgrade', up[0]], ['plain', plain[0]]] as const) {
    t.equal(s?.headers.host, 'chat.internal', `${name}: Host rewritten by host_policy`);
    t.equal(s?.headers['x-forwarded-for'], '127.0.0.1', `${name}: X-Forwarded-For is the client's address only`);
    t.equal(s?.headers['x-forwarded-host'], 'ws.example', `${name}: X-Forwarded-Host is the downstream host`);
    t.notMatch(String(s?.headers.forwarded), /6\.6\.6\.6/, `${name}: the forged Forwarded is gone`);
  }
});

t.test('on a consistent-hash pool, an upgrade goes to the backend its key picks for a plain request', async (t) => {
  const plainIds: string[] = [];
  for (let i = 0; i < 12; i++) {
    const user = `user-${i}`;
    const plain = await exchange(`GET /sticky/x HTTP/1.1\r\nhost: localhost\r\nx-user: ${user}\r\nconnection: close\r\n`);
    const id = /\r\nx-backend: ([^\r]*)\r\n/.exec(plain)?.[1] ?? '';
    plainIds.push(id);
    const u = await open(`GET /sticky/x HTTP/1.1\r\nhost: localhost\r\nx-user: ${user}\r\n${UPGRADE}\r\n`);
    const greeting = (await u.until((b) => b.includes('hello from'), 'the greeting')).toString('latin1');
    u.socket.destroy();
    t.equal(/hello from (.*)$/.exec(greeting)?.[1], id, `${user}: the upgrade reached ${id}, as the plain request did`);
  }
  // Not vacuous: the key spreads these users over more than one backend.
  t.ok(new Set(plainIds).size > 1, `users spread over ${[...new Set(plainIds)].join(', ')}`);
});
