// The service's own error codes (supervisor, state directory, operations), declared once as data.
// Each is printed as `edge-proxy serve: CODE: message` or carried in a log line's `code` field;
// scripts branch on the code, never on the message. docs/errors.md is generated from this table.

export const SERVICE_ERROR_CODES = {
  EDGE_STARTUP_CONFIG: 'the configuration given with `-c` is invalid: the service does not start (each error line precedes this one)',
  EDGE_STARTUP_ACTIVATION: 'the first generation could not be prepared or committed by the workers: the service does not start',
  EDGE_STARTUP_CONTROL_API: 'the control API is `required` and could not bind or load its TLS identity: the service does not start',
  EDGE_STATE_KEY_INVALID: 'the fingerprint key in the state directory is unreadable or malformed: fingerprints use a key of this process only',
  EDGE_SYSTEMD_NOTIFY_FAILED: 'a notification to systemd (`$NOTIFY_SOCKET`) could not be sent or the socket address is not supported: logged once at warn; the service keeps serving, but systemd may miss readiness (start timeout), the end of a reload or watchdog pings',
  EDGE_SYSTEMD_WATCHDOG_WITHHELD: 'the worker pool stayed not ready with no worker coming back beyond its stall limit: WATCHDOG=1 pings stop, so systemd restarts the service after `WatchdogSec=` (logged at error; pings resume, logged at info, if the pool serves again first)',
  EDGE_OPERATION_ABANDONED: 'a control operation passed its deadline or lost its caller before it changed anything; nothing was carried out',
} as const satisfies Record<string, string>;

export type ServiceErrorCode = keyof typeof SERVICE_ERROR_CODES;
