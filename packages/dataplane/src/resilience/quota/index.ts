// Distributed quota (docs/quota.md): burst and sustained contracts per policy over selector
// dimensions, counted atomically in Redis (one EVALSHA per request) with local counters as the
// `local` backend and the `local_fallback` failure mode.
export { QuotaControl, parseRedisAddress, retryAfterSeconds } from './quota-control.ts';
export type { QuotaAvailability, QuotaFailureMode, QuotaMode, QuotaSettings, QuotaVerdict } from './quota-control.ts';
export { compilePolicies, selectorDigest, DEFAULT_KEY_PREFIX } from './policy.ts';
export type { CompiledPolicy, ContractKind, QuotaConfig, QuotaContract, QuotaRequestFacts, QuotaRoutesSource } from './policy.ts';
export { LocalCounters, MAX_LOCAL_KEYS, workerShare } from './local-counters.ts';
export { QUOTA_SCRIPT, reconnectDelay } from './redis-store.ts';
export type { HealthReason } from './redis-store.ts';
