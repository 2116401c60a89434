// @edge-proxy/auth: request authentication. JWKS sources and their cache states (run once per node
// by the supervisor), JWT verification with jose against the keys handed to workers, and the
// external authorization client with the undici Pool it shares with the data plane.
export { JWKS_FAILURE_REASONS, JWKS_STATES } from './types.ts';
export type { JwksFailureReason, JwksKeySet, JwksSourceSpec, JwksSourceView, JwksState } from './types.ts';
export { jwksSourceId, sanitizeEndpoint } from './source-id.ts';
export { JwksSources } from './jwks-sources.ts';
export type { JwksSourcesOptions } from './jwks-sources.ts';
export { KeyStore, validatesTokens } from './key-store.ts';
export type { KeyStoreOptions, SourceKeys } from './key-store.ts';
export { JWT_ALGORITHM_LABELS, JWT_FAILURE_REASONS, JwtVerifier, algorithmLabel } from './jwt-verifier.ts';
export type { JwtFailureReason, JwtOutcome, JwtPolicy } from './jwt-verifier.ts';
export { MAX_TOKEN_LENGTH, tokenFromHeader } from './bearer-token.ts';
export { EXTERNAL_AUTH_CONNECTIONS, EXTERNAL_AUTH_MAX_BODY, ExternalAuthorizer } from './external-auth.ts';
export type { AuthRequestView, ExternalAuthPolicy, ExternalDecision } from './external-auth.ts';
export { FailOpenBudget } from './fail-open-budget.ts';
export type { FailOpenGate } from './fail-open-budget.ts';
export { jwksSourceSpecs, poolCaPems, poolJwksSpec } from './specs.ts';
export { Pool as UndiciPool } from './undici-pool.ts';
