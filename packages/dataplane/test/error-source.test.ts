// Whose failure an upstream error is (docs/decisions.md, "Whose failure"), table-driven: only
// failures that came from the backend carry a passive-health signal; errors raised while building
// the request, and defects of ours, carry none. Then the same through a real undici pool: a
// request undici refuses to build never reaches the backend and is the client's 400.
import t from 'tap';
import http from 'node:http';
import { once } from 'node:events';
import { PassThrough } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { Pool } from 'undici';
import { classifyError, codedError, forward } from '../src/proxy/forward.ts';
import type { DownstreamResponse } from '../src/proxy/forward.ts';
import { acceptsUpgrade, allowedUpgradeTokens, declinedUpgrade, upgradeMatches } from '../src/ingress/upgrade.ts';
import { H1_ERR } from '../src/upstream/h1-client.ts';
import { REASON_PHRASES, REQUEST_ERROR_DEFS } from '../src/errors.ts';

t.test('classifyError: status, outcome, reason and health per error code', async (t) => {
  const table: [string, string][] = [
    ['ECONNREFUSED', '502 backend_error transport transport'],
    ['ECONNRESET', '502 backend_error transport transport'],
    ['UND_ERR_SOCKET', '502 backend_error transport transport'],
    ['HPE_INVALID_CONSTANT', '502 backend_error transport transport'],
    ['ERR_TLS_CERT_ALTNAME_INVALID', '502 backend_error tls tls'],
    ['UND_ERR_CONNECT_TIMEOUT', '504 timeout connect_timeout timeout'],
    ['UND_ERR_HEADERS_TIMEOUT', '504 timeout headers_timeout timeout'],
    ['UND_ERR_INVALID_ARG', '400 failure invalid_request -'],
    ['UND_ERR_NOT_SUPPORTED', '400 failure invalid_request -'],
    ['UND_ERR_REQ_CONTENT_LENGTH_MISMATCH', '400 failure invalid_request -'],
    ['UND_ERR_DESTROYED', '502 failure internal -'],
    ['UND_ERR_CLOSED', '502 failure internal -'],
    // Our HTTP/1.1 client's codes (upstream/h1-client.ts) fall in the same classes as undici's.
    [H1_ERR.CONNECT_TIMEOUT, '504 timeout connect_timeout timeout'],
    [H1_ERR.HEADERS_TIMEOUT, '504 timeout headers_timeout timeout'],
    [H1_ERR.BODY_TIMEOUT, '504 timeout body_timeout timeout'],
    [H1_ERR.CLOSED, '502 backend_error transport transport'],
    [H1_ERR.PROTOCOL, '502 backend_error transport transport'],
    [H1_ERR.INVALID_REQUEST, '400 failure invalid_request -'],
    [H1_ERR.CONTENT_LENGTH_MISMATCH, '400 failure invalid_request -'],
    [H1_ERR.POOL_CLOSED, '502 failure internal -'],
    ['', '502 failure internal -'],
  ];
  for (const [code, expected] of table) {
    const c = classifyError(code === '' ? new Error('no code') : codedError(code, 'x'));
    t.equal(`${c.status} ${c.outcome} ${c.reason} ${c.health ?? '-'}`, expected, code || '(no code)');
  }
});

t.test('a request undici refuses to build: 400, no health signal, the backend sees nothing', async (t) => {
  let seen = 0;
  const backend = http.createServer((_req, res) => {
    seen++;
    res.end('ok');
  });
  backend.listen(0, '127.0.0.1');
  await once(backend, 'listening');
  t.teardown(() => new Promise<void>((r) => backend.close(() => r())));
  const pool = new Pool(`http://127.0.0.1:${(backend.address() as AddressInfo).port}`);
  t.teardown(() => pool.close());
  const res = Object.assign(new PassThrough(), { headersSent: false, writeHead: () => res }) as unknown as DownstreamResponse;
  const base = { pool, method: 'GET', body: null, headersTimeout: 2000, bodyTimeout: 2000, bodyTotalMs: 2000, backendProtocol: '1.1' as const, servername: undefined };
  for (const bad of [{ path: '*', headers: {} }, { path: '/a b', headers: {} }, { path: '/', headers: { 'x-a': 'a\x01b' } }, { path: '/', headers: { upgrade: 'websocket' } }]) {
    const r = await forward(res, { ...base, ...bad });
    t.match(r, { status: 400, outcome: 'failure', reason: 'invalid_request', health: undefined, responseStarted: false }, JSON.stringify(bad));
  }
  t.equal(seen, 0);
});

t.test('upgradeMatches: a 101 must name a protocol the client asked for', async (t) => {
  t.ok(upgradeMatches('websocket', 'WebSocket'));
  t.ok(upgradeMatches('h2c, websocket', 'websocket'));
  t.notOk(upgradeMatches('websocket', 'h2c'));
  t.notOk(upgradeMatches('websocket', undefined));
  t.notOk(upgradeMatches(undefined, 'websocket'));
  // Only WebSocket is ever switched to, whatever both sides name (a lenient backend and h2c).
  t.notOk(upgradeMatches('h2c', 'h2c'));
  t.notOk(upgradeMatches('websocket, h2c', 'h2c'));
  t.notOk(upgradeMatches('websocket, h2c', 'websocket, h2c'));
  t.notOk(upgradeMatches('TLS/1.0', 'TLS/1.0'));
  t.ok(upgradeMatches('websocket/13', 'websocket/13'));
});

t.test('acceptsUpgrade and allowedUpgradeTokens: WebSocket only', async (t) => {
  const table: [string | string[] | undefined, string[]][] = [
    ['websocket', ['websocket']],
    ['WebSocket', ['websocket']],
    ['h2c', []],
    ['H2C', []],
    ['h2c, websocket', ['websocket']],
    [['h2c', 'websocket'], ['websocket']],
    ['websocket/13, h2c', ['websocket/13']],
    ['TLS/1.0, HTTP/1.1', []],
    ['websockets', []],
    ['', []],
    [undefined, []],
  ];
  for (const [v, allowed] of table) {
    t.same(allowedUpgradeTokens(v), allowed, JSON.stringify(v));
    t.equal(acceptsUpgrade({ upgrade: v }), allowed.length > 0);
  }
});

t.test('every status the proxy answers itself has its reason phrase (a coded body starts "401 Unauthorized: ...", never "401 Error")', async (t) => {
  const statuses = [...new Set(Object.values(REQUEST_ERROR_DEFS).map((d) => d.status).filter((s) => s !== undefined))].sort();
  t.ok(statuses.includes(401) && statuses.includes(503), `${statuses.length} statuses`);
  t.same(statuses.filter((s) => REASON_PHRASES[s as number] === undefined), [], 'none without a phrase');
  t.equal(REASON_PHRASES[401], 'Unauthorized');
});

t.test('declinedUpgrade: an upgrade asked for and not taken (the connection then closes)', async (t) => {
  const table: [Record<string, string | string[] | undefined>, boolean][] = [
    [{ upgrade: 'h2c', connection: 'Upgrade, HTTP2-Settings' }, true],
    [{ upgrade: 'h2c', connection: 'upgrade' }, true],
    [{ upgrade: 'TLS/1.0', connection: ['keep-alive', 'Upgrade'] }, true],
    [{ upgrade: 'websocket', connection: 'Upgrade' }, false],
    [{ upgrade: 'h2c, websocket', connection: 'Upgrade' }, false],
    [{ upgrade: 'h2c' }, false],
    [{ upgrade: 'h2c', connection: 'close' }, false],
    [{ upgrade: 'h2c', connection: 'upgraded' }, false],
    [{ connection: 'upgrade' }, false],
    [{}, false],
  ];
  for (const [headers, declined] of table) t.equal(declinedUpgrade(headers), declined, JSON.stringify(headers));
});
