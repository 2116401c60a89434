// JWKS sources: the state policy and the key-set reader as tables; then the supervisor's
// JwksSources against a real HTTPS JWKS endpoint with a private CA, on loopback.
import t from 'tap';
import type { Test } from 'tap';
import net from 'node:net';
import { generateKeyPairSync } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { exportJWK, generateKeyPair, generateSecret } from 'jose';
import type { JWK } from 'jose';
import { JwksSources } from '../src/index.ts';
import { jwksSourceId } from '../src/source-id.ts';
import { afterFetch, observedState, retryDelayMs } from '../src/jwks-state.ts';
import type { StoredJwksState } from '../src/jwks-state.ts';
import { readKeySet } from '../src/jwks-key-set.ts';
import { JWKS_MAX_BODY_BYTES } from '../src/jwks-fetch.ts';
import type { JwksFailureReason, JwksKeySet, JwksSourceSpec, JwksState } from '../src/types.ts';
import { JwksServer } from './support/jwks-server.ts';
import type { Answer } from './support/jwks-server.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-jwks-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

async function publicJwk(alg: 'RS256' | 'ES256', kid: string): Promise<{ pub: JWK; priv: JWK }> {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true });
  return { pub: { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' }, priv: { ...(await exportJWK(privateKey)), kid, alg } };
}

const rsaA = await publicJwk('RS256', 'a-rsa');
const ecA = await publicJwk('ES256', 'a-ec');
const rsaB = await publicJwk('RS256', 'b-rsa');
// jose will not make (nor verify with) an RSA key under 2048 bits: node:crypto makes this one.
const small = { ...(generateKeyPairSync('rsa', { modulusLength: 1024 }).publicKey.export({ format: 'jwk' }) as JWK), kid: 'small', alg: 'RS256' };
const setA = { keys: [rsaA.pub, ecA.pub] };
const setB = { keys: [rsaB.pub] };
const withPrivate = { keys: [rsaA.pub, ecA.priv] };
const hs = { ...(await exportJWK(await generateSecret('HS256', { extractable: true }))), kid: 'hs' };
const huge = Buffer.alloc(Math.floor(JWKS_MAX_BODY_BYTES * 1.5), ' ');
huge.write('{"keys":[]}');

const server = await JwksServer.start(dir);
t.teardown(() => server.close());

const kids = (set: { keys: readonly JWK[] }): (string | undefined)[] => set.keys.map((k) => k.kid);

// ---- pure policy -------------------------------------------------------------------------------

t.test('afterFetch: every stored state × success, transport failure, refused document', async (t) => {
  const states: StoredJwksState[] = ['never_fetched', 'fresh', 'refresh_failed_retained', 'quarantined_retained', 'empty_unusable'];
  const got = states.map((s) => [s, afterFetch(s, undefined), afterFetch(s, 'timeout'), afterFetch(s, 'no_usable_keys')]);
  t.same(got, [
    ['never_fetched', 'fresh', 'empty_unusable', 'empty_unusable'],
    ['fresh', 'fresh', 'refresh_failed_retained', 'quarantined_retained'],
    ['refresh_failed_retained', 'fresh', 'refresh_failed_retained', 'quarantined_retained'],
    ['quarantined_retained', 'fresh', 'refresh_failed_retained', 'quarantined_retained'],
    ['empty_unusable', 'fresh', 'empty_unusable', 'empty_unusable'],
  ]);
  const transport: JwksFailureReason[] = ['timeout', 'connect_error', 'tls_error', 'http_status', 'too_large'];
  const document: JwksFailureReason[] = ['invalid_json', 'invalid_key_set', 'no_usable_keys'];
  t.same(transport.map((r) => afterFetch('fresh', r)), transport.map(() => 'refresh_failed_retained'));
  t.same(document.map((r) => afterFetch('fresh', r)), document.map(() => 'quarantined_retained'));
});

t.test('observedState: keys older than stale_after_ms are stale in every state that holds keys', async (t) => {
  const rows: [StoredJwksState, number, JwksState][] = [
    ['fresh', 10_000, 'fresh'],
    ['fresh', 10_001, 'stale'],
    ['refresh_failed_retained', 10_001, 'stale'],
    ['quarantined_retained', 10_001, 'stale'],
    ['refresh_failed_retained', 9_999, 'refresh_failed_retained'],
    ['never_fetched', 99_999, 'never_fetched'],
    ['empty_unusable', 99_999, 'empty_unusable'],
  ];
  for (const [stored, age, want] of rows) t.equal(observedState(stored, 1_000, 10_000, 1_000 + age), want, `${stored} at age ${age}`);
});

t.test('retryDelayMs: 1 s doubling, capped at min(interval, 60 s), ±10 % jitter', async (t) => {
  const mid = (): number => 0.5;
  t.same([1, 2, 3, 4, 5, 6, 7, 8, 20, 2000].map((n) => retryDelayMs(n, 300_000, mid)), [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000, 60_000]);
  t.same([1, 2, 3, 4].map((n) => retryDelayMs(n, 5_000, mid)), [1000, 2000, 4000, 5000], 'the refresh interval caps it when shorter');
  t.same([1, 2].map((n) => retryDelayMs(n, 300, mid)), [300, 300], 'an interval under 1 s is the whole backoff');
  t.equal(retryDelayMs(3, 300_000, () => 0), 3600, '-10 %');
  t.equal(retryDelayMs(3, 300_000, () => 0.999_999), 4400, '+10 %');
});

t.test('readKeySet: usable keys kept (public members only), each refusal has its reason', async (t) => {
  const enc = (v: unknown): Uint8Array => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v));
  const ok = await readKeySet(enc(setA));
  t.ok(ok.ok);
  if (ok.ok) {
    t.same(kids(ok), ['a-rsa', 'a-ec']);
    t.same(ok.keys[0], rsaA.pub, 'the JWK as published');
  }
  const noAlg = await readKeySet(enc({ keys: [{ ...rsaA.pub, alg: undefined, x5c: ['MIIB...'], key_ops: ['verify'] }, { ...ecA.pub, alg: undefined }] }));
  t.same(noAlg.ok && noAlg.keys.map((k) => Object.keys(k).sort()), [['e', 'kid', 'kty', 'n', 'use'], ['crv', 'kid', 'kty', 'use', 'x', 'y']], 'no alg: checked under the kty/curve default; unknown members dropped');
  const ignored = await readKeySet(enc({ keys: [hs, { ...rsaB.pub, use: 'enc' }, { ...rsaB.pub, alg: 'RSA-OAEP' }, { ...rsaB.pub, alg: 'ES256' }, small, { kty: 'RSA', n: 'x' }, 42, null, rsaA.pub] }));
  t.same(ignored.ok && kids(ignored), ['a-rsa'], 'oct, use≠sig, a non-JWS alg, an alg of another kty, RSA < 2048 bits, malformed entries: ignored');
  const rows: [string, unknown, JwksFailureReason][] = [
    ['garbage', 'not json{', 'invalid_json'],
    ['not UTF-8', Buffer.from([0x7b, 0xff, 0x7d]), 'invalid_json'],
    ['no keys member', { issuer: 'x' }, 'invalid_key_set'],
    ['keys not an array', { keys: {} }, 'invalid_key_set'],
    ['an array', [rsaA.pub], 'invalid_key_set'],
    ['an EC private key', withPrivate, 'invalid_key_set'],
    ['an RSA private key', { keys: [rsaA.priv] }, 'invalid_key_set'],
    ['an empty set', { keys: [] }, 'no_usable_keys'],
    ['only an oct key', { keys: [hs] }, 'no_usable_keys'],
  ];
  for (const [name, body, reason] of rows) {
    const r = await readKeySet(Buffer.isBuffer(body) ? body : enc(body));
    t.same(r, { ok: false, reason }, name);
  }
});

// ---- JwksSources over HTTPS --------------------------------------------------------------------

interface LogLine {
  readonly level: 'info' | 'warn';
  readonly obj: Record<string, unknown>;
  readonly msg: string;
}

interface Harness {
  readonly sources: JwksSources;
  readonly sets: JwksKeySet[];
  readonly logs: LogLine[];
  readonly refreshes: { id: string; result: string; reason: JwksFailureReason | undefined; at: number }[];
  /** The next pushed set that satisfies `pred` (arm it before causing the push). */
  nextSet(pred?: (s: JwksKeySet) => boolean, ms?: number): Promise<JwksKeySet>;
  /** The next completed fetch attempt. */
  nextRefresh(ms?: number): Promise<{ result: string; reason: JwksFailureReason | undefined; at: number }>;
}

function harness(t: Test, now?: () => number, monotonicNow?: () => number): Harness {
  const events = new EventEmitter();
  const sets: JwksKeySet[] = [];
  const logs: LogLine[] = [];
  const refreshes: Harness['refreshes'] = [];
  const sources = new JwksSources({
    onKeySet: (s) => {
      sets.push(s);
      events.emit('set', s);
    },
    log: {
      info: (obj, msg) => logs.push({ level: 'info', obj: obj as Record<string, unknown>, msg }),
      warn: (obj, msg) => logs.push({ level: 'warn', obj: obj as Record<string, unknown>, msg }),
    },
    onRefresh: (id, result, reason) => {
      const r = { id, result, reason, at: performance.now() };
      refreshes.push(r);
      events.emit('refresh', r);
    },
    // An injected clock drives both unless a monotonic one is given: the tests that move it move the cooldown too.
    ...(now ? { now, monotonicNow: monotonicNow ?? now } : {}),
  });
  t.teardown(() => sources.close());
  const next = <T>(event: string, pred: (v: T) => boolean, ms: number): Promise<T> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        events.off(event, on);
        reject(new Error(`no '${event}' within ${ms} ms`));
      }, ms);
      const on = (v: T): void => {
        if (!pred(v)) return;
        clearTimeout(timer);
        events.off(event, on);
        resolve(v);
      };
      events.on(event, on);
    });
  return {
    sources, sets, logs, refreshes,
    nextSet: (pred = () => true, ms = 5_000) => next('set', pred, ms),
    nextRefresh: (ms = 5_000) => next('refresh', () => true, ms),
  };
}

let specs = 0;
/** A spec for a fresh URL on `server` (its own id), trusting the test CA. */
function spec(o: Partial<JwksSourceSpec> & { pathAndQuery?: string; userinfo?: string } = {}): JwksSourceSpec {
  const url = o.url ?? server.url(o.pathAndQuery ?? `/jwks/${++specs}`, o.userinfo);
  const caPems = 'caPems' in o ? o.caPems : [server.caPem];
  return { id: jwksSourceId(url, caPems ?? []), url, refreshIntervalMs: 60_000, timeoutMs: 2_000, staleAfterMs: 3_600_000, unknownKidCooldownMs: 0, ...o, caPems };
}

/** Sets the server's answer, asks for a refresh and returns the set pushed after it. */
async function refreshWith(h: Harness, id: string, answer: Answer): Promise<JwksKeySet> {
  server.answer = answer;
  const pushed = h.nextSet();
  h.sources.requestRefresh(id);
  return pushed;
}

const transitions = (h: Harness): unknown[] => h.logs.map((l) => [l.level, l.obj.previous_state, l.obj.state, l.obj.reason]);

t.test('never_fetched → fresh, then each failure kind keeps the keys and names its reason', async (t) => {
  const h = harness(t);
  const s = spec({ timeoutMs: 500 });
  server.answer = { kind: 'json', body: setA };
  const first = h.nextSet();
  h.sources.configure([s]);
  t.match(h.sources.views(), [{ jwks_source_id: s.id, state: 'never_fetched', active_keys: 0, age_seconds: null, last_refresh_success_unix_ms: null }]);
  t.ok(h.sources.views()[0]!.last_refresh_attempt_unix_ms !== null, 'the first fetch started at once');
  t.same(h.sources.keySets(), [{ sourceId: s.id, state: 'never_fetched', keys: [], fetchedAtMs: 0, version: 0 }]);
  const set1 = await first;
  t.same([set1.state, kids(set1), set1.version], ['fresh', ['a-rsa', 'a-ec'], 1]);
  t.equal(server.seen.at(-1)!.headers.accept, 'application/json');

  const steps: [string, Answer, JwksState, JwksFailureReason][] = [
    ['500', { kind: 'status', status: 500 }, 'refresh_failed_retained', 'http_status'],
    ['garbage', { kind: 'raw', body: '<html>oops' }, 'quarantined_retained', 'invalid_json'],
    ['a private key', { kind: 'json', body: withPrivate }, 'quarantined_retained', 'invalid_key_set'],
    ['an empty set', { kind: 'json', body: { keys: [] } }, 'quarantined_retained', 'no_usable_keys'],
    ['no keys array', { kind: 'json', body: { jwks: [] } }, 'quarantined_retained', 'invalid_key_set'],
    ['a 302 (not followed)', { kind: 'status', status: 302, headers: { location: '/elsewhere' } }, 'refresh_failed_retained', 'http_status'],
    ['1.5 MiB with content-length', { kind: 'raw', body: huge }, 'refresh_failed_retained', 'too_large'],
    ['1.5 MiB chunked', { kind: 'chunked', body: huge }, 'refresh_failed_retained', 'too_large'],
    ['a hang', { kind: 'hang' }, 'refresh_failed_retained', 'timeout'],
  ];
  for (const [name, answer, state, reason] of steps) {
    const fetches = server.fetches;
    const set = await refreshWith(h, s.id, answer);
    t.same([set.state, kids(set), set.version], [state, ['a-rsa', 'a-ec'], 1], `${name}: ${state}, set A retained`);
    t.same(h.sources.keySets(), [set], `${name}: keySets() says the same`);
    t.same([h.refreshes.at(-1)!.result, h.refreshes.at(-1)!.reason, h.sources.views()[0]!.last_failure_reason], ['failure', reason, reason], `${name}: ${reason}`);
    t.equal(server.fetches, fetches + 1, `${name}: one fetch`);
  }
  t.notOk(server.seen.some((r) => r.url === '/elsewhere'), 'the redirect was not followed');
  t.match(h.sources.views()[0], { state: 'refresh_failed_retained', active_keys: 2, consecutive_failures: steps.length, refresh_success_total: 1, refresh_failure_total: steps.length });

  const setB1 = await refreshWith(h, s.id, { kind: 'json', body: setB });
  t.same([setB1.state, kids(setB1), setB1.version], ['fresh', ['b-rsa'], 2], 'a success replaces the keys: version 2');
  const setB2 = await refreshWith(h, s.id, { kind: 'json', body: setB });
  t.same([setB2.state, setB2.version], ['fresh', 2], 'the same keys again: version unchanged (pushed because asked)');
  t.match(h.sources.views()[0], { consecutive_failures: 0, last_failure_reason: 'timeout', refresh_success_total: 3 });

  t.same(transitions(h), [
    ['info', 'never_fetched', 'fresh', undefined],
    ['warn', 'fresh', 'refresh_failed_retained', 'http_status'],
    ['warn', 'refresh_failed_retained', 'quarantined_retained', 'invalid_json'],
    ['warn', 'quarantined_retained', 'refresh_failed_retained', 'http_status'],
    ['info', 'refresh_failed_retained', 'fresh', undefined],
  ], 'one line per transition, none for a failure that keeps the state');
});

t.test('a first fetch that fails is empty_unusable whatever the reason; a success then makes it fresh', async (t) => {
  const closedPort = await new Promise<number>((resolve) => {
    const probe = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as net.AddressInfo;
      probe.close(() => resolve(port));
    });
  });
  const rows: [string, Answer, Partial<JwksSourceSpec>, JwksFailureReason][] = [
    ['500', { kind: 'status', status: 500 }, {}, 'http_status'],
    ['garbage', { kind: 'raw', body: 'garbage' }, {}, 'invalid_json'],
    ['a private key', { kind: 'json', body: withPrivate }, {}, 'invalid_key_set'],
    ['an empty set', { kind: 'json', body: { keys: [] } }, {}, 'no_usable_keys'],
    ['an untrusted certificate (no caPems: system CAs)', { kind: 'json', body: setA }, { caPems: undefined }, 'tls_error'],
    ['a closed port', { kind: 'json', body: setA }, { url: `https://127.0.0.1:${closedPort}/jwks` }, 'connect_error'],
  ];
  for (const [name, answer, o, reason] of rows) {
    const h = harness(t);
    const s = spec(o);
    server.answer = answer;
    const pushed = h.nextSet();
    h.sources.configure([s]);
    h.sources.requestRefresh(s.id);
    const set = await pushed;
    t.same([set.state, set.keys, set.version, h.refreshes.map((r) => r.reason)], ['empty_unusable', [], 0, [reason]], `${name}: empty_unusable (${reason})`);
    t.same(transitions(h), [['warn', 'never_fetched', 'empty_unusable', reason]]);
    h.sources.close();
  }

  const h = harness(t);
  const s = spec();
  server.answer = { kind: 'status', status: 503 };
  const pushed = h.nextSet();
  h.sources.configure([s]);
  h.sources.requestRefresh(s.id);
  await pushed;
  const again = await refreshWith(h, s.id, { kind: 'raw', body: '{' });
  t.same([again.state, h.sources.views()[0]!.consecutive_failures, h.sources.views()[0]!.last_failure_reason], ['empty_unusable', 2, 'invalid_json'], 'a second failure stays empty_unusable');
  const fresh = await refreshWith(h, s.id, { kind: 'json', body: setA });
  t.same([fresh.state, kids(fresh), fresh.version], ['fresh', ['a-rsa', 'a-ec'], 1]);
  t.same(transitions(h), [['warn', 'never_fetched', 'empty_unusable', 'http_status'], ['info', 'empty_unusable', 'fresh', undefined]]);
});

t.test('stale (fake clock): read without a fetch, from fresh and both retained states; left only by a success', async (t) => {
  let clock = 1_700_000_000_000;
  const h = harness(t, () => clock);
  const s = spec({ staleAfterMs: 10_000 });
  const fetchA = async (): Promise<void> => {
    const set = await refreshWith(h, s.id, { kind: 'json', body: setA });
    t.equal(set.state, 'fresh');
  };
  server.answer = { kind: 'json', body: setA };
  const first = h.nextSet();
  h.sources.configure([s]);
  t.equal((await first).fetchedAtMs, clock);

  clock += 10_000;
  t.equal(h.sources.views()[0]!.state, 'fresh', 'exactly stale_after_ms old: not older');
  clock += 1;
  t.match(h.sources.views(), [{ state: 'stale', active_keys: 2, age_seconds: 10.001 }], 'fresh → stale with no fetch');
  t.same(h.sources.keySets().map((k) => [k.state, kids(k)]), [['stale', ['a-rsa', 'a-ec']]], 'the keys still validate');

  const failed = await refreshWith(h, s.id, { kind: 'status', status: 500 });
  t.same([failed.state, kids(failed)], ['stale', ['a-rsa', 'a-ec']], 'a failure does not leave stale');
  const quarantined = await refreshWith(h, s.id, { kind: 'raw', body: 'x' });
  t.equal(quarantined.state, 'stale', 'nor does a refused set');
  await fetchA();

  await refreshWith(h, s.id, { kind: 'status', status: 500 });
  t.equal(h.sources.views()[0]!.state, 'refresh_failed_retained');
  clock += 10_001;
  t.equal(h.sources.views()[0]!.state, 'stale', 'refresh_failed_retained → stale');
  await fetchA();

  await refreshWith(h, s.id, { kind: 'json', body: { keys: [] } });
  t.equal(h.sources.views()[0]!.state, 'quarantined_retained');
  clock += 10_001;
  t.match(h.sources.keySets(), [{ state: 'stale', keys: setA.keys }], 'quarantined_retained → stale, set A kept');
  await fetchA();
  t.equal(h.sources.views()[0]!.age_seconds, 0);

  // The fake clock jumps past the stale timer (armed for 10 s of real time), so a transition to
  // stale is reported by the next fetch that observes it (or not at all when a success comes
  // first); under the real clock the timer reports it (next test).
  t.same(transitions(h), [
    ['info', 'never_fetched', 'fresh', undefined],
    ['warn', 'fresh', 'stale', 'http_status'],
    ['info', 'stale', 'fresh', undefined],
    ['warn', 'fresh', 'refresh_failed_retained', 'http_status'],
    ['info', 'refresh_failed_retained', 'fresh', undefined],
    ['warn', 'fresh', 'quarantined_retained', 'no_usable_keys'],
    ['info', 'quarantined_retained', 'fresh', undefined],
  ]);
});

t.test('stale (real clock): a timer pushes the set and logs when the keys turn stale; configure() applies a new stale_after_ms at once', async (t) => {
  const h = harness(t);
  const s = spec({ staleAfterMs: 300 });
  server.answer = { kind: 'json', body: setA };
  const before = server.fetches;
  const fresh = h.nextSet();
  h.sources.configure([s]);
  const f = await fresh;
  // Under load the stale push may come before this line runs: look at what was pushed first.
  const stale = h.sets.find((k) => k.state === 'stale') ?? (await h.nextSet((k) => k.state === 'stale', 3_000));
  t.same([stale.state, kids(stale), stale.version], ['stale', ['a-rsa', 'a-ec'], 1], 'pushed without a fetch');
  t.ok(Date.now() - f.fetchedAtMs > 300, 'not before stale_after_ms');
  t.equal(server.fetches - before, 1);
  t.same(transitions(h).at(-1), ['warn', 'fresh', 'stale', undefined]);

  const s2 = { ...s, staleAfterMs: 3_600_000 };
  const backToFresh = h.nextSet();
  h.sources.configure([s2]);
  t.equal((await backToFresh).state, 'fresh', 'a longer stale_after_ms: fresh again, pushed');
  await refreshWith(h, s.id, { kind: 'status', status: 500 });
  t.equal(h.sources.views()[0]!.state, 'refresh_failed_retained');
  const toStale = h.nextSet();
  h.sources.configure([{ ...s2, staleAfterMs: 1 }]);
  t.match(await toStale, { state: 'stale', keys: setA.keys }, 'refresh_failed_retained → stale, pushed');
  t.same(transitions(h).slice(-3), [['info', 'stale', 'fresh', undefined], ['warn', 'fresh', 'refresh_failed_retained', 'http_status'], ['warn', 'refresh_failed_retained', 'stale', undefined]]);
  t.equal(server.fetches - before, 2);
});

t.test('unknown kid: 100 requests join the fetch in flight; within the cooldown none fetches; after it one does', async (t) => {
  let clock = 1_700_000_000_000;
  const h = harness(t, () => clock);
  const s = spec({ unknownKidCooldownMs: 10_000 });
  server.answer = { kind: 'json', body: setA };
  const before = server.fetches;
  const first = h.nextSet();
  h.sources.configure([s]);
  for (let i = 0; i < 100; i++) h.sources.requestRefresh(s.id);
  await first;
  t.equal(server.fetches - before, 1, 'one fetch for the first fetch and 100 requests in flight');
  t.equal(h.sets.length, 1, 'one push when it completed');

  clock += 9_999;
  for (let i = 0; i < 100; i++) h.sources.requestRefresh(s.id);
  t.equal(h.sets.length, 101, 'within the cooldown each request is answered at once with the current set');
  t.ok(h.sets.slice(1).every((k) => k.state === 'fresh' && k.version === 1));
  t.equal(h.sources.views()[0]!.last_refresh_attempt_unix_ms, clock - 9_999, 'and starts no fetch');

  clock += 1;
  server.answer = { kind: 'json', body: setB };
  const rotated = h.nextSet();
  h.sources.requestRefresh(s.id);
  h.sources.requestRefresh('jwks-000000000000');
  const r = await rotated;
  t.same([r.version, kids(r)], [2, ['b-rsa']], 'after the cooldown one fetch: the new kid is there');
  t.equal(server.fetches - before, 2, 'two fetches in all');
  t.equal(h.refreshes.length, 2);

  const failing = harness(t, () => clock);
  const f = spec({ unknownKidCooldownMs: 10_000 });
  server.answer = { kind: 'status', status: 500 };
  const empty = failing.nextSet();
  failing.sources.configure([f]);
  failing.sources.requestRefresh(f.id);
  await empty;
  const n = server.fetches;
  for (let i = 0; i < 100; i++) failing.sources.requestRefresh(f.id);
  t.equal(failing.sets.length, 101, 'empty_unusable within the cooldown: answered at once, no fetch');
  t.ok(failing.sets.every((k) => k.state === 'empty_unusable'));
  clock += 10_000;
  server.answer = { kind: 'json', body: setA };
  const recovered = failing.nextSet();
  failing.sources.requestRefresh(f.id);
  t.equal((await recovered).state, 'fresh');
  t.equal(server.fetches, n + 1);
});

t.test('unknown kid: the cooldown runs on the monotonic clock; a wall clock stepped back an hour does not hold off the fetch', async (t) => {
  let wall = 1_700_000_000_000;
  let mono = 5_000;
  const h = harness(t, () => wall, () => mono);
  const s = spec({ unknownKidCooldownMs: 10_000 });
  server.answer = { kind: 'json', body: setA };
  const before = server.fetches;
  const first = h.nextSet();
  h.sources.configure([s]);
  await first;
  wall -= 3_600_000;
  mono += 10_000;
  server.answer = { kind: 'json', body: setB };
  const rotated = h.nextSet();
  h.sources.requestRefresh(s.id);
  const r = await rotated;
  t.equal(server.fetches - before, 2, 'the cooldown had passed on the monotonic clock: a second fetch');
  t.same([r.version, kids(r)], [2, ['b-rsa']], 'the rotated key is there');
});

t.test('timeout: a hanging endpoint fails within timeout_ms plus a margin, and the connection is closed', async (t) => {
  const h = harness(t);
  const s = spec({ timeoutMs: 400 });
  server.answer = { kind: 'hang' };
  const requested = once(server, 'request');
  const done = h.nextRefresh();
  const start = performance.now();
  h.sources.configure([s]);
  await requested;
  const r = await done;
  const elapsed = r.at - start;
  t.equal(r.reason, 'timeout');
  t.ok(elapsed >= 390 && elapsed < 400 + 600, `ended after ${Math.round(elapsed)} ms (timeout 400 ms)`);
  await server.seen.at(-1)!.closed;
});

t.test('configure(): a known id keeps its state; a removed id stops (no more fetches, in-flight fetch aborted)', async (t) => {
  const h = harness(t);
  const s = spec();
  server.answer = { kind: 'json', body: setA };
  const first = h.nextSet();
  h.sources.configure([s]);
  await first;
  const fetches = server.fetches;
  const withoutAge = (): unknown[] => h.sources.views().map((v) => ({ ...v, age_seconds: 'real clock' }));
  const view = withoutAge();
  h.sources.configure([{ ...s, refreshIntervalMs: 30_000, timeoutMs: 1_000 }]);
  h.sources.configure([{ ...s, refreshIntervalMs: 30_000, timeoutMs: 1_000 }]);
  t.same(withoutAge(), view, 'same state, keys, counters; no fetch started');
  t.equal(h.sets.length, 1, 'nothing pushed');

  // A short interval: refreshes run on schedule (from the end of the last fetch) ...
  const seen: number[] = [];
  const twoMore = new Promise<void>((resolve) => {
    const onRequest = (): void => {
      seen.push(performance.now());
      if (seen.length < 2) return;
      server.off('request', onRequest);
      resolve();
    };
    server.on('request', onRequest);
  });
  h.sources.configure([{ ...s, refreshIntervalMs: 150 }]);
  await twoMore;
  t.ok(seen[1]! - seen[0]! >= 140, `the next refresh a refresh interval later (${Math.round(seen[1]! - seen[0]!)} ms)`);
  t.equal(h.sources.views()[0]!.state, 'fresh');
  t.equal(h.sets.length, 1, 'unchanged keys are not pushed again');
  // ... until the source is removed.
  h.sources.configure([]);
  const after = server.fetches;
  t.same([h.sources.views(), h.sources.keySets()], [[], []]);
  // The absence of an event: wait out four intervals.
  await new Promise((resolve) => setTimeout(resolve, 600));
  t.equal(server.fetches, after, 'no fetch in 4 intervals after removal');
  t.ok(fetches < after);

  // An in-flight fetch of a removed source is aborted: the server sees the connection close,
  // and it is neither counted nor logged.
  const hanging = spec({ timeoutMs: 30_000 });
  server.answer = { kind: 'hang' };
  const requested = once(server, 'request');
  const refreshes = h.refreshes.length;
  const logs = h.logs.length;
  h.sources.configure([hanging]);
  await requested;
  h.sources.configure([]);
  await server.seen.at(-1)!.closed;
  t.equal(h.refreshes.length, refreshes);
  t.equal(h.logs.length, logs);
});

t.test('after a failure the retry backs off (capped by a short refresh interval), not at the interval of a success', async (t) => {
  const h = harness(t);
  const s = spec({ refreshIntervalMs: 250 });
  server.answer = { kind: 'status', status: 500 };
  const at: number[] = [];
  const three = new Promise<void>((resolve) => {
    const on = (): void => {
      at.push(performance.now());
      if (at.length === 3) {
        server.off('request', on);
        resolve();
      }
    };
    server.on('request', on);
  });
  h.sources.configure([s]);
  await three;
  for (let i = 1; i < 3; i++) t.ok(at[i]! - at[i - 1]! >= 250 * 0.9 - 10, `retry ${i} after ${Math.round(at[i]! - at[i - 1]!)} ms (min(1 s, 250 ms) ± 10 %)`);
  t.match(h.sources.views()[0], { state: 'empty_unusable', last_failure_reason: 'http_status' });
  t.ok(h.sources.views()[0]!.consecutive_failures >= 2);
});

t.test('no log line, view or key set carries the URL, its credentials or query, a body or a key', async (t) => {
  const h = harness(t);
  const secret = spec({ pathAndQuery: '/jwks?token=SECRET', userinfo: 'user:pass@' });
  const never = spec({ pathAndQuery: '/other?token=SECRET', userinfo: 'user:pass@' });
  server.answer = { kind: 'json', body: setA };
  const first = h.nextSet();
  h.sources.configure([secret]);
  await first;
  const seen = server.seen.at(-1)!;
  t.equal(seen.url, '/jwks?token=SECRET', 'the URL is fetched as configured');
  t.equal(seen.headers.authorization, `Basic ${Buffer.from('user:pass').toString('base64')}`, 'its credentials sent as basic auth');
  await refreshWith(h, secret.id, { kind: 'status', status: 500 });
  await refreshWith(h, secret.id, { kind: 'raw', body: 'SECRET body' });
  await refreshWith(h, secret.id, { kind: 'json', body: withPrivate });
  const stale = h.nextSet();
  h.sources.configure([{ ...secret, staleAfterMs: 1 }]);
  await stale;
  await refreshWith(h, secret.id, { kind: 'json', body: setB });
  server.answer = { kind: 'raw', body: 'SECRET' };
  const empty = h.nextSet();
  h.sources.configure([secret, never]);
  h.sources.requestRefresh(never.id);
  await empty;

  t.same(new Set(h.logs.map((l) => l.obj.state)), new Set(['fresh', 'refresh_failed_retained', 'quarantined_retained', 'stale', 'empty_unusable']), 'every warning state logged');
  const forbidden = ['SECRET', 'token', 'user', 'pass', '127.0.0.1', '/jwks', '/other', String(rsaA.pub.n).slice(0, 16), String(ecA.priv.d)];
  for (const l of h.logs) {
    t.same(Object.keys(l.obj).filter((k) => !['jwks_source_id', 'state', 'previous_state', 'reason'].includes(k)), [], `only the allowed fields (${l.msg})`);
    const text = JSON.stringify(l);
    for (const f of forbidden) t.notOk(text.includes(f), `log line "${l.msg}" does not contain ${f}`);
  }
  const port = new URL(secret.url).port;
  t.same(h.sources.views().map((v) => v.jwks_endpoint), [`https://127.0.0.1:${port}/jwks`, `https://127.0.0.1:${port}/other`], 'views: the sanitized endpoint only');
  const text = JSON.stringify([h.sources.views(), h.sources.keySets(), h.sets]);
  for (const f of ['SECRET', 'token', 'user:', 'pass', String(ecA.priv.d)]) t.notOk(text.includes(f), `views and key sets do not contain ${f}`);
});
