// Interop with a browser: headless Debian chromium, forced onto QUIC for our origin, loads a
// page and its script from our server over HTTP/3. Kept off the network: every name but
// localhost resolves to nothing.
import t from 'tap';
import { chromium } from 'playwright-core';
import { Http3Server } from '../src/index.ts';
import { makePki, requireTool } from './net-helpers.ts';
import { spkiHash } from '../../../scripts/lib/bench-browser.ts';

const executablePath = requireTool(t, 'chromium', 'chromium');
const pki = makePki(t);
// Chromium trusts a certificate whose public key hash is listed (base64 SHA-256 of the SPKI).
const spki = spkiHash(pki.certPem);

t.test('chromium loads a page and a subresource over HTTP/3', async (t) => {
  const server = new Http3Server({ key: pki.keyPem, cert: pki.certPem });
  t.teardown(() => server.destroy());
  const seen: Array<{ path: string; alpn: string; ua: string }> = [];
  server.on('request', (req, res) => {
    seen.push({ path: req.url, alpn: req.socket.alpnProtocol, ua: String(req.headers['user-agent']) });
    req.resume();
    if (req.url === '/app.js') {
      res.writeHead(200, { 'content-type': 'text/javascript' });
      res.end("document.getElementById('out').textContent = 'script ran over ' + performance.getEntriesByType('navigation')[0].nextHopProtocol;");
      return;
    }
    if (req.url === '/') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end('<!doctype html><title>edge-proxy h3</title><p id="out">waiting</p><script src="/app.js"></script>');
      return;
    }
    res.writeHead(404);
    res.end();
  });
  // Chromium resolves localhost to ::1 first: listen dual-stack.
  const { port } = await server.listen({ host: '::', port: 0 });
  const origin = `localhost:${port}`;
  const browser = await chromium.launch({
    executablePath,
    headless: true,
    timeout: 30000,
    args: [
      `--origin-to-force-quic-on=${origin}`,
      `--ignore-certificate-errors-spki-list=${spki}`,
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1',
      '--disable-background-networking',
      '--no-first-run',
      '--no-sandbox',
    ],
  });
  t.teardown(() => browser.close());
  const page = await browser.newPage();
  const response = await page.goto(`https://${origin}/`, { timeout: 20000 });
  t.equal(response?.status(), 200, 'the page loaded');
  // Browser-side code as strings: this package's TypeScript has no DOM types.
  await page.waitForFunction("document.getElementById('out').textContent !== 'waiting'", undefined, { timeout: 10000 });
  t.equal(await page.textContent('#out'), 'script ran over h3', 'the browser reports HTTP/3 (nextHopProtocol h3)');
  const resources = (await page.evaluate("performance.getEntriesByType('resource').map((e) => [new URL(e.name).pathname, e.nextHopProtocol])")) as Array<[string, string]>;
  t.same(resources.find(([p]) => p === '/app.js'), ['/app.js', 'h3'], 'the script also came over h3');
  t.ok(seen.some((s) => s.path === '/' && s.alpn === 'h3'), 'the server saw the page request on h3');
  t.ok(seen.some((s) => s.path === '/app.js'), 'and the script request');
  t.match(seen[0]?.ua ?? '', /Chrome/);
  await browser.close();
  await server.close(1000);
  t.same(server.stats().sessions, 0, 'the browser connection was closed and released');
});
