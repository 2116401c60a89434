// The sd_notify protocol as plain data (sd_notify(3), systemd.service(5)): where systemd listens
// (`$NOTIFY_SOCKET`), whether it watches us (`$WATCHDOG_USEC`, `$WATCHDOG_PID`), and the datagram
// a state change is sent as. No sockets here: systemd/notifier.ts sends what this formats.

/** The variables systemd sets for a `Type=notify` service (unset before forking: see unsetNotifyEnvironment). */
export const NOTIFY_ENVIRONMENT = ['NOTIFY_SOCKET', 'WATCHDOG_USEC', 'WATCHDOG_PID'] as const;

/** What systemd asked of this process, read once at start. */
export interface NotifySettings {
  /**
   * Address to send to: a filesystem path, or an abstract socket name with its leading NUL
   * (`@name` in `$NOTIFY_SOCKET`). Undefined: not started by systemd (every notification is a no-op).
   */
  readonly socket: string | undefined;
  /** `$NOTIFY_SOCKET` held a form this sender cannot reach (e.g. `vsock:` of systemd ≥ 254). */
  readonly unsupported: string | undefined;
  /** Ping every this many ms (half of `$WATCHDOG_USEC`); undefined: no watchdog for this process. */
  readonly watchdogPingMs: number | undefined;
}

/** Reads the notify variables of `env` (left in place: a re-exec of this process needs them). */
export function readNotifyEnvironment(env: NodeJS.ProcessEnv, pid: number): NotifySettings {
  const address = notifyAddress(env['NOTIFY_SOCKET']);
  return {
    socket: address.socket,
    unsupported: address.unsupported,
    watchdogPingMs: address.socket === undefined ? undefined : watchdogPingMs(env['WATCHDOG_USEC'], env['WATCHDOG_PID'], pid),
  };
}

/**
 * Removes the notify variables from `env` (sd_notify's `unset_environment`), before the first
 * child is started, so that nothing this process starts (workers, `restart_command`) inherits
 * them: with `NotifyAccess=main` systemd would ignore a worker's datagram anyway, but a worker
 * must not try.
 */
export function unsetNotifyEnvironment(env: NodeJS.ProcessEnv): void {
  for (const name of NOTIFY_ENVIRONMENT) delete env[name];
}

/** `$NOTIFY_SOCKET` → the address to send to: `/path` as is, `@name` → abstract (leading NUL). */
export function notifyAddress(raw: string | undefined): { socket: string | undefined; unsupported: string | undefined } {
  if (raw === undefined || raw === '') return { socket: undefined, unsupported: undefined };
  if (raw.startsWith('/')) return { socket: raw, unsupported: undefined };
  if (raw.startsWith('@') && raw.length > 1) return { socket: `\0${raw.slice(1)}`, unsupported: undefined };
  return { socket: undefined, unsupported: raw };
}

/**
 * The ping interval for `$WATCHDOG_USEC`: half of it (sd_watchdog_enabled(3) recommends pinging at
 * half the timeout). None when it is unset, not a positive integer, or `$WATCHDOG_PID` names
 * another process (the watchdog is someone else's).
 */
export function watchdogPingMs(usec: string | undefined, watchdogPid: string | undefined, pid: number): number | undefined {
  if (usec === undefined || !/^[1-9][0-9]*$/.test(usec)) return undefined;
  if (watchdogPid !== undefined && watchdogPid !== '' && watchdogPid !== String(pid)) return undefined;
  return Math.max(1, Math.floor(Number(usec) / 2000));
}

/** One state change of the service, as systemd reads it. */
export type NotifyState =
  | { readonly kind: 'ready'; readonly status: string }
  | { readonly kind: 'reloading'; readonly monotonicUsec: bigint; readonly status: string }
  | { readonly kind: 'status'; readonly status: string }
  | { readonly kind: 'stopping'; readonly status: string }
  | { readonly kind: 'watchdog' };

/** The datagram for a state change: `KEY=value` lines (sd_notify(3)). */
export function formatNotify(s: NotifyState): string {
  switch (s.kind) {
    case 'ready':
      return `READY=1\nSTATUS=${statusText(s.status)}`;
    case 'reloading':
      // MONOTONIC_USEC: CLOCK_MONOTONIC when the reload began (systemd ≥ 253 requires it with
      // RELOADING=1 to tell this reload from an older one; earlier versions ignore it).
      return `RELOADING=1\nMONOTONIC_USEC=${s.monotonicUsec}\nSTATUS=${statusText(s.status)}`;
    case 'status':
      return `STATUS=${statusText(s.status)}`;
    case 'stopping':
      return `STOPPING=1\nSTATUS=${statusText(s.status)}`;
    case 'watchdog':
      return 'WATCHDOG=1';
  }
}

/** Longest STATUS text sent (characters): `systemctl status` shows one line. */
export const MAX_STATUS_CHARS = 200;

/** A STATUS value is one line: line breaks would start new assignments. */
function statusText(s: string): string {
  return s.replace(/[\r\n]+/g, ' ').slice(0, MAX_STATUS_CHARS);
}

/** The facts a STATUS line tells (the active generation and how many workers serve it). */
export interface ServiceFacts {
  readonly generation: number;
  readonly workersReady: number;
  readonly workersExpected: number;
}

/** `generation 3 active; 2/2 workers ready`, with a prefix for what is going on. */
export function describeService(f: ServiceFacts, doing?: string): string {
  const base = `generation ${f.generation} active; ${f.workersReady}/${f.workersExpected} workers ready`;
  return doing === undefined ? base : `${doing}; ${base}`;
}
