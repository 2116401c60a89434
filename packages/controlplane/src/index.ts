// @edge-proxy/controlplane: the supervisor, its generation history, control API and watchdog.
export { SERVICE_ERROR_CODES } from './errors.ts';
export type { ServiceErrorCode } from './errors.ts';
export { GenerationHistory, DEFAULT_HISTORY_LIMITS } from './generations/history.ts';
export { WorkerPool } from './supervisor/worker-pool.ts';
export { GenerationManager } from './generations/activation.ts';
export { Supervisor, StartupError, defaultStateDir } from './supervisor/supervisor.ts';
export type { SupervisorOptions } from './supervisor/supervisor.ts';
export { DASHBOARD_PACKAGES } from './supervisor/bundle.ts';
export type { Activator, ActivationRequest, CandidateStatus, OperationResult, Plan, Retained, RollbackRequest } from './generations/activation.ts';
export type { ActivationOutcome, WorkerPoolOptions } from './supervisor/worker-pool.ts';
export type { GenerationStatus, HistoryEntry, HistoryLimits, Operation, RetainedGeneration, RollbackRefusal } from './generations/history.ts';
export { hostProblems } from './supervisor/process-keys.ts';
export { operatorWorkerFlags } from './supervisor/worker-flags.ts';
export type { HostProblem } from './supervisor/process-keys.ts';
export type { AdmissionBlock, CircuitBreakersBlock } from './supervisor/overload-snapshot.ts';
