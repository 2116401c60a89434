// A worker's copy of the JWKS key sets. The supervisor fetches every source once per node and
// pushes each set (and each change of its state) to every worker; a worker that needs keys it does
// not have (a source never fetched yet, a `kid` not in the set) asks for a refresh and waits,
// bounded, for the next push of that source (docs/auth.md).
import type { JWTVerifyGetKey } from 'jose';
import { jose } from './jose.ts';
import type { JwksKeySet, JwksState } from './types.ts';

/** What a worker does with a source in each state: only these may validate tokens. */
const VALIDATING: ReadonlySet<JwksState> = new Set<JwksState>(['fresh', 'stale', 'refresh_failed_retained', 'quarantined_retained']);

/** Whether a set in `state` validates tokens (`never_fetched` and `empty_unusable` do not). */
export function validatesTokens(state: JwksState): boolean {
  return VALIDATING.has(state);
}

/** A set and jose's key selector over its keys, built once per set version. */
export interface SourceKeys {
  readonly set: JwksKeySet;
  readonly getKey: JWTVerifyGetKey;
}

/** Options of a `KeyStore`. */
export interface KeyStoreOptions {
  /** Asks the supervisor for a refresh of `sourceId` (IPC `requestRefresh`); must not throw (an exception is swallowed). */
  readonly askRefresh: (sourceId: string) => void;
}

/** The key sets the supervisor pushes to this worker (one store per worker, shared by its verifiers). */
export class KeyStore {
  private readonly askRefresh: (sourceId: string) => void;
  private readonly sets = new Map<string, JwksKeySet>();
  private readonly selectors = new Map<string, SourceKeys>();
  /** Resolvers of the `refresh` calls waiting for the next push of a source. */
  private readonly waiters = new Map<string, Set<() => void>>();
  /** The ask outstanding per source (a token: the asking waiter's timeout ends only its own ask). */
  private readonly asks = new Map<string, object>();

  constructor(opts: KeyStoreOptions) {
    this.askRefresh = opts.askRefresh;
  }

  /** Replaces the source's set (a push from the supervisor) and resolves everyone waiting for it. */
  update(set: JwksKeySet): void {
    const id = set.sourceId;
    this.sets.set(id, set);
    const built = this.selectors.get(id);
    if (built !== undefined && built.set.version !== set.version) this.selectors.delete(id);
    this.asks.delete(id);
    const waiting = this.waiters.get(id);
    if (waiting === undefined) return;
    this.waiters.delete(id);
    for (const resolve of waiting) resolve();
  }

  /** The last set pushed for `sourceId` (undefined: none yet). */
  get(sourceId: string): JwksKeySet | undefined {
    return this.sets.get(sourceId);
  }

  /**
   * The current set of `sourceId` with a jose key selector over its keys (`createLocalJWKSet`),
   * built once per set version: a push of the same version (a refresh answered within the
   * cooldown) keeps it, and with it jose's imported keys.
   */
  keys(sourceId: string): SourceKeys | undefined {
    const set = this.sets.get(sourceId);
    if (set === undefined) return undefined;
    const built = this.selectors.get(sourceId);
    if (built !== undefined && built.set.version === set.version) return built.set === set ? built : this.remember(sourceId, { set, getKey: built.getKey });
    return this.remember(sourceId, { set, getKey: jose().createLocalJWKSet({ keys: set.keys.map((k) => ({ ...k })) }) });
  }

  private remember(sourceId: string, keys: SourceKeys): SourceKeys {
    this.selectors.set(sourceId, keys);
    return keys;
  }

  /**
   * Waits for the next push of `sourceId`, at most `timeoutMs`. Asks the supervisor at most once
   * while an ask of that source is outstanding: the ask ends at the source's next push or when the
   * wait of the call that made it times out (a lost ask is asked again by the next caller after
   * that). Never rejects.
   */
  refresh(sourceId: string, timeoutMs: number): Promise<void> {
    return new Promise<void>((resolve) => {
      let waiting = this.waiters.get(sourceId);
      if (waiting === undefined) {
        waiting = new Set();
        this.waiters.set(sourceId, waiting);
      }
      const set = waiting;
      // This call makes the ask unless one is outstanding; its timeout ends that ask (not a later one).
      const ask = this.asks.has(sourceId) ? undefined : {};
      const done = (): void => {
        clearTimeout(timer);
        set.delete(done);
        if (set.size === 0 && this.waiters.get(sourceId) === set) this.waiters.delete(sourceId);
        if (ask !== undefined && this.asks.get(sourceId) === ask) this.asks.delete(sourceId);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, timeoutMs));
      // Registered before asking: a supervisor answering synchronously (tests, one process) still resolves this wait.
      set.add(done);
      if (ask === undefined) return;
      this.asks.set(sourceId, ask);
      try {
        this.askRefresh(sourceId);
      } catch {
        // The wait stays bounded by its timeout; the caller decides with what it has.
      }
    });
  }
}
