// Every error the request path produces, declared once as data (STYLE "Errors"; the model is
// Pingora's `Error` with its `ErrorSource` and `RetryType`): its code, the HTTP status the client
// gets, the failure class metrics count it under, whether another attempt may be made, who caused
// it, and the `outcome` label it records. Phases return one of the frozen `RequestError` objects
// below (no allocation on an error path either); code branches on `code`, `class` or `retryable`,
// never on message text. docs/errors.md is generated from this table, and a test checks that every
// `EDGE_*` code written in the data plane's sources is registered here.

/** Who caused a failure: the client, the backend, or the proxy itself (a defect or its own protection). */
export type ErrorSource = 'downstream' | 'upstream' | 'internal';

/**
 * What metrics count a failure as. `malformed`: refused by request validation
 * (svc_request_validation_rejects); `client`: the client's own failure (too large, too slow, gone); `policy`: refused by protocol policy (svc_policy_denied); `route`: no route;
 * `limited`: refused by a scoped rate limit (svc_request_rate_limited) or a quota
 * (svc_quota_policy_outcomes_total); `auth`: refused by request authentication (counted by it:
 * svc_jwt_validation_failures_total, svc_external_auth_*); `overload`: shed by overload protection (svc_overload_shed); `timeout` / `transport` / `tls`: the
 * backend failed (svc_backend_timeouts, svc_backend_errors, a passive-health and breaker failure);
 * `unavailable`: no backend may be used; `internal`: a defect of ours.
 */
export type FailureClass = 'malformed' | 'client' | 'policy' | 'route' | 'auth' | 'limited' | 'overload' | 'timeout' | 'transport' | 'tls' | 'unavailable' | 'internal';

/** `outcome` label values (SPEC) an error records. */
export type ErrorOutcome = 'failure' | 'timeout' | 'backend_error' | 'overload_shed' | 'rate_limited';

interface Def {
  /** Status answered downstream; undefined: nothing is answered (the client is gone). */
  readonly status: number | undefined;
  readonly class: FailureClass;
  /**
   * Whether the request may be tried again when this failure happens before the response is
   * committed downstream (a backend failure: refused, reset, TLS, a timeout, a 502/503). The request
   * path retries only idempotent requests it can replay, within the retry budget (docs/retries.md).
   */
  readonly retryable: boolean;
  readonly source: ErrorSource;
  readonly outcome: ErrorOutcome;
  /** Short text of the answer's body (never request data). */
  readonly detail: string;
  /** What it means, for docs/errors.md. */
  readonly meaning: string;
}

const down = (status: number | undefined, cls: FailureClass, detail: string, meaning: string): Def => ({ status, class: cls, retryable: false, source: 'downstream', outcome: 'failure', detail, meaning });
const shed = (detail: string, meaning: string, source: ErrorSource = 'internal'): Def => ({ status: 503, class: 'overload', retryable: false, source, outcome: 'overload_shed', detail, meaning });
const up = (status: number, cls: FailureClass, retryable: boolean, outcome: ErrorOutcome, detail: string, meaning: string): Def => ({ status, class: cls, retryable, source: 'upstream', outcome, detail, meaning });

/** The request path's errors. */
export const REQUEST_ERROR_DEFS = {
  // Downstream: the request itself.
  EDGE_REQUEST_INVALID_TARGET: down(400, 'malformed', 'invalid request target', 'the request target is malformed or unsafe once normalized (characters, percent-encoding, encoded separators, dot segments, form); answered 400'),
  EDGE_REQUEST_INVALID_HEADER: down(400, 'malformed', 'invalid header', 'a Host, `:authority` or `:scheme` is malformed, Host is repeated, or a field value holds forbidden characters; answered 400'),
  EDGE_REQUEST_UNSUPPORTED_CODING: down(501, 'malformed', 'unsupported transfer coding', 'a transfer coding other than chunked (RFC 9112 §6.1); answered 501'),
  EDGE_REQUEST_INVALID: down(400, 'client', 'invalid request', 'the upstream client refused to build the request (a field value or target it will not send, a body that does not match its content-length); nothing reached the backend; answered 400'),
  EDGE_REQUEST_HEADERS_TOO_LARGE: down(431, 'malformed', 'request header fields too large', 'more header fields than `max_headers_count` or more bytes than `max_headers_bytes`; answered 431'),
  EDGE_REQUEST_BODY_TOO_LARGE: down(413, 'client', 'request body larger than the limit', 'the request body (declared or streamed) exceeds `max_request_body_bytes`; answered 413'),
  EDGE_CLIENT_BODY_TIMEOUT: down(408, 'client', 'client body timeout', 'the client sent its body too slowly (`client_body_idle_ms`, `client_body_total_ms`, `client_body_min_bytes_per_s`); answered 408'),
  EDGE_CLIENT_SEND_TIMEOUT: down(408, 'client', 'client send timeout', 'the client did not read the response for `client_send_idle_ms`: the exchange is cut'),
  EDGE_REQUEST_BODY_LENGTH_MISMATCH: down(400, 'malformed', 'body length mismatch', 'on HTTP/2 or HTTP/3 the request body is longer than its content-length, or ends shorter (RFC 9113 §8.1.1, RFC 9114 §4.1.2): the stream is reset (RST_STREAM PROTOCOL_ERROR, H3_MESSAGE_ERROR) and the upstream request aborted before the backend has the whole body (the final chunk is held until the end of stream); recorded with status 0, nothing answered (400 if the stream was still open)'),
  EDGE_CLIENT_CLOSED: down(undefined, 'client', 'client closed', 'the client went away before the response ended: the upstream request is aborted, nothing is answered'),
  // Downstream: refused by protocol policy.
  EDGE_REQUEST_AUTHORITY_MISMATCH: down(400, 'malformed', 'authority host mismatch', '`:authority` differs from Host under `enforce_authority_host_match`; answered 400'),
  EDGE_POLICY_METHOD_NOT_ALLOWED: down(405, 'policy', 'method not allowed', 'the method is not in `allowed_methods`, or it is CONNECT (tunnelling is not built: every CONNECT, on every protocol); answered 405 with `Allow`'),
  EDGE_POLICY_PATH_DENIED: down(403, 'policy', 'denied path', 'the path lies under `denied_path_prefixes`; answered 403'),
  EDGE_REQUEST_UPGRADE_UNSUPPORTED: down(400, 'malformed', 'upgrade not supported', 'an Upgrade request on HTTP/2 or HTTP/3 (upgrades exist on HTTP/1.1 only); answered 400'),
  EDGE_POLICY_TOO_EARLY: down(425, 'policy', 'early data unsafe', 'a request in 0-RTT early data that is not safe to replay; answered 425 (RFC 8470)'),
  EDGE_ROUTE_NOT_FOUND: down(404, 'route', 'no route matches this host and path', 'no route matches the host and path; answered 404'),
  EDGE_ROUTE_METHOD_NOT_ALLOWED: down(405, 'route', 'no route accepts this method', 'routes match the host and path but none accepts the method; answered 405 with `Allow`'),
  // Request authentication (docs/auth.md): counted by reason by the authenticate phase.
  EDGE_AUTH_TOKEN_MISSING: down(401, 'auth', 'bearer token required', 'the route validates JWTs and the request carries none in the configured header; answered 401 with `WWW-Authenticate: Bearer` (reason `missing_token`)'),
  EDGE_AUTH_TOKEN_INVALID: down(401, 'auth', 'invalid bearer token', 'the JWT failed validation (reason in svc_jwt_validation_failures_total: signature, algorithm, key, issuer, audience, expiry, or keys unavailable); answered 401 with `WWW-Authenticate: Bearer error="invalid_token"`'),
  EDGE_AUTH_DENIED: down(403, 'auth', 'denied by authorization service', 'the external authorization service answered 401 or 403; answered 403 (svc_external_auth_denied)'),
  EDGE_AUTH_UNAVAILABLE: { status: 503, class: 'auth', retryable: false, source: 'internal', outcome: 'failure', detail: 'authorization service unavailable', meaning: 'the external authorization service timed out or failed and its `failure_mode` is `deny`; answered 503 with `Retry-After: 1` (svc_external_auth_timeout, svc_external_auth_error)' },
  // Scoped rate limits and quota (docs/rate-limits.md): 429 with `Retry-After`.
  EDGE_RATE_LIMITED: { status: 429, class: 'limited', retryable: false, source: 'downstream', outcome: 'rate_limited', detail: 'rate limit exceeded', meaning: 'the request found its bucket of a `resilience.rate_limits` entry empty; answered 429 with `Retry-After` (seconds until a token); svc_request_rate_limited' },
  EDGE_QUOTA_EXCEEDED: { status: 429, class: 'limited', retryable: false, source: 'downstream', outcome: 'rate_limited', detail: 'quota exceeded', meaning: 'a `resilience.quota` policy\'s burst or sustained contract is used up for the request\'s selector, or the store is unreachable under `failure_mode: deny`; answered 429 with `Retry-After` (seconds until the window ends); svc_quota_policy_outcomes_total{decision="deny"}' },
  // Overload protection (docs/overload.md): 503 with `Retry-After`.
  EDGE_SHED_BROWNOUT: shed('brownout active: non-core route shed', 'brownout is active and the route is not in `core_routes`; answered 503 with `Retry-After` (reason `brownout`)'),
  EDGE_SHED_QUEUE_FULL: shed('route queue full', 'the request found its limits full and its route queue (or all queues, `global_cap`) full; answered 503 with `Retry-After` (reason `queue_full`)'),
  EDGE_SHED_QUEUE_TIMEOUT: shed('waited too long for admission', 'the request waited `max_wait_ms` in its route queue without being admitted; answered 503 with `Retry-After` (reason `queue_timeout`)'),
  EDGE_SHED_LEASE_UNAVAILABLE: shed('node limit service unavailable', 'the request needed a unit of a node budget (an in-flight slot, a rate-limit token, a route-queue place) its worker\'s lease did not hold, and the supervisor did not answer the worker\'s ask in time (`LEASE_WAIT_MS`): a slow or frozen supervisor never makes a worker admit past its lease; answered 503 with `Retry-After` (reason `lease_unavailable`)'),
  EDGE_SHED_CIRCUIT_OPEN: shed("every backend's circuit breaker is open", "every backend the request could use has its circuit breaker open (or half-open with its probes taken); answered 503 with `Retry-After` (reason `circuit_open`, svc_circuit_breaker_rejected_total)", 'upstream'),
  EDGE_NO_HEALTHY_BACKEND: { status: 503, class: 'unavailable', retryable: false, source: 'upstream', outcome: 'backend_error', detail: 'no healthy backend', meaning: 'every backend of the route fails its active health checks; answered 503 with `Retry-After`' },
  // Upstream.
  EDGE_UPSTREAM_CONNECT_TIMEOUT: up(504, 'timeout', true, 'timeout', 'connect timeout', 'the backend did not accept the connection within `connect_ms`; answered 504; an idempotent request may be retried'),
  EDGE_UPSTREAM_HEADERS_TIMEOUT: up(504, 'timeout', true, 'timeout', 'headers timeout', 'the backend did not answer within `backend_request_ms`; answered 504; an idempotent request may be retried'),
  EDGE_UPSTREAM_BODY_TIMEOUT: up(504, 'timeout', true, 'timeout', 'body timeout', 'the response body paused longer than `backend_body_idle_ms` or took longer than `backend_body_total_ms`; 504, or the downstream is cut if the response had started; retryable only while the response is still held in the prebuffer'),
  EDGE_UPSTREAM_TRANSPORT: up(502, 'transport', true, 'backend_error', 'transport', 'the backend connection failed (refused, reset, closed, unparsable response); answered 502; an idempotent request may be retried'),
  EDGE_UPSTREAM_TLS: up(502, 'tls', true, 'backend_error', 'tls', 'TLS to the backend failed (certificate, name, protocol); answered 502; an idempotent request may be retried'),
  EDGE_UPSTREAM_PROTOCOL: up(502, 'transport', false, 'backend_error', 'backend switched to a protocol the client did not ask for', 'the backend answered an Upgrade with a 101 naming a protocol the client did not ask for; answered 502'),
  EDGE_UPSTREAM_ERROR_STATUS: up(502, 'transport', true, 'backend_error', 'backend error status', 'the backend answered 502 or 503 to an idempotent request that could be tried again: that answer is discarded and the request retried (docs/retries.md); if the retry cannot be made after all (no backend left), answered with that status'),
  // Internal.
  EDGE_ATTEMPT_CANCELLED: { status: undefined, class: 'internal', retryable: false, source: 'internal', outcome: 'failure', detail: 'attempt cancelled', meaning: 'the proxy cancelled an attempt it no longer needed: the losing attempt of a hedged request (docs/retries.md); nothing is answered for it, and it counts for no breaker or health' },
  EDGE_INTERNAL: { status: 502, class: 'internal', retryable: false, source: 'internal', outcome: 'failure', detail: 'internal', meaning: 'a defect of the proxy, or its connection pool closed under the request (a generation swap); answered 502 and counted in svc_runtime_panics when it is a defect' },
} as const satisfies Record<string, Def>;

export type RequestErrorCode = keyof typeof REQUEST_ERROR_DEFS;

/** One error of the request path: its definition and its code (one frozen object per code). */
export interface RequestError extends Def {
  readonly code: RequestErrorCode;
}

/** The frozen error objects by code: `ERR.EDGE_UPSTREAM_TRANSPORT`. */
export const ERR: { readonly [K in RequestErrorCode]: RequestError } = Object.freeze(
  Object.fromEntries(Object.entries(REQUEST_ERROR_DEFS).map(([code, def]) => [code, Object.freeze({ code, ...def })])),
) as { readonly [K in RequestErrorCode]: RequestError };

/**
 * Codes of the data plane that are not request-path errors: thrown while provisioning a
 * generation, or raised by the worker's test hook (`EDGE_TEST_HOOKS=1` only).
 */
/**
 * The reason phrase of every status the proxy answers itself (RFC 9110 §15), for the status line
 * of an upgrade answer and the first line of every coded body (`401 Unauthorized: ...`). A test
 * checks that each status of REQUEST_ERROR_DEFS has one.
 */
export const REASON_PHRASES: Readonly<Record<number, string>> = {
  200: 'OK',
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  413: 'Content Too Large',
  421: 'Misdirected Request',
  425: 'Too Early',
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  501: 'Not Implemented',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

export const DATAPLANE_ERROR_CODES = {
  EDGE_UPSTREAM_TLS_UNUSABLE: 'an upstream pool\'s TLS material parses but the TLS library refuses it (a key too weak, an unsupported algorithm): the candidate generation fails in prepare and the active one keeps serving',
  EDGE_NOT_INITIALIZED: 'a worker was asked to prepare a generation before the supervisor sent it the shared keys: the prepare fails (a defect, never seen in a healthy start)',
  EDGE_NOT_PREPARED: 'a worker was asked to commit a generation it has not prepared (or prepared another): the commit fails and the active generation stays',
  EDGE_TEST_REFUSED: 'test hook only (`EDGE_TEST_FAIL` in the environment of a test): a worker refuses a prepare or commit on purpose',
} as const satisfies Record<string, string>;

/** Every request-path error as docs/errors.md shows it: status, class, retryable, source, meaning. */
export function requestErrorDocs(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of Object.values(ERR)) out[e.code] = `[${e.status ?? 'no answer'}, ${e.class}, ${e.source}${e.retryable ? ', retryable' : ''}] ${e.meaning}`;
  return { ...out, ...DATAPLANE_ERROR_CODES };
}
