// @edge-proxy/cli: process entry points. The binary is bin/edge-proxy (src/main.ts).
export { validateCommand, EXIT_OK, EXIT_INVALID, EXIT_USAGE } from './validate-command.ts';
export type { Output } from './validate-command.ts';
export { ctlCommand } from './ctl-command.ts';
export { CTL_EXIT, CTL_OPERATIONS, ctlRequest, exitForStatus, outcomeOf, problemLines, failureLine } from './ctl-request.ts';
export type { CtlArgs, CtlOperation, CtlRequest, ApiPaths } from './ctl-request.ts';
export { CTL_ENV, resolveTarget } from './ctl-target.ts';
export type { TargetOptions } from './ctl-target.ts';
export { MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT_MS } from './ctl-client.ts';
