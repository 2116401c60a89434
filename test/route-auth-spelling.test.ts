// Authentication skipped by spelling (issue 38, finding 1), end to end: a real `edge-proxy serve`
// with 2 workers, JWT auth over a local JWKS (HTTPS under a private CA, test/support/idp.ts) on
// `/jwt`, external authorization (test/support/authz-service.ts) on `/ext`, and a public catch-all
// `/`, each pool a real backend that records what it receives. Every spelling a backend that
// ignores case (IIS, ASP.NET) or drops `;params` (Tomcat, Jetty, Spring) serves as the protected
// resource is sent over HTTP/1.1 (raw TLS socket, the target written verbatim), HTTP/2 (node:http2,
// `:path` verbatim) and HTTP/3 (Http3ClientSession): without a credential the proxy answers
// 401/403 and the catch-all's backend sees nothing; with one the protected backend serves it, with
// the normalized path as sent (case kept). Then `default_auth` ("protect everything but"): the
// catch-all protected, one route opted out with `auth: { public: true }`, one with its own auth,
// and an activation that closes the opted-out route live.
import t from 'tap';
import tls from 'node:tls';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { api } from './support/serve.ts';
import { connectH2, connectH3, pollUntil, snapshot } from './support/overload.ts';
import { authzServer } from './support/authz-service.ts';
import { assertAuthAnswer, bearer, jwksServer, jwtAuth, mint, pool, shown, signingKey, sourceUntil, startAuthProxy } from './support/idp.ts';
import type { Answer, Proxy, RequestOptions } from './support/overload.ts';
import type { AuthCode, AuthProxy } from './support/idp.ts';
import type { AuthzCall, AuthzDecision } from './support/authz-service.ts';
import type { Protocol } from './support/served-by.ts';
import type { Test } from 'tap';

const files = serviceFiles(t, 'edge-route-spelling-');

/** The one credential the authorization service accepts. */
const EXT_TOKEN = 'ext-allow-5d7e21';
function allowOnlyToken(call: AuthzCall): AuthzDecision {
  const headers = (call.body['headers'] ?? {}) as Record<string, string>;
  return { kind: 'status', status: headers['authorization'] === `Bearer ${EXT_TOKEN}` ? 200 : 403 };
}

// --- clients --------------------------------------------------------------------------------

/** One HTTP/1.1 request on its own raw TLS connection, the request target written as given. */
async function rawH1(p: Proxy, o: RequestOptions): Promise<Answer> {
  const t0 = performance.now();
  const s = tls.connect({ host: '127.0.0.1', port: p.lport, servername: 'localhost', ca: p.ca, ALPNProtocols: ['http/1.1'] });
  s.on('error', () => {});
  await once(s, 'secureConnect');
  const fields = Object.entries({ host: 'localhost', connection: 'close', ...o.headers }).map(([k, v]) => `${k}: ${v}\r\n`);
  s.write(`${o.method ?? 'GET'} ${o.path ?? '/'} HTTP/1.1\r\n${fields.join('')}\r\n`);
  const text = await new Promise<string>((resolve) => {
    let got = '';
    const timer = setTimeout(() => {
      s.destroy();
      resolve(got);
    }, 10_000);
    s.setEncoding('latin1');
    s.on('data', (d: string) => (got += d));
    s.once('close', () => {
      clearTimeout(timer);
      resolve(got);
    });
  });
  const end = text.indexOf('\r\n\r\n');
  const head = end === -1 ? text : text.slice(0, end);
  const [statusLine = '', ...lines] = head.split('\r\n');
  const headers: Record<string, string> = {};
  for (const l of lines) {
    const c = l.indexOf(':');
    if (c > 0) headers[l.slice(0, c).toLowerCase()] = l.slice(c + 1).trim();
  }
  let body = end === -1 ? '' : text.slice(end + 4);
  if (headers['transfer-encoding'] === 'chunked') body = unchunk(body);
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine)?.[1] ?? 0);
  return { status, headers, body, ms: performance.now() - t0, ...(status === 0 ? { error: `no response (${JSON.stringify(text.slice(0, 80))})` } : {}) };
}

/** A chunked body's data (RFC 9112 §7.1), enough for the proxy's and the backends' answers. */
function unchunk(body: string): string {
  let out = '';
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    if (eol === -1) return out;
    const size = parseInt(body.slice(at, eol), 16);
    if (!(size > 0)) return out;
    out += body.slice(eol + 2, eol + 2 + size);
    at = eol + 2 + size + 2;
  }
}

/** One client per protocol: raw TLS for HTTP/1.1 (a connection per request), one HTTP/2 and one HTTP/3 connection. */
async function clients(t: Test, p: Proxy): Promise<Record<Protocol, (o: RequestOptions) => Promise<Answer>>> {
  const h2 = await connectH2(t, p);
  const h3 = await connectH3(t, p);
  return { h1: (o) => rawH1(p, o), h2: (o) => h2.request(o), h3: (o) => h3.request(o) };
}

// --- the spellings --------------------------------------------------------------------------

interface Spelling {
  /** The request target as the client writes it. */
  readonly target: string;
  /** The pool it must reach (its authentication decides). */
  readonly pool: 'jwt' | 'ext';
  /** The path the protected backend receives: the normalized target, case and parameters kept. */
  readonly forwarded: string;
}

const SPELLINGS: readonly Spelling[] = [
  // The ones the pass reported.
  { target: '/jwt;a/x', pool: 'jwt', forwarded: '/jwt;a/x' },
  { target: '/JWT/x', pool: 'jwt', forwarded: '/JWT/x' },
  { target: '/Jwt/x', pool: 'jwt', forwarded: '/Jwt/x' },
  { target: '/jwt%3bx/x', pool: 'jwt', forwarded: '/jwt%3Bx/x' },
  { target: '/ext;x/forbidden', pool: 'ext', forwarded: '/ext;x/forbidden' },
  // More of the same family.
  { target: '/JWT%3Bx', pool: 'jwt', forwarded: '/JWT%3Bx' },
  { target: '/jwt;', pool: 'jwt', forwarded: '/jwt;' },
  { target: '/jwt./x', pool: 'jwt', forwarded: '/jwt./x' },
  { target: '/jwt%20/x', pool: 'jwt', forwarded: '/jwt%20/x' },
  { target: '/jwt::$DATA/x', pool: 'jwt', forwarded: '/jwt::$DATA/x' },
  { target: '/;x/jwt/x', pool: 'jwt', forwarded: '/;x/jwt/x' },
  { target: '//jwt/x', pool: 'jwt', forwarded: '/jwt/x' },
  { target: '/x/../JWT;v=1/x?q=1', pool: 'jwt', forwarded: '/JWT;v=1/x?q=1' },
  { target: '/%4Awt/x', pool: 'jwt', forwarded: '/Jwt/x' },
  { target: '/EXT/forbidden', pool: 'ext', forwarded: '/EXT/forbidden' },
  { target: '/Ext%3B/forbidden', pool: 'ext', forwarded: '/Ext%3B/forbidden' },
  { target: '/ext./forbidden', pool: 'ext', forwarded: '/ext./forbidden' },
];

/** Spellings the proxy refuses outright (400), with or without a credential: no backend sees them. */
const REFUSED: readonly string[] = ['/jwt%2F', '/jwt%2fx/y', '/JWT%5Cx', '/jwt/..;/x'];

const NO_CREDENTIAL: Readonly<Record<Spelling['pool'], AuthCode>> = { jwt: 'EDGE_AUTH_TOKEN_MISSING', ext: 'EDGE_AUTH_DENIED' };

t.test('every spelling of /jwt and /ext on h1, h2 and h3: 401/403 without a credential (the catch-all backend sees nothing), the protected backend with one', async (t) => {
  const [publicBe, jwtBe, extBe] = [await controlledBackend(t, 'public'), await controlledBackend(t, 'jwt'), await controlledBackend(t, 'ext')];
  const key = await signingKey('RS256', 'spelling-1');
  const jwks = (await jwksServer(t, files.dir, 'idp')).serveKeys(key.publicJwk);
  const authz = await authzServer(t);
  authz.decide = allowOnlyToken;
  const url = jwks.url('/jwks.json');
  const p = await startAuthProxy(t, files, 'spelling', {
    workers: 2,
    upstream: `{ public: { route: { path_prefix: / }, backends: [{ id: b-public, address: "127.0.0.1:${publicBe.port}" }] }, ${pool('jwt', jwtBe.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(url)} }`)}, ${pool('ext', extBe.port, `auth: { external: { url: "${authz.url}", timeout_ms: 2000 } }`)} }`,
  });
  t.ok(await sourceUntil(p, url, (s) => s.state === 'fresh'), 'the JWKS was fetched');
  const send = await clients(t, p);
  const token = await mint(key);
  const credential: Readonly<Record<Spelling['pool'], Record<string, string>>> = { jwt: bearer(token), ext: bearer(EXT_TOKEN) };

  // The layout works as intended before any trick: the catch-all is public, the pools are not.
  for (const protocol of PROTOCOLS) {
    const a = await send[protocol]({ path: '/public/page' });
    t.same([a.status, a.body], [200, 'public /public/page'], `${protocol}: the catch-all serves /public/page (got ${shown(a)})`);
  }
  const publicBefore = publicBe.arrivals.length;

  let refusedAnswers = 0;
  let served = 0;
  for (const protocol of PROTOCOLS) {
    for (const s of SPELLINGS) {
      const what = `${protocol} ${s.target}`;
      const jwtSeen = jwtBe.arrivals.length;
      const extSeen = extBe.arrivals.length;
      const bare = await send[protocol]({ path: s.target });
      assertAuthAnswer(t, bare, NO_CREDENTIAL[s.pool], `${what} without a credential`);
      if (bare.status === 401 || bare.status === 403) refusedAnswers++;
      t.equal(jwtBe.arrivals.length + extBe.arrivals.length, jwtSeen + extSeen, `${what} without a credential: no protected backend reached`);

      const ok = await send[protocol]({ path: s.target, headers: credential[s.pool] });
      t.same([ok.status, ok.body], [200, `${s.pool} ${s.forwarded}`], `${what} with a credential: the ${s.pool} backend serves it as ${s.forwarded} (got ${shown(ok)})`);
      const be = s.pool === 'jwt' ? jwtBe : extBe;
      t.equal(be.arrivals.at(-1)?.path, s.forwarded, `${what}: the backend got the normalized target, case and parameters kept`);
      if (ok.status === 200) served++;
    }
    for (const target of REFUSED) {
      for (const headers of [{}, credential.jwt]) {
        const a = await send[protocol]({ path: target, headers });
        t.equal(a.status, 400, `${protocol} ${target}${Object.keys(headers).length === 0 ? '' : ' with a token'}: 400 (got ${shown(a)})`);
      }
    }
  }
  t.equal(publicBe.arrivals.length, publicBefore, `the catch-all's backend saw none of the ${SPELLINGS.length * 2 * 3 + REFUSED.length * 2 * 3} requests (${publicBe.arrivals.map((a) => a.path).join(' ')})`);
  t.equal(refusedAnswers, SPELLINGS.length * 3, `${refusedAnswers} requests without a credential refused by the proxy`);
  t.equal(served, SPELLINGS.length * 3, `${served} requests with a credential served by the protected backend`);
  const asked = new Set(authz.calls.map((c) => String(c.body['path'])));
  t.same([...asked].sort(), [...new Set(SPELLINGS.filter((s) => s.pool === 'ext').map((s) => s.forwarded))].sort(), 'the authorization service was asked about every /ext spelling, as the backend sees it, and about nothing else');
  t.comment(`${SPELLINGS.length} spellings × 3 protocols: ${refusedAnswers} refused without a credential, ${served} served with one; ${REFUSED.length} × 2 × 3 refused with 400; catch-all arrivals during the run: ${publicBe.arrivals.length - publicBefore}`);
});

t.test('default_auth protects everything but: the catch-all needs a token, `auth: { public: true }` opts a route out, a pool with its own auth keeps it, and an activation closes the opt-out live', async (t) => {
  const [publicBe, healthBe, extBe] = [await controlledBackend(t, 'public'), await controlledBackend(t, 'health'), await controlledBackend(t, 'ext')];
  const key = await signingKey('ES256', 'default-1');
  const jwks = (await jwksServer(t, files.dir, 'idp-default')).serveKeys(key.publicJwk);
  const authz = await authzServer(t);
  authz.decide = allowOnlyToken;
  const url = jwks.url('/jwks.json');
  const ca = `tls: { ca_file: "${jwks.ca.cert}" }`;
  const upstream = (healthAuth: string): string =>
    `{ public: { route: { path_prefix: / }, backends: [{ id: b-public, address: "127.0.0.1:${publicBe.port}" }], ${ca} }, ${pool('health', healthBe.port, healthAuth === '' ? ca : `${ca}, ${healthAuth}`)}, ${pool('ext', extBe.port, `auth: { external: { url: "${authz.url}", timeout_ms: 2000 } }`)} }`;
  const p: AuthProxy = await startAuthProxy(t, files, 'default-auth', { workers: 2, role: 'operator', upstream: upstream('auth: { public: true }'), extra: `default_auth: { ${jwtAuth(url)} }` });
  t.ok(await sourceUntil(p, url, (s) => s.state === 'fresh'), 'the JWKS of default_auth was fetched');
  const send = await clients(t, p);
  const token = bearer(await mint(key));

  for (const protocol of PROTOCOLS) {
    assertAuthAnswer(t, await send[protocol]({ path: '/anything' }), 'EDGE_AUTH_TOKEN_MISSING', `${protocol} /anything without a token (catch-all under default_auth)`);
    assertAuthAnswer(t, await send[protocol]({ path: '/' }), 'EDGE_AUTH_TOKEN_MISSING', `${protocol} / without a token`);
    assertAuthAnswer(t, await send[protocol]({ path: '/anything', headers: bearer('not-a-jwt') }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol} /anything with a bad token`);
    let a = await send[protocol]({ path: '/anything', headers: token });
    t.same([a.status, a.body], [200, 'public /anything'], `${protocol} /anything with a token: the catch-all (got ${shown(a)})`);
    a = await send[protocol]({ path: '/health/live' });
    t.same([a.status, a.body], [200, 'health /health/live'], `${protocol} /health/live without a token: opted out (got ${shown(a)})`);
    a = await send[protocol]({ path: '/HEALTH;x/live' });
    t.same([a.status, a.body], [200, 'health /HEALTH;x/live'], `${protocol} /HEALTH;x/live: the same opted-out route (got ${shown(a)})`);
    // `ext` has its own auth, which replaces the default as a whole: no JWT asked, the service decides.
    assertAuthAnswer(t, await send[protocol]({ path: '/ext/x', headers: token }), 'EDGE_AUTH_DENIED', `${protocol} /ext/x with only the JWT: its own check (the service) refuses`);
    a = await send[protocol]({ path: '/ext/x', headers: bearer(EXT_TOKEN) });
    t.same([a.status, a.body], [200, 'ext /ext/x'], `${protocol} /ext/x with the service's credential and no JWT: served (got ${shown(a)})`);
  }
  t.equal(publicBe.arrivals.length, 3, `the catch-all's backend saw only the 3 requests with a token (${publicBe.arrivals.map((x) => x.path).join(' ')})`);
  t.equal(extBe.arrivals.length, 3, 'the ext backend saw only the 3 requests the service allowed');

  // Live: the opt-out removed, /health falls under default_auth on the next request.
  const file = path.join(files.dir, 'default-auth-2.yaml');
  writeFileSync(file, p.configText.replace(upstream('auth: { public: true }'), upstream('')));
  const r = await api(p.cport, p.ca, 'POST', '/admin/runtime/activate', { token: p.token }, { config_path: file, expected_generation: 1, reason: 'close /health' });
  t.match(r, { status: 202, body: { generation: 2 } }, `activated as generation 2 (${JSON.stringify(r.body).slice(0, 200)})`);
  const onTwo = (s: Record<string, unknown>): boolean => {
    const list = ((s['workers'] as { list?: { generation?: number }[] } | undefined)?.list ?? []);
    return list.length === 2 && list.every((w) => w.generation === 2);
  };
  t.ok(onTwo(await pollUntil(() => snapshot(p), onTwo, 10_000)), 'both workers serve generation 2');
  const healthBefore = healthBe.arrivals.length;
  for (const protocol of PROTOCOLS) {
    // Each protocol on a new connection: both workers take part in the answer.
    const fresh = await clients(t, p);
    assertAuthAnswer(t, await fresh[protocol]({ path: '/health/live' }), 'EDGE_AUTH_TOKEN_MISSING', `${protocol} /health/live without a token after the activation`);
    const a = await fresh[protocol]({ path: '/health/live', headers: token });
    t.same([a.status, a.body], [200, 'health /health/live'], `${protocol} /health/live with a token after the activation (got ${shown(a)})`);
  }
  t.equal(healthBe.arrivals.length, healthBefore + 3, 'after the activation the health backend saw only the requests with a token');
});
