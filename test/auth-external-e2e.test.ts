// External authorization end to end (issue 16, "Must show"): a real `edge-proxy serve`, a real
// authorization service that records each call and decides by the request's path
// (test/support/authz-service.ts), a real backend, clients over HTTP/1.1, HTTP/2 and HTTP/3. This file:
// allow → served, deny → 403 EDGE_AUTH_DENIED; what the service receives (method, path, host,
// client address, only the allowlisted headers, the client id and the secret from a file as Basic
// credentials) and the secret in no log line, metric or snapshot; a service that times out, answers
// 500 or is not there, under `failure_mode: deny` (503 EDGE_AUTH_UNAVAILABLE) and `allow`
// (forwarded); with JWT configured too, the JWT is checked first and a request it refuses never
// reaches the service; an https service verified against the pool's CA. JWT and JWKS alone:
// auth-jwt-e2e.test.ts.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { request, snapshot } from './support/overload.ts';
import { scrape } from './support/exposition.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { assertAuthAnswer, authCounters, bearer, jwksServer, jwtAuth, leaked, mint, moved, pool, shown, signingKey, sourceUntil, startAuthProxy } from './support/idp.ts';
import { authzServer } from './support/authz-service.ts';
import type { AuthzCall, AuthzDecision, AuthzServer } from './support/authz-service.ts';
import type { Protocol } from './support/served-by.ts';

const files = serviceFiles(t, 'edge-auth-ext-');

const CLIENT_ID = 'edge-proxy';
const SECRET = 'client-SECRET-3c9d0a';
const secretFile = path.join(files.dir, 'authz-client.secret');
writeFileSync(secretFile, SECRET, { mode: 0o600 });

/** Decides by the second segment of the request's path: `allow…` 200, `deny…` 403, `slow…` never answers, `error…` 500; anything else 200. */
function byPath(call: AuthzCall): AuthzDecision {
  const segment = String(call.body['path'] ?? '').split('/')[2] ?? '';
  if (segment.startsWith('deny')) return { kind: 'status', status: 403 };
  if (segment.startsWith('slow')) return { kind: 'hold' };
  if (segment.startsWith('error')) return { kind: 'status', status: 500 };
  return { kind: 'status', status: 200 };
}

/** The `external` entry of a pool's `auth`. */
const external = (url: string, failureMode: 'deny' | 'allow', timeoutMs = 200): string =>
  `external: { url: "${url}", timeout_ms: ${timeoutMs}, client_id: ${CLIENT_ID}, client_secret_ref: { ref: "file://${secretFile}" }, failure_mode: ${failureMode}, allowed_headers: [authorization, x-tenant] }`;

const METHOD: Readonly<Record<Protocol, string>> = { h1: 'GET', h2: 'PUT', h3: 'DELETE' };

/** Every backend of this file is named `ext`: a 200 with its body for `path`. */
const servedBody = (p: string): string => `ext ${p}`;

t.test('allow → served, deny → 403 EDGE_AUTH_DENIED over h1, h2 and h3; the service gets method, path, host, client address, only the allowlisted headers and Basic client credentials; the secret appears in no log line, metric or snapshot', async (t) => {
  const be = await controlledBackend(t, 'ext');
  const authz = await authzServer(t);
  authz.decide = byPath;
  const p = await startAuthProxy(t, files, 'ext-decisions', { upstream: `{ ${pool('fd', be.port, `auth: { ${external(authz.url, 'deny')} }`)} }` });
  // x-forwarded-for: a client's claim about its address, which must not become client_address.
  const headers = { authorization: 'Bearer opaque-token-61f0', 'x-tenant': 'tenant-7', cookie: 'session=COOKIE-SECRET-2e8b', 'x-other': 'not-for-the-service', 'x-forwarded-for': '203.0.113.9' };
  const before = await authCounters(p);
  for (const protocol of PROTOCOLS) {
    const allowPath = `/fd/allow-${protocol}`;
    const a = await request(p, protocol, { path: allowPath, method: METHOD[protocol], headers });
    t.same([a.status, a.body], [200, servedBody(allowPath)], `${protocol}: allowed → 200 from the backend (got ${shown(a)})`);
    const d = await request(p, protocol, { path: `/fd/deny-${protocol}`, method: METHOD[protocol], headers });
    assertAuthAnswer(t, d, 'EDGE_AUTH_DENIED', `${protocol}: denied`);
  }
  t.same(be.arrivalsUnder('/fd/').map((a) => `${a.method} ${a.path}`), PROTOCOLS.map((pr) => `${METHOD[pr]} /fd/allow-${pr}`), 'the backend saw the allowed requests only');
  t.same(moved(await authCounters(p), before), { 'external allowed': 3, 'external denied': 3 }, 'svc_external_auth_allowed +3, svc_external_auth_denied +3, nothing else');

  t.equal(authz.calls.length, 6, 'one call to the service per request');
  const basic = `Basic ${Buffer.from(`${CLIENT_ID}:${SECRET}`).toString('base64')}`;
  for (const protocol of PROTOCOLS) {
    for (const kind of ['allow', 'deny']) {
      const reqPath = `/fd/${kind}-${protocol}`;
      const call = authz.callsFor(reqPath)[0];
      t.match(call, { method: 'POST', url: '/authz' }, `${protocol} ${kind}: a POST to the configured path`);
      t.match(String(call?.headers['content-type']), /^application\/json/, `${protocol} ${kind}: a JSON body`);
      t.equal(call?.headers.authorization, basic, `${protocol} ${kind}: Basic credentials ${CLIENT_ID}:<the secret from the file>`);
      t.same(call?.body, { method: METHOD[protocol], path: reqPath, host: 'localhost', client_address: '127.0.0.1', headers: { authorization: headers.authorization, 'x-tenant': headers['x-tenant'] } }, `${protocol} ${kind}: method, path, host, the connection's client address (not x-forwarded-for) and the two allowlisted headers, nothing else`);
    }
  }
  const secrets = { 'the client secret': SECRET, 'its Basic encoding': basic.slice('Basic '.length) };
  t.same(leaked(p.served.text(), secrets), [], `the log (${p.served.lines.length} lines) holds no client secret`);
  t.same(leaked(await scrape(p.mport), secrets), [], 'the metrics hold no client secret');
  t.same(leaked(JSON.stringify(await snapshot(p)), secrets), [], 'the snapshot holds no client secret');
});

t.test('a service that times out, answers 500 or is not there: failure_mode deny → 503 EDGE_AUTH_UNAVAILABLE, allow → forwarded, over h1, h2 and h3', async (t) => {
  const TIMEOUT = 200;
  /** Allowance on top of timeout_ms for an answer through a loaded 2-core machine. */
  const MARGIN = 800;
  const be = await controlledBackend(t, 'ext');
  const authz = await authzServer(t);
  authz.decide = byPath;
  const goneUrl = `http://127.0.0.1:${await freePort()}/authz`;
  const p = await startAuthProxy(t, files, 'ext-failures', {
    upstream: `{ ${[
      pool('fd', be.port, `auth: { ${external(authz.url, 'deny', TIMEOUT)} }`),
      pool('fa', be.port, `auth: { ${external(authz.url, 'allow', TIMEOUT)} }`),
      pool('gd', be.port, `auth: { ${external(goneUrl, 'deny', TIMEOUT)} }`),
      pool('ga', be.port, `auth: { ${external(goneUrl, 'allow', TIMEOUT)} }`),
    ].join(', ')} }`,
  });
  const before = await authCounters(p);
  const cases = [
    { name: 'timeout, deny', path: '/fd/slow', served: false },
    { name: 'timeout, allow', path: '/fa/slow', served: true },
    { name: '500, deny', path: '/fd/error', served: false },
    { name: '500, allow', path: '/fa/error', served: true },
    { name: 'not there, deny', path: '/gd/x', served: false },
    { name: 'not there, allow', path: '/ga/x', served: true },
  ] as const;
  for (const protocol of PROTOCOLS) {
    for (const c of cases) {
      const reqPath = `${c.path}-${protocol}`;
      const a = await request(p, protocol, { path: reqPath, headers: { authorization: 'Bearer x' } });
      if (c.served) t.same([a.status, a.body], [200, servedBody(reqPath)], `${protocol}, ${c.name}: forwarded, 200 from the backend (got ${shown(a)})`);
      else assertAuthAnswer(t, a, 'EDGE_AUTH_UNAVAILABLE', `${protocol}, ${c.name}`);
      if (c.path.endsWith('slow')) t.ok(a.ms < TIMEOUT + MARGIN, `${protocol}, ${c.name}: answered in ${a.ms.toFixed(0)} ms (timeout_ms ${TIMEOUT} + ${MARGIN})`);
    }
  }
  t.same(
    be.arrivals.map((a) => a.path),
    PROTOCOLS.flatMap((pr) => cases.filter((c) => c.served).map((c) => `${c.path}-${pr}`)),
    'the backend saw the requests failure_mode allow forwarded, none of the refused ones',
  );
  t.same(moved(await authCounters(p), before), { 'external timeout': 6, 'external error': 12 }, 'svc_external_auth_timeout +6 (2 modes × 3 protocols), svc_external_auth_error +12 (500 and not there), never counted allowed or denied');
  t.equal(authz.callsFor('/fd/slow').length + authz.callsFor('/fa/slow').length, 6, 'the service got every timed-out call');
});

t.test('JWT and external together: the JWT is checked first; a request it refuses never reaches the service; a valid token is then allowed or denied by it', async (t) => {
  const be = await controlledBackend(t, 'ext');
  const authz: AuthzServer = await authzServer(t);
  authz.decide = byPath;
  const rsa = await signingKey('RS256', 'rsa-1');
  const jwks = (await jwksServer(t, files.dir, 'idp-both')).serveKeys(rsa.publicJwk);
  const p = await startAuthProxy(t, files, 'ext-with-jwt', {
    upstream: `{ ${pool('both', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(jwks.url())}, ${external(authz.url, 'deny')} }`)} }`,
  });
  t.equal((await sourceUntil(p, jwks.url(), (s) => s.state === 'fresh'))?.state, 'fresh', 'the JWKS source is fresh');
  const before = await authCounters(p);
  for (const protocol of PROTOCOLS) {
    assertAuthAnswer(t, await request(p, protocol, { path: `/both/allow-missing-${protocol}` }), 'EDGE_AUTH_TOKEN_MISSING', `${protocol}: no token`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/both/allow-expired-${protocol}`, headers: bearer(await mint(rsa, { exp: Math.floor(Date.now() / 1000) - 300 })) }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}: an expired token`);
    const token = await mint(rsa);
    const ok = await request(p, protocol, { path: `/both/allow-${protocol}`, headers: bearer(token) });
    t.same([ok.status, ok.body], [200, servedBody(`/both/allow-${protocol}`)], `${protocol}: a valid token the service allows → 200 (got ${shown(ok)})`);
    const seen = authz.callsFor(`/both/allow-${protocol}`)[0]?.body['headers'] as Record<string, string> | undefined;
    t.equal(seen?.['authorization'], `Bearer ${token}`, `${protocol}: the service saw the validated token (authorization is allowlisted)`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/both/deny-${protocol}`, headers: bearer(await mint(rsa)) }), 'EDGE_AUTH_DENIED', `${protocol}: a valid token the service denies`);
  }
  t.same(authz.calls.map((c) => c.body['path']).sort(), PROTOCOLS.flatMap((pr) => [`/both/allow-${pr}`, `/both/deny-${pr}`]).sort(), 'the service was asked only about requests with a valid token');
  t.same(be.arrivals.map((a) => a.path), PROTOCOLS.map((pr) => `/both/allow-${pr}`), 'the backend saw the requests both allowed');
  t.same(moved(await authCounters(p), before), { 'failure missing_token': 3, 'failure token_expired': 3, 'external allowed': 3, 'external denied': 3 }, 'counters: 3 missing, 3 expired, 3 allowed, 3 denied');
});

t.test('an https authorization service is verified against the pool CA: trusted → decided by the service; a pool trusting another CA → an error, decided by failure_mode', async (t) => {
  const be = await controlledBackend(t, 'ext');
  const authz = await authzServer(t, { dir: files.dir, name: 'authz-tls' });
  authz.decide = byPath;
  const trusted = authz.tlsCa?.cert ?? '';
  const p = await startAuthProxy(t, files, 'ext-tls', {
    upstream: `{ ${[
      pool('ok', be.port, `tls: { ca_file: "${trusted}" }, auth: { ${external(authz.url, 'deny')} }`),
      pool('other', be.port, `tls: { ca_file: "${files.ca.cert}" }, auth: { ${external(authz.url, 'deny')} }`),
    ].join(', ')} }`,
  });
  const before = await authCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/ok/allow-${protocol}` });
    t.same([a.status, a.body], [200, servedBody(`/ok/allow-${protocol}`)], `${protocol}: trusted service allows → 200 (got ${shown(a)})`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/ok/deny-${protocol}` }), 'EDGE_AUTH_DENIED', `${protocol}: trusted service denies`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/other/allow-${protocol}` }), 'EDGE_AUTH_UNAVAILABLE', `${protocol}: a pool that does not trust the service's CA`);
  }
  t.same(authz.calls.map((c) => c.body['path']).sort(), PROTOCOLS.flatMap((pr) => [`/ok/allow-${pr}`, `/ok/deny-${pr}`]).sort(), 'the service was reached only through the pool that trusts it');
  t.same(moved(await authCounters(p), before), { 'external allowed': 3, 'external denied': 3, 'external error': 3 }, 'counters: 3 allowed, 3 denied, 3 errors (the untrusted certificate)');
});
