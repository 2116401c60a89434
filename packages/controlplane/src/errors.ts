// The service's own error codes (supervisor, state directory, operations), declared once as data.
// Each is printed as `edge-proxy serve: CODE: message` or carried in a log line's `code` field;
// scripts branch on the code, never on the message. docs/errors.md is generated from this table.

export const SERVICE_ERROR_CODES = {
  EDGE_STARTUP_CONFIG: 'the configuration given with `-c` is invalid: the service does not start (each error line precedes this one)',
  EDGE_STARTUP_ACTIVATION: 'the first generation could not be prepared or committed by the workers: the service does not start',
  EDGE_STARTUP_CONTROL_API: 'the control API is `required` and could not bind or load its TLS identity: the service does not start',
  EDGE_STATE_KEY_INVALID: 'the fingerprint key in the state directory is unreadable or malformed: fingerprints use a key of this process only',
  EDGE_STARTUP_LOG_FILE: '`log.file` cannot be opened for appending (its directory is missing, not writable, or the path is not a regular file): the service does not start',
  EDGE_STARTUP_METRICS: 'the metrics endpoint could not bind its address and port (in use, or not permitted): the service does not start',
  EDGE_STARTUP_WORKERS: 'a worker process exited before it was ready: the service does not start',
  EDGE_STARTUP_FAILED: 'the service could not start for a reason without a code of its own (the message says which): the service does not start',
  EDGE_STOP_FAILED: 'stopping the service (drain, workers, control API, metrics endpoint) failed: `serve` exits 1 instead of 0',
  EDGE_RESTART_COMMAND_NOT_STARTED: '`restart_command` could not be started (missing or not executable; the errno is logged): the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_FAILED: '`restart_command` exited non-zero or was ended by a signal (both logged, with its last stderr line): the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_TIMEOUT: '`restart_command` was still running after `restart_command_timeout_ms`: its process group is killed and the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_NO_RESTART: '`restart_command` exited 0 but the service was not stopped within `restart_command_timeout_ms`: the workers are re-forked on the active generation',
  EDGE_OPERATION_ABANDONED: 'a control operation passed its deadline or lost its caller before it changed anything; nothing was carried out',
} as const satisfies Record<string, string>;

export type ServiceErrorCode = keyof typeof SERVICE_ERROR_CODES;
