// `observability`: metrics endpoint, control API, tracing, route-decision logs, the access log and request ids.
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Defaulted, Enum, Millis, Obj, Port, secretPair } from './common.ts';
import { ClientAuth } from './listener.ts';

const HttpPath = (def: string, description: string) => Type.String({ pattern: '^/[A-Za-z0-9._~!$&\'()*+,;=:@/%-]*$', maxLength: 256, default: def, description });

export const Metrics = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'serve the metrics endpoint (plain HTTP)' }),
    address: Type.String({ minLength: 1, default: '127.0.0.1', description: 'IP address to bind' }),
    port: Port(9100, 'TCP port'),
    path: HttpPath('/metrics', 'only this path answers; any other is 404'),
    max_connections: Type.Integer({ minimum: 1, maximum: 100_000, default: 512, description: 'concurrent connections; at the limit a new connection displaces the oldest one' }),
    max_connections_per_source: Type.Integer({ minimum: 1, maximum: 100_000, default: 32, description: 'concurrent connections from one source address; at the limit a new one displaces that source\'s oldest' }),
    idle_timeout_ms: Millis(15_000, 'a connection with no request in progress (before its first request too) is closed after this'),
    connection_timeout_ms: Millis(30_000, 'per-connection lifetime'),
  },
  { description: 'metrics endpoint' },
);

export const BearerToken = Obj(
  {
    ...secretPair('token', 'bearer token value (at least 16 characters)'),
    role: Enum(['viewer', 'operator', 'admin'], { description: 'granted role', 'x-example': 'operator' }),
    actor_id: Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}$', description: 'who holds the token; recorded in audit events', 'x-example': 'deploy-bot' }),
  },
  { description: 'a bearer token with its role' },
);

export const ControlApiAuth = Obj(
  {
    bearer_tokens: Type.Array(BearerToken, { maxItems: 1024, default: [], description: 'bearer tokens with roles' }),
    identity_source: Type.Optional(
      Obj(
        {
          kind: Enum(['mtls_subject_cn'], { description: 'identity from the client certificate subject CN' }),
          role_attribute: Enum(['OU', 'O', 'CN'], {
            default: 'OU',
            description: 'subject attribute holding the role (`viewer`, `operator` or `admin`)',
          }),
        },
        { description: 'role-bearing mTLS identity mapping' },
      ),
    ),
  },
  { description: 'control API authentication' },
);

export const ControlApiTls = Obj(
  {
    cert: Type.Optional(Type.String({ minLength: 1, description: 'path of the PEM certificate chain', 'x-example': '/etc/edge-proxy/tls/admin.crt' })),
    key: Type.Optional(Type.String({ minLength: 1, description: 'path of the PEM private key', 'x-example': '/etc/edge-proxy/tls/admin.key' })),
    client_auth: Type.Optional(ClientAuth),
  },
  { description: "control API TLS; without `cert`/`key` the first listener's default identity is used" },
);

export const Audit = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'emit audit events' }),
    format: Enum(['json'], { default: 'json', description: 'event format' }),
    sink: Enum(['log'], { default: 'log', description: 'events go to the service log (one JSON line each, `audit: true`)' }),
  },
  { description: 'audit stream' },
);

export const ControlApi = Obj(
  {
    enabled: Type.Boolean({ default: true, description: 'serve the control API (HTTPS, HTTP/1.1)' }),
    required: Type.Boolean({ default: true, description: 'a failed bind or TLS initialization stops startup' }),
    address: Type.String({ minLength: 1, default: '127.0.0.1', description: 'IP address to bind; non-loopback requires `auth_token`' }),
    port: Port(9443, 'TCP port'),
    ...secretPair('auth_token', 'legacy single token, treated as an admin identity'),
    auth: Defaulted(ControlApiAuth),
    tls: Defaulted(ControlApiTls),
    ip_allowlist: Type.Optional(
      Obj(
        { cidrs: Type.Array(Type.String({ minLength: 1, maxLength: 64 }), { minItems: 1, maxItems: 1024, description: 'allowed source CIDR blocks', 'x-example': ['10.0.0.0/8', '::1/128'] }) },
        { description: 'source-address policy, evaluated before bearer tokens' },
      ),
    ),
    audit: Defaulted(Audit),
    reload_path: HttpPath('/admin/runtime/reload', 'POST path of the legacy reload'),
    reload_certs_path: HttpPath('/admin/runtime/reload-certs', 'POST path of the certificate reload'),
    max_connections: Type.Integer({ minimum: 1, maximum: 100_000, default: 256, description: 'concurrent connections; excess dropped (`svc_control_api_connection_limit_drops`)' }),
    connection_timeout_ms: Millis(30_000, 'per-connection lifetime'),
    max_body_bytes: Type.Integer({ minimum: 64, maximum: 1_048_576, default: 65_536, description: 'largest request body (413 above)', 'x-unit': 'bytes' }),
    max_connections_per_source: Type.Integer({
      minimum: 1,
      maximum: 100_000,
      default: 32,
      description: 'concurrent connections from one source address; a new one beyond it (or beyond `max_connections`) evicts the oldest connection that has not yet authenticated a request, else it is dropped',
    }),
    handshake_timeout_ms: Millis(5_000, 'a connection must finish its TLS handshake within this time', { maximum: 600_000 }),
    idle_timeout_ms: Millis(10_000, 'a connection with no request in progress is closed after this time (before the first request too)', { maximum: 600_000 }),
    operation_timeout_ms: Millis(30_000, 'deadline of a control operation (activate, preview, reload, rollback, reload-certs, SIGHUP), queueing included; a late one is not carried out (503/504)', { minimum: 100, maximum: 600_000 }),
    config_path_allowed_dirs: Type.Optional(
      Type.Array(Type.String({ pattern: '^/', minLength: 1, maxLength: 4096 }), {
        maxItems: 64,
        description: 'absolute directories a `config_path` must lie in (symlinks resolved); default: the directory of the configuration file the service was started with; `[]` refuses every `config_path`; a directory that does not exist matches nothing',
        'x-example': ['/etc/edge-proxy'],
      }),
    ),
  },
  { description: 'control API' },
);

export const Tracing = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'export a server span per request and a client span per upstream attempt, and send `traceparent` upstream (docs/observability.md, "Tracing")' }),
    exporter: Enum(['otlp-http'], { default: 'otlp-http', description: 'span exporter: OTLP over HTTP, JSON encoding, uncompressed' }),
    endpoint: Type.Optional(
      Type.String({
        pattern: '^https?://',
        maxLength: 2048,
        description: 'OTLP/HTTP traces URL; default (when enabled) `http://localhost:4318/v1/traces`, a local collector. No credentials in it (`user:pass@` is refused; a collector credential goes in OTEL_EXPORTER_OTLP_TRACES_HEADERS of the environment); logs name its host:port only',
        'x-example': 'http://127.0.0.1:4318/v1/traces',
      }),
    ),
    service_name: Type.String({ minLength: 1, maxLength: 128, default: 'edge-proxy', description: '`service.name` resource attribute' }),
    sample_ratio: Type.Number({ minimum: 0, maximum: 1, default: 0.01, description: 'share of requests sampled: of new traces, and of a caller\'s trace (its `traceparent`) unless `trust_incoming_sampling`' }),
    trust_incoming_sampling: Type.Boolean({
      default: false,
      description:
        'a caller\'s `traceparent` sampled flag decides for its trace (`-01` exported, `-00` not); false: `sample_ratio` decides for every request (a client cannot force export), and the span stays in the caller\'s trace; true only where every client is part of your own tracing',
    }),
  },
  { description: 'tracing (startup configuration; restart required)' },
);

export const Routing = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'emit route-decision logs' }),
    include_reason: Type.Boolean({ default: true, description: 'include why the route matched' }),
    expose_header: Type.Boolean({ default: false, description: 'reserved: expose the decision in a response header' }),
    header_name: Type.String({ maxLength: 128, default: 'x-svc-route-decision', description: 'reserved: header name; non-empty when `expose_header` is true' }),
  },
  { description: 'route-decision logs' },
);

export const AccessLog = Obj(
  {
    enabled: Type.Boolean({ default: false, description: 'write one line per request (docs/observability.md, "Access log") to the service log\'s destination (stdout or `log.file`), whatever `log.level` is' }),
    sample_ratio: Type.Number({ minimum: 0, maximum: 1, default: 1, description: 'share of requests logged (a random draw per request); `log_failures` decides for failures' }),
    log_failures: Type.Boolean({ default: true, description: 'log every request answered 5xx or not answered (the client went away) whatever `sample_ratio` draws' }),
  },
  { description: 'access log' },
);

export const RequestId = Obj(
  {
    accept_incoming: Type.Boolean({ default: true, description: 'keep a client\'s `x-request-id` when it is 1 to 128 characters of `A-Z a-z 0-9 - _ . : + / = @`; otherwise (or when false) the proxy generates one (a UUID)' }),
  },
  { description: 'request ids (`x-request-id`): sent upstream, written in access and route-decision logs and spans, returned on error answers' },
);

export const Observability = Obj(
  {
    metrics: Defaulted(Metrics),
    control_api: Defaulted(ControlApi),
    tracing: Defaulted(Tracing),
    routing: Defaulted(Routing),
    access_log: Defaulted(AccessLog),
    request_id: Defaulted(RequestId),
  },
  { description: 'observability' },
);

export type ObservabilityConfig = Static<typeof Observability>;
export type ControlApiConfig = Static<typeof ControlApi>;
export type MetricsConfig = Static<typeof Metrics>;
