// Content-Length normalized before forwarding (issue 38, finding 10): `content-length: 005` was
// forwarded as written, and a backend that reads leading zeros otherwise (octal, or a refusal)
// frames the body differently from the proxy. The backend must see `content-length: 5`; a value
// that is not 1*DIGIT, or a list whose members differ, is refused with 400 (RFC 9110 §8.6,
// RFC 9112 §6.3) and never forwarded. Real `edge-proxy serve` (2 workers), a backend that records
// the raw header lines it received, a raw TLS socket (HTTP/1.1), node:http2 and our HTTP/3 client.
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

const dir = mkdtempSync(path.join(tmpdir(), 'edge-clfwd-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

/** Per request path: the Content-Length lines the backend received (raw, as sent) and the body. */
const seen = new Map<string, { lengths: string[]; body: string }>();
const appPort = await listenTracked(
  t,
  http.createServer((req, res) => {
    const lengths: string[] = [];
    for (let i = 0; i < req.rawHeaders.length; i += 2) if (req.rawHeaders[i]?.toLowerCase() === 'content-length') lengths.push(req.rawHeaders[i + 1] as string);
    let body = '';
    req.setEncoding('latin1');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      seen.set(req.url ?? '', { lengths, body });
      res.end('ok');
    });
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

/** One raw HTTP/1.1 POST with `length` as its Content-Length line(s) and body `hello`; the status line's code. */
async function h1(p: string, lengthLines: string[]): Promise<number> {
  const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] });
  s.on('error', () => {});
  await once(s, 'secureConnect');
  let text = '';
  s.setEncoding('latin1');
  s.on('data', (d: string) => (text += d));
  const closed = once(s, 'close');
  s.write(`POST ${p} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n${lengthLines.map((l) => `content-length: ${l}\r\n`).join('')}\r\nhello`);
  await Promise.race([closed, new Promise((r) => setTimeout(r, 10_000))]);
  s.destroy();
  return Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
}

t.test('HTTP/1.1: content-length 005 reaches the backend as 5; a sign, a differing list or two differing lines get 400 and are not forwarded', async (t) => {
  t.equal(await h1('/h1/zeros', ['005']), 200);
  t.same(seen.get('/h1/zeros'), { lengths: ['5'], body: 'hello' }, 'the backend saw content-length: 5 and the five bytes');
  t.equal(await h1('/h1/canonical', ['5']), 200);
  t.same(seen.get('/h1/canonical'), { lengths: ['5'], body: 'hello' });
  for (const [name, lines] of [
    ['sign', ['+5']],
    ['list', ['5, 6']],
    ['two-lines', ['5', '6']],
    ['hex', ['0x5']],
  ] as [string, string[]][]) {
    t.equal(await h1(`/h1/bad-${name}`, lines), 400, `${JSON.stringify(lines)}: 400`);
    t.notOk(seen.has(`/h1/bad-${name}`), `${JSON.stringify(lines)}: not forwarded`);
  }
});

t.test('HTTP/2: content-length 005 reaches the backend as 5; a sign is refused and not forwarded', async (t) => {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  session.on('error', () => {});
  t.teardown(() => session.close());
  const post = async (p: string, length: string): Promise<string> => {
    const req = session.request({ ':method': 'POST', ':path': p, 'content-length': length });
    req.on('error', () => {});
    req.end('hello');
    return new Promise((resolve) => {
      let status = '';
      req.on('response', (h) => (status = String(h[':status'])));
      req.resume();
      req.on('close', () => resolve(status === '' ? `reset ${req.rstCode}` : status));
    });
  };
  t.equal(await post('/h2/zeros', '005'), '200');
  t.same(seen.get('/h2/zeros'), { lengths: ['5'], body: 'hello' }, 'the backend saw content-length: 5 and the five bytes');
  const bad = await post('/h2/bad-sign', '+5');
  t.ok(bad === '400' || bad.startsWith('reset'), `+5: refused (${bad})`);
  t.notOk(seen.has('/h2/bad-sign'), 'not forwarded');
});

t.test('HTTP/3: content-length 005 and an agreeing list 5, 05 reach the backend as 5; a differing list is refused and not forwarded', async (t) => {
  const c = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem.toString() });
  t.teardown(() => c.close(true));
  const post = async (p: string, length: string): Promise<string> => {
    try {
      return String((await c.fetch({ method: 'POST', path: p, headers: { 'content-length': length }, body: Buffer.from('hello'), timeoutMs: 10_000 })).status);
    } catch (err) {
      return `reset ${(err as { code?: string }).code}`;
    }
  };
  t.equal(await post('/h3/zeros', '005'), '200');
  t.same(seen.get('/h3/zeros'), { lengths: ['5'], body: 'hello' }, 'the backend saw content-length: 5 and the five bytes');
  t.equal(await post('/h3/list', '5, 05'), '200');
  t.same(seen.get('/h3/list'), { lengths: ['5'], body: 'hello' }, 'an agreeing list is sent as one canonical value');
  for (const [name, length] of [
    ['list', '5, 6'],
    ['sign', '+5'],
  ]) {
    const r = await post(`/h3/bad-${name}`, length as string);
    t.ok(r === '400' || r.startsWith('reset'), `${length}: refused (${r})`);
    t.notOk(seen.has(`/h3/bad-${name}`), `${length}: not forwarded`);
  }
});
