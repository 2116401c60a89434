// JWT verification against keys fed to a KeyStore by hand (the supervisor's pushes), tokens signed
// in the test with jose, on a fake clock: every reason of the vocabulary, the algorithm-confusion
// attacks, unknown kids and never-fetched sources, and the cache of verified tokens.
import t from 'tap';
import { CompactSign, SignJWT, base64url, exportJWK, exportSPKI, generateKeyPair } from 'jose';
import type { CryptoKey, JWK, JWTPayload } from 'jose';
import { KeyStore } from '../src/key-store.ts';
import { JWT_ALGORITHM_LABELS, JWT_FAILURE_REASONS, JwtVerifier, algorithmLabel } from '../src/jwt-verifier.ts';
import type { JwtOutcome, JwtPolicy } from '../src/jwt-verifier.ts';
import type { JwksKeySet, JwksState } from '../src/types.ts';

const SRC = 'jwks-0123456789ab';
const ISS = 'https://idp.test/';
const AUD = 'edge-api';
const T0 = Date.UTC(2030, 0, 1);
const SEC = T0 / 1000;

const rsa = await generateKeyPair('RS256', { extractable: true });
const rsa2 = await generateKeyPair('RS256', { extractable: true });
const ec = await generateKeyPair('ES256', { extractable: true });
const rsaJwk: JWK = { ...(await exportJWK(rsa.publicKey)), kid: 'rsa-1', alg: 'RS256', use: 'sig' };
const rsa2Jwk: JWK = { ...(await exportJWK(rsa2.publicKey)), kid: 'rsa-2', alg: 'RS256', use: 'sig' };
const ecJwk: JWK = { ...(await exportJWK(ec.publicKey)), kid: 'ec-1' };

const keySet = (keys: readonly JWK[], version = 1, state: JwksState = 'fresh'): JwksKeySet => ({ sourceId: SRC, state, keys, fetchedAtMs: T0, version });

interface SignOpts {
  readonly alg?: string;
  readonly kid?: string | null;
  readonly claims?: JWTPayload;
  /** Leave out the default iss/aud/iat/exp. */
  readonly bare?: boolean;
}
async function sign(key: CryptoKey | Uint8Array, o: SignOpts = {}): Promise<string> {
  const header: { alg: string; kid?: string; typ: string } = { alg: o.alg ?? 'RS256', typ: 'JWT' };
  if (o.kid !== null) header.kid = o.kid ?? 'rsa-1';
  const base = o.bare === true ? {} : { iss: ISS, aud: AUD, iat: SEC, exp: SEC + 300 };
  return new SignJWT({ ...base, ...o.claims }).setProtectedHeader(header).sign(key);
}

function policy(p: Partial<JwtPolicy> = {}): JwtPolicy {
  return { issuer: ISS, audiences: [AUD], algorithms: ['RS256', 'ES256'], sourceId: SRC, jwksTimeoutMs: 1000, clockSkewMs: 30_000, header: 'authorization', cacheEntries: 0, ...p };
}

interface Fixture {
  readonly store: KeyStore;
  readonly asks: string[];
  readonly clock: { now: number };
  verifier(p?: Partial<JwtPolicy>): JwtVerifier;
}
function fixture(initial: JwksKeySet | null = keySet([rsaJwk, ecJwk]), onAsk?: (store: KeyStore) => void): Fixture {
  const asks: string[] = [];
  const clock = { now: T0 };
  const store: KeyStore = new KeyStore({
    askRefresh: (id) => {
      asks.push(id);
      onAsk?.(store);
    },
  });
  if (initial !== null) store.update(initial);
  return { store, asks, clock, verifier: (p) => new JwtVerifier(policy(p), store, () => clock.now) };
}

const bearer = (token: string): string => `Bearer ${token}`;
const fail = (o: JwtOutcome): string => (o.ok ? 'ok' : o.reason);

t.test('the vocabulary: ten reasons, bounded algorithm labels', async (t) => {
  t.same([...JWT_FAILURE_REASONS], ['missing_token', 'malformed_token', 'key_source_unavailable', 'missing_verification_key', 'algorithm_not_allowed', 'invalid_signature', 'issuer_mismatch', 'audience_mismatch', 'token_expired', 'token_not_yet_valid']);
  for (const alg of ['HS256', 'RS512', 'PS384', 'ES512', 'EdDSA', 'ES256K', 'none']) t.equal(algorithmLabel(alg), alg);
  for (const alg of ['NONE', 'None', 'other', 'RS1', 'x'.repeat(300), 42, undefined, null]) t.equal(algorithmLabel(alg), 'other', `${String(alg).slice(0, 10)} → other`);
  t.ok(JWT_ALGORITHM_LABELS.includes('other'));
  t.ok(Object.isFrozen(JWT_ALGORITHM_LABELS));
});

t.test('valid RS256 and ES256 tokens are accepted', async (t) => {
  const f = fixture();
  const v = f.verifier();
  t.same(await v.verify(bearer(await sign(rsa.privateKey))), { ok: true, cached: false });
  t.same(await v.verify(bearer(await sign(ec.privateKey, { alg: 'ES256', kid: 'ec-1' }))), { ok: true, cached: false });
  t.same(f.asks, [], 'no refresh asked for keys the set holds');
});

t.test('time, issuer and audience claims', async (t) => {
  const f = fixture();
  const cases: Array<{ name: string; claims: JWTPayload; want: string; p?: Partial<JwtPolicy> }> = [
    { name: 'expired beyond the skew', claims: { exp: SEC - 31 }, want: 'token_expired' },
    { name: 'expired within the skew', claims: { exp: SEC - 29 }, want: 'ok' },
    { name: 'expired, no skew', claims: { exp: SEC - 1 }, want: 'token_expired', p: { clockSkewMs: 0 } },
    { name: 'exp exactly now, no skew', claims: { exp: SEC }, want: 'token_expired', p: { clockSkewMs: 0 } },
    { name: 'not yet valid beyond the skew', claims: { nbf: SEC + 31 }, want: 'token_not_yet_valid' },
    { name: 'not yet valid within the skew', claims: { nbf: SEC + 29 }, want: 'ok' },
    { name: 'not yet valid, no skew', claims: { nbf: SEC + 1 }, want: 'token_not_yet_valid', p: { clockSkewMs: 0 } },
    { name: 'wrong issuer', claims: { iss: 'https://evil.test/' }, want: 'issuer_mismatch' },
    { name: 'no issuer claim', claims: { iss: undefined }, want: 'issuer_mismatch' },
    { name: 'any issuer when none is configured', claims: { iss: 'https://other.test/' }, want: 'ok', p: { issuer: undefined } },
    { name: 'wrong audience', claims: { aud: 'other-api' }, want: 'audience_mismatch' },
    { name: 'no aud claim', claims: { aud: undefined }, want: 'audience_mismatch' },
    { name: 'aud array with one match', claims: { aud: ['x', AUD, 'y'] }, want: 'ok' },
    { name: 'aud array without a match', claims: { aud: ['x', 'y'] }, want: 'audience_mismatch' },
    { name: 'one of several audiences', claims: { aud: 'b' }, want: 'ok', p: { audiences: ['a', 'b'] } },
    { name: 'any aud when none is configured', claims: { aud: 'whatever' }, want: 'ok', p: { audiences: [] } },
    { name: 'exp of the wrong type', claims: { exp: 'soon' as unknown as number }, want: 'malformed_token' },
    { name: 'nbf of the wrong type', claims: { nbf: 'now' as unknown as number }, want: 'malformed_token' },
  ];
  for (const c of cases) {
    const token = await sign(rsa.privateKey, { claims: c.claims });
    t.equal(fail(await f.verifier(c.p).verify(bearer(token))), c.want, c.name);
  }
});

t.test('a clock moving across exp and nbf, skew honoured both ways', async (t) => {
  const f = fixture();
  const v = f.verifier({ clockSkewMs: 10_000 });
  const token = await sign(rsa.privateKey, { claims: { nbf: SEC + 60, exp: SEC + 120 } });
  const at = async (offsetS: number): Promise<string> => {
    f.clock.now = T0 + offsetS * 1000;
    return fail(await v.verify(bearer(token)));
  };
  t.equal(await at(49), 'token_not_yet_valid');
  t.equal(await at(50), 'ok', 'nbf - skew');
  t.equal(await at(129), 'ok', 'exp + skew - 1 s');
  t.equal(await at(130), 'token_expired', 'exp + skew');
});

t.test('alg none is refused whatever the policy lists', async (t) => {
  const f = fixture();
  const enc = (o: object): string => base64url.encode(JSON.stringify(o));
  const payload = enc({ iss: ISS, aud: AUD, exp: SEC + 300 });
  for (const alg of ['none', 'NONE', 'None']) {
    const token = `${enc({ alg, typ: 'JWT' })}.${payload}.`;
    for (const algorithms of [['RS256'], ['RS256', 'none'], ['none']]) {
      const o = await f.verifier({ algorithms }).verify(bearer(token));
      t.same(o, { ok: false, reason: 'algorithm_not_allowed', algorithm: alg === 'none' ? 'none' : 'other' }, `${alg} under [${algorithms.join(', ')}]`);
    }
    // The same with a signature appended by hand.
    t.equal(fail(await f.verifier().verify(bearer(`${enc({ alg })}.${payload}.${enc({ x: 1 })}`))), 'algorithm_not_allowed');
  }
  t.same(f.asks, [], 'no key was looked for');
});

t.test('HS256 signed with the RSA public key fails as algorithm_not_allowed under an asymmetric policy', async (t) => {
  const f = fixture();
  const pem = new TextEncoder().encode(await exportSPKI(rsa.publicKey));
  const jwkBytes = new TextEncoder().encode(JSON.stringify(rsaJwk));
  for (const [name, secret] of [['SPKI PEM', pem], ['JWK JSON', jwkBytes]] as const) {
    const token = await sign(secret, { alg: 'HS256' });
    t.same(await f.verifier().verify(bearer(token)), { ok: false, reason: 'algorithm_not_allowed', algorithm: 'HS256' }, name);
    // A policy listing HS256 without a secret (config refuses it) still never treats a public key as an HMAC secret.
    t.same(await f.verifier({ algorithms: ['RS256', 'HS256'] }).verify(bearer(token)), { ok: false, reason: 'algorithm_not_allowed', algorithm: 'HS256' }, `${name}, HS256 listed without a secret`);
  }
  t.same(f.asks, []);
});

t.test('HS256 with a shared secret', async (t) => {
  const secret = new TextEncoder().encode('a-shared-secret-of-at-least-32-bytes!!');
  const v = new JwtVerifier(policy({ algorithms: ['HS256'], sourceId: undefined, secret, cacheEntries: 10 }), undefined, () => T0);
  const token = await sign(secret, { alg: 'HS256', kid: null });
  t.same(await v.verify(bearer(token)), { ok: true, cached: false });
  t.same(await v.verify(bearer(token)), { ok: true, cached: true });
  t.equal(fail(await v.verify(bearer(await sign(new TextEncoder().encode('another-secret-another-secret-xx'), { alg: 'HS256', kid: null })))), 'invalid_signature');
  t.same(await v.verify(bearer(await sign(rsa.privateKey))), { ok: false, reason: 'algorithm_not_allowed', algorithm: 'RS256' }, 'an asymmetric token under a secret policy');
  t.equal(fail(await v.verify(bearer(await sign(secret, { alg: 'HS512', kid: null })))), 'algorithm_not_allowed', 'HS512 not listed');
});

t.test('bad signatures and malformed tokens', async (t) => {
  const f = fixture();
  const v = f.verifier();
  const good = await sign(rsa.privateKey);
  const [h, p, s] = good.split('.') as [string, string, string];
  const forged = await sign(rsa2.privateKey); // kid rsa-1, signed with another key
  t.equal(fail(await v.verify(bearer(forged))), 'invalid_signature', 'signed by another key under a known kid');
  const tampered = `${h}.${base64url.encode(JSON.stringify({ iss: ISS, aud: AUD, exp: SEC + 300, admin: true }))}.${s}`;
  t.equal(fail(await v.verify(bearer(tampered))), 'invalid_signature', 'payload changed');
  t.equal(fail(await v.verify(bearer(`${h}.${p}.${s.slice(0, -4)}AAAA`))), 'invalid_signature', 'signature changed');
  const cases: Array<[string, string | readonly string[] | undefined, string]> = [
    ['no header', undefined, 'missing_token'],
    ['no values', [], 'missing_token'],
    ['empty', '', 'missing_token'],
    ['another scheme', `Basic ${Buffer.from('a:b').toString('base64')}`, 'missing_token'],
    ['Bearer alone', 'Bearer', 'malformed_token'],
    ['Bearer and spaces', 'Bearer   ', 'malformed_token'],
    ['the bare token in authorization', good, 'missing_token'],
    ['two values', [bearer(good), bearer(good)], 'malformed_token'],
    ['one value in an array', [bearer(good)], 'ok'],
    ['lower-case scheme, two spaces', `bearer  ${good}`, 'ok'],
    ['two tokens', `Bearer ${good} ${good}`, 'malformed_token'],
    ['garbage', 'Bearer not-a-jwt', 'malformed_token'],
    ['two segments', `Bearer ${h}.${p}`, 'malformed_token'],
    ['five segments (JWE)', `Bearer ${h}.${p}.${s}.${s}.${s}`, 'malformed_token'],
    ['header not JSON', `Bearer ${base64url.encode('{alg')}.${p}.${s}`, 'malformed_token'],
    ['header without alg', `Bearer ${base64url.encode('{"kid":"rsa-1"}')}.${p}.${s}`, 'malformed_token'],
    ['alg not a string', `Bearer ${base64url.encode('{"alg":256}')}.${p}.${s}`, 'malformed_token'],
    ['payload not JSON', `Bearer ${h}.${base64url.encode('nope')}.${s}`, 'invalid_signature'],
    ['over 8 KiB', `Bearer ${h}.${'A'.repeat(8200)}.${s}`, 'malformed_token'],
    ['unknown crit extension', `Bearer ${base64url.encode(JSON.stringify({ alg: 'RS256', kid: 'rsa-1', crit: ['x-ext'], 'x-ext': 1 }))}.${p}.${s}`, 'malformed_token'],
  ];
  for (const [name, value, want] of cases) t.equal(fail(await v.verify(value)), want, name);
  t.same(f.asks, [], 'none of these asked for keys');
});

t.test('a token in another header: Bearer or bare', async (t) => {
  const f = fixture();
  const v = f.verifier({ header: 'x-jwt' });
  const token = await sign(rsa.privateKey);
  t.equal(fail(await v.verify(token)), 'ok', 'bare');
  t.equal(fail(await v.verify(bearer(token))), 'ok', 'Bearer');
  t.equal(fail(await v.verify(`Basic ${token}`)), 'malformed_token');
});

t.test('a properly signed payload that is not a JSON object', async (t) => {
  const f = fixture();
  const notObject = await new CompactSign(new TextEncoder().encode('[1,2]')).setProtectedHeader({ alg: 'RS256', kid: 'rsa-1' }).sign(rsa.privateKey);
  t.equal(fail(await f.verifier().verify(bearer(notObject))), 'malformed_token', 'a signed payload that is no claims set');
});

t.test('retained states validate, empty_unusable answers key_source_unavailable at once', async (t) => {
  for (const state of ['fresh', 'stale', 'refresh_failed_retained', 'quarantined_retained'] as const) {
    const f = fixture(keySet([rsaJwk], 3, state));
    t.equal(fail(await f.verifier().verify(bearer(await sign(rsa.privateKey)))), 'ok', state);
  }
  const f = fixture(keySet([], 1, 'empty_unusable'));
  const v = f.verifier({ jwksTimeoutMs: 10_000 });
  const started = performance.now();
  t.equal(fail(await v.verify(bearer(await sign(rsa.privateKey)))), 'key_source_unavailable');
  t.ok(performance.now() - started < 1000, 'without waiting for the 10 s bound');
  t.same(f.asks, [], 'empty_unusable asks for nothing: the supervisor retries on its own schedule');
  // A verifier without a store or a source has no keys either.
  t.equal(fail(await new JwtVerifier(policy(), undefined).verify(bearer(await sign(rsa.privateKey)))), 'key_source_unavailable');
  t.equal(fail(await new JwtVerifier(policy({ sourceId: undefined }), f.store).verify(bearer(await sign(rsa.privateKey)))), 'key_source_unavailable');
});

t.test('never_fetched: waits for the first push, bounded by jwksTimeoutMs', async (t) => {
  const token = await sign(rsa.privateKey);
  for (const initial of [null, keySet([], 0, 'never_fetched')]) {
    const f = fixture(initial);
    const v = f.verifier({ jwksTimeoutMs: 150 });
    const started = performance.now();
    const o = await v.verify(bearer(token));
    const elapsed = performance.now() - started;
    t.equal(fail(o), 'key_source_unavailable', `${initial === null ? 'no set yet' : 'never_fetched'}: no push within the bound`);
    t.ok(elapsed >= 140 && elapsed < 150 + 1500, `waited ${elapsed.toFixed(0)} ms for a 150 ms bound`);
    t.same(f.asks, [SRC], 'asked the supervisor once');
  }
  // The first fetch completes during the wait: the waiting request is served.
  const f = fixture(keySet([], 0, 'never_fetched'), (store) => setTimeout(() => store.update(keySet([rsaJwk], 1)), 20));
  const v = f.verifier({ jwksTimeoutMs: 5000 });
  const started = performance.now();
  const all = await Promise.all(Array.from({ length: 10 }, () => v.verify(bearer(token))));
  t.same(all.map(fail), Array(10).fill('ok'));
  t.ok(performance.now() - started < 2500, 'served at the push, not at the bound');
  t.same(f.asks, [SRC], 'ten waiting requests, one ask');
  // The first fetch fails during the wait (empty_unusable pushed): answered at the push.
  const g = fixture(keySet([], 0, 'never_fetched'), (store) => setTimeout(() => store.update(keySet([], 1, 'empty_unusable')), 20));
  const s2 = performance.now();
  t.equal(fail(await g.verifier({ jwksTimeoutMs: 5000 }).verify(bearer(token))), 'key_source_unavailable');
  t.ok(performance.now() - s2 < 2500);
});

t.test('unknown kid: 50 concurrent requests ask once; the rotated key arriving during the wait is accepted', async (t) => {
  let pushes = 0;
  const f = fixture(keySet([rsaJwk], 1), (store) =>
    setTimeout(() => {
      pushes++;
      store.update(keySet([rsaJwk, rsa2Jwk], 2));
    }, 30),
  );
  const v = f.verifier({ jwksTimeoutMs: 5000 });
  const token = await sign(rsa2.privateKey, { kid: 'rsa-2' });
  const outcomes = await Promise.all(Array.from({ length: 50 }, () => v.verify(bearer(token))));
  t.same(outcomes, Array(50).fill({ ok: true, cached: false }));
  t.same(f.asks, [SRC], 'one ask for 50 requests');
  t.equal(pushes, 1);
  t.equal(fail(await v.verify(bearer(token))), 'ok');
  t.same(f.asks, [SRC], 'a known kid asks nothing');
});

t.test('unknown kid still unknown after the refresh: missing_verification_key, unknownKid', async (t) => {
  // The supervisor within its cooldown pushes the current set again at once.
  const f = fixture(keySet([rsaJwk], 1), (store) => queueMicrotask(() => store.update(keySet([rsaJwk], 1))));
  const v = f.verifier({ jwksTimeoutMs: 5000 });
  const started = performance.now();
  const o = await v.verify(bearer(await sign(rsa2.privateKey, { kid: 'nobody' })));
  t.same(o, { ok: false, reason: 'missing_verification_key', unknownKid: true });
  t.ok(performance.now() - started < 2500, 'answered at the push');
  t.same(f.asks, [SRC]);
  // A kid the set holds, but for another algorithm: no key, and the kid is not unknown.
  const o2 = await v.verify(bearer(await sign(ec.privateKey, { alg: 'ES256', kid: 'rsa-1' })));
  t.same(o2, { ok: false, reason: 'missing_verification_key', unknownKid: false });
  t.equal(f.asks.length, 2, 'each new request may ask again: the supervisor\'s cooldown bounds the fetches');
  // No answer at all: bounded by jwksTimeoutMs.
  const g = fixture(keySet([rsaJwk], 1));
  const s2 = performance.now();
  t.same(await g.verifier({ jwksTimeoutMs: 100 }).verify(bearer(await sign(rsa2.privateKey, { kid: 'nobody' }))), { ok: false, reason: 'missing_verification_key', unknownKid: true });
  const e2 = performance.now() - s2;
  t.ok(e2 >= 90 && e2 < 100 + 1500, `waited ${e2.toFixed(0)} ms for a 100 ms bound`);
});

t.test('keys without kid: every matching key is tried', async (t) => {
  const { kid: _a, ...noKid1 } = rsaJwk;
  const { kid: _b, ...noKid2 } = rsa2Jwk;
  const f = fixture(keySet([noKid1, noKid2], 1));
  const v = f.verifier();
  t.equal(fail(await v.verify(bearer(await sign(rsa2.privateKey, { kid: null })))), 'ok', 'the second key verifies');
  t.equal(fail(await v.verify(bearer(await sign(rsa.privateKey, { kid: null })))), 'ok', 'the first key verifies');
  const other = await generateKeyPair('RS256');
  t.equal(fail(await v.verify(bearer(await sign(other.privateKey, { kid: null })))), 'invalid_signature', 'no key verifies');
  t.equal(fail(await v.verify(bearer(await sign(rsa2.privateKey, { kid: null, claims: { iss: 'x' } })))), 'issuer_mismatch', 'a claim error after the good key');
});

t.test('the cache of verified tokens', async (t) => {
  t.test('a hit skips the keys, cached: true', async (t) => {
    const f = fixture();
    const v = f.verifier({ cacheEntries: 100 });
    const token = await sign(rsa.privateKey);
    t.same(await v.verify(bearer(token)), { ok: true, cached: false });
    t.same(await v.verify(bearer(token)), { ok: true, cached: true });
    // Same version pushed again without keys (not a real push: it shows the answer reads no key).
    f.store.update(keySet([], 1));
    t.same(await v.verify(bearer(token)), { ok: true, cached: true }, 'no key consulted');
    t.same(await v.verify(bearer(await sign(ec.privateKey, { alg: 'ES256', kid: 'ec-1' }))), { ok: false, reason: 'key_source_unavailable' }, 'an uncached token needs keys');
  });
  t.test('bounded, least recently used out first', async (t) => {
    const f = fixture();
    const v = f.verifier({ cacheEntries: 2 });
    const [a, b, c] = await Promise.all([1, 2, 3].map((n) => sign(rsa.privateKey, { claims: { sub: `u${n}` } }))) as [string, string, string];
    for (const x of [a, b]) t.same(await v.verify(bearer(x)), { ok: true, cached: false });
    t.same(await v.verify(bearer(a)), { ok: true, cached: true }, 'a is now the most recent');
    t.same(await v.verify(bearer(c)), { ok: true, cached: false }, 'c evicts b');
    t.same(await v.verify(bearer(a)), { ok: true, cached: true });
    t.same(await v.verify(bearer(c)), { ok: true, cached: true });
    t.same(await v.verify(bearer(b)), { ok: true, cached: false }, 'b was evicted');
  });
  t.test('a cached token past exp + skew is token_expired without crypto', async (t) => {
    const f = fixture();
    const v = f.verifier({ cacheEntries: 10, clockSkewMs: 5000 });
    const token = await sign(rsa.privateKey, { claims: { exp: SEC + 60 } });
    t.same(await v.verify(bearer(token)), { ok: true, cached: false });
    f.clock.now = T0 + 64_000;
    t.same(await v.verify(bearer(token)), { ok: true, cached: true }, 'exp + skew not reached');
    f.store.update(keySet([], 1)); // as above: no key could answer now
    f.clock.now = T0 + 65_000;
    t.same(await v.verify(bearer(token)), { ok: false, reason: 'token_expired' }, 'answered by the entry');
    t.same(await v.verify(bearer(token)), { ok: false, reason: 'key_source_unavailable' }, 'the entry is gone');
  });
  t.test('a new set version invalidates; the same version pushed again does not', async (t) => {
    const f = fixture();
    const v = f.verifier({ cacheEntries: 10 });
    const token = await sign(rsa.privateKey);
    await v.verify(bearer(token));
    f.store.update(keySet([rsaJwk, ecJwk], 1, 'stale'));
    t.same(await v.verify(bearer(token)), { ok: true, cached: true }, 'same version (stale now)');
    f.store.update(keySet([rsaJwk], 2));
    t.same(await v.verify(bearer(token)), { ok: true, cached: false }, 'verified again under version 2');
    t.same(await v.verify(bearer(token)), { ok: true, cached: true });
    f.store.update(keySet([rsa2Jwk], 3)); // rsa-1 rotated out
    t.equal(fail(await v.verify(bearer(token))), 'missing_verification_key', 'a removed key is not served from the cache');
  });
  t.test('not cached: tokens without exp, failures, a cache of 0', async (t) => {
    const f = fixture();
    const v = f.verifier({ cacheEntries: 10 });
    const noExp = await sign(rsa.privateKey, { bare: true, claims: { iss: ISS, aud: AUD } });
    t.same(await v.verify(bearer(noExp)), { ok: true, cached: false });
    t.same(await v.verify(bearer(noExp)), { ok: true, cached: false }, 'no exp, no entry');
    const wrongAud = await sign(rsa.privateKey, { claims: { aud: 'x' } });
    for (let i = 0; i < 2; i++) t.equal(fail(await v.verify(bearer(wrongAud))), 'audience_mismatch');
    const off = f.verifier({ cacheEntries: 0 });
    const token = await sign(rsa.privateKey);
    for (let i = 0; i < 2; i++) t.same(await off.verify(bearer(token)), { ok: true, cached: false });
  });
  t.test('one verifier\'s cache is not another\'s policy', async (t) => {
    const f = fixture();
    const token = await sign(rsa.privateKey);
    await f.verifier({ cacheEntries: 10 }).verify(bearer(token));
    t.equal(fail(await f.verifier({ cacheEntries: 10, audiences: ['other'] }).verify(bearer(token))), 'audience_mismatch');
  });
});

t.test('verifyNow: decided without waiting by the header or the cache, undefined when a signature must be checked', async (t) => {
  const f = fixture();
  const v = f.verifier({ cacheEntries: 10, clockSkewMs: 0 });
  const token = await sign(rsa.privateKey, { claims: { exp: SEC + 60 } });
  t.same(v.verifyNow(undefined), { ok: false, reason: 'missing_token' }, 'no header');
  t.same(v.verifyNow([bearer(token), bearer(token)]), { ok: false, reason: 'malformed_token' }, 'two values');
  t.equal(v.verifyNow(bearer(token)), undefined, 'not verified yet: a signature to check');
  t.same(await v.verify(bearer(token)), { ok: true, cached: false });
  t.same(v.verifyNow(bearer(token)), { ok: true, cached: true }, 'a hit, synchronously');
  f.clock.now = T0 + 61_000;
  t.same(v.verifyNow(bearer(token)), { ok: false, reason: 'token_expired' }, 'past exp: expired, synchronously');
  t.equal(v.verifyNow(bearer(token)), undefined, 'the entry is gone');
  const uncached = f.verifier({ cacheEntries: 0 });
  await uncached.verify(bearer(token));
  t.equal(uncached.verifyNow(bearer(token)), undefined, 'no cache: always a signature to check');
});
