// JWT validation against a JWKS end to end (issue 16, "Must show"): a real `edge-proxy serve`, a
// real JWKS endpoint over HTTPS under a private CA (the pool's `tls.ca_file`) whose answers the
// test switches, tokens signed in the test (test/support/idp.ts), a real backend, clients over
// HTTP/1.1, HTTP/2 and HTTP/3. This file: every kind of token (valid, expired, not yet valid,
// wrong issuer, wrong audience, `alg: none`, HS256 signed with the RSA public key, tampered,
// missing) with its answer, reason counter and the backend never reached, and the JWKS URL's
// credentials and query nowhere in logs, metrics or the snapshot; HS256 with a secret from
// `secret_ref` in a custom header, where RS256 is refused; an activation switching JWKS source
// (the new one fetched, the old one gone) or keeping it (no refetch); one fetch per node with two
// workers, a flood of 50 unknown kids costing the endpoint one fetch, a re-forked worker handed
// the keys without a fetch; key rotation picked up
// through the unknown-kid refresh; the endpoint failing after a good fetch (500, timeout, garbage,
// no usable key, a private key published) → `refresh_failed_retained` / `quarantined_retained`
// then `stale`, the retained keys still validating; requests waiting in `never_fetched` for the
// first fetch; never fetched and failing → `empty_unusable` and `key_source_unavailable`. External authorization: auth-external-e2e.test.ts.
import t from 'tap';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { SignJWT } from 'jose';
import { setTimeout as sleep } from 'node:timers/promises';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { activate as activateGeneration, pollUntil, request, send, snapshot } from './support/overload.ts';
import { scrape } from './support/exposition.ts';
import { connectionsOnEveryWorker, statuses } from './support/limits.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import {
  AUDIENCE,
  ISSUER,
  SUBJECT,
  assertAuthAnswer,
  authCounters,
  bearer,
  goodClaims,
  hs256WithPublicKey,
  jwksGauges,
  jwksServer,
  jwksSource,
  jwksSources,
  jwtAuth,
  leaked,
  loggedTransitions,
  mint,
  moved,
  pool,
  privateJwk,
  shown,
  signingKey,
  sourceUntil,
  startAuthProxy,
  tampered,
  unsignedToken,
} from './support/idp.ts';
import type { AuthCode, AuthProxy, JwksServer, SigningKey } from './support/idp.ts';
import type { Protocol } from './support/served-by.ts';
import type { Test } from 'tap';

const files = serviceFiles(t, 'edge-auth-jwt-');
const now = (): number => Math.floor(Date.now() / 1000);
const ID = /^jwks-[0-9a-f]{12}$/;

/** A token that must be served by the backend (every backend of this file is named `api`): a 200 with its body for `path`. */
async function assertServed(t: Test, p: AuthProxy, protocol: Protocol, reqPath: string, token: string, what: string): Promise<void> {
  await assertServedWith(t, p, protocol, reqPath, bearer(token), what);
}

/** A request with `headers` that must be served by the backend. */
async function assertServedWith(t: Test, p: AuthProxy, protocol: Protocol, reqPath: string, headers: Record<string, string>, what: string): Promise<void> {
  const a = await request(p, protocol, { path: reqPath, headers });
  t.same([a.status, a.body], [200, `api ${reqPath}`], `${what} (${protocol}): 200 from the backend (got ${shown(a)})`);
}

/**
 * Waits until the proxy's unknown-kid cooldown for `endpoint` is over, so a refresh asked for now
 * is due, not suppressed. The proxy counts it from the *end* of its last completed fetch, which
 * the snapshot gives (`last_refresh_success_unix_ms`: every fetch in this file succeeds), not from
 * when the endpoint saw the request: on a loaded machine the fetch's TLS handshake and the key
 * import took more than the 50-ms margin once, and the first rotation's token met the cooldown
 * (401). A fetch still in flight (its attempt later than the last success) is waited for first.
 */
async function pastCooldown(jwks: JwksServer, p: AuthProxy, endpoint: string, cooldownMs: number): Promise<void> {
  const settled = await pollUntil(
    () => jwksSource(p, endpoint),
    (s) => s !== undefined && (s.last_refresh_attempt_unix_ms ?? 0) <= (s.last_refresh_success_unix_ms ?? 0),
    10_000,
  );
  const last = Math.max(jwks.fetches.at(-1)?.at ?? 0, settled?.last_refresh_success_unix_ms ?? 0);
  const wait = last + cooldownMs + 50 - Date.now();
  if (wait > 0) await sleep(wait); // the cooldown is a span of time, not an event
}

t.test('every kind of token over h1, h2 and h3: the answer, the reason counted, the backend reached only by the valid ones; the JWKS URL credentials and query, the tokens and the claims appear in no log, metric or snapshot', async (t) => {
  const be = await controlledBackend(t, 'api');
  const rsa = await signingKey('RS256', 'rsa-1');
  const ec = await signingKey('ES256', 'ec-1');
  /** Another key published under the same kid as `rsa`: its signatures must not verify. */
  const impostor = await signingKey('RS256', 'rsa-1');
  const jwks = (await jwksServer(t, files.dir, 'idp')).serveKeys(rsa.publicJwk, ec.publicJwk);
  const secrets = { 'URL user': 'jwks-user-5e0b', 'URL password': 'jwks-PASSWORD-7f3a', 'URL query secret': 'QUERY-SECRET-91c2' };
  const url = jwks.url('/jwks.json', { userinfo: `${secrets['URL user']}:${secrets['URL password']}`, query: `token=${secrets['URL query secret']}` });
  const endpoint = jwks.url('/jwks.json');
  const started = Date.now();
  const p = await startAuthProxy(t, files, 'jwt-cases', {
    upstream: `{ ${pool('api', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(url, { jwks: 'timeout_ms: 2000, unknown_kid_cooldown_ms: 60000' })} }`)} }`,
  });
  const source = await sourceUntil(p, endpoint, (s) => s.state === 'fresh');
  t.match(source, { state: 'fresh', active_keys: 2, consecutive_failures: 0, last_failure_reason: null, refresh_success_total: 1, refresh_failure_total: 0 }, `snapshot: the source is fresh with the 2 published keys (${JSON.stringify(source)})`);
  const id = source?.jwks_source_id ?? '';
  t.match(id, ID, `jwks_source_id ${id} is opaque (jwks- and 12 hex digits)`);
  t.ok((source?.last_refresh_success_unix_ms ?? 0) >= started && (source?.last_refresh_success_unix_ms ?? 0) <= Date.now(), 'last_refresh_success_unix_ms: during this test');
  t.equal(jwks.fetches.length, 1, 'the endpoint was fetched once');
  t.equal(jwks.fetches[0]?.url, `/jwks.json?token=${secrets['URL query secret']}`, 'the fetch carried the configured path and query');
  t.match(String(jwks.fetches[0]?.headers.accept), /application\/json/, `the fetch asked for JSON (accept: ${jwks.fetches[0]?.headers.accept})`);
  t.comment(`the fetch's authorization header: ${jwks.fetches[0]?.headers.authorization === undefined ? 'none (URL user info not sent)' : 'present (URL user info sent as credentials)'}`);

  interface Case {
    readonly name: string;
    readonly headers: () => Promise<Record<string, string>>;
    readonly expect: 200 | AuthCode;
    readonly reason?: string;
    readonly algorithm?: string;
  }
  const cases: readonly Case[] = [
    { name: 'valid RS256', headers: async () => bearer(await mint(rsa)), expect: 200 },
    { name: 'valid ES256', headers: async () => bearer(await mint(ec)), expect: 200 },
    { name: 'expired 10 s ago, within the 30 s clock skew', headers: async () => bearer(await mint(rsa, { exp: now() - 10 })), expect: 200 },
    { name: 'not before 10 s from now, within the clock skew', headers: async () => bearer(await mint(ec, { nbf: now() + 10 })), expect: 200 },
    { name: 'scheme written in lower case (RFC 9110 §11.1: case-insensitive)', headers: async () => ({ authorization: `bearer ${await mint(rsa)}` }), expect: 200 },
    { name: 'no authorization header', headers: async () => ({}), expect: 'EDGE_AUTH_TOKEN_MISSING', reason: 'missing_token' },
    { name: 'another scheme (Basic): no bearer token', headers: async () => ({ authorization: `Basic ${Buffer.from('user:pass').toString('base64')}` }), expect: 'EDGE_AUTH_TOKEN_MISSING', reason: 'missing_token' },
    { name: 'not a JWT', headers: async () => bearer('not-a-jwt'), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'malformed_token' },
    { name: 'expired 2 min ago', headers: async () => bearer(await mint(rsa, { exp: now() - 120, iat: now() - 720 })), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'token_expired' },
    { name: 'not before 2 min from now', headers: async () => bearer(await mint(rsa, { nbf: now() + 120 })), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'token_not_yet_valid' },
    { name: 'wrong issuer', headers: async () => bearer(await mint(rsa, { iss: 'https://evil.test/' })), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'issuer_mismatch' },
    { name: 'wrong audience', headers: async () => bearer(await mint(ec, { aud: 'other-api' })), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'audience_mismatch' },
    { name: 'alg: none', headers: async () => bearer(unsignedToken({}, rsa.kid)), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'algorithm_not_allowed', algorithm: 'none' },
    { name: 'HS256 signed with the RSA public key (kid of the RSA key)', headers: async () => bearer(hs256WithPublicKey(rsa)), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'algorithm_not_allowed', algorithm: 'HS256' },
    { name: 'payload changed after signing', headers: async () => bearer(tampered(await mint(rsa))), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'invalid_signature' },
    { name: 'signed by another key under the published kid', headers: async () => bearer(await mint(impostor)), expect: 'EDGE_AUTH_TOKEN_INVALID', reason: 'invalid_signature' },
  ];
  const before = await authCounters(p);
  const sentTokens: string[] = [];
  for (const protocol of PROTOCOLS) {
    for (const [i, c] of cases.entries()) {
      const reqPath = `/api/${protocol}/${i}`;
      const headers = await c.headers();
      if (headers['authorization']?.toLowerCase().startsWith('bearer ') === true) sentTokens.push(headers['authorization'].slice('Bearer '.length));
      const a = await request(p, protocol, { path: reqPath, headers });
      if (c.expect === 200) t.same([a.status, a.body], [200, `api ${reqPath}`], `${protocol}, ${c.name}: 200 from the backend (got ${shown(a)})`);
      else assertAuthAnswer(t, a, c.expect, `${protocol}, ${c.name}`);
    }
  }
  const servedIndexes = cases.flatMap((c, i) => (c.expect === 200 ? [i] : []));
  t.same(
    be.arrivalsUnder('/api/').map((a) => a.path),
    PROTOCOLS.flatMap((protocol) => servedIndexes.map((i) => `/api/${protocol}/${i}`)),
    'the backend saw exactly the accepted requests: no rejected request reached it',
  );
  const expected: Record<string, number> = {};
  for (const c of cases) {
    if (c.reason !== undefined) expected[`failure ${c.reason}`] = (expected[`failure ${c.reason}`] ?? 0) + PROTOCOLS.length;
    if (c.algorithm !== undefined) expected[`algorithm ${c.algorithm}`] = (expected[`algorithm ${c.algorithm}`] ?? 0) + PROTOCOLS.length;
  }
  t.same(moved(await authCounters(p), before), expected, 'svc_jwt_validation_failures_total{reason} and svc_jwt_algorithm_rejections_total{algorithm}: one per rejection, by its reason');
  t.equal(jwks.fetches.length, 1, 'no refresh was asked for: every kid was known');

  const gauges = await jwksGauges(p, id);
  t.same(gauges.states, { never_fetched: 0, fresh: 1, stale: 0, refresh_failed_retained: 0, quarantined_retained: 0, empty_unusable: 0 }, 'svc_jwks_state: 1 on fresh, 0 on the five others');
  t.equal(gauges.activeKeys, 2, 'svc_jwks_active_keys 2');
  t.ok(gauges.ageSeconds !== undefined && gauges.ageSeconds >= 0 && gauges.ageSeconds < 120, `svc_jwks_age_seconds ${gauges.ageSeconds}`);
  t.ok(gauges.lastSuccess !== undefined && Math.abs(gauges.lastSuccess - (source?.last_refresh_success_unix_ms ?? 0) / 1000) < 2, `svc_jwks_last_refresh_success_seconds ${gauges.lastSuccess}: the snapshot's time`);
  // The attempt is stamped when the fetch starts, the success when it ends: at most timeout_ms apart.
  const attemptMs = source?.last_refresh_attempt_unix_ms ?? 0;
  const successMs = source?.last_refresh_success_unix_ms ?? 0;
  t.ok(attemptMs <= successMs && successMs - attemptMs <= 2000, `snapshot: the last attempt (${attemptMs}) started the last success (${successMs}), within timeout_ms`);
  t.ok(gauges.lastAttempt !== undefined && Math.abs(gauges.lastAttempt - attemptMs / 1000) < 2, `svc_jwks_last_refresh_attempt_seconds ${gauges.lastAttempt}: the snapshot's time`);

  const metrics = await scrape(p.mport);
  const snap = JSON.stringify(await snapshot(p));
  const logs = p.served.text();
  const everything = { ...secrets, 'the configured URL': url, 'the claims (sub)': SUBJECT, ...Object.fromEntries(sentTokens.map((tok, i) => [`token #${i}`, tok])) };
  t.same(leaked(logs, { ...everything, 'the endpoint, even sanitized': endpoint }), [], `the log (${p.served.lines.length} lines) holds no URL of the source (not even sanitized), no token, no claim`);
  t.same(leaked(metrics, { ...everything, 'the endpoint': endpoint, 'the endpoint path': '/jwks.json' }), [], 'the metrics hold no URL, not even sanitized, no token, no claim');
  t.same(leaked(snap, everything), [], 'the snapshot holds none of the URL credentials or query, no token, no claim');
  const sources = await jwksSources(p);
  t.same(sources.map((s) => [s.jwks_source_id, s.jwks_endpoint]), [[id, endpoint]], `snapshot jwks.sources[]: one source, its endpoint sanitized to ${endpoint}`);

  // An upload without a token is refused from its head: the answer does not wait for the body, which never reaches the backend.
  const body = Buffer.alloc(256 * 1024, 'u');
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/api/upload-${protocol}`, method: 'POST', body, timeoutMs: 10_000 });
    assertAuthAnswer(t, a, 'EDGE_AUTH_TOKEN_MISSING', `${protocol}: a 256 KiB POST without a token`);
  }
  t.equal(be.arrivalsUnder('/api/upload-').length, 0, 'no upload reached the backend');
  await assertServed(t, p, 'h1', '/api/after-uploads', await mint(rsa), 'after the refused uploads');
});

t.test('two workers: one JWKS fetch at start for the node; a flood of 50 unknown kids on both workers costs the endpoint one fetch within the cooldown; a re-forked worker validates with no fetch', async (t) => {
  const COOLDOWN = 3000;
  const be = await controlledBackend(t, 'api');
  be.set({ kind: 'hold' }, '/probe');
  const rsa = await signingKey('RS256', 'rsa-1');
  const stranger = await signingKey('RS256', 'unpublished');
  const jwks = (await jwksServer(t, files.dir, 'idp-two')).serveKeys(rsa.publicJwk);
  const endpoint = jwks.url();
  const p = await startAuthProxy(t, files, 'jwt-two-workers', {
    workers: 2,
    upstream: `{ ${pool('api', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(endpoint, { jwks: `refresh_interval_ms: 300000, unknown_kid_cooldown_ms: ${COOLDOWN}` })} }`)}, ${pool('probe', be.port)} }`,
  });
  const fresh = await sourceUntil(p, endpoint, (s) => s.state === 'fresh');
  t.equal(fresh?.state, 'fresh', 'the source is fresh');
  const id = fresh?.jwks_source_id ?? '';
  // One HTTP/2 connection on each worker, so each worker is known to validate.
  const conns = await connectionsOnEveryWorker(t, p, be, '/probe', 2, 1);
  for (const c of conns) {
    const a = await c.request({ path: `/api/worker-${c.worker}`, headers: bearer(await mint(rsa)) });
    t.same([a.status, a.body], [200, `api /api/worker-${c.worker}`], `worker ${c.worker}: a valid token served (got ${shown(a)})`);
  }
  t.equal(jwks.fetches.length, 1, 'both workers validate, and the endpoint was fetched once for the node, not once per worker');

  await pastCooldown(jwks, p, endpoint, COOLDOWN);
  const before = await authCounters(p);
  const fetchesBefore = jwks.fetches.length;
  const t0 = Date.now();
  const flood = await Promise.all(
    Array.from({ length: 50 }, async (_, i) => {
      const c = conns[i % conns.length] as (typeof conns)[number];
      return c.request({ path: `/api/flood-${i}`, headers: bearer(await mint(stranger, {}, `kid-${randomUUID()}`)) });
    }),
  );
  const elapsed = Date.now() - t0;
  t.same(statuses(flood), { 401: 50 }, `the 50 unknown kids: 50 × 401 (${elapsed} ms)`);
  for (const a of flood.slice(0, 2)) assertAuthAnswer(t, a, 'EDGE_AUTH_TOKEN_INVALID', 'an unknown kid');
  const fetched = jwks.fetches.length - fetchesBefore;
  // Within one cooldown the node fetches at most once; a flood outlasting it may start one more per cooldown.
  const allowed = 1 + Math.floor(elapsed / COOLDOWN);
  t.ok(fetched >= 1 && fetched <= allowed, `the flood asked for a refresh and cost the endpoint ${fetched} fetch(es) (at most ${allowed} in ${elapsed} ms with a ${COOLDOWN} ms cooldown)`);
  t.same(moved(await authCounters(p), before), { [`unknown_kid ${id}`]: 50, 'failure missing_verification_key': 50, [`refresh_success ${id}`]: fetched }, 'svc_jwks_unknown_kid_total +50, missing_verification_key +50, one refresh counted per fetch');
  t.equal(be.arrivalsUnder('/api/flood-').length, 0, 'no flood request reached the backend');

  // Still inside the cooldown of that refresh: an unknown kid over each protocol costs nothing more.
  const inside = jwks.fetches.length;
  const sinceLast = Date.now() - (jwks.fetches.at(-1)?.at ?? 0);
  for (const protocol of PROTOCOLS) assertAuthAnswer(t, await request(p, protocol, { path: `/api/unknown-${protocol}`, headers: bearer(await mint(stranger, {}, `kid-${randomUUID()}`)) }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}: an unknown kid`);
  if (Date.now() - (jwks.fetches.at(-1)?.at ?? 0) < COOLDOWN) t.equal(jwks.fetches.length, inside, `within the cooldown (${sinceLast} ms after the last fetch): no new fetch`);
  else t.comment('the three requests outlasted the cooldown: the no-fetch check is skipped');

  // A worker killed is re-forked and handed the node's keys at its start: past the cooldown, a
  // worker without keys would ask for a refresh and the endpoint would see a fetch.
  await pastCooldown(jwks, p, endpoint, COOLDOWN);
  interface Workers {
    readonly list: ReadonlyArray<{ readonly index: number; readonly pid: number; readonly listening: boolean; readonly state: string }>;
  }
  const workers = async (): Promise<Workers> => (await snapshot(p))['workers'] as Workers;
  const victim = (await workers()).list[0] as Workers['list'][number];
  const fetchesBeforeKill = jwks.fetches.length;
  process.kill(victim.pid, 'SIGKILL');
  const reforked = await pollUntil(workers, (w) => w.list.length === 2 && w.list.every((x) => x.pid !== victim.pid && x.listening), 20_000, 100);
  t.ok(reforked.list.every((x) => x.pid !== victim.pid && x.listening), `worker ${victim.index} (pid ${victim.pid}) re-forked and listening (${JSON.stringify(reforked.list.map((x) => [x.index, x.pid, x.state]))})`);
  const again = await connectionsOnEveryWorker(t, p, be, '/probe/again', 2, 1);
  for (const c of again) {
    const a = await c.request({ path: `/api/after-refork-${c.worker}`, headers: bearer(await mint(rsa)) });
    t.same([a.status, a.body], [200, `api /api/after-refork-${c.worker}`], `after the re-fork, worker ${c.worker}: a valid token served (got ${shown(a)})`);
  }
  t.equal(jwks.fetches.length, fetchesBeforeKill, 'the re-forked worker validated with the keys the supervisor handed it: no fetch');
});

t.test('HS256 with a secret from secret_ref, the token in a custom header (bare or Bearer), over h1, h2 and h3: accepted; signed with another secret → invalid_signature; an RS256 token → algorithm_not_allowed; a cached token refused past its exp; the secret in no log', async (t) => {
  const be = await controlledBackend(t, 'api');
  const SECRET = 'hmac-SECRET-a4d1c07e-0123456789abcdef';
  const secretFile = path.join(files.dir, 'jwt-hmac.secret');
  writeFileSync(secretFile, SECRET, { mode: 0o600 });
  const rsa = await signingKey('RS256', 'rsa-1');
  const p = await startAuthProxy(t, files, 'jwt-hmac', {
    upstream: `{ ${pool('api', be.port, `auth: { jwt: { issuer: "${ISSUER}", audiences: [${AUDIENCE}], algorithms: [HS256], secret_ref: { ref: "file://${secretFile}" }, header: x-token, clock_skew_ms: 0 } }`)} }`,
  });
  const hs = (secret: string, claims = {}): Promise<string> => new SignJWT(goodClaims(claims)).setProtectedHeader({ alg: 'HS256', typ: 'JWT' }).sign(new TextEncoder().encode(secret));
  const before = await authCounters(p);
  for (const protocol of PROTOCOLS) {
    await assertServedWith(t, p, protocol, `/api/bare-${protocol}`, { 'x-token': await hs(SECRET) }, 'HS256, the bare token in x-token');
    await assertServedWith(t, p, protocol, `/api/bearer-${protocol}`, { 'x-token': `Bearer ${await hs(SECRET)}` }, 'HS256, Bearer in x-token');
    assertAuthAnswer(t, await request(p, protocol, { path: `/api/authorization-${protocol}`, headers: bearer(await hs(SECRET)) }), 'EDGE_AUTH_TOKEN_MISSING', `${protocol}: the token in authorization, not in the configured header`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/api/other-secret-${protocol}`, headers: { 'x-token': await hs('another-secret-0123456789abcdef') } }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}: HS256 with another secret`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/api/rs256-${protocol}`, headers: { 'x-token': await mint(rsa) } }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}: an RS256 token where only HS256 is allowed`);
  }
  t.same(moved(await authCounters(p), before), { 'failure missing_token': 3, 'failure invalid_signature': 3, 'failure algorithm_not_allowed': 3, 'algorithm RS256': 3 }, 'counted: 3 missing, 3 invalid signatures, 3 RS256 refused by the allowlist');
  t.same(be.arrivalsUnder('/api/').map((a) => a.path), PROTOCOLS.flatMap((pr) => [`/api/bare-${pr}`, `/api/bearer-${pr}`]), 'the backend saw the accepted requests only');
  // A verified token is remembered (verification_cache_entries, default 10000) but not past its exp.
  const exp = now() + 3;
  const shortLived = await hs(SECRET, { exp });
  await assertServedWith(t, p, 'h1', '/api/short-lived', { 'x-token': shortLived }, 'a token expiring in 2 to 3 s');
  await assertServedWith(t, p, 'h1', '/api/short-lived-again', { 'x-token': shortLived }, 'the same token again (from the cache)');
  await sleep(exp * 1000 + 200 - Date.now()); // its exp is a time, not an event
  const before2 = await authCounters(p);
  assertAuthAnswer(t, await request(p, 'h1', { path: '/api/short-lived-expired', headers: { 'x-token': shortLived } }), 'EDGE_AUTH_TOKEN_INVALID', 'the same token past its exp (clock_skew_ms 0)');
  t.same(moved(await authCounters(p), before2), { 'failure token_expired': 1 }, 'counted token_expired: no cached verification outlives exp');
  t.same(leaked(p.served.text(), { 'the HMAC secret': SECRET }), [], 'the log holds no HMAC secret');
  t.same(leaked(JSON.stringify(await snapshot(p)), { 'the HMAC secret': SECRET }), [], 'the snapshot holds no HMAC secret');
  t.same(await jwksSources(p), [], 'no JWKS source: jwks.sources[] is empty');
});

t.test('key rotation: the endpoint switches to a set with a new kid; a token with it is accepted at its first request (the unknown-kid refresh), over h1, h2 and h3; the old kid is refused', async (t) => {
  const COOLDOWN = 200;
  const be = await controlledBackend(t, 'api');
  const first = await signingKey('RS256', 'key-0');
  const jwks = (await jwksServer(t, files.dir, 'idp-rotate')).serveKeys(first.publicJwk);
  const endpoint = jwks.url();
  const p = await startAuthProxy(t, files, 'jwt-rotation', {
    upstream: `{ ${pool('api', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(endpoint, { jwks: `refresh_interval_ms: 300000, unknown_kid_cooldown_ms: ${COOLDOWN}` })} }`)} }`,
  });
  t.equal((await sourceUntil(p, endpoint, (s) => s.state === 'fresh'))?.state, 'fresh', 'fresh with key-0');
  const old = await mint(first);
  await assertServed(t, p, 'h1', '/api/old', old, 'a key-0 token before the rotation');

  let previous: SigningKey = first;
  for (const [n, protocol] of PROTOCOLS.entries()) {
    const next = await signingKey(n % 2 === 0 ? 'ES256' : 'RS256', `key-${n + 1}`);
    jwks.serveKeys(next.publicJwk);
    await pastCooldown(jwks, p, endpoint, COOLDOWN);
    const fetches = jwks.fetches.length;
    await assertServed(t, p, protocol, `/api/rotated-${n + 1}`, await mint(next), `the first ${next.kid} token right after the rotation`);
    t.equal(jwks.fetches.length - fetches, 1, `${protocol}: one fetch brought ${next.kid}`);
    assertAuthAnswer(t, await request(p, protocol, { path: `/api/previous-${n}`, headers: bearer(await mint(previous)) }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}: a new token with the rotated-out ${previous.kid}`);
    previous = next;
  }
  // The very token accepted before: its verification may be cached, but under keys that are gone.
  assertAuthAnswer(t, await request(p, 'h2', { path: '/api/old-again', headers: bearer(old) }), 'EDGE_AUTH_TOKEN_INVALID', 'the key-0 token accepted before the rotations (no cached verification outlives its key)');
  t.same(be.arrivalsUnder('/api/').map((a) => a.path), ['/api/old', '/api/rotated-1', '/api/rotated-2', '/api/rotated-3'], 'the backend saw the accepted requests only');
  const s = await jwksSources(p);
  t.match(s, [{ jwks_endpoint: endpoint, state: 'fresh', active_keys: 1, refresh_failure_total: 0 }], 'snapshot: fresh, one key (the latest set)');
  t.ok((s[0]?.refresh_success_total ?? 0) >= 4, `snapshot: refresh_success_total ${s[0]?.refresh_success_total} (the first fetch and one per rotation, plus any refresh the rotated-out kids asked for)`);
});

t.test('activation: a configuration naming another JWKS URL → the new source fetched once and validating on h1, h2 and h3, the old one gone from the snapshot and svc_jwks_state; an activation keeping the source does not fetch it again', async (t) => {
  const be = await controlledBackend(t, 'api');
  const keyA = await signingKey('RS256', 'idp-a-key');
  const keyB = await signingKey('ES256', 'idp-b-key');
  const idpA = (await jwksServer(t, files.dir, 'idp-a')).serveKeys(keyA.publicJwk);
  const idpB = (await jwksServer(t, files.dir, 'idp-b')).serveKeys(keyB.publicJwk);
  const upstream = (idp: JwksServer, skew = 30000): string =>
    `{ ${pool('api', be.port, `tls: { ca_file: "${idp.ca.cert}" }, auth: { ${jwtAuth(idp.url(), { jwks: 'refresh_interval_ms: 300000', clockSkewMs: skew })} }`)} }`;
  const p = await startAuthProxy(t, files, 'jwt-activation', { role: 'operator', upstream: upstream(idpA) });
  const a = await sourceUntil(p, idpA.url(), (s) => s.state === 'fresh');
  t.equal(a?.state, 'fresh', 'generation 1: source A fresh');
  await assertServed(t, p, 'h1', '/api/gen1-a', await mint(keyA), 'generation 1: a token of IdP A');

  const activate = (name: string, text: string, generation: number): Promise<void> => activateGeneration(t, p, name, text, generation);
  await activate('jwt-activation-b', p.configText.replace(/upstream: .*\n/, `upstream: ${upstream(idpB)}\n`), 2);
  const b = await sourceUntil(p, idpB.url(), (s) => s.state === 'fresh');
  t.equal(b?.state, 'fresh', 'generation 2: source B fresh');
  const sources = await pollUntil(() => jwksSources(p), (l) => l.length === 1, 5000);
  t.same(sources.map((s) => s.jwks_endpoint), [idpB.url()], 'snapshot: only source B');
  // Workers may take the new generation a moment after the supervisor: wait for B's token to pass once.
  const bToken = await mint(keyB);
  await pollUntil(() => request(p, 'h1', { path: '/api/gen2-wait', headers: bearer(bToken) }), (x) => x.status === 200, 10_000, 100);
  for (const protocol of PROTOCOLS) {
    await assertServed(t, p, protocol, `/api/gen2-b-${protocol}`, await mint(keyB), 'generation 2: a token of IdP B');
    assertAuthAnswer(t, await request(p, protocol, { path: `/api/gen2-a-${protocol}`, headers: bearer(await mint(keyA)) }), 'EDGE_AUTH_TOKEN_INVALID', `${protocol}, generation 2: a token of IdP A`);
  }
  t.same((await jwksGauges(p, a?.jwks_source_id ?? '')).states, {}, 'svc_jwks_state: no series left for source A');
  t.equal((await jwksGauges(p, b?.jwks_source_id ?? '')).state, 'fresh', 'svc_jwks_state: 1 on fresh for source B');
  const fetchesA = idpA.fetches.length;
  const fetchesB = idpB.fetches.length;

  // The same source, another clock skew: the source is kept as it is.
  await activate('jwt-activation-b2', p.configText.replace(/upstream: .*\n/, `upstream: ${upstream(idpB, 5000)}\n`), 3);
  await assertServed(t, p, 'h2', '/api/gen3-b', await mint(keyB), 'generation 3: a token of IdP B');
  const kept = await jwksSources(p);
  t.match(kept, [{ jwks_source_id: b?.jwks_source_id, state: 'fresh', refresh_success_total: b?.refresh_success_total }], 'generation 3: source B kept (same id, state, refresh count)');
  t.equal(idpB.fetches.length, fetchesB, 'generation 3: B not fetched again');
  t.equal(idpA.fetches.length, fetchesA, 'A not fetched since it was left');
});

/** The keys' sources of a failing-endpoint test: a pool `api` validating with `jwks` at `endpoint`, no verification cache (every request verifies against the keys held now). */
async function failingSetup(t: Test, name: string, jwksFields: string): Promise<{ p: AuthProxy; jwks: JwksServer; rsa: SigningKey; ec: SigningKey; endpoint: string; id: string }> {
  const be = await controlledBackend(t, 'api');
  const rsa = await signingKey('RS256', 'rsa-1');
  const ec = await signingKey('ES256', 'ec-1');
  const jwks = (await jwksServer(t, files.dir, `idp-${name}`)).serveKeys(rsa.publicJwk, ec.publicJwk);
  const endpoint = jwks.url();
  const p = await startAuthProxy(t, files, name, {
    upstream: `{ ${pool('api', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(endpoint, { jwks: jwksFields, more: 'verification_cache_entries: 0' })} }`)} }`,
  });
  const fresh = await sourceUntil(p, endpoint, (s) => s.state === 'fresh');
  t.match(fresh, { state: 'fresh', active_keys: 2 }, 'fresh with 2 keys');
  return { p, jwks, rsa, ec, endpoint, id: fresh?.jwks_source_id ?? '' };
}

t.test('the endpoint failing after a good fetch: 500, a timeout, a redirect, a body over 1 MiB → refresh_failed_retained; garbage, no usable key, a private key → quarantined_retained; the retained keys validate over h1, h2 and h3; a good fetch → fresh', async (t) => {
  // timeout_ms 1000: with 300, a cold worker's first fetch beside another test file once timed out
  // (never_fetched → empty_unusable before fresh), and this case is about failures after a good fetch.
  const { p, jwks, rsa, ec, endpoint, id } = await failingSetup(t, 'jwt-failing', 'refresh_interval_ms: 500, timeout_ms: 1000, stale_after_ms: 600000, unknown_kid_cooldown_ms: 200');
  const oct = { kty: 'oct', k: Buffer.from('an hmac key that is no signing key of an idp').toString('base64url'), kid: 'oct-1' };
  const phases = [
    { name: '500', set: () => jwks.set({ kind: 'status', status: 500 }), state: 'refresh_failed_retained', reason: 'http_status' },
    { name: 'no answer within timeout_ms', set: () => jwks.set({ kind: 'hang' }), state: 'refresh_failed_retained', reason: 'timeout' },
    { name: 'a redirect (302: not followed)', set: () => jwks.set({ kind: 'status', status: 302 }), state: 'refresh_failed_retained', reason: 'http_status' },
    { name: 'a body over 1 MiB', set: () => jwks.set({ kind: 'body', body: JSON.stringify({ keys: [rsa.publicJwk], padding: 'x'.repeat(1_100_000) }) }), state: 'refresh_failed_retained', reason: 'too_large' },
    { name: 'garbage (not JSON)', set: () => jwks.set({ kind: 'body', body: '<html>oops</html>' }), state: 'quarantined_retained', reason: 'invalid_json' },
    { name: 'JSON without a keys array', set: () => jwks.set({ kind: 'body', body: '{"issuer":"x"}' }), state: 'quarantined_retained', reason: 'invalid_key_set' },
    { name: 'a set of zero usable keys (one oct key)', set: () => jwks.set({ kind: 'keys', keys: [oct] }), state: 'quarantined_retained', reason: 'no_usable_keys' },
    { name: 'a set with a private key published', set: async () => jwks.set({ kind: 'keys', keys: [await privateJwk(rsa), ec.publicJwk] }), state: 'quarantined_retained', reason: 'invalid_key_set' },
  ] as const;
  for (const [n, phase] of phases.entries()) {
    const before = await authCounters(p);
    await phase.set();
    const s = await sourceUntil(p, endpoint, (x) => x.state === phase.state, 8000);
    t.equal(s?.state, phase.state, `${phase.name}: snapshot state ${phase.state}`);
    t.equal(s?.last_failure_reason, phase.reason, `${phase.name}: last_failure_reason ${phase.reason}`);
    t.ok((s?.consecutive_failures ?? 0) >= 1, `${phase.name}: consecutive_failures ${s?.consecutive_failures}`);
    t.equal(s?.active_keys, 2, `${phase.name}: the 2 good keys retained`);
    const g = await jwksGauges(p, id);
    t.equal(g.state, phase.state, `${phase.name}: svc_jwks_state 1 on ${phase.state} only (${JSON.stringify(g.states)})`);
    t.equal(g.activeKeys, 2, `${phase.name}: svc_jwks_active_keys 2`);
    for (const [i, protocol] of PROTOCOLS.entries()) {
      await assertServed(t, p, protocol, `/api/phase-${n}-${protocol}`, await mint(i === 1 ? ec : rsa), `${phase.name}: a token signed by a retained key`);
    }
    const m = moved(await authCounters(p), before);
    t.ok((m[`refresh_failure ${id}`] ?? 0) >= 1, `${phase.name}: svc_jwks_refresh_failure_total +${m[`refresh_failure ${id}`] ?? 0}`);
    jwks.serveKeys(rsa.publicJwk, ec.publicJwk);
    const back = await sourceUntil(p, endpoint, (x) => x.state === 'fresh', 8000);
    t.match(back, { state: 'fresh', consecutive_failures: 0, active_keys: 2 }, `${phase.name}, then a good set: fresh again, consecutive_failures 0`);
  }
  const s = (await jwksSources(p))[0];
  t.ok((s?.refresh_failure_total ?? 0) >= phases.length, `snapshot: refresh_failure_total ${s?.refresh_failure_total} ≥ ${phases.length}`);
  t.same(
    loggedTransitions(p, id),
    ['info never_fetched → fresh', ...phases.flatMap((ph) => [`warn fresh → ${ph.state} (${ph.reason})`, `info ${ph.state} → fresh`])],
    'the log: one line per transition, warn into a retained state with the failure reason, info back to fresh',
  );
});

t.test('stale: keys older than stale_after_ms while the endpoint fails → stale, still validating; a failure while stale stays stale; a good fetch → fresh', async (t) => {
  const STALE_AFTER = 1500;
  const { p, jwks, rsa, ec, endpoint, id } = await failingSetup(t, 'jwt-stale', `refresh_interval_ms: 500, timeout_ms: 300, stale_after_ms: ${STALE_AFTER}, unknown_kid_cooldown_ms: 200`);
  jwks.set({ kind: 'status', status: 500 });
  const failing = await sourceUntil(p, endpoint, (x) => x.state === 'refresh_failed_retained' || x.state === 'stale', 8000);
  t.ok(failing?.state === 'refresh_failed_retained' || failing?.state === 'stale', `500: refresh_failed_retained first (${failing?.state})`);
  const stale = await sourceUntil(p, endpoint, (x) => x.state === 'stale', 8000);
  t.equal(stale?.state, 'stale', `keys older than ${STALE_AFTER} ms: stale`);
  t.ok((stale?.age_seconds ?? 0) >= Math.floor(STALE_AFTER / 1000), `snapshot age_seconds ${stale?.age_seconds} ≥ ${Math.floor(STALE_AFTER / 1000)} (stale_after_ms ${STALE_AFTER}, whole seconds allowed)`);
  t.equal(stale?.active_keys, 2, 'the 2 keys retained');
  const g = await jwksGauges(p, id);
  t.equal(g.state, 'stale', `svc_jwks_state 1 on stale only (${JSON.stringify(g.states)})`);
  t.ok((g.ageSeconds ?? 0) >= Math.floor(STALE_AFTER / 1000), `svc_jwks_age_seconds ${g.ageSeconds} ≥ ${Math.floor(STALE_AFTER / 1000)}`);
  for (const [i, protocol] of PROTOCOLS.entries()) await assertServed(t, p, protocol, `/api/stale-${protocol}`, await mint(i === 1 ? ec : rsa), 'stale: a token signed by a retained key');
  // A failure of another kind while stale (a quarantined set) does not leave stale.
  const failures = (await jwksSources(p))[0]?.refresh_failure_total ?? 0;
  jwks.set({ kind: 'body', body: 'garbage' });
  const after = await sourceUntil(p, endpoint, (x) => x.refresh_failure_total > failures && x.last_failure_reason === 'invalid_json', 8000);
  t.match(after, { state: 'stale', last_failure_reason: 'invalid_json' }, 'garbage while stale: still stale (a failure does not leave stale)');
  await assertServed(t, p, 'h2', '/api/stale-garbage', await mint(rsa), 'stale after garbage: a token signed by a retained key');
  jwks.serveKeys(rsa.publicJwk, ec.publicJwk);
  t.match(await sourceUntil(p, endpoint, (x) => x.state === 'fresh', 8000), { state: 'fresh', consecutive_failures: 0 }, 'a good fetch: fresh');
});

t.test('never_fetched: requests arriving before the first fetch has completed wait for it, on h1, h2 and h3, and are served once it completes; the node still fetches once', async (t) => {
  const be = await controlledBackend(t, 'api');
  const rsa = await signingKey('RS256', 'rsa-1');
  const jwks = (await jwksServer(t, files.dir, 'idp-first')).set({ kind: 'hold' });
  const endpoint = jwks.url();
  const p = await startAuthProxy(t, files, 'jwt-never-fetched', {
    upstream: `{ ${pool('api', be.port, `tls: { ca_file: "${jwks.ca.cert}" }, auth: { ${jwtAuth(endpoint, { jwks: 'timeout_ms: 8000, refresh_interval_ms: 300000' })} }`)} }`,
  });
  await jwks.until(() => jwks.held === 1, 'the first fetch held');
  const s = await jwksSource(p, endpoint);
  t.match(s, { state: 'never_fetched', active_keys: 0, last_refresh_success_unix_ms: null, refresh_success_total: 0, refresh_failure_total: 0 }, `snapshot: never_fetched while the first fetch is under way (${JSON.stringify(s)})`);
  t.equal((await jwksGauges(p, s?.jwks_source_id ?? '')).state, 'never_fetched', 'svc_jwks_state: 1 on never_fetched');
  const answered: string[] = [];
  const sent = await Promise.all(
    PROTOCOLS.map(async (protocol) => {
      const x = send(p, protocol, { path: `/api/first-${protocol}`, headers: bearer(await mint(rsa)) });
      void x.head.then(() => answered.push(protocol));
      await x.sent;
      return x;
    }),
  );
  // A waiting request holds no admission slot (docs/request-path.md): nothing the proxy exposes
  // says it is waiting, so the fetch is held a while longer with the three on the wire.
  await sleep(300);
  t.same(answered, [], 'none answered while the first fetch is under way');
  t.equal(jwks.release({ kind: 'keys', keys: [rsa.publicJwk] }), 1, 'the first fetch answered');
  for (const [i, protocol] of PROTOCOLS.entries()) {
    const a = await (sent[i] as (typeof sent)[number]).answer;
    t.same([a.status, a.body], [200, `api /api/first-${protocol}`], `${protocol}: served once the keys came (got ${shown(a)})`);
  }
  t.equal(jwks.fetches.length, 1, 'one fetch: the waiting requests joined the first one');
  t.match(await jwksSource(p, endpoint), { state: 'fresh', active_keys: 1 }, 'fresh');
});

t.test('never fetched and failing (500, connection refused, a certificate the pool does not trust) → empty_unusable: valid tokens refused with key_source_unavailable over h1, h2 and h3; the endpoint back → fresh and served', async (t) => {
  const be = await controlledBackend(t, 'api');
  const rsa = await signingKey('RS256', 'rsa-1');
  const down = (await jwksServer(t, files.dir, 'idp-down')).set({ kind: 'status', status: 500 });
  // Signed by its own CA: a pool trusting `down`'s CA must refuse its certificate.
  const untrusted = (await jwksServer(t, files.dir, 'idp-untrusted')).serveKeys(rsa.publicJwk);
  const refusedUrl = `https://127.0.0.1:${await freePort()}/jwks.json`;
  const fields = 'refresh_interval_ms: 500, timeout_ms: 500, unknown_kid_cooldown_ms: 200';
  const ca = `tls: { ca_file: "${down.ca.cert}" }`;
  const p = await startAuthProxy(t, files, 'jwt-empty', {
    upstream: `{ ${[
      pool('down', be.port, `${ca}, auth: { ${jwtAuth(down.url(), { jwks: fields })} }`),
      pool('refused', be.port, `${ca}, auth: { ${jwtAuth(refusedUrl, { jwks: fields })} }`),
      pool('untrusted', be.port, `${ca}, auth: { ${jwtAuth(untrusted.url(), { jwks: fields })} }`),
    ].join(', ')} }`,
  });
  const pools = [
    { name: 'down', endpoint: down.url(), reason: 'http_status' },
    { name: 'refused', endpoint: refusedUrl, reason: 'connect_error' },
    { name: 'untrusted', endpoint: untrusted.url(), reason: 'tls_error' },
  ] as const;
  const ids: Record<string, string> = {};
  for (const pl of pools) {
    const s = await sourceUntil(p, pl.endpoint, (x) => x.state === 'empty_unusable', 8000);
    ids[pl.name] = s?.jwks_source_id ?? '';
    t.match(s, { state: 'empty_unusable', active_keys: 0, last_refresh_success_unix_ms: null, last_failure_reason: pl.reason }, `${pl.name}: empty_unusable, no key, last_failure_reason ${pl.reason} (${JSON.stringify(s)})`);
    t.equal((await jwksGauges(p, s?.jwks_source_id ?? '')).state, 'empty_unusable', `${pl.name}: svc_jwks_state 1 on empty_unusable only`);
  }
  t.same(
    pools.map((pl) => loggedTransitions(p, ids[pl.name] ?? '')),
    pools.map((pl) => [`warn never_fetched → empty_unusable (${pl.reason})`]),
    'the log: never_fetched → empty_unusable once per source, at warn, with its reason',
  );
  t.equal(untrusted.fetches.length, 0, 'the untrusted endpoint never got a request (the TLS handshake failed first)');
  const before = await authCounters(p);
  for (const pl of pools) {
    for (const protocol of PROTOCOLS) {
      assertAuthAnswer(t, await request(p, protocol, { path: `/${pl.name}/${protocol}`, headers: bearer(await mint(rsa)) }), 'EDGE_AUTH_TOKEN_INVALID', `${pl.name}, ${protocol}: a valid token`);
    }
  }
  const m = moved(await authCounters(p), before);
  t.equal(m['failure key_source_unavailable'], pools.length * PROTOCOLS.length, `svc_jwt_validation_failures_total{reason="key_source_unavailable"} +${pools.length * PROTOCOLS.length} (${JSON.stringify(m)})`);
  t.same(Object.keys(m).filter((k) => k.startsWith('failure ') && k !== 'failure key_source_unavailable'), [], 'no other failure reason');
  t.equal(be.arrivals.length, 0, 'the backend saw nothing');

  down.serveKeys(rsa.publicJwk);
  t.match(await sourceUntil(p, down.url(), (x) => x.state === 'fresh', 8000), { state: 'fresh', active_keys: 1, consecutive_failures: 0 }, 'down, back: fresh with its key');
  for (const protocol of PROTOCOLS) await assertServed(t, p, protocol, `/down/back-${protocol}`, await mint(rsa), 'down, back: a valid token');
});
