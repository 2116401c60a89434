// bench:proxy's second HTTP/3 client (scripts/lib/bench-browser.ts) against a real HTTP/3 server:
// headless Chromium must make exactly the requests asked, over h3, on one connection or on a new
// connection per context and wave as its phases say, and count every answer other than 200 as an
// error, so that a round's req/s and CPU per request are the proxy's and not a fallback's.
import t from 'tap';
import type { Test } from 'tap';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Http3Server } from '@edge-proxy/http3';
import { BrowserLoad, spkiHash } from '../scripts/lib/bench-browser.ts';
import { makeLeaf } from '../scripts/lib/certs.ts';
import { toolPath } from '../scripts/system-tools.ts';

const chromium = toolPath('chromium');
if (chromium === undefined) t.fail('chromium is missing: install the Debian package chromium');

interface Seen {
  readonly path: string;
  readonly alpn: string;
  readonly port: number;
}

/** An HTTP/3 server on 127.0.0.1 answering `status(n)` to its n-th request (from 1; the icon aside), "ok" as the body. */
async function server(t: Test, status: (n: number) => number = () => 200): Promise<{ origin: string; seen: Seen[]; spki: string }> {
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-browser-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const leaf = makeLeaf(dir, 'h3', undefined, { sans: ['127.0.0.1'] });
  const s = new Http3Server({ key: readFileSync(leaf.key, 'utf8'), cert: readFileSync(leaf.cert, 'utf8') });
  t.teardown(() => s.destroy());
  const seen: Seen[] = [];
  s.on('request', (req, res) => {
    // Chromium asks for the page's icon after each page load: not part of the load, left out.
    if (req.url === '/favicon.ico') {
      req.resume();
      res.writeHead(404);
      res.end();
      return;
    }
    seen.push({ path: req.url, alpn: req.socket.alpnProtocol, port: req.socket.remotePort });
    req.resume();
    res.writeHead(status(seen.length), { 'content-type': 'text/plain' });
    res.end('ok');
  });
  const { port } = await s.listen({ host: '127.0.0.1', port: 0 });
  return { origin: `127.0.0.1:${port}`, seen, spki: spkiHash(readFileSync(leaf.cert)) };
}

const profiles = (): string[] => readdirSync(tmpdir()).filter((f) => f.startsWith('bench-chromium-'));

t.test('one connection: the page and n requests, all over h3 on one connection', { skip: chromium === undefined }, async (t) => {
  const { origin, seen, spki } = await server(t);
  const before = new Set(profiles());
  const browser = await BrowserLoad.launch(chromium as string, 0, [origin], spki);
  const mine = profiles().filter((f) => !before.has(f));
  t.equal(mine.length, 1, 'Chromium runs in a profile directory of its own');
  try {
    const r = await browser.oneConnection(origin, 40, 8);
    t.equal(r.requests, 41, 'the page load and the 40 fetches');
    t.equal(r.errors, 0);
    t.ok(r.reqPerSec > 0 && r.p99 >= r.p50, `a rate and latencies (${Math.round(r.reqPerSec)} req/s, p50 ${r.p50.toFixed(1)} ms)`);
    t.equal(seen.length, 41, 'the server saw exactly those requests');
    t.same([...new Set(seen.map((s) => s.alpn))], ['h3']);
    t.equal(new Set(seen.map((s) => s.port)).size, 1, 'all on one connection');
    // A second round opens a fresh browser context, so a fresh connection.
    const again = await browser.oneConnection(origin, 10, 5);
    t.equal(again.requests, 11);
    t.equal(new Set(seen.slice(41).map((s) => s.port)).size, 1);
    t.not(seen[41]?.port, seen[0]?.port, 'the next round came on a new connection');
  } finally {
    await browser.close();
  }
  t.notOk(existsSync(path.join(tmpdir(), mine[0] as string)), 'close() removed the profile directory');
});

t.test('an answer other than 200 is an error, not a request served', { skip: chromium === undefined }, async (t) => {
  // Request 1 is the page; every fifth after it fails.
  const { origin, spki } = await server(t, (n) => (n > 1 && n % 5 === 0 ? 503 : 200));
  const browser = await BrowserLoad.launch(chromium as string, 0, [origin], spki);
  t.teardown(() => browser.close());
  const r = await browser.oneConnection(origin, 40, 4);
  // Requests 2-41 are the fetches: 5, 10, ..., 40 answered 503.
  t.equal(r.errors, 8);
  t.equal(r.requests, 33);
  t.match(r.raw, /33 answered 200 of 41 asked, 8 failed, 0 not over h3/);
});

t.test('many connections: each context opens a new connection for every wave', { skip: chromium === undefined }, async (t) => {
  const { origin, seen, spki } = await server(t);
  const browser = await BrowserLoad.launch(chromium as string, 0, [origin], spki);
  t.teardown(() => browser.close());
  const r = await browser.manyConnections(origin, 3, 4, 2);
  t.equal(r.requests, 24, '3 contexts × 4 requests × 2 waves (the page loads before are not counted)');
  t.equal(r.errors, 0);
  const pages = seen.slice(0, 3);
  const fetches = seen.slice(3);
  t.equal(fetches.length, 24);
  t.same([...new Set(seen.map((s) => s.alpn))], ['h3']);
  const pagePorts = new Set(pages.map((s) => s.port));
  t.equal(pagePorts.size, 3, 'three contexts, three connections for the page loads');
  const wave1 = new Set(fetches.slice(0, 12).map((s) => s.port));
  const wave2 = new Set(fetches.slice(12).map((s) => s.port));
  t.equal(wave1.size, 3, 'wave 1: one new connection per context');
  t.equal(wave2.size, 3, 'wave 2: one new connection per context');
  t.equal([...wave1, ...wave2].filter((p) => pagePorts.has(p)).length, 0, 'no wave reused a page-load connection');
  t.equal([...wave2].filter((p) => wave1.has(p)).length, 0, 'nor one of the wave before');
});
