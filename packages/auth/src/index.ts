// @edge-proxy/auth: request authentication. JWKS sources and their cache states (run once per node
// by the supervisor), JWT verification with jose against the keys handed to workers, and the
// external authorization client.
export { JWKS_FAILURE_REASONS, JWKS_STATES } from './types.ts';
export type { JwksFailureReason, JwksKeySet, JwksSourceSpec, JwksSourceView, JwksState } from './types.ts';
export { jwksSourceId, sanitizeEndpoint } from './source-id.ts';
export { JwksSources } from './jwks-sources.ts';
export type { JwksSourcesOptions } from './jwks-sources.ts';
