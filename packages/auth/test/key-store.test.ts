// The worker's key store: pushes replace a source's set and resolve its waiters; refresh asks are
// coalesced per source and every wait is bounded; jose's key selector is built once per version.
import t from 'tap';
import { exportJWK, generateKeyPair } from 'jose';
import type { CryptoKey } from 'jose';
import { KeyStore, validatesTokens } from '../src/key-store.ts';
import { JWKS_STATES } from '../src/types.ts';
import type { JwksKeySet } from '../src/types.ts';

const set = (sourceId: string, version: number, keys: JwksKeySet['keys'] = []): JwksKeySet => ({ sourceId, state: 'fresh', keys, fetchedAtMs: 1, version });

t.test('only the four usable states validate tokens', async (t) => {
  t.same(JWKS_STATES.filter(validatesTokens), ['fresh', 'stale', 'refresh_failed_retained', 'quarantined_retained']);
});

t.test('update replaces the set of its source only', async (t) => {
  const store = new KeyStore({ askRefresh: () => undefined });
  t.equal(store.get('a'), undefined);
  const a1 = set('a', 1);
  store.update(a1);
  store.update(set('b', 7));
  t.equal(store.get('a'), a1);
  const a2 = set('a', 2);
  store.update(a2);
  t.equal(store.get('a'), a2);
  t.equal(store.get('b')?.version, 7);
});

t.test('concurrent refreshes of one source ask once and all resolve at its next push', async (t) => {
  const asks: string[] = [];
  const store = new KeyStore({ askRefresh: (id) => void asks.push(id) });
  let resolved = 0;
  const waits = Array.from({ length: 20 }, () => store.refresh('a', 60_000).then(() => resolved++));
  const other = store.refresh('b', 60_000);
  t.same(asks, ['a', 'b'], 'one ask per source');
  await new Promise((r) => setImmediate(r));
  t.equal(resolved, 0, 'nothing resolves before a push');
  store.update(set('b', 1));
  await other;
  t.equal(resolved, 0, 'a push of another source resolves none of a\'s waiters');
  store.update(set('a', 1));
  await Promise.all(waits);
  t.equal(resolved, 20);
  await store.refresh('a', 0);
  t.same(asks, ['a', 'b', 'a'], 'the push ended the ask: the next refresh asks again');
});

t.test('a wait ends at its timeout, and then the ask may be made again', async (t) => {
  const asks: string[] = [];
  const store = new KeyStore({ askRefresh: (id) => void asks.push(id) });
  const started = performance.now();
  await store.refresh('a', 80);
  const elapsed = performance.now() - started;
  t.ok(elapsed >= 70 && elapsed < 80 + 1500, `resolved after ${elapsed.toFixed(0)} ms for an 80 ms bound`);
  t.same(asks, ['a']);
  // A second caller while the first waits joins its ask; after the asker's timeout, a new caller asks again.
  const first = store.refresh('a', 50);
  const joined = store.refresh('a', 5000);
  t.same(asks, ['a', 'a']);
  await first;
  const third = store.refresh('a', 5000);
  t.same(asks, ['a', 'a', 'a'], 'an unanswered ask is not outstanding forever');
  store.update(set('a', 1));
  await Promise.all([joined, third]);
});

t.test('an ask answered synchronously still resolves the wait; a throwing ask does not reject', async (t) => {
  const store: KeyStore = new KeyStore({ askRefresh: (id) => store.update(set(id, 1)) });
  await store.refresh('a', 60_000);
  t.equal(store.get('a')?.version, 1);
  const throwing = new KeyStore({
    askRefresh: () => {
      throw new Error('ipc channel closed');
    },
  });
  const started = performance.now();
  await throwing.refresh('a', 30);
  t.ok(performance.now() - started < 1500);
});

t.test('the key selector is built once per version', async (t) => {
  const { publicKey } = await generateKeyPair('ES256');
  const jwk = { ...(await exportJWK(publicKey)), kid: 'k' };
  const store = new KeyStore({ askRefresh: () => undefined });
  t.equal(store.keys('a'), undefined);
  store.update(set('a', 1, [jwk]));
  const k1 = store.keys('a');
  t.ok(k1);
  t.equal(store.keys('a')?.getKey, k1?.getKey);
  const again = set('a', 1, [jwk]); // the same version pushed again (a structured clone over IPC)
  store.update(again);
  t.equal(store.keys('a')?.getKey, k1?.getKey, 'same version: same selector (jose keeps its imported keys)');
  t.equal(store.keys('a')?.set, again, 'and the set pushed last');
  store.update(set('a', 2, [jwk]));
  t.not(store.keys('a')?.getKey, k1?.getKey, 'a new version builds a new selector');
  const key = await store.keys('a')?.getKey({ alg: 'ES256', kid: 'k' }, { payload: '', signature: '' });
  t.equal((key as CryptoKey | undefined)?.type, 'public');
});
