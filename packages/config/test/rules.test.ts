// Every validation rule, table-driven: a config that passes (a near miss) and one that fails with
// the expected code at the expected path. Resolution rules (files, PEM) are in resolve.test.ts.
import t from 'tap';
import { validateConfig, CONFIG_ERROR_CODES, ConfigValidationError, inactiveFeatures, NOT_ACTIVE_PATHS, NOT_BUILT_PATHS } from '../src/index.ts';
import { referenceRows } from '../src/reference.ts';
import type { ConfigErrorCode } from '../src/index.ts';

import { base } from './fixtures/base.ts';
import type { Doc } from './fixtures/base.ts';

interface Case {
  name: string;
  /** Makes the passing near miss. */
  ok: (d: Doc) => void;
  /** Makes the failing document. */
  bad: (d: Doc) => void;
  code: ConfigErrorCode;
  path: string;
  /**
   * The near miss turns on a feature that is refused until built: it must fail with
   * EDGE_CONFIG_NOT_BUILT only, so the rule under test is still shown not to fire on it.
   */
  unbuilt?: true;
}

const TOKEN = 'tok-0123456789abcdef';
const cases: Case[] = [
  // Document and schema
  { name: 'version 1 accepted, 2 rejected', ok: (d) => (d.version = 1), bad: (d) => (d.version = 2), code: 'EDGE_CONFIG_UNSUPPORTED_VERSION', path: 'version' },
  { name: 'unknown top-level key', ok: (d) => (d.log = { level: 'debug' }), bad: (d) => (d.logging = {}), code: 'EDGE_CONFIG_UNKNOWN_KEY', path: 'logging' },
  { name: 'unknown nested key', ok: (d) => (d.upstream.api.backends[0].weight = 3), bad: (d) => (d.upstream.api.backends[0].wieght = 3), code: 'EDGE_CONFIG_UNKNOWN_KEY', path: 'upstream.api.backends[0].wieght' },
  { name: 'upstream required', ok: () => {}, bad: (d) => delete d.upstream, code: 'EDGE_CONFIG_REQUIRED', path: 'upstream' },
  { name: 'backend address required', ok: () => {}, bad: (d) => delete d.upstream.api.backends[0].address, code: 'EDGE_CONFIG_REQUIRED', path: 'upstream.api.backends[0].address' },
  { name: 'backend id required', ok: () => {}, bad: (d) => delete d.upstream.api.backends[0].id, code: 'EDGE_CONFIG_REQUIRED', path: 'upstream.api.backends[0].id' },
  { name: 'type of port', ok: (d) => (d.listen.port = 443), bad: (d) => (d.listen.port = '443'), code: 'EDGE_CONFIG_TYPE', path: 'listen.port' },
  { name: 'port range low', ok: (d) => (d.listen.port = 1), bad: (d) => (d.listen.port = 0), code: 'EDGE_CONFIG_RANGE', path: 'listen.port' },
  { name: 'port range high', ok: (d) => (d.listen.port = 65535), bad: (d) => (d.listen.port = 65536), code: 'EDGE_CONFIG_RANGE', path: 'listen.port' },
  { name: 'zero timeout', ok: (d) => (d.performance = { timeouts: { connect_ms: 1 } }), bad: (d) => (d.performance = { timeouts: { connect_ms: 0 } }), code: 'EDGE_CONFIG_RANGE', path: 'performance.timeouts.connect_ms' },
  { name: 'protocol only http3', ok: (d) => (d.listen.protocol = 'http3'), bad: (d) => (d.listen.protocol = 'http2'), code: 'EDGE_CONFIG_ENUM', path: 'listen.protocol' },
  { name: 'unsupported load-balancing strategy', ok: (d) => (d.load_balancing = { type: 'least-connections' }), bad: (d) => (d.load_balancing = { type: 'fastest' }), code: 'EDGE_CONFIG_ENUM', path: 'load_balancing.type' },
  { name: 'backend id form', ok: (d) => (d.upstream.api.backends[0].id = 'api-1.a'), bad: (d) => (d.upstream.api.backends[0].id = 'has space'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.backends[0].id' },
  // Listeners
  { name: 'listen or listeners required', ok: (d) => { d.listeners = [d.listen]; delete d.listen; }, bad: (d) => delete d.listen, code: 'EDGE_CONFIG_NO_LISTENER', path: 'listen' },
  { name: 'invalid listener IP', ok: (d) => (d.listen.address = '::'), bad: (d) => (d.listen.address = 'localhost'), code: 'EDGE_CONFIG_INVALID_IP', path: 'listen.address' },
  {
    name: 'duplicate effective bind',
    ok: (d) => (d.listeners = [d.listen, { ...d.listen, port: 9890 }]),
    bad: (d) => (d.listeners = [d.listen, { ...d.listen, address: '0.0.0.0' }]),
    code: 'EDGE_CONFIG_DUPLICATE_BIND',
    path: 'listeners[1]',
  },
  {
    name: 'duplicate listener name',
    ok: (d) => (d.listeners = [{ ...d.listen, name: 'a' }, { ...d.listen, port: 9890, name: 'b' }]),
    bad: (d) => (d.listeners = [{ ...d.listen, name: 'a' }, { ...d.listen, port: 9890, name: 'a' }]),
    code: 'EDGE_CONFIG_DUPLICATE_LISTENER_NAME',
    path: 'listeners[1].name',
  },
  { name: 'partial cert/key pair', ok: () => {}, bad: (d) => delete d.listen.tls.key, code: 'EDGE_CONFIG_TLS_PARTIAL_PAIR', path: 'listen.tls.key' },
  {
    name: 'no TLS identity',
    ok: (d) => (d.listen.tls = { certificates: [{ server_name: 'a.example', cert: 'a.crt', key: 'a.key' }] }),
    bad: (d) => (d.listen.tls = {}),
    code: 'EDGE_CONFIG_TLS_NO_IDENTITY',
    path: 'listen.tls',
  },
  {
    name: 'server_name must be an exact DNS name',
    ok: (d) => (d.listen.tls.certificates = [{ server_name: 'api.example.com', cert: 'a.crt', key: 'a.key' }]),
    bad: (d) => (d.listen.tls.certificates = [{ server_name: '*.example.com', cert: 'a.crt', key: 'a.key' }]),
    code: 'EDGE_CONFIG_TLS_SERVER_NAME_INVALID',
    path: 'listen.tls.certificates[0].server_name',
  },
  {
    name: 'duplicate server_name',
    ok: (d) => (d.listen.tls.certificates = [{ server_name: 'a.example.com', cert: 'a.crt', key: 'a.key' }, { server_name: 'b.example.com', cert: 'b.crt', key: 'b.key' }]),
    bad: (d) => (d.listen.tls.certificates = [{ server_name: 'a.example.com', cert: 'a.crt', key: 'a.key' }, { server_name: 'A.example.com', cert: 'b.crt', key: 'b.key' }]),
    code: 'EDGE_CONFIG_TLS_SERVER_NAME_DUPLICATE',
    path: 'listen.tls.certificates[1].server_name',
  },
  // Upstreams
  { name: 'at least one pool', ok: () => {}, bad: (d) => (d.upstream = {}), code: 'EDGE_CONFIG_NO_UPSTREAM', path: 'upstream' },
  {
    name: 'pool names differing only in case',
    ok: (d) => (d.upstream.api2 = { route: { path_prefix: '/v2' }, backends: [{ id: 'x', address: 'h' }] }),
    bad: (d) => (d.upstream.API = { route: { path_prefix: '/v2' }, backends: [{ id: 'x', address: 'h' }] }),
    code: 'EDGE_CONFIG_DUPLICATE_UPSTREAM',
    path: 'upstream.API',
  },
  { name: 'empty route', ok: (d) => (d.upstream.api.route.path_prefix = '/v1'), bad: (d) => (d.upstream.api.route.path_prefix = ''), code: 'EDGE_CONFIG_EMPTY_ROUTE', path: 'upstream.api.route.path_prefix' },
  { name: 'route prefix starts with /', ok: () => {}, bad: (d) => (d.upstream.api.route.path_prefix = 'api'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  {
    name: 'duplicate normalized route matcher',
    ok: (d) => (d.upstream.web.route = { path_prefix: '/api', host: 'a.example.com' }),
    bad: (d) => (d.upstream.web.route = { path_prefix: '/api/' }),
    code: 'EDGE_CONFIG_DUPLICATE_ROUTE',
    path: 'upstream.web.route',
  },
  {
    name: 'ambiguous overlapping methods',
    ok: (d) => {
      d.upstream.api.route.methods = ['GET'];
      d.upstream.web.route = { path_prefix: '/api', methods: ['POST'] };
    },
    bad: (d) => {
      d.upstream.api.route.methods = ['GET', 'HEAD'];
      d.upstream.web.route = { path_prefix: '/api', methods: ['GET', 'POST'] };
    },
    code: 'EDGE_CONFIG_AMBIGUOUS_ROUTE',
    path: 'upstream.web.route',
  },
  {
    // Issue 38, finding 1: routing compares prefixes in policy form (path-form.ts).
    name: 'route prefixes equal once case and ;params are ignored',
    ok: (d) => (d.upstream.web.route = { path_prefix: '/API', host: 'a.example.com' }),
    bad: (d) => (d.upstream.web.route = { path_prefix: '/API;v=1/' }),
    code: 'EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS',
    path: 'upstream.web.route.path_prefix',
  },
  { name: 'route prefix in normalized form: an escape of an unreserved character', ok: (d) => (d.upstream.api.route.path_prefix = '/a%C3%A9/'), bad: (d) => (d.upstream.api.route.path_prefix = '/%61pi'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  { name: 'route prefix in normalized form: an empty segment', ok: (d) => (d.upstream.api.route.path_prefix = '/api//'), bad: (d) => (d.upstream.api.route.path_prefix = '/a//pi'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  { name: 'route prefix in normalized form: a dot segment', ok: (d) => (d.upstream.api.route.path_prefix = '/.well-known'), bad: (d) => (d.upstream.api.route.path_prefix = '/x/../api'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  { name: 'route prefix in normalized form: an encoded separator', ok: (d) => (d.upstream.api.route.path_prefix = '/a%3Bb'), bad: (d) => (d.upstream.api.route.path_prefix = '/a%2Fb'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  { name: 'route prefix in normalized form: a query', ok: (d) => (d.upstream.api.route.path_prefix = '/api;v=1'), bad: (d) => (d.upstream.api.route.path_prefix = '/api?x=1'), code: 'EDGE_CONFIG_FORMAT', path: 'upstream.api.route.path_prefix' },
  {
    name: 'route prefixes equal once a trailing dot is ignored',
    ok: (d) => (d.upstream.web.route = { path_prefix: '/api.v1' }),
    bad: (d) => (d.upstream.web.route = { path_prefix: '/Api.' }),
    code: 'EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS',
    path: 'upstream.web.route.path_prefix',
  },
  {
    name: 'default_auth needs a check',
    ok: (d) => (d.default_auth = { jwt: { algorithms: ['HS256'], secret_ref: { ref: `literal:${TOKEN}` } } }),
    bad: (d) => (d.default_auth = {}),
    code: 'EDGE_CONFIG_REQUIRED',
    path: 'default_auth',
  },
  {
    name: 'default_auth follows the JWT rules',
    ok: (d) => (d.default_auth = { jwt: { issuer: 'https://idp.example/', jwks: { url: 'https://idp.example/jwks.json' } } }),
    bad: (d) => (d.default_auth = { jwt: { algorithms: ['HS256'] } }),
    code: 'EDGE_CONFIG_JWT',
    path: 'default_auth.jwt.secret',
  },
  {
    name: 'public: true stands alone',
    ok: (d) => {
      d.default_auth = { external: { url: 'http://127.0.0.1:9191/authz' } };
      d.upstream.api.auth = { public: true };
    },
    bad: (d) => {
      d.default_auth = { external: { url: 'http://127.0.0.1:9191/authz' } };
      d.upstream.api.auth = { public: true, external: { url: 'http://127.0.0.1:9191/authz' } };
    },
    code: 'EDGE_CONFIG_AUTH_PUBLIC',
    path: 'upstream.api.auth.public',
  },
  {
    name: 'public: true needs a default_auth to opt out of',
    ok: (d) => (d.upstream.api.auth = { public: false, external: { url: 'http://127.0.0.1:9191/authz' } }),
    bad: (d) => (d.upstream.api.auth = { public: true }),
    code: 'EDGE_CONFIG_AUTH_PUBLIC',
    path: 'upstream.api.auth.public',
  },
  {
    name: 'under default_auth an empty pool auth must say public: true',
    ok: (d) => {
      d.default_auth = { external: { url: 'http://127.0.0.1:9191/authz' } };
      d.upstream.api.auth = { public: true };
    },
    bad: (d) => {
      d.default_auth = { external: { url: 'http://127.0.0.1:9191/authz' } };
      d.upstream.api.auth = {};
    },
    code: 'EDGE_CONFIG_AUTH_PUBLIC',
    path: 'upstream.api.auth',
  },
  {
    name: 'duplicate backend id',
    ok: (d) => d.upstream.api.backends.push({ id: 'a2', address: '127.0.0.1:8083' }),
    bad: (d) => d.upstream.api.backends.push({ id: 'a1', address: '127.0.0.1:8083' }),
    code: 'EDGE_CONFIG_DUPLICATE_BACKEND_ID',
    path: 'upstream.api.backends[1].id',
  },
  { name: 'backend address form', ok: (d) => (d.upstream.api.backends[0].address = 'https://[::1]:8443'), bad: (d) => (d.upstream.api.backends[0].address = 'tcp://x:1'), code: 'EDGE_CONFIG_BACKEND_ADDRESS', path: 'upstream.api.backends[0].address' },
  { name: 'host outside mode: rewrite', ok: (d) => (d.upstream.api.host_policy = { mode: 'rewrite', host: 'api.internal' }), bad: (d) => (d.upstream.api.host_policy = { mode: 'preserve', host: 'api.internal' }), code: 'EDGE_CONFIG_HOST_POLICY', path: 'upstream.api.host_policy.host' },
  { name: 'mode: rewrite needs host', ok: (d) => (d.upstream.api.host_policy = { mode: 'backend' }), bad: (d) => (d.upstream.api.host_policy = { mode: 'rewrite' }), code: 'EDGE_CONFIG_HOST_POLICY', path: 'upstream.api.host_policy.host' },
  { name: 'key spec syntax', ok: (d) => (d.upstream.api.load_balancing = { type: 'consistent-hash', key: 'cookie:session' }), bad: (d) => (d.upstream.api.load_balancing = { type: 'consistent-hash', key: 'cookie' }), code: 'EDGE_CONFIG_LB_KEY', path: 'upstream.api.load_balancing.key' },
  { name: 'key only for consistent-hash', ok: (d) => (d.load_balancing = { type: 'consistent-hash', key: 'client_ip' }), bad: (d) => (d.load_balancing = { type: 'round-robin', key: 'client_ip' }), code: 'EDGE_CONFIG_LB_KEY', path: 'load_balancing.key' },
  {
    name: 'policy names an unknown route',
    ok: (d) => (d.resilience = { brownout: { core_routes: ['api'] } }),
    bad: (d) => (d.resilience = { brownout: { core_routes: ['apx'] } }),
    code: 'EDGE_CONFIG_UNKNOWN_ROUTE_REFERENCE',
    path: 'resilience.brownout.core_routes[0]',
  },
  {
    name: 'health probe timeout shorter than interval',
    // The interval alone: the probe timeout's default follows it (derived-defaults.ts).
    ok: (d) => (d.upstream.api.health_check = { path: '/healthz', interval: 1000 }),
    bad: (d) => (d.upstream.api.health_check = { path: '/healthz', interval: 1000, timeout_ms: 1000 }),
    code: 'EDGE_CONFIG_TIMEOUT_ORDER',
    path: 'upstream.api.health_check.timeout_ms',
  },
  {
    name: 'connect within request timeout',
    ok: (d) => (d.performance = { timeouts: { connect_ms: 1000, backend_request_ms: 1000 } }),
    bad: (d) => (d.performance = { timeouts: { connect_ms: 1001, backend_request_ms: 1000 } }),
    code: 'EDGE_CONFIG_TIMEOUT_ORDER',
    path: 'performance.timeouts.connect_ms',
  },
  {
    name: 'client body idle within client body total',
    ok: (d) => (d.performance = { timeouts: { client_body_idle_ms: 1000, client_body_total_ms: 1000 } }),
    bad: (d) => (d.performance = { timeouts: { client_body_idle_ms: 1001, client_body_total_ms: 1000 } }),
    code: 'EDGE_CONFIG_TIMEOUT_ORDER',
    path: 'performance.timeouts.client_body_idle_ms',
  },
  {
    name: 'pool timeout override ordering',
    ok: (d) => (d.upstream.api.timeouts = { backend_body_idle_ms: 100, backend_body_total_ms: 100 }),
    bad: (d) => (d.upstream.api.timeouts = { backend_body_idle_ms: 101, backend_body_total_ms: 100 }),
    code: 'EDGE_CONFIG_TIMEOUT_ORDER',
    path: 'upstream.api.timeouts.backend_body_idle_ms',
  },
  {
    name: 'per-backend limit within per-upstream limit',
    ok: (d) => (d.performance = { per_backend_inflight_limit: 100, per_upstream_inflight_limit: 100 }),
    bad: (d) => (d.performance = { per_backend_inflight_limit: 101, per_upstream_inflight_limit: 100 }),
    code: 'EDGE_CONFIG_LIMIT_ORDER',
    path: 'performance.per_backend_inflight_limit',
  },
  {
    name: 'route queue caps within global cap',
    // Both set: a cap alone raises the global cap's default instead (derived-defaults.ts).
    ok: (d) => (d.resilience = { route_queue: { global_cap: 2048, caps: { api: 2048 } } }),
    bad: (d) => (d.resilience = { route_queue: { global_cap: 2048, caps: { api: 2049 } } }),
    code: 'EDGE_CONFIG_LIMIT_ORDER',
    path: 'resilience.route_queue.caps.api',
  },
  // Several workers on one shared UDP socket would split QUIC connections (rules/process.ts).
  {
    name: 'reuseport false with one worker',
    ok: (d) => (d.performance = { reuseport: false, worker_threads: 1 }),
    bad: (d) => (d.performance = { reuseport: false, worker_threads: 2 }),
    code: 'EDGE_CONFIG_REUSEPORT',
    path: 'performance.reuseport',
  },
  {
    name: 'reuseport false needs worker_threads set (the default is one per CPU)',
    ok: (d) => (d.performance = { reuseport: true }),
    bad: (d) => (d.performance = { reuseport: false }),
    code: 'EDGE_CONFIG_REUSEPORT',
    path: 'performance.reuseport',
  },
  {
    name: 'JWT HS algorithms need a secret',
    ok: (d) => (d.upstream.api.auth = { jwt: { algorithms: ['HS256'], secret_ref: { ref: `literal:${TOKEN}` } } }),
    bad: (d) => (d.upstream.api.auth = { jwt: { algorithms: ['HS256'] } }),
    code: 'EDGE_CONFIG_JWT',
    path: 'upstream.api.auth.jwt.secret',
  },
  {
    name: 'JWT default algorithms need a JWKS source',
    ok: (d) => (d.upstream.api.auth = { jwt: { issuer: 'https://idp.example/', jwks: { url: 'https://idp.example/jwks.json' } } }),
    bad: (d) => (d.upstream.api.auth = { jwt: { issuer: 'https://idp.example/' } }),
    code: 'EDGE_CONFIG_JWT',
    path: 'upstream.api.auth.jwt.jwks',
  },
  {
    name: 'JWT HS algorithms take no JWKS source',
    ok: (d) => (d.upstream.api.auth = { jwt: { algorithms: ['HS256'], secret_ref: { ref: `literal:${TOKEN}` } } }),
    bad: (d) => (d.upstream.api.auth = { jwt: { algorithms: ['HS256'], secret_ref: { ref: `literal:${TOKEN}` }, jwks: { url: 'https://idp.example/jwks.json' } } }),
    code: 'EDGE_CONFIG_JWT',
    path: 'upstream.api.auth.jwt.jwks',
  },
  {
    name: 'external auth client secret needs a client id',
    ok: (d) => (d.upstream.api.auth = { external: { url: 'http://127.0.0.1:9191/authz', client_id: 'edge', client_secret_ref: { ref: `literal:${TOKEN}` } } }),
    bad: (d) => (d.upstream.api.auth = { external: { url: 'http://127.0.0.1:9191/authz', client_secret_ref: { ref: `literal:${TOKEN}` } } }),
    code: 'EDGE_CONFIG_JWT',
    path: 'upstream.api.auth.external.client_id',
  },
  // Resilience (SPEC Configuration errors table)
  {
    name: 'brownout hysteresis inverted',
    ok: (d) => (d.resilience = { brownout: { trigger_inflight_percent: 80, recover_inflight_percent: 79 } }),
    bad: (d) => (d.resilience = { brownout: { trigger_inflight_percent: 80, recover_inflight_percent: 80 } }),
    code: 'EDGE_CONFIG_BROWNOUT_HYSTERESIS',
    path: 'resilience.brownout.recover_inflight_percent',
  },
  { name: 'min_limit == 0', ok: (d) => (d.resilience = { adaptive_admission: { min_limit: 1 } }), bad: (d) => (d.resilience = { adaptive_admission: { min_limit: 0 } }), code: 'EDGE_CONFIG_ADMISSION_MIN_LIMIT', path: 'resilience.adaptive_admission.min_limit' },
  { name: 'max_limit == 0', ok: (d) => (d.resilience = { adaptive_admission: { max_limit: 64 } }), bad: (d) => (d.resilience = { adaptive_admission: { max_limit: 0 } }), code: 'EDGE_CONFIG_ADMISSION_MAX_LIMIT', path: 'resilience.adaptive_admission.max_limit' },
  {
    name: 'max_limit < min_limit',
    ok: (d) => (d.resilience = { adaptive_admission: { min_limit: 100, max_limit: 100 } }),
    bad: (d) => (d.resilience = { adaptive_admission: { min_limit: 100, max_limit: 99 } }),
    code: 'EDGE_CONFIG_ADMISSION_LIMIT_ORDER',
    path: 'resilience.adaptive_admission.max_limit',
  },
  {
    name: 'max_limit > global_inflight_limit',
    ok: (d) => {
      d.performance = { global_inflight_limit: 1000, per_upstream_inflight_limit: 1000 };
      d.resilience = { adaptive_admission: { max_limit: 1000 } };
    },
    bad: (d) => {
      d.performance = { global_inflight_limit: 1000, per_upstream_inflight_limit: 1000 };
      d.resilience = { adaptive_admission: { max_limit: 1001 } };
    },
    code: 'EDGE_CONFIG_ADMISSION_ABOVE_GLOBAL',
    path: 'resilience.adaptive_admission.max_limit',
  },
  { name: 'retry ratio > 100', ok: (d) => (d.resilience = { retry_budget: { ratio_percent: 100 } }), bad: (d) => (d.resilience = { retry_budget: { ratio_percent: 101 } }), code: 'EDGE_CONFIG_RETRY_RATIO', path: 'resilience.retry_budget.ratio_percent' },
  {
    name: 'per-route retry ratio > 100',
    ok: (d) => (d.resilience = { retry_budget: { per_route_ratio_percent: { api: 0 } } }),
    bad: (d) => (d.resilience = { retry_budget: { per_route_ratio_percent: { api: 150 } } }),
    code: 'EDGE_CONFIG_RETRY_RATIO',
    path: 'resilience.retry_budget.per_route_ratio_percent.api',
  },
  { name: 'hedging without a retry budget', ok: (d) => (d.resilience = { hedging: { enabled: true }, retry_budget: { max_attempts: 2 } }), bad: (d) => (d.resilience = { hedging: { enabled: true }, retry_budget: { enabled: false } }), code: 'EDGE_CONFIG_HEDGING_NEEDS_RETRY', path: 'resilience.hedging.enabled' },
  { name: 'hedging with one attempt', ok: (d) => (d.resilience = { hedging: { enabled: false }, retry_budget: { max_attempts: 1 } }), bad: (d) => (d.resilience = { hedging: { enabled: true }, retry_budget: { max_attempts: 1 } }), code: 'EDGE_CONFIG_HEDGING_NEEDS_RETRY', path: 'resilience.hedging.enabled' },
  { name: 'hedging only for methods sent twice', ok: (d) => (d.resilience = { hedging: { safe_methods: ['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE'] } }), bad: (d) => (d.resilience = { hedging: { safe_methods: ['GET', 'POST'] } }), code: 'EDGE_CONFIG_HEDGING_METHOD', path: 'resilience.hedging.safe_methods[1]' },
  { name: 'hedging refuses TRACE (never retried) even while disabled', ok: (d) => (d.resilience = { hedging: { enabled: false, safe_methods: ['HEAD'] } }), bad: (d) => (d.resilience = { hedging: { enabled: false, safe_methods: ['TRACE'] } }), code: 'EDGE_CONFIG_HEDGING_METHOD', path: 'resilience.hedging.safe_methods[0]' },
  { name: 'breaker failure_statuses are 5xx', ok: (d) => (d.resilience = { circuit_breaker: { failure_statuses: [500, 599] } }), bad: (d) => (d.resilience = { circuit_breaker: { failure_statuses: [499] } }), code: 'EDGE_CONFIG_RANGE', path: 'resilience.circuit_breaker.failure_statuses[0]' },
  { name: 'breaker max_ejection_percent is a percentage', ok: (d) => (d.resilience = { circuit_breaker: { max_ejection_percent: 0 } }), bad: (d) => (d.resilience = { circuit_breaker: { max_ejection_percent: 101 } }), code: 'EDGE_CONFIG_RANGE', path: 'resilience.circuit_breaker.max_ejection_percent' },
  { name: 'hedging delay 0', ok: (d) => (d.resilience = { hedging: { enabled: false, delay_ms: 0 } }), bad: (d) => (d.resilience = { hedging: { enabled: true, delay_ms: 0 } }), code: 'EDGE_CONFIG_HEDGING_DELAY', path: 'resilience.hedging.delay_ms' },
  { name: 'restart_hook rejected', ok: (d) => (d.resilience = { watchdog: { restart_command: ['/bin/systemctl', 'restart', 'edge-proxy'] } }), bad: (d) => (d.resilience = { watchdog: { restart_hook: '/usr/local/bin/restart.sh' } }), code: 'EDGE_CONFIG_WATCHDOG_RESTART_HOOK', path: 'resilience.watchdog.restart_hook' },
  { name: 'restart executable absolute', ok: () => {}, bad: (d) => (d.resilience = { watchdog: { restart_command: ['systemctl', 'restart'] } }), code: 'EDGE_CONFIG_WATCHDOG', path: 'resilience.watchdog.restart_command[0]' },
  { name: 'quota redis TLS refused', ok: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: 'redis://127.0.0.1:6379' } } }), bad: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: 'rediss://127.0.0.1:6379' } } }), code: 'EDGE_CONFIG_QUOTA', path: 'resilience.quota.redis.address' },
  { name: 'quota redis address form', ok: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: '[::1]:6379' } } }), bad: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: 'redis-host' } } }), code: 'EDGE_CONFIG_QUOTA', path: 'resilience.quota.redis.address' },
  { name: 'quota redis block', ok: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: '127.0.0.1:6379' } } }), bad: (d) => (d.resilience = { quota: { backend: 'redis' } }), code: 'EDGE_CONFIG_QUOTA', path: 'resilience.quota.redis' },
  {
    name: 'quota selector key spec',
    ok: (d) => (d.resilience = { quota: { policies: [{ name: 'tenant', dimensions: ['header:x-tenant'], burst: { limit: 10, window_ms: 1000 } }] } }),
    bad: (d) => (d.resilience = { quota: { policies: [{ name: 'tenant', dimensions: ['tenant'], burst: { limit: 10, window_ms: 1000 } }] } }),
    code: 'EDGE_CONFIG_KEY_SPEC',
    path: 'resilience.quota.policies[0].dimensions[0]',
  },
  {
    name: 'rate limit names unique',
    ok: (d) => (d.resilience = { rate_limits: [{ name: 'a', requests_per_second: 1, burst: 1 }, { name: 'b', requests_per_second: 1, burst: 1 }] }),
    bad: (d) => (d.resilience = { rate_limits: [{ name: 'a', requests_per_second: 1, burst: 1 }, { name: 'a', requests_per_second: 1, burst: 1 }] }),
    code: 'EDGE_CONFIG_RATE_LIMIT',
    path: 'resilience.rate_limits[1].name',
  },
  // Features refused until built (features.ts): fail closed, never open.
  {
    name: 'CONNECT tunnelling is not built',
    ok: (d) => (d.resilience = { protocol: { allow_connect: false } }),
    bad: (d) => (d.resilience = { protocol: { allow_connect: true } }),
    code: 'EDGE_CONFIG_NOT_BUILT',
    path: 'resilience.protocol.allow_connect',
  },
  {
    name: 'CONNECT port allowlist is not built',
    ok: (d) => (d.resilience = { protocol: { connect_allowed_ports: [] } }),
    bad: (d) => (d.resilience = { protocol: { connect_allowed_ports: [443] } }),
    code: 'EDGE_CONFIG_NOT_BUILT',
    path: 'resilience.protocol.connect_allowed_ports',
  },
  {
    name: 'CONNECT authority allowlist is not built',
    ok: (d) => (d.resilience = { protocol: { connect_allowed_authorities: [] } }),
    bad: (d) => (d.resilience = { protocol: { connect_allowed_authorities: ['example.com:443'] } }),
    code: 'EDGE_CONFIG_NOT_BUILT',
    path: 'resilience.protocol.connect_allowed_authorities',
  },
  {
    name: 'CONNECT route without allow_connect',
    ok: (d) => (d.upstream.api.route.methods = ['GET']),
    bad: (d) => (d.upstream.api.route.methods = ['CONNECT']),
    code: 'EDGE_CONFIG_CONNECT_CONFLICT',
    path: 'upstream.api.route.methods',
  },
  { name: 'early data only for safe methods', ok: (d) => (d.resilience = { protocol: { early_data_safe_methods: ['GET', 'OPTIONS'] } }), bad: (d) => (d.resilience = { protocol: { early_data_safe_methods: ['GET', 'POST'] } }), code: 'EDGE_CONFIG_EARLY_DATA', path: 'resilience.protocol.early_data_safe_methods[1]' },
  // Control plane
  {
    name: 'non-loopback control API needs auth_token',
    ok: (d) => (d.observability = { control_api: { address: '10.1.2.3', auth_token: TOKEN } }),
    bad: (d) => (d.observability = { control_api: { address: '10.1.2.3' } }),
    code: 'EDGE_CONFIG_CONTROL_API_AUTH',
    path: 'observability.control_api.auth_token',
  },
  { name: 'control API address is an IP', ok: (d) => (d.observability = { control_api: { address: '::1' } }), bad: (d) => (d.observability = { control_api: { address: 'admin.local' } }), code: 'EDGE_CONFIG_INVALID_IP', path: 'observability.control_api.address' },
  {
    name: 'identity_source needs client certificates',
    ok: (d) => (d.observability = { control_api: { tls: { client_auth: { mode: 'required', ca_file: 'ca.crt' } }, auth: { identity_source: { kind: 'mtls_subject_cn' } } } }),
    bad: (d) => (d.observability = { control_api: { auth: { identity_source: { kind: 'mtls_subject_cn' } } } }),
    code: 'EDGE_CONFIG_AUTH_COMBINATION',
    path: 'observability.control_api.auth.identity_source',
  },
  {
    name: 'tokens at least 16 characters',
    ok: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ token: TOKEN, role: 'viewer', actor_id: 'v' }] } } }),
    bad: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ token: 'short', role: 'viewer', actor_id: 'v' }] } } }),
    code: 'EDGE_CONFIG_TOKEN_WEAK',
    path: 'observability.control_api.auth.bearer_tokens[0].token',
  },
  {
    name: 'tokens distinct',
    ok: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ token: TOKEN, role: 'viewer', actor_id: 'v' }, { token: `${TOKEN}x`, role: 'admin', actor_id: 'a' }] } } }),
    bad: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ token: TOKEN, role: 'viewer', actor_id: 'v' }, { token: TOKEN, role: 'admin', actor_id: 'a' }] } } }),
    code: 'EDGE_CONFIG_DUPLICATE_TOKEN',
    path: 'observability.control_api.auth.bearer_tokens[1].token',
  },
  {
    name: 'bearer token value required',
    ok: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ token_ref: { ref: `literal:${TOKEN}` }, role: 'viewer', actor_id: 'v' }] } } }),
    bad: (d) => (d.observability = { control_api: { auth: { bearer_tokens: [{ role: 'viewer', actor_id: 'v' }] } } }),
    code: 'EDGE_CONFIG_REQUIRED',
    path: 'observability.control_api.auth.bearer_tokens[0].token',
  },
  { name: 'allowlist CIDRs', ok: (d) => (d.observability = { control_api: { ip_allowlist: { cidrs: ['10.0.0.0/8', '::1/128'] } } }), bad: (d) => (d.observability = { control_api: { ip_allowlist: { cidrs: ['10.0.0.0/33'] } } }), code: 'EDGE_CONFIG_CIDR', path: 'observability.control_api.ip_allowlist.cidrs[0]' },
  { name: 'metrics bind vs listener', ok: (d) => (d.observability = { metrics: { port: 9100 } }), bad: (d) => (d.observability = { metrics: { address: '127.0.0.1', port: 9889 } }), code: 'EDGE_CONFIG_BIND_CONFLICT', path: 'observability.metrics.port' },
  { name: 'reload paths differ', ok: (d) => (d.observability = { control_api: { reload_path: '/admin/reload' } }), bad: (d) => (d.observability = { control_api: { reload_path: '/admin/runtime/reload-certs' } }), code: 'EDGE_CONFIG_PATH_CONFLICT', path: 'observability.control_api.reload_certs_path' },
  { name: 'reload path not a built-in route', ok: (d) => (d.observability = { control_api: { reload_path: '/admin/reload' } }), bad: (d) => (d.observability = { control_api: { reload_path: '/admin/runtime/activate' } }), code: 'EDGE_CONFIG_RESERVED_PATH', path: 'observability.control_api.reload_path' },
  // Span export (issue 17): `enabled` alone is valid (the OTLP default endpoint); credentials in the URL are refused.
  { name: 'tracing endpoint without credentials', ok: (d) => (d.observability = { tracing: { enabled: true } }), bad: (d) => (d.observability = { tracing: { enabled: true, endpoint: 'https://user:secret@collector.example:4318/v1/traces' } }), code: 'EDGE_CONFIG_TRACING_ENDPOINT', path: 'observability.tracing.endpoint' },
  { name: 'tracing endpoint a URL', ok: (d) => (d.observability = { tracing: { enabled: true, endpoint: 'http://127.0.0.1:4318/v1/traces?tenant=a' } }), bad: (d) => (d.observability = { tracing: { endpoint: 'http://exa mple:4318/' } }), code: 'EDGE_CONFIG_TRACING_ENDPOINT', path: 'observability.tracing.endpoint' },
  { name: 'route-decision header refused while not built', ok: () => {}, bad: (d) => (d.observability = { routing: { expose_header: true } }), code: 'EDGE_CONFIG_NOT_BUILT', path: 'observability.routing.expose_header' },
  { name: 'routing header needs a name', ok: (d) => (d.observability = { routing: { expose_header: true } }), bad: (d) => (d.observability = { routing: { expose_header: true, header_name: '' } }), code: 'EDGE_CONFIG_ROUTING_HEADER', path: 'observability.routing.header_name', unbuilt: true },
  // Secrets
  {
    name: 'plaintext and _ref exclusive',
    ok: (d) => (d.upstream.api.tls = { client_key_ref: { ref: 'file:///etc/k.pem' }, client_certificate_ref: { ref: 'file:///etc/c.pem' } }),
    bad: (d) => (d.upstream.api.tls = { client_key: 'PEM', client_key_ref: { ref: 'file:///etc/k.pem' } }),
    code: 'EDGE_CONFIG_SECRET_EXCLUSIVE',
    path: 'upstream.api.tls.client_key',
  },
  { name: 'reference scheme', ok: (d) => (d.observability = { control_api: { auth_token_ref: { ref: `literal:${TOKEN}` } } }), bad: (d) => (d.observability = { control_api: { auth_token_ref: { ref: 'vault://kv/edge' } } }), code: 'EDGE_CONFIG_SECRET_REF', path: 'observability.control_api.auth_token_ref' },
  {
    name: 'relative file reference needs a provider',
    ok: (d) => {
      d.secrets = { default_provider: 'local', providers: { local: { kind: 'file', base_dir: '/etc/edge-proxy/secrets' } } };
      d.observability = { control_api: { auth_token_ref: { ref: 'file://admin.token' } } };
    },
    bad: (d) => (d.observability = { control_api: { auth_token_ref: { ref: 'file://admin.token' } } }),
    code: 'EDGE_CONFIG_SECRET_PROVIDER',
    path: 'observability.control_api.auth_token_ref',
  },
  {
    name: 'relative reference stays inside base_dir',
    ok: (d) => {
      d.secrets = { default_provider: 'local', providers: { local: { kind: 'file', base_dir: '/etc/s' } } };
      d.observability = { control_api: { auth_token_ref: { ref: 'file://sub/admin.token' } } };
    },
    bad: (d) => {
      d.secrets = { default_provider: 'local', providers: { local: { kind: 'file', base_dir: '/etc/s' } } };
      d.observability = { control_api: { auth_token_ref: { ref: 'file://../shadow' } } };
    },
    code: 'EDGE_CONFIG_SECRET_REF',
    path: 'observability.control_api.auth_token_ref',
  },
  {
    name: 'empty literal',
    ok: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: '127.0.0.1:6379', auth_token_ref: { ref: 'literal:k' } } } }),
    bad: (d) => (d.resilience = { quota: { backend: 'redis', redis: { address: '127.0.0.1:6379', auth_token_ref: { ref: 'literal:' } } } }),
    code: 'EmptySecret',
    path: 'resilience.quota.redis.auth_token_ref',
  },
];

/** Codes checked by resolution against real files, in resolve.test.ts. */
export const RESOLUTION_CODES: readonly ConfigErrorCode[] = [
  'EDGE_CONFIG_READ',
  'EDGE_CONFIG_YAML_SYNTAX',
  'EDGE_CONFIG_TLS_SAN_MISMATCH',
  'EDGE_CONFIG_TLS_UNREADABLE',
  'EDGE_CONFIG_TLS_INVALID_MATERIAL',
  'EDGE_CONFIG_TLS_KEY_MISMATCH',
  'EDGE_CONFIG_SECRET_UNREADABLE',
  'MalformedPemCertificate',
  'MalformedPemPrivateKey',
  'EDGE_CONFIG_SECRET_KEY_MISMATCH',
];

t.test('the base document is valid', async (t) => {
  const r = validateConfig(base(), '/tmp');
  t.ok(r.ok, r.ok ? 'valid' : JSON.stringify(r.issues));
});

for (const c of cases) {
  t.test(c.name, async (t) => {
    const good = base();
    c.ok(good);
    const g = validateConfig(good, '/tmp');
    if (c.unbuilt === true) t.ok(!g.ok && g.issues.every((i) => i.code === 'EDGE_CONFIG_NOT_BUILT'), `near miss fails only as not built${g.ok ? '' : `: ${JSON.stringify(g.issues)}`}`);
    else t.ok(g.ok, `near miss passes${g.ok ? '' : `: ${JSON.stringify(g.issues)}`}`);
    const badDoc = base();
    c.bad(badDoc);
    const b = validateConfig(badDoc, '/tmp');
    t.notOk(b.ok, 'fails');
    if (!b.ok) {
      const hit = b.issues.find((i) => i.code === c.code && i.path === c.path);
      t.ok(hit, `has ${c.code} at ${c.path}; got ${JSON.stringify(b.issues.map((i) => `${i.path} ${i.code}`))}`);
    }
  });
}

t.test('every feature that is not built is refused when turned on, at its own path', async (t) => {
  const d = base();
  d.observability = { tracing: { enabled: true }, routing: { expose_header: true } };
  d.resilience = { protocol: { allow_connect: true, allowed_methods: ['GET', 'CONNECT'], connect_allowed_ports: [443], connect_allowed_authorities: ['example.com:443'] } };
  const r = validateConfig(d, '/tmp');
  t.notOk(r.ok);
  const refused = r.ok ? [] : r.issues.filter((i) => i.code === 'EDGE_CONFIG_NOT_BUILT').map((i) => i.path).sort();
  t.same(refused, ['observability.routing.expose_header', 'resilience.protocol.allow_connect', 'resilience.protocol.connect_allowed_authorities', 'resilience.protocol.connect_allowed_ports'], 'span export is built (issue 17): the route-decision header and CONNECT tunnelling (#42) are refused');
  t.same(r.ok ? [] : r.issues.map((i) => i.code).filter((c) => c !== 'EDGE_CONFIG_NOT_BUILT'), [], 'and nothing else');
  // The same features, off: valid, and no default-on feature is left unenforced (issue 14 built the last ones).
  const off = validateConfig(base(), '/tmp');
  t.ok(off.ok);
  if (off.ok) t.same(inactiveFeatures(off.value.config).map((f) => f.path), []);
  // The reference marks exactly these blocks (docs/configuration.md, reference.ts).
  if (off.ok) t.same(inactiveFeatures(off.value.config).map((f) => f.path), NOT_ACTIVE_PATHS);
  const refusedRoots = refused.map((p) => p.replace(/\.enabled$/, ''));
  // `routing.header_name` only names the refused header: it is marked with it, refused through it.
  t.same([...new Set(refusedRoots), 'observability.routing.header_name'].sort(), [...NOT_BUILT_PATHS].sort(), 'the reference marks exactly the refused features');
});

t.test('the reference does not call a key of an inactive or unbuilt feature live', async (t) => {
  const rows = referenceRows();
  for (const root of [...NOT_ACTIVE_PATHS, ...NOT_BUILT_PATHS]) {
    const keys = rows.filter((r) => r.path === root || r.path.startsWith(`${root}.`) || r.path.startsWith(`${root}[`));
    t.ok(keys.length > 0, `${root} is documented`);
    t.same(keys.filter((r) => r.activation === 'live').map((r) => r.path), [], `${root}: no key called live`);
    t.ok(keys.every((r) => r.activation === (NOT_ACTIVE_PATHS.includes(root) ? 'not active yet' : 'not built (refused when on)')), `${root}: every key marked`);
  }
  // An enforced key keeps its class.
  t.equal(rows.find((r) => r.path === 'resilience.protocol.denied_path_prefixes')?.activation, 'live');
});

t.test('all errors of a document are reported at once', async (t) => {
  const d = base();
  d.listen.port = 0;
  d.upstream.api.backends[0].address = 'ftp://x';
  d.resilience = { brownout: { trigger_inflight_percent: 10, recover_inflight_percent: 20 }, retry_budget: { ratio_percent: 300 } };
  d.extra = true;
  const r = validateConfig(d, '/tmp');
  t.notOk(r.ok);
  if (!r.ok) {
    t.same(
      r.issues.map((i) => i.code).sort(),
      ['EDGE_CONFIG_BACKEND_ADDRESS', 'EDGE_CONFIG_BROWNOUT_HYSTERESIS', 'EDGE_CONFIG_RANGE', 'EDGE_CONFIG_RETRY_RATIO', 'EDGE_CONFIG_UNKNOWN_KEY'],
    );
  }
});

t.test('a rejected configuration as one error: EDGE_CONFIG_INVALID carrying every issue', async (t) => {
  const d = base();
  d.listen.port = 0;
  d.extra = true;
  const r = validateConfig(d, '/tmp');
  t.notOk(r.ok);
  if (r.ok) return;
  const err = new ConfigValidationError('config.yaml', r.issues);
  t.match(err, { code: 'EDGE_CONFIG_INVALID', message: 'config.yaml: 2 configuration errors' });
  t.same(err.issues.map((i) => i.code).sort(), ['EDGE_CONFIG_RANGE', 'EDGE_CONFIG_UNKNOWN_KEY']);
});

t.test('every error code has a case here or in resolve.test.ts', async (t) => {
  // EDGE_CONFIG_LOG_FILE: log-file.test.ts (a host check of `edge-proxy -c`, not a rule).
  // EDGE_CONFIG_INVALID: the error that carries the issues (the test above).
  const covered = new Set<string>([...cases.map((c) => c.code), ...RESOLUTION_CODES, 'EDGE_CONFIG_NOT_OBJECT', 'EDGE_CONFIG_LOG_FILE', 'EDGE_CONFIG_INVALID']);
  const missing = Object.keys(CONFIG_ERROR_CODES).filter((code) => !covered.has(code));
  t.same(missing, [], 'codes without a test case');
});

t.test('a non-object document', async (t) => {
  for (const input of [null, 42, 'text', [1, 2]]) {
    const r = validateConfig(input, '/tmp');
    t.equal(r.ok ? 'ok' : r.issues[0]?.code, 'EDGE_CONFIG_NOT_OBJECT');
  }
});

t.test('default_auth: pools without their own auth take it; their own replaces it; public: true opts out', async (t) => {
  const d = base();
  d.upstream.admin = { route: { path_prefix: '/admin' }, backends: [{ id: 'x1', address: '127.0.0.1:8084' }], auth: { external: { url: 'http://127.0.0.1:9191/authz' } } };
  d.default_auth = { jwt: { algorithms: ['HS256'], secret_ref: { ref: `literal:${TOKEN}` } } };
  d.upstream.api.auth = { public: true };
  const r = validateConfig(d, '/');
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  const pools = r.value.config.upstream;
  t.equal(pools.web?.auth?.jwt?.algorithms.join(), 'HS256', 'the catch-all takes the default');
  t.equal(pools.web?.auth_at, 'default_auth', 'its secret slot is under default_auth');
  t.equal(pools.api?.auth, undefined, 'public: true leaves the pool without authentication');
  t.equal(pools.admin?.auth?.jwt, undefined, "a pool's own auth replaces the default as a whole");
  t.equal(pools.admin?.auth?.external?.url, 'http://127.0.0.1:9191/authz');
  t.equal(pools.admin?.auth_at, 'upstream.admin.auth');
  t.notOk('default_auth' in r.value.config, 'the default is folded into the pools, not kept beside them');
  t.ok(r.value.config.secret_slots.some((s) => s.path === 'default_auth.jwt.secret'), 'the default secret is a slot of its own');
});
