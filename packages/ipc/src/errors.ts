// The supervisor–worker channel's error codes, declared once (docs/errors.md is generated from this table).

export const IPC_ERROR_CODES = {
  EDGE_IPC_CLOSED: 'the worker exited or its channel closed before it answered: the operation fails on that worker',
  EDGE_IPC_TIMEOUT: 'the worker did not answer within the deadline: it is killed (`ipc_timeout`) and replaced',
  EDGE_IPC_REMOTE: 'the worker refused the request without a code of its own (its message is kept)',
} as const satisfies Record<string, string>;
