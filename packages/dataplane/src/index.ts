// @edge-proxy/dataplane: the worker. Runtime provisioning from a resolved configuration, the TLS
// bootstrap ingress (HTTP/1.1 + HTTP/2), routing, balancing, upstream forwarding, health.
export { Dataplane } from './runtime/dataplane.ts';
export { provision } from './runtime/provision.ts';
export type { Runtime, RuntimeDeps, UpstreamRuntime, BackendRuntime } from './runtime/provision.ts';
export { BootstrapIngress } from './ingress/bootstrap.ts';
export { IpcWorker } from './worker/ipc-worker.ts';
export { serveListeners } from './worker/serve-listeners.ts';
export type { BootstrapOptions } from './ingress/bootstrap.ts';
export type { RuntimeSource } from './proxy/handler.ts';
export { handleRequest } from './proxy/handler.ts';
export type { DownstreamRequest } from './proxy/handler.ts';
export { Router, normalizeHost, normalizePrefix } from './routing/router.ts';
export type { RouteResult, RouteReason } from './routing/router.ts';
export { buildSelector, BackendStatsRegistry, compileKeySpec } from './balancing/index.ts';
export type { BackendRef, BackendStats, KeyExtractor, KeySource, PickContext, Selector, SelectorDeps } from './balancing/index.ts';
export { ERR, REQUEST_ERROR_DEFS, DATAPLANE_ERROR_CODES, requestErrorDocs } from './errors.ts';
export type { RequestError, RequestErrorCode, FailureClass, ErrorSource } from './errors.ts';
