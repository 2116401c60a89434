// Every configuration error code, declared once. Code branches on `issue.code`, never on message text.
// `docs/errors.md` documents each code; a test keeps the two in step.

/** Error codes of the config package, with a one-line meaning used by the docs. */
export const CONFIG_ERROR_CODES = {
  EDGE_CONFIG_INVALID: 'the configuration was rejected; the error carries every issue found, each with its own code below',
  // Reading and parsing
  EDGE_CONFIG_READ: 'the configuration file cannot be read',
  EDGE_CONFIG_YAML_SYNTAX: 'the file is not well-formed YAML (or has duplicate keys)',
  EDGE_CONFIG_NOT_OBJECT: 'the document is not a mapping at the top level',
  // Schema
  EDGE_CONFIG_UNSUPPORTED_VERSION: '`version` is not 1, the only supported schema version',
  EDGE_CONFIG_UNKNOWN_KEY: 'a key that the schema does not define',
  EDGE_CONFIG_REQUIRED: 'a required key is missing',
  EDGE_CONFIG_TYPE: 'a value has the wrong type',
  EDGE_CONFIG_ENUM: 'a value is not one of the allowed values',
  EDGE_CONFIG_RANGE: 'a number or size is out of its allowed range',
  EDGE_CONFIG_FORMAT: 'a string does not have the required form',
  // Listeners and downstream TLS
  EDGE_CONFIG_NO_LISTENER: 'neither `listen` nor a non-empty `listeners` is configured',
  EDGE_CONFIG_DUPLICATE_BIND: 'two effective listeners bind the same address and port',
  EDGE_CONFIG_DUPLICATE_LISTENER_NAME: 'two listeners have the same name',
  EDGE_CONFIG_INVALID_IP: 'an address is not a valid IPv4 or IPv6 address',
  EDGE_CONFIG_TLS_PARTIAL_PAIR: '`cert` and `key` must be given together',
  EDGE_CONFIG_TLS_NO_IDENTITY: 'a listener has neither `cert`/`key` nor `certificates[]`',
  EDGE_CONFIG_TLS_SERVER_NAME_INVALID: '`server_name` is not a valid DNS name',
  EDGE_CONFIG_TLS_SERVER_NAME_DUPLICATE: 'two `certificates[]` entries have the same `server_name`',
  EDGE_CONFIG_TLS_SAN_MISMATCH: "`server_name` is not covered by the certificate's subject alternative names",
  EDGE_CONFIG_TLS_UNREADABLE: 'a certificate, key or CA file cannot be read',
  EDGE_CONFIG_TLS_INVALID_MATERIAL: 'a certificate, key or CA file does not hold usable PEM material',
  EDGE_CONFIG_TLS_KEY_MISMATCH: 'a private key does not belong to its certificate',
  // Upstreams, routes and backends
  EDGE_CONFIG_NO_UPSTREAM: '`upstream` defines no pool',
  EDGE_CONFIG_DUPLICATE_UPSTREAM: 'two upstream pools have the same name',
  EDGE_CONFIG_EMPTY_ROUTE: 'a route has an empty path prefix',
  EDGE_CONFIG_DUPLICATE_ROUTE: 'two routes have the same normalized matcher',
  EDGE_CONFIG_AMBIGUOUS_ROUTE: 'two routes overlap so that a request could match both with equal precedence',
  EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS: 'two routes of one host have path prefixes that differ only in case, `;params` or trailing dots or spaces, which routing ignores (docs/request-path.md, "Routing")',
  EDGE_CONFIG_DUPLICATE_BACKEND_ID: 'two backends of one pool have the same id',
  EDGE_CONFIG_BACKEND_ADDRESS: 'a backend address is not host, host:port, http://host[:port] or https://host[:port]',
  EDGE_CONFIG_HOST_POLICY: '`host_policy.host` is set outside `mode: rewrite`, or missing in it',
  EDGE_CONFIG_LB_KEY: 'a load-balancing key spec is invalid or does not fit the strategy',
  EDGE_CONFIG_KEY_SPEC: 'a request key spec (client_ip, host, path, route, header:NAME, cookie:NAME, query:NAME) is malformed',
  EDGE_CONFIG_RATE_LIMIT: 'an invalid scoped rate limit (for example a duplicate name)',
  EDGE_CONFIG_EARLY_DATA: 'a method that is not safe and idempotent is listed as accepted in 0-RTT early data',
  EDGE_CONFIG_TOKEN_WEAK: 'a control API token is shorter than 16 characters',
  EDGE_CONFIG_RESERVED_PATH: 'a configured path collides with a built-in control API route',
  EDGE_CONFIG_UNKNOWN_ROUTE_REFERENCE: 'a policy names an upstream pool (route) that does not exist',
  EDGE_CONFIG_CONNECT_CONFLICT: 'CONNECT routing or policy settings contradict each other',
  // Timeouts and limits
  EDGE_CONFIG_TIMEOUT_ORDER: 'timeouts are ordered illegally (for example connect longer than the whole request)',
  EDGE_CONFIG_LIMIT_ORDER: 'limits are ordered illegally (for example a per-backend limit above the global one)',
  // Process model
  EDGE_CONFIG_REUSEPORT: '`performance.reuseport: false` needs `worker_threads: 1`: several workers sharing one UDP socket would split QUIC connections between them',
  // Resilience (SPEC "Configuration errors")
  EDGE_CONFIG_BROWNOUT_HYSTERESIS: 'brownout hysteresis inverted: recover_inflight_percent must be < trigger_inflight_percent',
  EDGE_CONFIG_ADMISSION_MIN_LIMIT: 'adaptive_admission.min_limit must be > 0',
  EDGE_CONFIG_ADMISSION_MAX_LIMIT: 'adaptive_admission.max_limit must be > 0 when provided',
  EDGE_CONFIG_ADMISSION_LIMIT_ORDER: 'adaptive_admission.max_limit must be >= min_limit',
  EDGE_CONFIG_ADMISSION_ABOVE_GLOBAL: 'adaptive_admission.max_limit must be <= performance.global_inflight_limit',
  EDGE_CONFIG_RETRY_RATIO: 'retry_budget ratios must be 0-100',
  EDGE_CONFIG_HEDGING_DELAY: 'hedging.delay_ms must be > 0 when hedging is enabled',
  EDGE_CONFIG_HEDGING_NEEDS_RETRY: 'hedging is enabled but could never send a hedge: a hedge is an attempt of the retry budget, which must be enabled with max_attempts >= 2',
  EDGE_CONFIG_HEDGING_METHOD: '`hedging.safe_methods` lists a method that may not be sent twice: only GET, HEAD, OPTIONS, PUT and DELETE can be hedged (RFC 9110 §9.2.2 idempotent methods the request path retries); POST, PATCH, TRACE and others are refused',
  EDGE_CONFIG_WATCHDOG_RESTART_HOOK: 'watchdog.restart_hook is deprecated and rejected; use restart_command',
  EDGE_CONFIG_WATCHDOG: 'an unsupported watchdog combination',
  EDGE_CONFIG_QUOTA: 'an invalid quota policy or store setting',
  // Control plane and observability
  EDGE_CONFIG_CONTROL_API_AUTH: 'a non-loopback control API requires `auth_token`',
  EDGE_CONFIG_AUTH_COMBINATION: 'an unsupported control API authentication combination',
  EDGE_CONFIG_DUPLICATE_TOKEN: 'two control API bearer tokens are equal',
  EDGE_CONFIG_CIDR: 'an IP allowlist entry is not a valid CIDR block',
  EDGE_CONFIG_BIND_CONFLICT: 'the control API, metrics endpoint and listeners must not share a TCP bind',
  EDGE_CONFIG_PATH_CONFLICT: 'two control API paths are equal or not absolute',
  EDGE_CONFIG_LOG_FILE: '`log.file` cannot be appended to by the user running the check: its directory is missing or not writable, or the file is a directory or not writable (checked by `edge-proxy -c` only)',
  EDGE_CONFIG_ROUTING_HEADER: '`observability.routing.header_name` must be non-empty when `expose_header` is true',
  EDGE_CONFIG_TRACING_ENDPOINT: '`observability.tracing.endpoint` is not a valid URL, or carries credentials (`user:password@`), which are refused (a collector credential goes in `OTEL_EXPORTER_OTLP_TRACES_HEADERS` of the environment of the service)',
  EDGE_CONFIG_JWT: 'an invalid request-authentication (JWT or external auth) setting',
  EDGE_CONFIG_AUTH_PUBLIC: "a pool's `auth.public: true` is combined with `jwt`/`external` or set without `default_auth`, or under `default_auth` a pool's `auth` names no check without saying `public: true`",
  // Features not carried out yet (see features.ts)
  EDGE_CONFIG_NOT_BUILT: 'the configuration turns on a feature that is not built yet (the route-decision response header; CONNECT tunnelling: `allow_connect` and its allowlists); refused so it cannot fail open',
  // Secrets
  EDGE_CONFIG_SECRET_EXCLUSIVE: 'a plaintext field and its `_ref` twin are both set; they are mutually exclusive',
  EDGE_CONFIG_SECRET_REF: 'a secret reference is malformed or uses an unsupported scheme',
  EDGE_CONFIG_SECRET_PROVIDER: 'a secret reference names a provider that is not configured',
  EDGE_CONFIG_SECRET_UNREADABLE: 'the file behind a secret reference is missing or unreadable',
  EmptySecret: 'the file behind a secret reference is empty',
  MalformedPemCertificate: 'a certificate behind a secret reference is not well-formed PEM',
  MalformedPemPrivateKey: 'a private key behind a secret reference is not well-formed PEM',
  EDGE_CONFIG_SECRET_KEY_MISMATCH: 'an upstream client key does not belong to its client certificate',
} as const;

/** A configuration error code. */
export type ConfigErrorCode = keyof typeof CONFIG_ERROR_CODES;

/** One problem found in a configuration: where (JSON path), which rule, and a message without secret bytes. */
export interface ConfigIssue {
  /** JSON pointer-like dotted path, e.g. `upstream.api.backends[1].address`; `` for the document. */
  readonly path: string;
  readonly code: ConfigErrorCode;
  readonly message: string;
}

/** Builds an issue; the single place where issues are made, so every issue has a declared code. */
export function issue(path: string, code: ConfigErrorCode, message: string): ConfigIssue {
  return { path, code, message };
}

/** Thrown when a configuration is rejected; carries every issue of the file at once. */
export class ConfigValidationError extends Error {
  readonly code = 'EDGE_CONFIG_INVALID';
  readonly issues: readonly ConfigIssue[];
  constructor(source: string, issues: readonly ConfigIssue[]) {
    super(`${source}: ${issues.length} configuration error${issues.length === 1 ? '' : 's'}`);
    this.name = 'ConfigValidationError';
    this.issues = issues;
  }
}

/** Formats an issue as one line: `path: CODE: message`. */
export function formatIssue(i: ConfigIssue): string {
  return `${i.path === '' ? '(document)' : i.path}: ${i.code}: ${i.message}`;
}
