// @edge-proxy/ipc: the supervisor–worker message contract and a typed request/reply channel.
export { isFromWorker, isNotice, isToWorker } from './messages.ts';
export type { BreakerReportEntry, FromWorker, GenerationBundle, NodeBreakerNotice, SharedKeys, ToWorker, WorkerWindow } from './messages.ts';
export { MAX_LEASE_ENTRIES, MAX_LEASE_KEY, isLeaseAsks, isLeaseGrants } from './lease.ts';
export type { LeaseAsk, LeaseGrant } from './lease.ts';
export { backendBudgetKey, backendLimitBinds } from './inflight-budgets.ts';
export type { InflightLimits } from './inflight-budgets.ts';
export { MAX_TOKEN_ENTRIES, MAX_TOKEN_KEY, hostClockMs, isTokenAsks, isTokenDeposits, isTokenGrants, isTokenSettles } from './tokens.ts';
export type { TokenAsk, TokenDeposit, TokenGrant, TokenSettle } from './tokens.ts';
export { AdaptiveLimit, HIGH_SHARE_PERCENT, INUSE_REPORT_MS, WINDOW_MS, inflightPercent, isHighWindow, nextBrownout, stepLimit } from './admission-policy.ts';
export type { AdaptivePolicy, AdaptiveWindow, AdmissionReport, BrownoutPolicy, NodeAdmissionNotice } from './admission-policy.ts';
export type { AdmissionView, BreakerStatus, BreakerView, QuotaHealthView, QuotaMode } from './overload.ts';
export { IpcError, RequestChannel, dropSendError, serveRequests } from './channel.ts';
export type { IpcEndpoint, OmitId } from './channel.ts';
export { WORKER_CPUS_ENV, WORKER_DROP_ENV, WORKER_WARMUP_ENV } from './process-env.ts';
export { IPC_ERROR_CODES } from './errors.ts';
export type { DropTarget } from './process-env.ts';
