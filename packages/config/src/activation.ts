// Which configuration changes can be activated live and which need a restart (SPEC "What the
// service does" 7 and 8). One table serves the domain diff and the generated configuration docs.

/** How a change to a key can take effect. */
export type Activation = 'live' | 'restart_required';

/** A classification row: a schema path pattern (`*` one segment, `**` the rest) and why. */
interface ActivationRule {
  readonly pattern: string;
  readonly activation: Activation;
  readonly reason: string;
}

/**
 * Restart-required keys, in SPEC order; anything not listed is live-activatable. Listener rows are
 * written against `listeners[]` (a listener is identified by its name); removal is handled by the diff.
 */
const RESTART_RULES: readonly ActivationRule[] = [
  { pattern: 'listeners[].address', activation: 'restart_required', reason: 'listener bind address change' },
  { pattern: 'listeners[].port', activation: 'restart_required', reason: 'listener bind port change' },
  { pattern: 'listeners[].protocol', activation: 'restart_required', reason: 'listener protocol change' },
  { pattern: 'listen.address', activation: 'restart_required', reason: 'listener bind address change' },
  { pattern: 'listen.port', activation: 'restart_required', reason: 'listener bind port change' },
  { pattern: 'listen.protocol', activation: 'restart_required', reason: 'listener protocol change' },
  { pattern: 'observability.control_api.enabled', activation: 'restart_required', reason: 'control API bind change' },
  { pattern: 'observability.control_api.required', activation: 'restart_required', reason: 'control API bind change' },
  { pattern: 'observability.control_api.address', activation: 'restart_required', reason: 'control API bind change' },
  { pattern: 'observability.control_api.port', activation: 'restart_required', reason: 'control API bind change' },
  { pattern: 'observability.metrics.enabled', activation: 'restart_required', reason: 'metrics bind change' },
  { pattern: 'observability.metrics.address', activation: 'restart_required', reason: 'metrics bind change' },
  { pattern: 'observability.metrics.port', activation: 'restart_required', reason: 'metrics bind change' },
  { pattern: 'log.format', activation: 'restart_required', reason: 'log format change' },
  { pattern: 'log.file', activation: 'restart_required', reason: 'log file change' },
  { pattern: 'observability.tracing.**', activation: 'restart_required', reason: 'tracing startup configuration change' },
  { pattern: 'performance.control_plane_threads', activation: 'restart_required', reason: 'control-plane thread count change' },
  // Decisions (docs/decisions.md): the worker process model and privilege drop are fixed at startup.
  { pattern: 'performance.worker_threads', activation: 'restart_required', reason: 'worker process count change' },
  { pattern: 'performance.reuseport', activation: 'restart_required', reason: 'socket option change' },
  { pattern: 'performance.pin_workers', activation: 'restart_required', reason: 'worker CPU pinning change' },
  { pattern: 'security.**', activation: 'restart_required', reason: 'privilege-drop change' },
  // Whether client certificates are requested is fixed when a TLS server starts; the CA is live.
  { pattern: 'observability.control_api.tls.client_auth.mode', activation: 'restart_required', reason: 'control API client authentication mode change' },
  { pattern: 'listeners[].tls.client_auth.mode', activation: 'restart_required', reason: 'listener client authentication mode change' },
  { pattern: 'listen.tls.client_auth.mode', activation: 'restart_required', reason: 'listener client authentication mode change' },
];

/** The reason given when a listener disappears. */
export const LISTENER_REMOVAL_REASON = 'listener removal';

/** Ports below this need CAP_NET_BIND_SERVICE (Linux `net.ipv4.ip_unprivileged_port_start` default). */
export const FIRST_UNPRIVILEGED_PORT = 1024;
/** The reason given when a listener added by activation could not be bound by a worker that dropped privileges. */
export const PRIVILEGED_LISTENER_REASON = 'listener on a port below 1024 added while the workers run as security.user (they dropped the capability to bind it)';

/**
 * Whether a listener on `port` added by activation needs a restart: the workers bind it at commit,
 * but with `security.user` they run as that user by then and the kernel refuses a port below 1024
 * (root's capabilities went with the switch). A restart binds it as root, before the switch.
 */
export function addedListenerNeedsRestart(security: { readonly user?: string | undefined }, port: number): boolean {
  return security.user !== undefined && port < FIRST_UNPRIVILEGED_PORT;
}

function matches(pattern: string, schemaPath: string): boolean {
  const p = pattern.split('.');
  const s = schemaPath.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '**') return s.length >= i;
    if (i >= s.length || (p[i] !== '*' && p[i] !== s[i])) return false;
  }
  return p.length === s.length;
}

/**
 * Classifies a key by its schema path (`listeners[].port`, `upstream.*.route.host`, `log.level`).
 * A parent path is restart-required when any restart-required key lies under it.
 */
export function classifySchemaPath(schemaPath: string): { activation: Activation; reason?: string } {
  const rule = RESTART_RULES.find((r) => matches(r.pattern, schemaPath) || r.pattern.startsWith(`${schemaPath}.`));
  return rule === undefined ? { activation: 'live' } : { activation: rule.activation, reason: rule.reason };
}
