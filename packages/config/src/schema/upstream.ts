// Upstream pools: route, backends, health checks, load balancing, upstream TLS, host policy and
// request authentication (SPEC "Configuration (YAML)": `upstream.<name>`, `upstream_tls`, `load_balancing`).
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Defaulted, Enum, Methods, Millis, Obj, secretPair } from './common.ts';

/** Load-balancing strategies (DESIGN "Settled open points"). */
export const LB_TYPES = ['round-robin', 'random', 'consistent-hash', 'least-connections', 'latency-aware', 'sticky-cid'] as const;

/** A load-balancing policy, global (`load_balancing`) or per pool (`upstream.<name>.load_balancing`). */
export const LoadBalancing = Obj(
  {
    type: Enum(LB_TYPES, { default: 'round-robin', description: `strategy: ${LB_TYPES.map((t) => `\`${t}\``).join(', ')}` }),
    key: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 256,
        description: 'consistent-hash request key: `client_ip`, `path`, `host`, `header:NAME`, `cookie:NAME` or `query:NAME` (default `client_ip`)',
        'x-example': 'header:x-tenant-id',
      }),
    ),
  },
  { description: 'load-balancing policy' },
);

/** Active health check of a backend. */
export const HealthCheck = Obj(
  {
    path: Type.String({ pattern: '^/', maxLength: 2048, description: 'request path probed with GET', 'x-example': '/healthz' }),
    interval: Millis(5000, 'time between probes; set without it, at least `timeout_ms` + 1'),
    timeout_ms: Millis(2000, 'probe timeout; must be shorter than `interval`; set without it, at most `interval` - 1'),
    healthy_threshold: Type.Integer({ minimum: 1, maximum: 100, default: 2, description: 'consecutive successes that make an unhealthy backend eligible again' }),
    unhealthy_threshold: Type.Integer({ minimum: 1, maximum: 100, default: 3, description: 'consecutive failures that make a backend ineligible' }),
    expected_status: Type.String({ pattern: '^[1-5]xx$|^[1-5][0-9][0-9](-[1-5][0-9][0-9])?$', default: '2xx', description: 'statuses counted healthy: a class (`2xx`), a code (`204`) or a range (`200-399`)' }),
  },
  { description: 'active health check' },
);

/** A backend of a pool. */
export const Backend = Obj(
  {
    id: Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$', description: 'identifier, unique within the pool; used in metrics and logs', 'x-example': 'api-1' }),
    address: Type.String({
      minLength: 1,
      maxLength: 2048,
      description: '`host:port`, `http://host[:port]`, `https://host[:port]` or bare `host` (scheme default `http`; port inferred from the scheme)',
      'x-example': 'https://10.0.0.11:8443',
    }),
    weight: Type.Integer({ minimum: 0, maximum: 10000, default: 1, description: 'relative weight; 0 takes the backend out of rotation' }),
    health_check: Type.Optional(HealthCheck),
  },
  { description: 'a backend server' },
);

/** TLS toward `https://` backends; per pool it overrides the global `upstream_tls` field by field. */
export function upstreamTlsSchema(global: boolean) {
  return Obj(
    {
      verify_certificates: global
        ? Type.Boolean({ default: true, description: 'verify backend certificates against the trusted CAs' })
        : Type.Optional(Type.Boolean({ description: 'overrides `upstream_tls.verify_certificates`' })),
      strict_sni: global
        ? Type.Boolean({ default: true, description: 'send SNI (the backend host or `server_name`) and verify the certificate against that name' })
        : Type.Optional(Type.Boolean({ description: 'overrides `upstream_tls.strict_sni`' })),
      server_name: Type.Optional(Type.String({ minLength: 1, maxLength: 253, description: 'SNI and verification name instead of the backend host', 'x-example': 'api.internal' })),
      ca_file: Type.Optional(Type.String({ minLength: 1, description: 'PEM bundle of CAs trusted for backend certificates (replaces the system store)', 'x-example': '/etc/edge-proxy/tls/backend-ca.pem' })),
      ca_dir: Type.Optional(Type.String({ minLength: 1, description: 'directory whose `*.pem` files are all trusted CAs', 'x-example': '/etc/edge-proxy/tls/backend-ca.d' })),
      ...secretPair('client_certificate', 'PEM client certificate chain presented to backends'),
      ...secretPair('client_key', 'PEM private key of the client certificate'),
    },
    { description: global ? 'global TLS policy for `https://` backends' : 'pool TLS policy; overrides `upstream_tls`' },
  );
}

export const UpstreamTlsGlobal = upstreamTlsSchema(true);
export const UpstreamTls = upstreamTlsSchema(false);

/** How the Host / :authority sent to the backend is chosen. */
export const HostPolicy = Obj(
  {
    mode: Enum(['preserve', 'rewrite', 'backend'], {
      default: 'preserve',
      description: '`preserve` the client host, `rewrite` to `host`, or use the `backend` address host',
    }),
    host: Type.Optional(Type.String({ minLength: 1, maxLength: 255, description: 'host sent upstream; only with `mode: rewrite`', 'x-example': 'api.internal' })),
  },
  { description: 'upstream Host policy' },
);

/** Route matcher of a pool: deterministic by host, path prefix and method. */
export const Route = Obj(
  {
    path_prefix: Type.String({
      maxLength: 2048,
      description:
        'path prefix matched segment-wise, longest prefix wins; compared in the policy form of the path (case folded, each segment cut at `;`/`%3B`, trailing dots and spaces ignored), as the deny list is, so `/api` also routes `/API/x` and `/api;v=1/x` (docs/request-path.md, "Routing"). Two routes of one host whose prefixes are equal in that form are refused: EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS',
      'x-example': '/api/',
    }),
    host: Type.Optional(
      Type.String({ minLength: 1, maxLength: 255, description: 'exact host, or `*.suffix` wildcard; exact beats wildcard beats no host', 'x-example': 'api.example.com' }),
    ),
    methods: Methods([], 'methods this route accepts; empty means all'),
  },
  { description: 'route of the pool' },
);

/** Per-pool timeout overrides (milliseconds); absent keys use `performance.timeouts`. */
export const UpstreamTimeouts = Obj(
  {
    connect_ms: Type.Optional(Millis(undefined, 'backend connect timeout')),
    backend_request_ms: Type.Optional(Millis(undefined, 'time to the backend response headers')),
    backend_body_idle_ms: Type.Optional(Millis(undefined, 'longest pause in the backend response body')),
    backend_body_total_ms: Type.Optional(Millis(undefined, 'whole backend response body')),
  },
  { description: 'per-pool timeouts; an absent key inherits `performance.timeouts`, unless that is a default out of order with a key set here, which it then follows' },
);

/** JWT validation of requests to this pool. */
export const JwtAuth = Obj(
  {
    issuer: Type.Optional(Type.String({ minLength: 1, description: 'required `iss` claim', 'x-example': 'https://idp.example.com/' })),
    audiences: Type.Array(Type.String({ minLength: 1 }), { maxItems: 32, default: [], description: 'accepted `aud` values; empty accepts any' }),
    algorithms: Type.Array(Type.String({ pattern: '^(RS|PS|ES)(256|384|512)$|^EdDSA$|^HS(256|384|512)$' }), {
      minItems: 1,
      uniqueItems: true,
      default: ['RS256', 'ES256'],
      description: 'accepted `alg` values; `none` is never accepted',
    }),
    jwks: Type.Optional(
      Obj(
        {
          url: Type.String({ pattern: '^https?://', maxLength: 2048, description: 'JWKS endpoint; never used as a metric label', 'x-example': 'https://idp.example.com/.well-known/jwks.json' }),
          refresh_interval_ms: Millis(300_000, 'time between JWKS refreshes'),
          timeout_ms: Millis(2000, 'JWKS fetch timeout'),
          stale_after_ms: Millis(3_600_000, 'keys older than this are served as stale'),
          unknown_kid_cooldown_ms: Millis(10_000, 'least time between two refreshes asked for by tokens naming a `kid` not in the set (a flood of random kids costs the IdP at most one fetch per cooldown)', { minimum: 0 }),
        },
        { description: 'JSON Web Key Set source' },
      ),
    ),
    ...secretPair('secret', 'HMAC key for HS* algorithms'),
    clock_skew_ms: Millis(30_000, 'allowed clock skew for `exp` / `nbf`', { minimum: 0 }),
    header: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9!#$%&\'*+.^_`|~-]+$', default: 'authorization', description: 'header carrying `Bearer <jwt>` (or the bare token)' }),
    verification_cache_entries: Type.Integer({ minimum: 0, maximum: 1_000_000, default: 10_000, description: 'verified tokens remembered per pool and worker until their `exp` (least recently used dropped first; 0: verify every request)' }),
  },
  { description: 'JWT validation of every request to the pool (docs/auth.md)' },
);

/** External authorization service consulted per request. */
export const ExternalAuth = Obj(
  {
    url: Type.String({ pattern: '^https?://', maxLength: 2048, description: 'authorization endpoint (POST)', 'x-example': 'http://127.0.0.1:9191/authz' }),
    timeout_ms: Millis(200, 'decision timeout'),
    client_id: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'client id sent to the service', 'x-example': 'edge-proxy' })),
    ...secretPair('client_secret', 'client secret sent to the service'),
    failure_mode: Enum(['deny', 'allow'], {
      default: 'deny',
      description:
        'decision when the service errs, times out or `max_pending` is full; a client can cause each of those (a flood, or requests the service is slow to decide), so `allow` lets such a client past unchecked: bound it with `fail_open_per_second` (docs/auth.md, "When the service fails")',
    }),
    max_pending: Type.Integer({
      minimum: 1,
      maximum: 65_536,
      default: 256,
      description: 'calls waiting for the service at most, per worker (64 connections, the rest queued, each within `timeout_ms`); a request beyond is decided by `failure_mode` at once without a call (`svc_external_auth_overflow`)',
    }),
    fail_open_per_second: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 1_000_000,
        description:
          'with `failure_mode: allow`: requests a failure (timeout, error, overflow) may allow per second for the pool on the whole node, all workers together (burst the same; the supervisor\'s token budget `auth-fo:<pool>`, leased to the workers); beyond, or when the lease gets no answer within 1 s, a failure is answered 503 as under `deny` (`svc_external_auth_fail_open_refused`). Default: absent, every failure allows. Refused with `deny` (EDGE_CONFIG_JWT)',
        'x-example': 50,
      }),
    ),
    allowed_headers: Type.Array(Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9!#$%&\'*+.^_`|~-]+$' }), {
      maxItems: 64,
      uniqueItems: true,
      default: ['authorization'],
      description: 'request headers sent to the service (names; any other header stays with the proxy)',
    }),
  },
  { description: 'external authorization of every request to the pool (docs/auth.md)' },
);

/** The checks of request authentication: JWT first, then external authorization (docs/auth.md). */
const AUTH_CHECKS = {
  jwt: Type.Optional(JwtAuth),
  external: Type.Optional(ExternalAuth),
};

/** Request-path authentication of a pool (separate from control API auth). */
export const RequestAuth = Obj(
  {
    ...AUTH_CHECKS,
    public: Type.Optional(
      Type.Boolean({
        description:
          'default false. `true`: the pool takes no authentication, opting out of `default_auth` (only valid while `default_auth` is set, and without `jwt` or `external`: EDGE_CONFIG_AUTH_PUBLIC)',
      }),
    ),
  },
  { description: 'request authentication of the pool; replaces `default_auth` as a whole when set' },
);

/**
 * Request authentication of every pool that sets no `auth` of its own ("protect everything but"
 * layouts): a pool's `auth` replaces it as a whole, and `auth: { public: true }` opts a pool out.
 */
export const DefaultRequestAuth = Obj(AUTH_CHECKS, {
  description:
    'request authentication of every pool without its own `auth` (the catch-all included); a pool opts out with `auth: { public: true }`. Needs `jwt` or `external` (EDGE_CONFIG_REQUIRED). Live-activatable (docs/auth.md, "Default authentication")',
});

/** A named upstream pool with its route. */
export const Upstream = Obj(
  {
    route: Route,
    backends: Type.Array(Backend, { minItems: 1, maxItems: 10_000, description: 'backend servers' }),
    health_check: Type.Optional(HealthCheck),
    load_balancing: Type.Optional(LoadBalancing),
    tls: Type.Optional(UpstreamTls),
    host_policy: Defaulted(HostPolicy),
    timeouts: Type.Optional(UpstreamTimeouts),
    auth: Type.Optional(RequestAuth),
  },
  { description: 'an upstream pool' },
);

export type UpstreamConfig = Static<typeof Upstream>;
export type RequestAuthConfig = Static<typeof RequestAuth>;
export type DefaultRequestAuthConfig = Static<typeof DefaultRequestAuth>;
export type BackendConfig = Static<typeof Backend>;
export type HealthCheckConfig = Static<typeof HealthCheck>;
export type LoadBalancingConfig = Static<typeof LoadBalancing>;
export type UpstreamTlsConfig = Static<typeof UpstreamTls>;
export type UpstreamTlsGlobalConfig = Static<typeof UpstreamTlsGlobal>;
export type RouteConfig = Static<typeof Route>;
