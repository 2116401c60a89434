// @edge-proxy/cli: process entry points. The binary is bin/edge-proxy (src/main.ts).
export { validateCommand, EXIT_OK, EXIT_INVALID, EXIT_USAGE } from './validate-command.ts';
export type { Output } from './validate-command.ts';
