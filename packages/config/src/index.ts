// @edge-proxy/config: the configuration model. Schema and defaults, validation rules, secret
// references and fingerprints, normalization and the domain diff. Opens no sockets.
export { ConfigSchema } from './schema/root.ts';
export type { RawConfig } from './schema/root.ts';
export { LB_TYPES } from './schema/upstream.ts';
export type { LoadBalancingConfig, HealthCheckConfig, RouteConfig } from './schema/upstream.ts';
export { CONFIG_ERROR_CODES, ConfigValidationError, formatIssue } from './errors.ts';
export type { ConfigErrorCode, ConfigIssue } from './errors.ts';
export { validateConfig, SUPPORTED_VERSION } from './validate.ts';
export type { ValidatedConfig, ValidationResult } from './validate.ts';
export { resolveConfig, publicSecretMaterial } from './resolve.ts';
export type { ResolvedConfig, ResolvedMaterial, ResolvedSecret, PemIdentity, TrustBundle, ListenerMaterial, ResolveResult, ResolveOptions } from './resolve.ts';
export { loadConfigFile, loadConfigText, parseConfigText, DEFAULT_CONFIG_PATH, MAX_CONFIG_BYTES } from './load.ts';
export { readBoundedFile, describeReadFailure, isInside } from './source-file.ts';
export type { BoundedRead, BoundedReadOptions, ReadFailure } from './source-file.ts';
export { publicIssue, publicPath, printable } from './public-issue.ts';
export type { LoadResult, ConfigSource } from './load.ts';
export { diffConfigs, DIFF_DOMAINS } from './diff.ts';
export type { ConfigDiff, DomainDiff, FieldChange, BackendPolicyChange, DiffDomain } from './diff.ts';
export { classifySchemaPath } from './activation.ts';
export type { Activation } from './activation.ts';
export { parseBackendAddress, listenerName } from './normalize.ts';
export type { NormalizedConfig, NormalizedListener, NormalizedUpstream, NormalizedBackend, EffectiveUpstreamTls, BackendAddress } from './normalize.ts';
export type { SecretSlot } from './secrets/refs.ts';
export { fingerprint, keyedFingerprint } from './secrets/pem.ts';
export { inactiveFeatures, NOT_ACTIVE_PATHS, NOT_BUILT_PATHS, REFUSED_PATHS } from './features.ts';
export type { InactiveFeature } from './features.ts';
export { renderReference, referenceRows } from './reference.ts';
export type { ReferenceRow } from './reference.ts';
