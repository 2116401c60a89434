// The supervisor's JWKS sources: one fetch per source per node, the last good key set kept, the
// cache state computed, and every change pushed (`onKeySet`) for the workers to verify with.
//
// Decisions the shared design left open (docs/auth.md "JWKS sources"):
// - States. `stale` is never stored: a source whose keys are older than `stale_after_ms` (strictly,
//   measured from the completion of the fetch that produced them) reads as `stale` whatever its
//   stored state (`fresh` included, when `stale_after_ms` < `refresh_interval_ms`), so a failure
//   cannot leave `stale`, only a success can. A timer at the stale instant logs the transition and
//   pushes the set; `views()` and `keySets()` compute the state when read, so they say `stale` on
//   time even under a fake clock.
// - Failures while keys are held: the latest failure's kind picks the state, whatever the previous
//   failure was: a transport failure (timeout, connect_error, tls_error, http_status, too_large) is
//   `refresh_failed_retained`, a refused document (invalid_json, invalid_key_set, no_usable_keys)
//   is `quarantined_retained`. Without keys every failure is `empty_unusable`. Once a source holds
//   keys it never loses them while configured (there is no transition back to `empty_unusable`).
// - Failure kinds by how far the connection got (jwks-fetch.ts): error before TCP is up
//   `connect_error`; before the TLS handshake ends `tls_error`; after it (reset, a reply that is
//   not HTTP) `connect_error`; the deadline beats all. Any non-2xx status, 3xx included, is
//   `http_status`. A body over 1 MiB (declared or counted) is `too_large`.
// - Keys (jwks-key-set.ts): a key without `alg` is checked under RS256 (RSA), ES256/384/512 (EC, by
//   curve) or Ed25519 (OKP); a key whose `alg` is not an asymmetric JWS algorithm, whose `use` is not
//   `sig`, an `oct` key, an RSA key under 2048 bits (jose will not verify with it) and malformed
//   entries are ignored (RFC 7517 §5). Only public members (kty, kid, use, alg, crv, n, e, x, y)
//   are handed on. Private members on any non-oct key refuse the whole set.
// - Versions: `version` grows when the kept keys differ (as JSON) from the previous set; refetching
//   the same keys keeps the version, so workers keep their verification caches.
// - Pushes (`onKeySet`): when the observed state or the keys change, and after every fetch that a
//   `requestRefresh` started or joined (even if nothing changed: the waiters resolve). Not on
//   `configure()`: the caller seeds workers from `keySets()`. Not for a removed source.
// - Schedule: the next refresh is `refresh_interval_ms` after a success, `retryDelayMs` after a
//   failure (1 s doubling to min(interval, 60 s), ±10 %), counted from the end of the fetch. A
//   fetch started by `requestRefresh` replaces the pending one. The cooldown is counted from the end
//   of the last completed fetch, success or failure, so an unknown kid can shorten a backoff to the
//   cooldown but never fetch more than once per cooldown.
// - `configure()` with new timings for a known id: the pending refresh is rescheduled from the
//   end of the last fetch under the new interval (or a new backoff draw); the new `timeout_ms`
//   applies from the next fetch; a changed `stale_after_ms` applies at once (and may change the
//   state either way). A removed source's in-flight fetch is aborted and neither counted
//   (`onRefresh`) nor logged.
// - Views: `last_refresh_attempt_unix_ms` is when the last attempt started (set while the first
//   fetch is in flight), `last_refresh_success_unix_ms` when the last success completed;
//   `last_failure_reason` survives a later success (`consecutive_failures` does not);
//   `age_seconds` has millisecond precision.
// - Log lines carry `jwks_source_id`, `state`, `previous_state` and, when a failed fetch caused
//   the transition, `reason`; never the URL, a body or a key.
import type { JWK } from 'jose';
import { fetchJwks } from './jwks-fetch.ts';
import { readKeySet } from './jwks-key-set.ts';
import { afterFetch, holdsKeys, msUntilStale, observedState, retryDelayMs } from './jwks-state.ts';
import type { StoredJwksState } from './jwks-state.ts';
import { sanitizeEndpoint } from './source-id.ts';
import type { JwksFailureReason, JwksKeySet, JwksSourceSpec, JwksSourceView, JwksState } from './types.ts';

export interface JwksSourcesOptions {
  /** Called with a source's key set each time its keys or state change, and after every requestRefresh (push to workers). */
  readonly onKeySet: (set: JwksKeySet) => void;
  /** One line per state transition (warn entering refresh_failed_retained / quarantined_retained / stale / empty_unusable, info entering fresh from another state), fields { jwks_source_id, state, previous_state, reason? } only: never the URL, a body or a key. */
  readonly log: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void };
  /** Each completed fetch attempt, for the supervisor's counters. */
  readonly onRefresh?: (sourceId: string, result: 'success' | 'failure', reason: JwksFailureReason | undefined) => void;
  readonly now?: () => number; // unix ms, for tests
  /**
   * Monotonic ms (default `performance.now()`), for tests: the unknown-kid cooldown and the refresh
   * schedule run on it, so a wall clock stepped back cannot hold off a refresh for the size of the step.
   */
  readonly monotonicNow?: () => number;
}

/** Longest delay a Node timer takes (ms); longer waits re-arm. */
const MAX_TIMER_MS = 2 ** 31 - 1;

const MESSAGES: Record<JwksState, string> = {
  never_fetched: 'jwks source not fetched yet',
  fresh: 'jwks source fresh',
  stale: 'jwks source keys stale',
  refresh_failed_retained: 'jwks source refresh failed, last keys retained',
  quarantined_retained: 'jwks source served an unusable key set, last keys retained',
  empty_unusable: 'jwks source has no usable keys',
};

interface Source {
  spec: JwksSourceSpec;
  stored: StoredJwksState;
  keys: readonly JWK[];
  keysJson: string;
  /** Completion (unix ms) of the fetch that produced `keys` (0: none). */
  fetchedAtMs: number;
  version: number;
  /** The state last logged and pushed. */
  reported: JwksState;
  lastAttemptAtMs: number | null;
  lastSuccessAtMs: number | null;
  /** When the last fetch ended, on the monotonic clock: what the cooldown and the schedule measure from. */
  lastEndedMono: number | null;
  consecutiveFailures: number;
  lastFailure: JwksFailureReason | null;
  successTotal: number;
  failureTotal: number;
  inflight: AbortController | undefined;
  /** A requestRefresh started or joined the fetch in flight: push when it completes. */
  pushAfterFetch: boolean;
  refreshTimer: NodeJS.Timeout | undefined;
  staleTimer: NodeJS.Timeout | undefined;
}

type Outcome = { readonly keys: readonly JWK[] } | { readonly reason: JwksFailureReason };

function timingsDiffer(a: JwksSourceSpec, b: JwksSourceSpec): boolean {
  return a.refreshIntervalMs !== b.refreshIntervalMs || a.staleAfterMs !== b.staleAfterMs;
}

function later(fn: () => void, ms: number): NodeJS.Timeout {
  return setTimeout(fn, Math.min(Math.max(ms, 1), MAX_TIMER_MS)).unref();
}

/** The JWKS sources of one node (run by the supervisor). */
export class JwksSources {
  readonly #opts: JwksSourcesOptions;
  readonly #now: () => number;
  readonly #mono: () => number;
  readonly #sources = new Map<string, Source>();
  #closed = false;

  constructor(opts: JwksSourcesOptions) {
    this.#opts = opts;
    this.#now = opts.now ?? Date.now;
    this.#mono = opts.monotonicNow ?? (() => performance.now());
  }

  /** Desired sources: new ids start (first fetch at once), known ids keep their keys/state (timings updated), absent ids stop (timers cleared, in-flight fetch aborted). */
  configure(specs: readonly JwksSourceSpec[]): void {
    if (this.#closed) return;
    const wanted = new Map(specs.map((s) => [s.id, s]));
    for (const [id, s] of this.#sources) {
      if (wanted.has(id)) continue;
      this.#stop(s);
      this.#sources.delete(id);
    }
    for (const spec of wanted.values()) {
      const s = this.#sources.get(spec.id);
      if (s === undefined) {
        const fresh = this.#create(spec);
        this.#sources.set(spec.id, fresh);
        this.#fetch(fresh);
        continue;
      }
      const changed = timingsDiffer(s.spec, spec);
      s.spec = spec;
      if (!changed) continue;
      if (s.inflight === undefined && s.lastEndedMono !== null) this.#scheduleRefresh(s, s.lastEndedMono + this.#nextDelay(s) - this.#mono());
      this.#armStale(s);
      if (this.#transition(s, undefined)) this.#push(s);
    }
  }

  /** An unknown kid (or a worker waiting in never_fetched): fetch now unless a fetch is in flight (join it) or the last fetch ended less than unknownKidCooldownMs ago (then just call onKeySet with the current set at once). Unknown id: ignored. */
  requestRefresh(sourceId: string): void {
    const s = this.#sources.get(sourceId);
    if (s === undefined || this.#closed) return;
    s.pushAfterFetch = true;
    if (s.inflight !== undefined) return;
    if (s.lastEndedMono !== null && this.#mono() - s.lastEndedMono < s.spec.unknownKidCooldownMs) {
      s.pushAfterFetch = false;
      this.#transition(s, undefined);
      this.#push(s);
      return;
    }
    this.#fetch(s);
  }

  keySets(): JwksKeySet[] {
    const now = this.#now();
    return [...this.#sources.values()].map((s) => this.#keySet(s, now));
  }

  views(): JwksSourceView[] {
    const now = this.#now();
    return [...this.#sources.values()].map((s) => ({
      jwks_source_id: s.spec.id,
      jwks_endpoint: sanitizeEndpoint(s.spec.url),
      state: this.#state(s, now),
      active_keys: s.keys.length,
      last_refresh_attempt_unix_ms: s.lastAttemptAtMs,
      last_refresh_success_unix_ms: s.lastSuccessAtMs,
      age_seconds: holdsKeys(s.stored) ? (now - s.fetchedAtMs) / 1000 : null,
      consecutive_failures: s.consecutiveFailures,
      last_failure_reason: s.lastFailure,
      refresh_success_total: s.successTotal,
      refresh_failure_total: s.failureTotal,
    }));
  }

  close(): void {
    this.#closed = true;
    for (const s of this.#sources.values()) this.#stop(s);
    this.#sources.clear();
  }

  #create(spec: JwksSourceSpec): Source {
    return {
      spec, stored: 'never_fetched', keys: [], keysJson: '[]', fetchedAtMs: 0, version: 0, reported: 'never_fetched',
      lastAttemptAtMs: null, lastSuccessAtMs: null, lastEndedMono: null, consecutiveFailures: 0, lastFailure: null,
      successTotal: 0, failureTotal: 0, inflight: undefined, pushAfterFetch: false, refreshTimer: undefined, staleTimer: undefined,
    };
  }

  #state(s: Source, now: number): JwksState {
    return observedState(s.stored, s.fetchedAtMs, s.spec.staleAfterMs, now);
  }

  #keySet(s: Source, now: number): JwksKeySet {
    return { sourceId: s.spec.id, state: this.#state(s, now), keys: s.keys, fetchedAtMs: s.fetchedAtMs, version: s.version };
  }

  #push(s: Source): void {
    this.#opts.onKeySet(this.#keySet(s, this.#now()));
  }

  /** Logs a change of the observed state since the last report; true when there was one. */
  #transition(s: Source, reason: JwksFailureReason | undefined): boolean {
    const state = this.#state(s, this.#now());
    if (state === s.reported) return false;
    const fields = { jwks_source_id: s.spec.id, state, previous_state: s.reported, ...(reason !== undefined && state !== 'fresh' ? { reason } : {}) };
    s.reported = state;
    if (state === 'fresh') this.#opts.log.info(fields, MESSAGES[state]);
    else this.#opts.log.warn(fields, MESSAGES[state]);
    return true;
  }

  #nextDelay(s: Source): number {
    return s.consecutiveFailures === 0 ? s.spec.refreshIntervalMs : retryDelayMs(s.consecutiveFailures, s.spec.refreshIntervalMs, Math.random);
  }

  #scheduleRefresh(s: Source, delayMs: number): void {
    clearTimeout(s.refreshTimer);
    s.refreshTimer = later(() => {
      s.refreshTimer = undefined;
      if (s.inflight === undefined) this.#fetch(s);
    }, delayMs);
  }

  /** A timer at the instant the keys turn stale: the transition is logged and pushed then. */
  #armStale(s: Source): void {
    clearTimeout(s.staleTimer);
    s.staleTimer = undefined;
    const now = this.#now();
    if (!holdsKeys(s.stored) || this.#state(s, now) === 'stale') return;
    s.staleTimer = later(() => {
      s.staleTimer = undefined;
      if (this.#transition(s, undefined)) this.#push(s);
      else this.#armStale(s);
    }, msUntilStale(s.fetchedAtMs, s.spec.staleAfterMs, now));
  }

  #fetch(s: Source): void {
    clearTimeout(s.refreshTimer);
    s.refreshTimer = undefined;
    const controller = new AbortController();
    s.inflight = controller;
    s.lastAttemptAtMs = this.#now();
    void this.#run(s, controller.signal);
  }

  async #run(s: Source, signal: AbortSignal): Promise<void> {
    const got = await fetchJwks(s.spec.url, { timeoutMs: s.spec.timeoutMs, caPems: s.spec.caPems, signal });
    if (got.kind === 'aborted' || signal.aborted) return;
    if (got.kind === 'failure') return this.#complete(s, { reason: got.reason });
    const read = await readKeySet(got.body);
    if (signal.aborted) return;
    this.#complete(s, read.ok ? { keys: read.keys } : { reason: read.reason });
  }

  #complete(s: Source, outcome: Outcome): void {
    const now = this.#now();
    s.inflight = undefined;
    s.lastEndedMono = this.#mono();
    let keysChanged = false;
    let reason: JwksFailureReason | undefined;
    if ('keys' in outcome) {
      const json = JSON.stringify(outcome.keys);
      keysChanged = json !== s.keysJson;
      if (keysChanged) {
        s.keys = outcome.keys;
        s.keysJson = json;
        s.version += 1;
      }
      s.fetchedAtMs = now;
      s.lastSuccessAtMs = now;
      s.consecutiveFailures = 0;
      s.successTotal += 1;
      s.stored = afterFetch(s.stored, undefined);
    } else {
      reason = outcome.reason;
      s.consecutiveFailures += 1;
      s.failureTotal += 1;
      s.lastFailure = reason;
      s.stored = afterFetch(s.stored, reason);
    }
    this.#scheduleRefresh(s, this.#nextDelay(s));
    this.#armStale(s);
    const requested = s.pushAfterFetch;
    s.pushAfterFetch = false;
    this.#opts.onRefresh?.(s.spec.id, reason === undefined ? 'success' : 'failure', reason);
    if (this.#transition(s, reason) || keysChanged || requested) this.#push(s);
  }

  #stop(s: Source): void {
    clearTimeout(s.refreshTimer);
    clearTimeout(s.staleTimer);
    s.refreshTimer = undefined;
    s.staleTimer = undefined;
    s.inflight?.abort();
    s.inflight = undefined;
    s.pushAfterFetch = false;
  }
}
