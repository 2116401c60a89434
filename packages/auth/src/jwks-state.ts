// The JWKS cache state as a pure policy: (stored state, fetch outcome) → stored state, and
// (stored state, age of the keys, now) → the state a reader sees. `stale` is never stored: it is a
// function of the keys' age, so it is observed without a fetch and left only by a success.
import type { JwksFailureReason, JwksState } from './types.ts';

/** What a source remembers between fetches (`stale` is derived, see `observedState`). */
export type StoredJwksState = Exclude<JwksState, 'stale'>;

/** Failures about the fetched document rather than the transport: they quarantine the new set. */
const SET_FAILURES: ReadonlySet<JwksFailureReason> = new Set(['invalid_json', 'invalid_key_set', 'no_usable_keys']);

/** Whether `reason` condemns the fetched set (quarantine) rather than the fetch itself. */
export function isSetFailure(reason: JwksFailureReason): boolean {
  return SET_FAILURES.has(reason);
}

/** Whether a source in `state` holds keys that validate tokens. */
export function holdsKeys(state: StoredJwksState): boolean {
  return state !== 'never_fetched' && state !== 'empty_unusable';
}

/**
 * The stored state after a completed fetch; `failure` undefined means the set was fetched and
 * usable. Without keys (never fetched, or only failures so far) any failure is `empty_unusable`;
 * with keys the latest failure's kind decides between `refresh_failed_retained` (transport) and
 * `quarantined_retained` (the document), the old keys being kept either way.
 */
export function afterFetch(prev: StoredJwksState, failure: JwksFailureReason | undefined): StoredJwksState {
  if (failure === undefined) return 'fresh';
  if (!holdsKeys(prev)) return 'empty_unusable';
  return isSetFailure(failure) ? 'quarantined_retained' : 'refresh_failed_retained';
}

/**
 * The state a reader sees at `nowMs`: keys older than `staleAfterMs` (strictly, since the fetch
 * that produced them completed at `keysFetchedAtMs`) are `stale`, whatever the fetches since said.
 */
export function observedState(stored: StoredJwksState, keysFetchedAtMs: number, staleAfterMs: number, nowMs: number): JwksState {
  if (!holdsKeys(stored)) return stored;
  return nowMs - keysFetchedAtMs > staleAfterMs ? 'stale' : stored;
}

/** Ms from `nowMs` until keys fetched at `keysFetchedAtMs` turn stale (≥ 1). */
export function msUntilStale(keysFetchedAtMs: number, staleAfterMs: number, nowMs: number): number {
  return Math.max(1, keysFetchedAtMs + staleAfterMs + 1 - nowMs);
}

/** Ceiling of the retry backoff (ms): a minute, or the refresh interval when that is shorter. */
export const RETRY_CEILING_MS = 60_000;

/**
 * Delay (ms) before retrying after `consecutiveFailures` (≥ 1) failed fetches: 1 s doubling per
 * failure up to min(`refreshIntervalMs`, 60 s), then ±10 % jitter (`random` in [0, 1)) so that
 * nodes restarted together do not retry together.
 */
export function retryDelayMs(consecutiveFailures: number, refreshIntervalMs: number, random: () => number): number {
  const ceiling = Math.min(refreshIntervalMs, RETRY_CEILING_MS);
  const base = Math.min(1000 * 2 ** Math.min(Math.max(consecutiveFailures, 1) - 1, 30), ceiling);
  return Math.round(base * (0.9 + 0.2 * random()));
}
