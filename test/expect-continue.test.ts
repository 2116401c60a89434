// `Expect: 100-continue` after policy (issue 38, finding 10): a request the proxy refuses without
// needing its body (a denied path, no route, a declared body over the limit) is answered with its
// final status and never told `100 Continue`; an allowed one gets `100 Continue` when the proxy
// reads its body, then the backend's answer. node's HTTP/1.1 server sent the 100 itself before
// the request was looked at. Real `edge-proxy serve` (2 workers), a backend that records what it
// received, a raw TLS socket (HTTP/1.1), node:http2 and our HTTP/3 client.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-continue-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

/** Every request the backend received: path and body. */
const seen: { url: string; body: string }[] = [];
const appPort = await listenTracked(
  t,
  http.createServer((req, res) => {
    let body = '';
    req.setEncoding('latin1');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      seen.push({ url: req.url ?? '', body });
      res.end(`got ${body}`);
    });
  }),
);

const [port, mport] = [await freePort(), await freePort()];
const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2, body: { max_request_body_bytes: 1000 } }
resilience:
  protocol: { denied_path_prefixes: [/app/private] }
upstream:
  app:
    route: { path_prefix: /app }
    backends: [{ id: app, address: "127.0.0.1:${appPort}" }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
`,
);
t.teardown(() => served.stop());

/** A head with `expect: 100-continue` on a new HTTP/1.1 connection; the first bytes the proxy sends back. */
async function h1Expect(target: string, length: number): Promise<{ s: tls.TLSSocket; first: string }> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  s.on('error', () => {});
  await once(s, 'secureConnect');
  s.write(`POST ${target} HTTP/1.1\r\nhost: localhost\r\ncontent-type: text/plain\r\ncontent-length: ${length}\r\nexpect: 100-continue\r\n\r\n`);
  const [d] = (await once(s, 'data')) as [Buffer];
  return { s, first: d.toString('latin1') };
}

/** The rest of what the proxy sends on `s` until it closes (bounded). */
function rest(s: tls.TLSSocket, ms = 10_000): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    const timer = setTimeout(() => {
      s.destroy();
      resolve(text);
    }, ms);
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    s.once('close', () => {
      clearTimeout(timer);
      resolve(text);
    });
  });
}

const REFUSED: [string, number, number][] = [
  ['/app/private/x', 5, 403],
  ['/APP/Private;x/y', 5, 403],
  ['/elsewhere', 5, 404],
  ['/app/big', 5000, 413],
];

t.test('HTTP/1.1: a refused request gets its final status first, never `100 Continue`, and the body is never forwarded', async (t) => {
  for (const [target, length, status] of REFUSED) {
    const before = seen.length;
    const { s, first } = await h1Expect(target, length);
    t.match(first, new RegExp(`^HTTP/1\\.1 ${status} `), `${target}: the first bytes are the ${status}`);
    t.notMatch(first + (await rest(s)), /HTTP\/1\.1 100/, `${target}: no 100 Continue at all`);
    t.equal(seen.length, before, `${target}: nothing reached the backend`);
  }
});

t.test('HTTP/1.1: an allowed request gets `100 Continue`, then its body is forwarded and the backend answers 200', async (t) => {
  const { s, first } = await h1Expect('/app/upload', 5);
  t.equal(first.slice(0, 25), 'HTTP/1.1 100 Continue\r\n\r\n', 'the first bytes are the 100');
  const answer = rest(s, 3000);
  s.write('hello');
  const text = first.slice(25) + (await answer);
  t.match(text, /^HTTP\/1\.1 200 /, 'then the 200');
  t.match(text, /got hello$/, "with the backend's answer to the body");
  t.same(seen.at(-1), { url: '/app/upload', body: 'hello' }, 'the backend received the body');
});

/** An HTTP/2 POST with `expect: 100-continue` that sends its body only on 'continue': the status, whether 100 came, and the body. */
async function h2Expect(session: http2.ClientHttp2Session, p: string, length: number): Promise<{ status: number; continued: boolean; body: string }> {
  const req = session.request({ ':method': 'POST', ':path': p, 'content-length': String(length), expect: '100-continue' });
  let continued = false;
  req.on('continue', () => {
    continued = true;
    req.end('x'.repeat(length));
  });
  req.on('error', () => {});
  const [h] = (await once(req, 'response')) as [http2.IncomingHttpHeaders];
  let body = '';
  req.setEncoding('utf8');
  for await (const c of req) body += c;
  if (!continued) req.close();
  return { status: Number(h[':status']), continued, body };
}

t.test('HTTP/2: the same, with `100 Continue` as an interim HEADERS frame', async (t) => {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  session.on('error', () => {});
  t.teardown(() => session.close());
  for (const [target, length, status] of REFUSED) {
    const before = seen.length;
    const r = await h2Expect(session, target, length);
    t.equal(r.status, status, `${target}: ${status}`);
    t.equal(r.continued, false, `${target}: no 100 Continue`);
    t.equal(seen.length, before, `${target}: nothing reached the backend`);
  }
  const ok = await h2Expect(session, '/app/upload2', 7);
  t.same(ok, { status: 200, continued: true, body: 'got xxxxxxx' }, 'allowed: 100, then the body forwarded and 200');
});

t.test('HTTP/3: refused requests get no `100 Continue`; an allowed one gets it before the final response', async (t) => {
  const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
  t.teardown(() => c.close(true));
  for (const [target, length, status] of REFUSED) {
    const before = seen.length;
    const r = await c.fetch({ method: 'POST', path: target, headers: { expect: '100-continue', 'content-length': String(length) }, body: Buffer.alloc(length, 0x78), timeoutMs: 10_000 });
    t.equal(r.status, status, `${target}: ${status}`);
    t.same(
      r.informational.map((i) => i.status),
      [],
      `${target}: no 100 Continue`,
    );
    t.equal(seen.length, before, `${target}: nothing reached the backend`);
  }
  const ok = await c.fetch({ method: 'POST', path: '/app/upload3', headers: { expect: '100-continue', 'content-length': '3' }, body: Buffer.from('abc'), timeoutMs: 10_000 });
  t.equal(ok.status, 200);
  t.same(
    ok.informational.map((i) => i.status),
    [100],
    'allowed: one 100 Continue before the 200',
  );
  t.equal(ok.body.toString(), 'got abc');
});
