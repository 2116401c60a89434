// The shapes request authentication shares between the supervisor (which fetches every JWKS once
// per node) and the workers (which verify tokens against the keys it hands them). Plain data: a
// key set crosses the IPC boundary by structured clone.
import type { JWK } from 'jose';

/** SPEC "JWKS cache state". Only `empty_unusable` cannot validate tokens (docs/auth.md: transitions). */
export const JWKS_STATES = ['never_fetched', 'fresh', 'stale', 'refresh_failed_retained', 'quarantined_retained', 'empty_unusable'] as const;
export type JwksState = (typeof JWKS_STATES)[number];

/** Why a refresh failed (a log field and the snapshot's `last_failure_reason`; never the URL or a body). */
export const JWKS_FAILURE_REASONS = ['timeout', 'connect_error', 'tls_error', 'http_status', 'too_large', 'invalid_json', 'invalid_key_set', 'no_usable_keys'] as const;
export type JwksFailureReason = (typeof JWKS_FAILURE_REASONS)[number];

/** What a JWKS source needs: derived from `upstream.<pool>.auth.jwt.jwks` and the pool's CA. */
export interface JwksSourceSpec {
  /** Opaque, stable id (`jwksSourceId`): a metric label and the snapshot's key; never the URL. */
  readonly id: string;
  /** The endpoint as configured (may hold credentials or a query: never logged, never a label). */
  readonly url: string;
  readonly refreshIntervalMs: number;
  readonly timeoutMs: number;
  readonly staleAfterMs: number;
  /** Least time between two refreshes that an unknown `kid` asks for. */
  readonly unknownKidCooldownMs: number;
  /** Trust for an `https://` endpoint: the pool's upstream CA (PEM); absent: the system's CAs. */
  readonly caPems?: readonly string[];
}

/** A source's usable keys and state as the supervisor hands them to workers. */
export interface JwksKeySet {
  readonly sourceId: string;
  readonly state: JwksState;
  /** Public JWKs that imported cleanly (private members stripped); empty in `never_fetched` / `empty_unusable`. */
  readonly keys: readonly JWK[];
  /** Unix ms of the fetch that produced `keys` (0: never). */
  readonly fetchedAtMs: number;
  /** Grows by one each time `keys` change: a worker drops verifications cached under older keys. */
  readonly version: number;
}

/** One entry of the snapshot's `jwks.sources[]`. */
export interface JwksSourceView {
  readonly jwks_source_id: string;
  /** `sanitizeEndpoint(url)`: scheme, host, port and path; no credentials, query or fragment. */
  readonly jwks_endpoint: string;
  readonly state: JwksState;
  readonly active_keys: number;
  readonly last_refresh_attempt_unix_ms: number | null;
  readonly last_refresh_success_unix_ms: number | null;
  /** Seconds since the keys in use were fetched (null: none). */
  readonly age_seconds: number | null;
  readonly consecutive_failures: number;
  readonly last_failure_reason: JwksFailureReason | null;
  readonly refresh_success_total: number;
  readonly refresh_failure_total: number;
}
