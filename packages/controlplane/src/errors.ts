// The service's own error codes (supervisor, state directory, operations), declared once as data.
// Each is printed as `edge-proxy serve: CODE: message` or carried in a log line's `code` field;
// scripts branch on the code, never on the message. docs/errors.md is generated from this table.

export const SERVICE_ERROR_CODES = {
  EDGE_STARTUP_CONFIG: 'the configuration given with `-c` is invalid: the service does not start (each error line precedes this one)',
  EDGE_STARTUP_ACTIVATION: 'the first generation could not be prepared or committed by the workers: the service does not start',
  EDGE_STARTUP_CONTROL_API: 'the control API is `required` and could not bind or load its TLS identity: the service does not start',
  EDGE_STARTUP_ACCOUNT: '`security.user` or `security.group` names no user or group on this host (looked up through NSS, `getent`): the service does not start; `edge-proxy -c` reports it too',
  EDGE_STARTUP_PRIVILEGE: '`security.user`/`group` is set but the service runs neither as root nor as that account, so its workers could not switch: the service does not start',
  EDGE_STARTUP_PIN_WORKERS: '`performance.pin_workers` is true but this host has no util-linux `taskset` (or is not Linux): the service does not start; `edge-proxy -c` reports it too',
  EDGE_WORKER_CPU_PIN: 'a worker could not pin its threads to its CPU (`taskset` failed): its commit fails, so the start fails or the re-fork is retried',
  EDGE_WORKER_PRIVILEGE_DROP: 'a worker could not switch to `security.user`/`group` after binding, or could switch back to root: its commit fails, it never serves as root',
  EDGE_STATE_KEY_INVALID: 'the fingerprint key in the state directory is unreadable or malformed: fingerprints use a key of this process only',
  EDGE_STATE_INVALID: 'a state file (`generations.json`, `watchdog.json`) is unreadable, torn, of an unknown version or larger than its bound: the service starts from `-c FILE` as generation 1 (an unusable generations file is moved to `generations.json.invalid`); an unusable watchdog file counts as a restart just now',
  EDGE_STATE_RECORD_DROPPED: 'a retained generation or a history entry of `generations.json` is malformed (e.g. a number that is not a generation number) or contradicts the others: that record is left out (logged at warn with where it was and why, counted in `svc_state_records_dropped_total`), the rest of the history and the active generation are kept, the file as it was is copied to `generations.json.invalid` and rewritten without it',
  EDGE_STATE_SOURCE_INVALID: 'the saved active configuration no longer validates or resolves (e.g. a certificate file is gone), or the workers failed it: the service starts from `-c FILE` as a new generation, the history kept',
  EDGE_STATE_EDIT_INVALID: 'the `-c` file changed since the service last read it but does not validate (each error in the line): the saved generation resumes, and the edit applies at the first start where it validates',
  EDGE_STATE_DIR_UNUSABLE: 'the state directory cannot be created or written (`errno` in the line): fingerprints use a key of this process only and generations are not saved; the service keeps serving',
  EDGE_COMPILE_CACHE_UNUSABLE: 'the compile cache for the workers (`compile-cache/` in the state directory) could not be created (or a file stands in its place), or its warm-up process failed or timed out (the reason is in the line): each worker compiles its code itself, which costs it about 20 MiB more; the service keeps serving',
  EDGE_COMPILE_CACHE_UNSAFE: 'the compile-cache directory is a link, is owned by another user, or is writable by its group or others: it is not used (the workers run what it holds before dropping privileges) and each worker compiles its code itself; the service keeps serving',
  EDGE_STATE_WRITE_FAILED: 'the state directory could not be written: the service keeps serving, and a restart would resume the last state saved',
  EDGE_LISTENER_BIND_FAILED: 'a listener added by an activation could not be bound by a worker (address in use, no permission): the activation fails in prepare (500 `prepare_failed`, `code` in the answer) and the active generation keeps serving',
  EDGE_STARTUP_LOG_FILE: '`log.file` cannot be opened for appending (its directory is missing, not writable, or the path is not a regular file): the service does not start',
  EDGE_STARTUP_METRICS: 'the metrics endpoint could not bind its address and port (in use, or not permitted): the service does not start',
  EDGE_STARTUP_WORKER_FLAGS: '`EDGE_PROXY_WORKER_FLAGS` is not a blank-separated list of `--flag` or `--flag=value` (at most 32, each up to 256 characters), or node refuses one of its flags (its own message is in the line): the service does not start; `edge-proxy -c` reports it too',
  EDGE_STARTUP_WORKERS: 'a worker process exited before it was ready: the service does not start',
  EDGE_STARTUP_FAILED: 'the service could not start for a reason without a code of its own (the message says which): the service does not start',
  EDGE_STOP_FAILED: 'stopping the service (drain, workers, control API, metrics endpoint) failed: `serve` exits 1 instead of 0',
  EDGE_RESTART_COMMAND_NOT_STARTED: '`restart_command` could not be started (missing or not executable; the errno is logged): the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_FAILED: '`restart_command` exited non-zero or was ended by a signal (both logged, with its last stderr line): the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_TIMEOUT: '`restart_command` was still running after `restart_command_timeout_ms`: its process group is killed and the workers are re-forked on the active generation',
  EDGE_RESTART_COMMAND_NO_RESTART: '`restart_command` exited 0 but the service was not stopped within `restart_command_timeout_ms`: the workers are re-forked on the active generation',
  EDGE_SYSTEMD_NOTIFY_FAILED: 'a notification to systemd (`$NOTIFY_SOCKET`) could not be sent or the socket address is not supported: logged once at warn; the service keeps serving, but systemd may miss readiness (start timeout), the end of a reload or watchdog pings',
  EDGE_SYSTEMD_WATCHDOG_WITHHELD: 'the worker pool stayed not ready with no worker coming back beyond its stall limit: WATCHDOG=1 pings stop, so systemd restarts the service after `WatchdogSec=` (logged at error; pings resume, logged at info, if the pool serves again first)',
  EDGE_NO_WORKERS: 'an activation found no live worker to prepare the candidate on: it fails in prepare and the active generation stays',
  EDGE_PREPARE_FAILED: 'a worker could not prepare the candidate generation (its message says why): the activation fails (500 `prepare_failed`) and the active generation stays',
  EDGE_COMMIT_FAILED: 'a worker could not commit the prepared generation: that worker is replaced, the others roll back, and the active generation stays',
  EDGE_WORKER_ERROR: 'a worker answered a request with an error that carried no code of its own (its message is kept)',
  EDGE_OPERATION_ABANDONED: 'a control operation passed its deadline or lost its caller before it changed anything; nothing was carried out',
} as const satisfies Record<string, string>;

export type ServiceErrorCode = keyof typeof SERVICE_ERROR_CODES;
