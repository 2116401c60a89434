// Pipelined HTTP/1.1 requests ahead of a malformed one (issue 38, finding 10): node parses every
// request of one read at once, so when the parser fails on the last, the earlier ones are already
// on their way to the backend. Their responses must reach the client, in order, before the 400
// and the close. Real `edge-proxy serve` (2 workers), a real backend that records what it ran,
// and a raw TLS socket that sends every byte in one write.
import t from 'tap';
import http from 'node:http';
import tls from 'node:tls';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { serve } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-pipelining-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

/** Every request path the backend ran, in order. */
const ran: string[] = [];
// `/slow/<ms>` answers after that long: the first response is still in progress when the parser
// fails on the malformed request, and the others wait behind it in node's queue.
const appPort = await listenTracked(
  t,
  http.createServer((req, res) => {
    ran.push(req.url ?? '');
    const m = /^\/slow\/(\d+)/.exec(req.url ?? '');
    const body = `body of ${req.url}`;
    const answer = (): void => void res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body) }).end(body);
    if (m === null) answer();
    else setTimeout(answer, Number(m[1]));
  }),
);

const [port, mport] = [await freePort(), await freePort()];
const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2 }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${appPort}" }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
`,
);
t.teardown(() => served.stop());

/** Sends `bytes` in one write on a new HTTP/1.1 TLS connection; everything received until the proxy closes it. */
async function exchange(bytes: string, ms = 15_000): Promise<string> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  await once(s, 'secureConnect');
  return new Promise((resolve, reject) => {
    let text = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`connection still open after ${ms} ms; got ${JSON.stringify(text.slice(0, 300))}`));
    }, ms);
    s.setEncoding('latin1');
    s.on('data', (d: string) => (text += d));
    s.on('error', () => {});
    s.once('close', () => {
      clearTimeout(timer);
      resolve(text);
    });
    s.write(bytes);
  });
}

/** The responses in `text`, in order: status and body (bodies framed by content-length). */
function responses(text: string): { status: number; body: string }[] {
  const out: { status: number; body: string }[] = [];
  let rest = text;
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n');
    if (end === -1) throw new Error(`a truncated head: ${JSON.stringify(rest.slice(0, 200))}`);
    const head = rest.slice(0, end);
    const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(head)?.[1] ?? NaN);
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? NaN);
    if (Number.isNaN(status) || Number.isNaN(length)) throw new Error(`not a framed response: ${JSON.stringify(head)}`);
    out.push({ status, body: rest.slice(end + 4, end + 4 + length) });
    rest = rest.slice(end + 4 + length);
  }
  return out;
}

const get = (p: string): string => `GET ${p} HTTP/1.1\r\nhost: localhost\r\n\r\n`;
/** A request line with a space inside its target: llhttp fails on it (HPE_INVALID_...). */
const MALFORMED = 'GET /bad path HTTP/1.1\r\nhost: localhost\r\n\r\n';

t.test('3 valid pipelined GETs + 1 malformed in one write: 3 responses with their bodies, then the 400, in order; the backend ran exactly 3', async (t) => {
  const tag = `a${Date.now()}`;
  const before = ran.length;
  const text = await exchange(get(`/slow/300/${tag}/1`) + get(`/${tag}/2`) + get(`/slow/50/${tag}/3`) + MALFORMED);
  const got = responses(text);
  t.same(
    got.map((r) => r.status),
    [200, 200, 200, 400],
    `statuses in order: ${got.map((r) => r.status).join(', ')}`,
  );
  t.same(
    got.slice(0, 3).map((r) => r.body),
    [`body of /slow/300/${tag}/1`, `body of /${tag}/2`, `body of /slow/50/${tag}/3`],
    'each response carries its own request\'s body, in request order',
  );
  t.match(text.slice(text.lastIndexOf('HTTP/1.1 400')), /\r\nconnection: close\r\n/i, 'the 400 closes the connection');
  t.same(ran.slice(before).sort(), [`/${tag}/2`, `/slow/300/${tag}/1`, `/slow/50/${tag}/3`].sort(), 'the backend ran exactly the three valid requests');
});

t.test('a malformed request alone still gets its 400 and the close at once', async (t) => {
  const before = ran.length;
  const t0 = performance.now();
  const got = responses(await exchange(MALFORMED));
  t.same(
    got.map((r) => r.status),
    [400],
  );
  t.ok(performance.now() - t0 < 5000, `closed ${Math.round(performance.now() - t0)} ms after the request`);
  t.equal(ran.length, before, 'nothing reached the backend');
});

t.test('ten pipelined GETs then a malformed one: ten responses in order, then the 400', async (t) => {
  const tag = `b${Date.now()}`;
  const paths = Array.from({ length: 10 }, (_, i) => (i % 3 === 0 ? `/slow/${100 - i * 5}/${tag}/${i}` : `/${tag}/${i}`));
  const before = ran.length;
  const got = responses(await exchange(paths.map(get).join('') + MALFORMED));
  t.same(
    got.map((r) => r.status),
    [...paths.map(() => 200), 400],
  );
  t.same(
    got.slice(0, 10).map((r) => r.body),
    paths.map((p) => `body of ${p}`),
  );
  t.equal(ran.length - before, 10, 'the backend ran the ten');
});
