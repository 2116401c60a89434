// What the request-authentication end-to-end tests (issue 16) share: an identity provider's JWKS
// endpoint over HTTPS under a private CA whose answers the test switches (a key set, a status, a
// silence, garbage, a held fetch) and which records every fetch; signing keys and tokens minted in
// the test (valid ones and each kind of bad one, `alg: none` and the RSA-public-key-as-HMAC-secret
// confusion included); a proxy started with its log lines kept (leak checks); and the answers,
// counters and snapshot entries of the contract read back. The external authorization service:
// authz-service.ts.
import type http from 'node:http';
import https from 'node:https';
import { createHmac, randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { SignJWT, exportJWK, exportSPKI, generateKeyPair } from 'jose';
import type { CryptoKey, JWK, JWTPayload } from 'jose';
import { makeCa, makeLeaf } from '../../scripts/lib/certs.ts';
import type { CertFiles } from '../../scripts/lib/certs.ts';
import { listenTracked } from './backends.ts';
import { parseExposition, scrape } from './exposition.ts';
import { pollUntil, snapshot, startProxy } from './overload.ts';
import type { Answer, Proxy, ProxyFiles, StartedProxy } from './overload.ts';
import { until } from './until.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

interface Assertions {
  equal(found: unknown, wanted: unknown, message: string): unknown;
  ok(v: unknown, message: string): unknown;
}

const b64url = (data: string | Buffer): string => Buffer.from(data).toString('base64url');

// ---------------------------------------------------------------------------------------------
// Keys and tokens

/** The issuer and audience the test pools are configured with. */
export const ISSUER = 'https://idp.test/';
export const AUDIENCE = 'edge-api';
/** The `sub` of every minted token: distinctive, so a log that leaks a claim is caught by a plain search. */
export const SUBJECT = 'subject-e2e-4b1f9c';

/** An asymmetric signing key of the test IdP: the private half signs, the public JWK is published. */
export interface SigningKey {
  readonly kid: string;
  readonly alg: 'RS256' | 'ES256';
  readonly privateKey: CryptoKey;
  /** The public JWK as the JWKS publishes it (`kid`, `alg`, `use: sig`). */
  readonly publicJwk: JWK;
  /** The public key as PEM (SPKI): the "secret" of the key-confusion attack. */
  readonly publicPem: string;
}

/** A new key pair for `alg` named `kid`. */
export async function signingKey(alg: 'RS256' | 'ES256', kid: string): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  const publicJwk = { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' };
  return { kid, alg, privateKey, publicJwk, publicPem: await exportSPKI(publicKey) };
}

/** The private JWK of `key` (an IdP that publishes this is broken: the set must be refused). */
export async function privateJwk(key: SigningKey): Promise<JWK> {
  return { ...(await exportJWK(key.privateKey)), kid: key.kid, alg: key.alg, use: 'sig' };
}

/** Claims of a token the test pools accept: `iss`, `aud`, `sub` (SUBJECT), `iat` now, `exp` in 10 minutes, `jti` unique. */
export function goodClaims(overrides: JWTPayload = {}): JWTPayload {
  const now = Math.floor(Date.now() / 1000);
  return { iss: ISSUER, aud: AUDIENCE, sub: SUBJECT, iat: now, exp: now + 600, jti: randomUUID(), ...overrides };
}

/**
 * A token signed by `key` (header `alg` = the key's, `kid` = the key's unless `kid` is given),
 * with `goodClaims(claims)`: every token is distinct (its `jti`), so no verification cache serves
 * one test case the answer of another.
 */
export async function mint(key: SigningKey, claims: JWTPayload = {}, kid: string = key.kid): Promise<string> {
  return new SignJWT(goodClaims(claims)).setProtectedHeader({ alg: key.alg, kid, typ: 'JWT' }).sign(key.privateKey);
}

/** An unsigned token: header `{"alg":"none"}`, empty signature (RFC 7519 §6.1). */
export function unsignedToken(claims: JWTPayload = {}, kid?: string): string {
  return `${b64url(JSON.stringify({ alg: 'none', typ: 'JWT', ...(kid === undefined ? {} : { kid }) }))}.${b64url(JSON.stringify(goodClaims(claims)))}.`;
}

/**
 * The key-confusion attack: HS256 over the token with the RSA public key's PEM as the HMAC
 * secret, header `kid` naming that RSA key. A verifier that feeds the key it selected by `kid` to
 * whatever `alg` the token names accepts it.
 */
export function hs256WithPublicKey(key: SigningKey, claims: JWTPayload = {}): string {
  const signingInput = `${b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT', kid: key.kid }))}.${b64url(JSON.stringify(goodClaims(claims)))}`;
  return `${signingInput}.${createHmac('sha256', key.publicPem).update(signingInput).digest('base64url')}`;
}

/** `token` with its payload replaced (`sub` changed) and the original signature kept. */
export function tampered(token: string): string {
  const [h, p, s] = token.split('.') as [string, string, string];
  const claims = JSON.parse(Buffer.from(p, 'base64url').toString('utf8')) as JWTPayload;
  return `${h}.${b64url(JSON.stringify({ ...claims, sub: 'admin' }))}.${s}`;
}

/** `authorization: Bearer <token>`. */
export const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });

// ---------------------------------------------------------------------------------------------
// The JWKS endpoint

/** What the JWKS endpoint answers. */
export type JwksBehaviour =
  /** 200, `{"keys": keys}`. */
  | { readonly kind: 'keys'; readonly keys: readonly JWK[] }
  /** `status` with a short text body. */
  | { readonly kind: 'status'; readonly status: number }
  /** 200 with this body (`application/json` unless `contentType`): garbage, a set without `keys`... */
  | { readonly kind: 'body'; readonly body: string; readonly contentType?: string }
  /** Nothing: the request stays open until the fetcher gives up (or the test ends). */
  | { readonly kind: 'hang' }
  /** Nothing until `release(b)` answers it as `b` would. */
  | { readonly kind: 'hold' };

/** One GET the endpoint received. */
export interface JwksFetch {
  /** Path and query as received. */
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
  /** Date.now() at arrival. */
  readonly at: number;
  /** The behaviour that answered it (its `kind`). */
  readonly answered: JwksBehaviour['kind'];
}

/** An HTTPS JWKS endpoint on 127.0.0.1 with a certificate of its own private CA (`ca`). */
export class JwksServer {
  port = 0;
  readonly fetches: JwksFetch[] = [];
  /** The CA that signed its certificate: the pool's `tls.ca_file`. */
  readonly ca: CertFiles;
  private readonly leaf: CertFiles;
  private behaviour: JwksBehaviour = { kind: 'keys', keys: [] };
  private readonly hung = new Set<http.ServerResponse>();
  private readonly holds: http.ServerResponse[] = [];
  private readonly changed = new EventEmitter();

  constructor(ca: CertFiles, leaf: CertFiles) {
    this.ca = ca;
    this.leaf = leaf;
    this.changed.setMaxListeners(0);
  }

  /** From now on, answer every fetch with `b` (fetches already hanging stay so). */
  set(b: JwksBehaviour): this {
    this.behaviour = b;
    return this;
  }

  /** Fetches held now (behaviour `hold`). */
  get held(): number {
    return this.holds.length;
  }

  /** Answers every held fetch as `b` would, and answers the next ones so too; how many were held. */
  release(b: Exclude<JwksBehaviour, { kind: 'hold' }>): number {
    this.behaviour = b;
    const now = this.holds.splice(0);
    for (const res of now) this.answer(b, res);
    return now.length;
  }

  /** Serve `keys` (public JWKs). */
  serveKeys(...keys: readonly JWK[]): this {
    return this.set({ kind: 'keys', keys });
  }

  /**
   * The endpoint's URL: `https://127.0.0.1:<port><p>`, with `userinfo@` before the host and
   * `?query` after the path when given (a URL holding credentials, which must never show).
   */
  url(p = '/jwks.json', o: { readonly userinfo?: string; readonly query?: string } = {}): string {
    return `https://${o.userinfo === undefined ? '' : `${o.userinfo}@`}127.0.0.1:${this.port}${p}${o.query === undefined ? '' : `?${o.query}`}`;
  }

  /** Resolves once `pred()` holds (checked on every fetch); rejects after `timeoutMs` saying what was seen. */
  until(pred: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    return until(this.changed, 'fetch', pred, () => `JWKS endpoint: not ${what} within ${timeoutMs} ms (${this.fetches.length} fetches: ${this.fetches.slice(-4).map((f) => f.answered).join(' ')})`, timeoutMs);
  }

  /** Fetches received after `n` already seen: `await jwks.until(() => jwks.fetches.length > n, ...)`. */
  since(n: number): JwksFetch[] {
    return this.fetches.slice(n);
  }

  /** Starts on 127.0.0.1 port 0; closed at teardown (hanging answers cut). */
  async start(t: Teardown): Promise<this> {
    const server = https.createServer({ cert: readFileSync(this.leaf.cert), key: readFileSync(this.leaf.key) }, (req, res) => this.handle(req, res));
    server.requestTimeout = 0;
    server.headersTimeout = 0;
    t.teardown(() => {
      for (const r of [...this.hung, ...this.holds]) r.destroy();
    });
    this.port = await listenTracked(t, server);
    return this;
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const b = this.behaviour;
    this.fetches.push({ url: req.url ?? '', headers: req.headers, at: Date.now(), answered: b.kind });
    req.resume();
    if (b.kind === 'hold') {
      this.holds.push(res);
      res.on('close', () => {
        const i = this.holds.indexOf(res);
        if (i >= 0) this.holds.splice(i, 1);
      });
    } else this.answer(b, res);
    this.changed.emit('fetch');
  }

  private answer(b: Exclude<JwksBehaviour, { kind: 'hold' }>, res: http.ServerResponse): void {
    if (res.destroyed) return;
    switch (b.kind) {
      case 'keys':
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=0' }).end(JSON.stringify({ keys: b.keys }));
        break;
      case 'status':
        res.writeHead(b.status, { 'content-type': 'text/plain' }).end(`jwks status ${b.status}`);
        break;
      case 'body':
        res.writeHead(200, { 'content-type': b.contentType ?? 'application/json' }).end(b.body);
        break;
      case 'hang':
        this.hung.add(res);
        res.on('close', () => this.hung.delete(res));
        break;
    }
  }
}

/**
 * A started JWKS endpoint whose certificate (for 127.0.0.1 and localhost) is signed by a new CA
 * made in `<dir>/<name>/`; pass `ca` to sign it with an existing CA instead (e.g. one the pool does
 * not trust). Serves an empty set until told otherwise.
 */
export async function jwksServer(t: Teardown, dir: string, name: string, ca?: CertFiles): Promise<JwksServer> {
  const own = path.join(dir, name);
  const authority = ca ?? makeCa(own, `${name}-ca`, `/CN=${name} test IdP CA`);
  const leaf = makeLeaf(own, `${name}-server`, authority, { sans: ['127.0.0.1', 'localhost'] });
  return new JwksServer(authority, leaf).start(t);
}

// ---------------------------------------------------------------------------------------------
// The proxy

/** A started proxy with its log (`served.lines`, `served.text()`). */
/** A started proxy for authentication tests (test/support/overload.ts `startProxy`). */
export type AuthProxy = StartedProxy;

/** What an authentication test varies. */
export interface AuthSetup {
  /** The `upstream` map, YAML flow style (pools with their `auth` blocks). */
  readonly upstream: string;
  /** `performance.worker_threads` (default 1). */
  readonly workers?: number;
  /** Role of the control API token (default `viewer`; `operator` to activate configurations). */
  readonly role?: 'viewer' | 'operator';
  /** More top-level YAML (e.g. `default_auth: { ... }`), one key a line. */
  readonly extra?: string;
}

/**
 * Starts `edge-proxy serve` through `startProxy` (one worker unless `workers`, 100 ms heartbeats)
 * with overload protection off and limits out of reach: nothing but authentication refuses a request.
 */
export function startAuthProxy(t: Teardown, files: ProxyFiles, name: string, o: AuthSetup): Promise<AuthProxy> {
  return startProxy(
    t,
    files,
    name,
    {
      upstream: o.upstream,
      ...(o.workers === undefined ? {} : { workers: o.workers }),
      ...(o.extra === undefined ? {} : { extra: o.extra }),
      performance: 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000',
      resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false } }',
    },
    o.role ?? 'viewer',
  );
}

/** A pool `name` on path `/<name>` with one backend on 127.0.0.1:`port`, and more YAML entries (`tls`, `auth`). */
export const pool = (name: string, port: number, more = ''): string => `${name}: { route: { path_prefix: /${name} }, backends: [{ id: b-${name}, address: "127.0.0.1:${port}" }]${more === '' ? '' : `, ${more}`} }`;

/** The `jwt` entry of a pool's `auth`: issuer, audience, clock skew (default 30 s), `jwks` at `url` with the given `jwks` fields, and more entries. */
export function jwtAuth(url: string, o: { readonly jwks?: string; readonly more?: string; readonly clockSkewMs?: number } = {}): string {
  return `jwt: { issuer: "${ISSUER}", audiences: [${AUDIENCE}], clock_skew_ms: ${o.clockSkewMs ?? 30000}, jwks: { url: "${url}"${o.jwks === undefined ? '' : `, ${o.jwks}`} }${o.more === undefined ? '' : `, ${o.more}`} }`;
}

// ---------------------------------------------------------------------------------------------
// Answers, counters, snapshot

/** The coded answers of request authentication. */
export type AuthCode = 'EDGE_AUTH_TOKEN_MISSING' | 'EDGE_AUTH_TOKEN_INVALID' | 'EDGE_AUTH_DENIED' | 'EDGE_AUTH_UNAVAILABLE';

const STATUS: Readonly<Record<AuthCode, number>> = { EDGE_AUTH_TOKEN_MISSING: 401, EDGE_AUTH_TOKEN_INVALID: 401, EDGE_AUTH_DENIED: 403, EDGE_AUTH_UNAVAILABLE: 503 };
/** RFC 9110 §15 reason phrases: the proxy's coded answers start `<status> <phrase>: ` (e.g. `503 Service Unavailable: `). */
const PHRASE: Readonly<Record<number, string>> = { 401: 'Unauthorized', 403: 'Forbidden', 503: 'Service Unavailable' };
const CHALLENGE: Readonly<Record<AuthCode, string | undefined>> = { EDGE_AUTH_TOKEN_MISSING: 'Bearer', EDGE_AUTH_TOKEN_INVALID: 'Bearer error="invalid_token"', EDGE_AUTH_DENIED: undefined, EDGE_AUTH_UNAVAILABLE: undefined };

/** One line saying what came back (status, error, the start of the body). */
export const shown = (a: Answer): string => `${a.status}${a.error === undefined ? '' : ` (${a.error})`} ${a.body.trim().slice(0, 100)}`;

/**
 * Asserts that `a` is the answer for `code`: its status, its `WWW-Authenticate` (401s only), a
 * plain-text uncacheable body that starts with the status and its reason phrase and ends with `(code)`.
 */
export function assertAuthAnswer(t: Assertions, a: Answer, code: AuthCode, what: string): void {
  const status = STATUS[code];
  t.equal(a.status, status, `${what}: ${status} (got ${shown(a)})`);
  t.equal(a.headers['www-authenticate'], CHALLENGE[code], `${what}: WWW-Authenticate ${CHALLENGE[code] ?? 'absent'}`);
  t.equal(a.headers['content-type'], 'text/plain; charset=utf-8', `${what}: content-type`);
  t.equal(a.headers['cache-control'], 'no-store', `${what}: cache-control no-store`);
  t.ok(a.body.startsWith(`${status} ${PHRASE[status]}: `), `${what}: the body starts with "${status} ${PHRASE[status]}: " (got "${a.body.slice(0, 40)}")`);
  t.ok(a.body.trimEnd().endsWith(`(${code})`), `${what}: the body ends with (${code})`);
}

/** The authentication counters that are not 0, from one scrape: `failure <reason>`, `algorithm <alg>`, `external <outcome>`, `unknown_kid <id>`, `refresh_success <id>`, `refresh_failure <id>`. */
export async function authCounters(p: Proxy): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  const add = (k: string, v: number): void => {
    if (v !== 0) out[k] = (out[k] ?? 0) + v;
  };
  for (const s of parseExposition(await scrape(p.mport))) {
    if (s.name === 'svc_jwt_validation_failures_total') add(`failure ${s.labels['reason']}`, s.value);
    else if (s.name === 'svc_jwt_algorithm_rejections_total') add(`algorithm ${s.labels['algorithm']}`, s.value);
    else if (s.name === 'svc_jwks_unknown_kid_total') add(`unknown_kid ${s.labels['jwks_source_id']}`, s.value);
    else if (s.name === 'svc_jwks_refresh_success_total') add(`refresh_success ${s.labels['jwks_source_id']}`, s.value);
    else if (s.name === 'svc_jwks_refresh_failure_total') add(`refresh_failure ${s.labels['jwks_source_id']}`, s.value);
    else if (s.name.startsWith('svc_external_auth_')) add(`external ${s.name.slice('svc_external_auth_'.length)}`, s.value);
  }
  return out;
}

/** What moved between two reads of `authCounters`, keys with no change left out. */
export function moved(after: Record<string, number>, before: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of new Set([...Object.keys(after), ...Object.keys(before)])) {
    const d = (after[k] ?? 0) - (before[k] ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}

/** The `svc_jwks_*` gauges of source `id` from one scrape: the state whose series is 1 (`states` lists every state series and its value). */
export async function jwksGauges(p: Proxy, id: string): Promise<{ state: string | undefined; states: Record<string, number>; activeKeys: number | undefined; ageSeconds: number | undefined; lastAttempt: number | undefined; lastSuccess: number | undefined }> {
  const samples = parseExposition(await scrape(p.mport)).filter((s) => s.labels['jwks_source_id'] === id);
  const one = (name: string): number | undefined => samples.find((s) => s.name === name)?.value;
  const states: Record<string, number> = {};
  for (const s of samples) if (s.name === 'svc_jwks_state') states[s.labels['state'] ?? ''] = s.value;
  const on = Object.entries(states).filter(([, v]) => v === 1).map(([k]) => k);
  return {
    state: on.length === 1 ? on[0] : on.length === 0 ? undefined : on.join('+'),
    states,
    activeKeys: one('svc_jwks_active_keys'),
    ageSeconds: one('svc_jwks_age_seconds'),
    lastAttempt: one('svc_jwks_last_refresh_attempt_seconds'),
    lastSuccess: one('svc_jwks_last_refresh_success_seconds'),
  };
}

/** One entry of the snapshot's `jwks.sources[]` (packages/auth/src/types.ts `JwksSourceView`). */
export interface JwksSourceEntry {
  readonly jwks_source_id: string;
  readonly jwks_endpoint: string;
  readonly state: string;
  readonly active_keys: number;
  readonly last_refresh_attempt_unix_ms: number | null;
  readonly last_refresh_success_unix_ms: number | null;
  readonly age_seconds: number | null;
  readonly consecutive_failures: number;
  readonly last_failure_reason: string | null;
  readonly refresh_success_total: number;
  readonly refresh_failure_total: number;
}

/** The snapshot's `jwks.sources[]`. */
export async function jwksSources(p: Proxy): Promise<JwksSourceEntry[]> {
  const jwks = (await snapshot(p))['jwks'] as { sources?: JwksSourceEntry[] } | undefined;
  return jwks?.sources ?? [];
}

/** The snapshot entry whose sanitized endpoint is `endpoint` (undefined when absent). */
export async function jwksSource(p: Proxy, endpoint: string): Promise<JwksSourceEntry | undefined> {
  return (await jwksSources(p)).find((s) => s.jwks_endpoint === endpoint);
}

/** Polls the snapshot until the source at `endpoint` satisfies `pred` (at most `timeoutMs`); the last entry seen. */
export function sourceUntil(p: Proxy, endpoint: string, pred: (s: JwksSourceEntry) => boolean, timeoutMs = 10_000): Promise<JwksSourceEntry | undefined> {
  return pollUntil(() => jwksSource(p, endpoint), (s) => s !== undefined && pred(s), timeoutMs, 50);
}

/**
 * The JWKS state transitions the proxy logged for source `id`, in order, each as
 * `level previous_state → state (reason)` (docs/auth.md: one line per transition).
 */
export function loggedTransitions(p: AuthProxy, id: string): string[] {
  return p.served.lines
    .filter((l) => l['jwks_source_id'] === id && typeof l['state'] === 'string')
    .map((l) => `${String(l['level'])} ${String(l['previous_state'])} → ${String(l['state'])}${l['reason'] === undefined ? '' : ` (${String(l['reason'])})`}`);
}

/** The strings of `secrets` found in `text` (each named by its `what`). */
export function leaked(text: string, secrets: Readonly<Record<string, string>>): string[] {
  return Object.entries(secrets)
    .filter(([, v]) => text.includes(v))
    .map(([k]) => k);
}
