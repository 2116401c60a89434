// Live means live (issue 12 item 7): every key the configuration reference calls `live` takes
// effect on activation. The table below has a row for each such key, derived from the reference
// itself (referenceRows(), what docs/configuration.md is generated from): a key documented live
// without a row, or a row naming a key that is not documented live, fails the first test.
//
// A row is proven one of three ways:
// - `observed`: a check in this file against a real `edge-proxy serve`: configuration A is served,
//   the test activates B (and then C), and the check sees the behaviour change on the wire, in the
//   metrics or in the log. A row may group keys applied by the same code as the key it observes;
//   `why` says which code.
// - `test`: an existing test that activates a change of the key and observes it (file and test
//   name; both are checked to exist).
// - `alias` (a `listen.*` key is normalized into `listeners[]`, whose row proves it) or `single`
//   (the schema allows one value, so there is no other value to activate).
// - `reserved`: a key the SPEC reserves and the reference describes as "reserved:"; it has no
//   effect to observe, live or not (a known gap, listed here so that it cannot go unnoticed).
import t from 'tap';
import type { Test } from 'tap';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { X509Certificate, createHmac } from 'node:crypto';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfigText, referenceRows } from '@edge-proxy/config';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { api, auditEvents, serve } from './support/serve.ts';
import { quicIdleClose } from './support/served-by.ts';

const root = path.resolve(import.meta.dirname, '..');

type Proof =
  | { readonly observed: string; readonly why?: string }
  | { readonly test: string; readonly name: string; readonly why?: string }
  | { readonly alias: string }
  | { readonly single: true }
  | { readonly reserved: true };

/** Keys are schema paths as the reference writes them; `X.**` stands for X and everything under it. */
interface Row {
  readonly keys: readonly string[];
  readonly proof: Proof;
}

const RUNTIME_WHY = 'read from the Runtime provisioned at prepare (dataplane/src/runtime/provision.ts) and swapped in at commit; new requests use the new one';

const ROWS: readonly Row[] = [
  { keys: ['version'], proof: { single: true } },
  // Listeners.
  { keys: ['listeners', 'listeners[].name'], proof: { test: 'test/added-listener.test.ts', name: 'an added listener is bound by every worker at commit and answers HTTPS and HTTP/3', why: 'a listener under a new name is an added listener' } },
  {
    keys: ['listeners[].tls.cert', 'listeners[].tls.key', 'listeners[].tls.certificates', 'listeners[].tls.certificates[].server_name', 'listeners[].tls.certificates[].cert', 'listeners[].tls.certificates[].key', 'listeners[].tls.client_auth.ca_file'],
    proof: { test: 'test/failure-paths.test.ts', name: 'certificate rotation by new paths is a live activation (docs/operations.md): 202, and the new certificate is presented on TCP and QUIC', why: 'the listener material (certificates, SNI entries, client CAs) reaches both ingresses in one updateMaterial per commit' },
  },
  { keys: ['listeners[].alt_svc_max_age_s'], proof: { observed: 'alt-svc' } },
  ...['name', 'tls.cert', 'tls.key', 'tls.certificates', 'tls.certificates[].server_name', 'tls.certificates[].cert', 'tls.certificates[].key', 'tls.client_auth.ca_file', 'alt_svc_max_age_s'].map((k) => ({ keys: [`listen.${k}`], proof: { alias: `listeners[].${k}` } })),
  // Upstreams, routes, backends, balancing, upstream TLS, secrets: the runtime.
  { keys: ['upstream.**', 'upstream_tls.**', 'load_balancing.**'], proof: { observed: 'route', why: RUNTIME_WHY } },
  { keys: ['secrets.**'], proof: { test: 'packages/controlplane/test/activation.test.ts', name: 'rollback: 404 unknown, 409 active or stale, 202 restores and re-reads secrets from disk', why: 'secret references are resolved by the control plane for each candidate (config/src/resolve.ts) with the candidate\'s providers' } },
  // Performance.
  { keys: ['performance.worker_heartbeat_ms'], proof: { test: 'packages/controlplane/test/worker-pool.test.ts', name: 'performance.worker_heartbeat_ms is live: a generation with 100 ms makes every worker beat about every 100 ms' } },
  { keys: ['performance.memory_trim.**'], proof: { test: 'test/memory-trim.test.ts', name: 'performance.memory_trim is live: off in the served generation, no trim however quiet; on after an activation, the quiet worker trims', why: 'the worker reads the active generation\'s settings at each one-second look (runtime/memory-trim.ts)' } },
  { keys: ['performance.worker_unresponsive_heartbeats'], proof: { observed: 'liveness', why: 'the pool judges silence with the active bundle (worker-pool.ts liveness())' } },
  {
    keys: ['performance.body.max_request_body_bytes', 'performance.body.client_body_min_bytes_per_s'],
    proof: { observed: 'body-limit', why: RUNTIME_WHY },
  },
  {
    keys: [
      'performance.global_inflight_limit',
      'performance.per_backend_inflight_limit',
      'performance.max_connections',
      'performance.max_connections_per_source',
      'performance.new_connections_per_sec',
      'performance.new_connections_burst',
    ],
    proof: { observed: 'connections-per-source', why: 'inflight limits: the Runtime; connection admission asks the active generation at every accept (runtime/dataplane.ts)' },
  },
  {
    keys: [
      'performance.timeouts',
      'performance.timeouts.connect_ms',
      'performance.timeouts.backend_request_ms',
      'performance.timeouts.backend_body_idle_ms',
      'performance.timeouts.backend_body_total_ms',
      'performance.timeouts.client_body_idle_ms',
      'performance.timeouts.client_body_total_ms',
      'performance.timeouts.tls_handshake_ms',
      'performance.timeouts.client_header_ms',
      'performance.timeouts.client_send_idle_ms',
      'performance.timeouts.client_idle_ms',
      'performance.timeouts.shutdown_drain_ms',
      'performance.timeouts.backend_dns_refresh_ms',
    ],
    proof: { observed: 'backend-timeout', why: 'backend timeouts: the Runtime; downstream ones: each new connection takes the active generation\'s (serve-listeners.ts timeouts())' },
  },
  { keys: ['performance.timeouts.quic_idle_ms'], proof: { observed: 'quic-idle', why: 'QUIC connections accepted after the commit advertise it (QuicIngress.setIdleTimeout)' } },
  // Protocol policy.
  { keys: ['resilience.protocol.allow_0rtt', 'resilience.protocol.early_data_safe_methods'], proof: { observed: '0-rtt', why: `the QUIC server's early-data setting follows the committed generation (QuicIngress.setEarlyData); the per-method 425 is ${RUNTIME_WHY}` } },
  {
    // `allow_connect` and the CONNECT allowlists are not built (refused when set): no row (issue 38).
    keys: ['resilience.protocol.max_headers_count', 'resilience.protocol.max_headers_bytes', 'resilience.protocol.enforce_authority_host_match', 'resilience.protocol.allowed_methods', 'resilience.protocol.denied_path_prefixes'],
    proof: { observed: 'protocol-policy', why: RUNTIME_WHY },
  },
  // Watchdog.
  {
    keys: ['resilience.watchdog', 'resilience.watchdog.enabled', 'resilience.watchdog.check_interval_ms', 'resilience.watchdog.poll_stall_timeout_ms', 'resilience.watchdog.timeout_error_rate_percent', 'resilience.watchdog.min_requests_per_window', 'resilience.watchdog.overload_inflight_percent', 'resilience.watchdog.unhealthy_consecutive_windows', 'resilience.watchdog.restart_cooldown_ms'],
    proof: { observed: 'watchdog', why: 'each window is judged with the active generation\'s watchdog settings; the window timer follows check_interval_ms' },
  },
  {
    keys: ['resilience.watchdog.restart_command', 'resilience.watchdog.restart_hook', 'resilience.watchdog.drain_grace_ms'],
    proof: { test: 'test/failure-paths.test.ts', name: 'restart with restart_command: the workers drain first, then the command runs (argv, no shell) and can stop the service as systemctl would; serve exits 0', why: 'a restart reads the active generation\'s command and grace' },
  },
  {
    keys: ['resilience.watchdog.restart_command_timeout_ms'],
    proof: { test: 'test/restart-command-failure.test.ts', name: 'a restart_command that fails, cannot start, hangs or does not restart the service: logged, counted, audited, and the workers come back; a further restart is accepted', why: 'a restart reads the active generation\'s timeout when it starts the command (supervisor requestRestart)' },
  },
  // Log and route decisions.
  { keys: ['log.level'], proof: { observed: 'log-level' } },
  { keys: ['observability.routing.enabled', 'observability.routing.include_reason'], proof: { observed: 'route-decisions' } },
  { keys: ['observability.access_log', 'observability.access_log.enabled'], proof: { observed: 'access-log', why: 'the record phase reads `access_log` from the request\'s generation' } },
  {
    keys: ['observability.access_log.sample_ratio', 'observability.access_log.log_failures'],
    proof: { test: 'test/access-log.test.ts', name: 'sampling: sample_ratio 0 keeps only failures, and log_failures false drops them too (activated live)', why: 'the record phase reads `access_log` from the request\'s generation' },
  },
  { keys: ['observability.request_id', 'observability.request_id.accept_incoming'], proof: { observed: 'request-id', why: 'each request reads `request_id` from its generation when it arrives' } },
  // Overload protection (issue 13).
  {
    keys: ['performance.per_upstream_inflight_limit', 'resilience.adaptive_admission.**', 'resilience.circuit_breaker.**', 'resilience.brownout.**', 'resilience.route_queue.**'],
    proof: { observed: 'overload', why: `the route phases (brownout or not, core or not) and the breaker/brownout policies are built with the ${RUNTIME_WHY}; slots, queue caps and the adaptive policy are read from each request's generation, and the adaptive limit is reconfigured at commit (OverloadControl.configure)` },
  },
  // Retries, body replay, the response prebuffer and hedging (issue 14).
  {
    keys: ['resilience.retry_budget.**'],
    proof: { observed: 'retries', why: `each route's retry policy (max_attempts, ratio) is built with the ${RUNTIME_WHY}; the budget's counts live per route in the worker (RetryControl) and are kept across generations` },
  },
  { keys: ['resilience.hedging.**'], proof: { observed: 'hedging', why: `each route's hedging policy is built with the ${RUNTIME_WHY}` } },
  // Scoped rate limits and quota (issue 15).
  { keys: ['resilience.rate_limits', 'resilience.rate_limits[].**'], proof: { observed: 'rate-limits', why: `each route's limits are compiled with the ${RUNTIME_WHY}; the buckets live in the worker (RateLimiter) and are found again by limit name` } },
  {
    keys: ['resilience.quota', 'resilience.quota.enabled', 'resilience.quota.policies', 'resilience.quota.policies[].**'],
    proof: { observed: 'quota', why: `each route's quota policies are compiled with the ${RUNTIME_WHY}; the store is reconfigured at commit (QuotaControl.configure)` },
  },
  {
    keys: ['resilience.quota.backend', 'resilience.quota.failure_mode', 'resilience.quota.redis', 'resilience.quota.redis.**'],
    proof: { test: 'packages/dataplane/test/quota-redis.test.ts', name: 'AUTH: the right password works; a wrong one is a health error, not a crash, and never logged', why: 'QuotaControl.configure runs at every commit: the backend, failure mode and timeout are read from it, and the Redis connection is re-made when the address or password changed' },
  },
  { keys: ['performance.body', 'performance.body.request_buffer_bytes'], proof: { observed: 'body-replay', why: `each route's retry policy carries it, built with the ${RUNTIME_WHY}` } },
  {
    keys: ['performance.body.response_prebuffer_bytes'],
    proof: { test: 'packages/dataplane/test/retry.test.ts', name: 'a response cut inside the prebuffer is retried; one cut past it is not', why: `each route's retry policy carries it, built with the ${RUNTIME_WHY}` },
  },
  {
    keys: ['upstream.*.auth.**'],
    proof: { observed: 'request-auth', why: `the authenticate phase, each pool's verifier and its authorization client are built with the ${RUNTIME_WHY}; JWKS sources follow the activated generation (supervisor onActivated → NodeJwks.configure)` },
  },
  {
    keys: ['default_auth', 'default_auth.**'],
    proof: {
      test: 'test/route-auth-spelling.test.ts',
      name: 'default_auth protects everything but: the catch-all needs a token, `auth: { public: true }` opts a route out, a pool with its own auth keeps it, and an activation closes the opt-out live',
      why: `normalize.ts folds default_auth into every pool without its own auth, so it reaches the request path as each pool's auth, built with the ${RUNTIME_WHY}`,
    },
  },
  // routing.expose_header / header_name (refused: not built) are not documented live.
  // Metrics endpoint.
  { keys: ['observability.metrics.path'], proof: { observed: 'metrics-path' } },
  { keys: ['observability.metrics.max_connections', 'observability.metrics.max_connections_per_source', 'observability.metrics.idle_timeout_ms', 'observability.metrics.connection_timeout_ms'], proof: { observed: 'metrics-limits', why: 'one settings object (MetricsEndpoint.update)' } },
  // Control API.
  {
    keys: [
      'observability.control_api.auth_token',
      'observability.control_api.auth_token_ref',
      'observability.control_api.auth_token_ref.ref',
      'observability.control_api.auth_token_ref.provider',
      'observability.control_api.auth',
      'observability.control_api.auth.bearer_tokens',
      'observability.control_api.auth.bearer_tokens[].token',
      'observability.control_api.auth.bearer_tokens[].token_ref',
      'observability.control_api.auth.bearer_tokens[].token_ref.ref',
      'observability.control_api.auth.bearer_tokens[].token_ref.provider',
      'observability.control_api.auth.bearer_tokens[].role',
      'observability.control_api.auth.bearer_tokens[].actor_id',
      'observability.control_api.auth.identity_source',
      'observability.control_api.auth.identity_source.kind',
      'observability.control_api.auth.identity_source.role_attribute',
    ],
    proof: { observed: 'control-auth', why: 'the Authenticator is rebuilt from the activated generation (supervisor onActivated)' },
  },
  { keys: ['observability.control_api.tls.cert', 'observability.control_api.tls.key', 'observability.control_api.tls.client_auth.ca_file'], proof: { observed: 'control-tls', why: 'one secure context set from the activated generation (ControlApiServer.setCertificate)' } },
  { keys: ['observability.control_api.ip_allowlist', 'observability.control_api.ip_allowlist.cidrs'], proof: { observed: 'control-allowlist' } },
  { keys: ['observability.control_api.audit', 'observability.control_api.audit.enabled'], proof: { observed: 'control-audit' } },
  { keys: ['observability.control_api.audit.format', 'observability.control_api.audit.sink'], proof: { single: true } },
  { keys: ['observability.control_api.reload_path', 'observability.control_api.reload_certs_path'], proof: { observed: 'control-paths' } },
  { keys: ['observability.control_api.max_body_bytes'], proof: { observed: 'control-body' } },
  {
    keys: ['observability.control_api.max_connections', 'observability.control_api.connection_timeout_ms', 'observability.control_api.max_connections_per_source', 'observability.control_api.handshake_timeout_ms', 'observability.control_api.idle_timeout_ms', 'observability.control_api.operation_timeout_ms'],
    proof: { observed: 'control-limits', why: 'one settings object (ControlApiServer.setSettings)' },
  },
  { keys: ['observability.control_api.config_path_allowed_dirs'], proof: { observed: 'control-dirs' } },
];

const covers = (key: string, p: string): boolean => (key.endsWith('.**') ? p === key.slice(0, -3) || p.startsWith(`${key.slice(0, -3)}.`) || p.startsWith(`${key.slice(0, -3)}[`) : p === key);
const reference = referenceRows();
const livePaths = reference.filter((r) => r.activation === 'live').map((r) => r.path);

// --- the real service ------------------------------------------------------------------------

const dir = mkdtempSync(path.join(tmpdir(), 'edge-live-keys-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const allowedDir = path.join(dir, 'allowed');
mkdirSync(allowedDir);
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const apiLeaf = makeLeaf(dir, 'api', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN_A = 'admin-token-a-0123456789abcdef0123';
const TOKEN_B = 'admin-token-b-0123456789abcdef0123';
/** B's HMAC key for the JWTs of pool `au`. */
const JWT_SECRET = 'live-keys-jwt-hmac-secret-0123456789';
const backends = { one: await namedBackend(t, 'one'), two: await namedBackend(t, 'two') };
// A backend that answers after 1.5 s: a backend_request_ms of 500 ms times it out (504).
const slow = http.createServer((_req, res) => setTimeout(() => res.end('slow'), 1500).unref());
slow.listen(0, '127.0.0.1');
await once(slow, 'listening');
t.teardown(() => new Promise<void>((r) => (slow.closeAllConnections(), slow.close(() => r()))));
const slowPort = (slow.address() as net.AddressInfo).port;
// B's external authorization service: denies every request, and keeps the paths it was asked about.
const authzAsked: string[] = [];
const authz = http.createServer((req, res) => {
  let body = '';
  req.on('data', (c: Buffer) => (body += c.toString()));
  req.on('end', () => {
    authzAsked.push(String((JSON.parse(body) as { path?: unknown }).path));
    res.statusCode = 403;
    res.end();
  });
});
authz.listen(0, '127.0.0.1');
await once(authz, 'listening');
t.teardown(() => new Promise<void>((r) => (authz.closeAllConnections(), authz.close(() => r()))));
const authzPort = (authz.address() as net.AddressInfo).port;
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];
/** A port nothing listens on: its backend refuses every connection (a breaker failure each). */
const closedPort = await freePort();

interface Variant {
  readonly app: 'one' | 'two';
  readonly altSvc: number;
  readonly zeroRtt: boolean;
  readonly bodyBytes: number;
  readonly perSource: number;
  readonly backendRequestMs: number;
  readonly quicIdleMs: number;
  readonly heartbeats: number;
  readonly protocol: string;
  readonly checkIntervalMs: number;
  readonly level: string;
  readonly routing: boolean;
  /** `observability.access_log.enabled` and `observability.request_id.accept_incoming`. */
  readonly accessLog: boolean;
  readonly acceptIds: boolean;
  readonly metricsPath: string;
  readonly metricsIdleMs: number;
  readonly token: string;
  readonly cidrs: string;
  readonly audit: boolean;
  readonly reloadPaths: string;
  readonly maxBody: number;
  readonly handshakeMs: number;
  readonly apiTls: string;
  readonly dirs: string;
  /** Lines under `performance:` and `resilience:` for the overload keys. */
  readonly perfOverload: string;
  readonly overload: string;
  /** Request authentication of pools `au` and `ax` (after their backends, in their flow mappings). */
  readonly auth: string;
  readonly externalAuth: string;
}

const A: Variant = {
  app: 'one',
  altSvc: 100,
  zeroRtt: false,
  bodyBytes: 1_048_576,
  perSource: 1000,
  backendRequestMs: 10_000,
  quicIdleMs: 30_000,
  heartbeats: 8,
  protocol: '{}',
  checkIntervalMs: 60_000,
  level: 'info',
  routing: false,
  accessLog: false,
  acceptIds: true,
  metricsPath: '/metrics',
  metricsIdleMs: 60_000,
  token: TOKEN_A,
  cidrs: '[127.0.0.0/8]',
  audit: true,
  reloadPaths: 'reload_path: /admin/runtime/reload',
  maxBody: 65_536,
  handshakeMs: 10_000,
  apiTls: '{}',
  dirs: `[${dir}]`,
  perfOverload: '',
  // One attempt per request in A, the default two in B (the retries observation); hedging off; no rate limit, no quota.
  overload: '\n  retry_budget: { max_attempts: 1 }',
  auth: '',
  externalAuth: '',
};
const B: Variant = {
  app: 'two',
  altSvc: 200,
  zeroRtt: true,
  bodyBytes: 100,
  // Every other check connects from 127.0.0.1, one connection a request, one after the other: a
  // closed connection's slot goes back to the node a message later, so on a loaded machine two or
  // three may still count; 8 leaves them room. The check itself holds 8 from 127.0.0.9.
  perSource: 8,
  backendRequestMs: 500,
  quicIdleMs: 1000,
  heartbeats: 4,
  protocol: '{ allowed_methods: [GET, HEAD, POST, PUT], denied_path_prefixes: [/denied], max_headers_count: 40 }',
  checkIntervalMs: 100,
  level: 'info',
  routing: true,
  accessLog: true,
  acceptIds: false,
  metricsPath: '/m2',
  metricsIdleMs: 1000,
  token: TOKEN_B,
  cidrs: '[127.0.0.1/32]',
  audit: false,
  reloadPaths: 'reload_path: /ops/reload\n    reload_certs_path: /ops/reload-certs',
  maxBody: 256,
  handshakeMs: 1000,
  apiTls: `{ cert: ${apiLeaf.cert}, key: ${apiLeaf.key} }`,
  dirs: `[${allowedDir}]`,
  perfOverload: '\n  per_upstream_inflight_limit: 1',
  overload: '\n  rate_limits: [{ name: lk, routes: [rl], key: client_ip, requests_per_second: 1, burst: 1 }]\n  quota: { enabled: true, backend: local, policies: [{ name: lq, routes: [ql], dimensions: [client_ip], burst: { limit: 1, window_ms: 60000 } }] }\n  hedging: { enabled: true, delay_ms: 100 }\n  circuit_breaker: { failure_threshold: 1, open_ms: 60000 }\n  adaptive_admission: { min_limit: 1, max_limit: 100 }\n  route_queue: { shed_retry_after_seconds: 7, caps: { hold: 0 } }\n  brownout: { core_routes: [app] }',
  auth: `, auth: { jwt: { algorithms: [HS256], secret: "${JWT_SECRET}", issuer: live-keys } }`,
  externalAuth: `, auth: { external: { url: "http://127.0.0.1:${authzPort}/authz", timeout_ms: 2000 } }`,
};
/** C differs from B in log.level only. */
const C: Variant = { ...B, level: 'warn' };

const configText = (v: Variant): string => `
listeners:
  - { name: main, address: 127.0.0.1, port: ${lport}, alt_svc_max_age_s: ${v.altSvc}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: ${v.level} }
performance:
  worker_threads: 1
  worker_heartbeat_ms: 1000
  worker_unresponsive_heartbeats: ${v.heartbeats}
  max_connections_per_source: ${v.perSource}
  body: { max_request_body_bytes: ${v.bodyBytes}, request_buffer_bytes: ${Math.min(v.bodyBytes, v.app === 'one' ? 65_536 : 40)} }
  timeouts: { backend_request_ms: ${v.backendRequestMs}, quic_idle_ms: ${v.quicIdleMs} }${v.perfOverload}
resilience:${v.overload}
  protocol: ${v.zeroRtt ? v.protocol.replace('{', '{ allow_0rtt: true, ').replace(', }', ' }') : v.protocol}
  watchdog: { check_interval_ms: ${v.checkIntervalMs}, poll_stall_timeout_ms: 60000 }
upstream:
  app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backends[v.app]}" }] }
  slow: { route: { path_prefix: /slow }, backends: [{ id: s, address: "127.0.0.1:${slowPort}" }] }
  hold: { route: { path_prefix: /hold }, backends: [{ id: h, address: "127.0.0.1:${slowPort}" }], timeouts: { backend_request_ms: 10000 } }
  brk: { route: { path_prefix: /brk }, backends: [{ id: k, address: "127.0.0.1:${closedPort}" }] }
  rty: { route: { path_prefix: /rty }, backends: [{ id: r1, address: "127.0.0.1:${closedPort}" }, { id: r2, address: "127.0.0.1:${backends['one']}" }] }
  rtb: { route: { path_prefix: /rtb }, backends: [{ id: q1, address: "127.0.0.1:${closedPort}" }, { id: q2, address: "127.0.0.1:${backends['one']}" }] }
  rl: { route: { path_prefix: /rl }, backends: [{ id: l1, address: "127.0.0.1:${backends['one']}" }] }
  ql: { route: { path_prefix: /ql }, backends: [{ id: l2, address: "127.0.0.1:${backends['one']}" }] }
  hdg: { route: { path_prefix: /hdg }, backends: [{ id: hs, address: "127.0.0.1:${slowPort}" }, { id: hf, address: "127.0.0.1:${backends['one']}" }] }
  au: { route: { path_prefix: /au }, backends: [{ id: a1, address: "127.0.0.1:${backends['one']}" }]${v.auth} }
  ax: { route: { path_prefix: /ax }, backends: [{ id: a2, address: "127.0.0.1:${backends['one']}" }]${v.externalAuth} }
observability:
  routing: { enabled: ${v.routing}, include_reason: true }
  access_log: { enabled: ${v.accessLog}, sample_ratio: 1 }
  request_id: { accept_incoming: ${v.acceptIds} }
  metrics: { address: 127.0.0.1, port: ${mport}, path: ${v.metricsPath}, idle_timeout_ms: ${v.metricsIdleMs} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    ${v.reloadPaths}
    max_body_bytes: ${v.maxBody}
    handshake_timeout_ms: ${v.handshakeMs}
    tls: ${v.apiTls}
    config_path_allowed_dirs: ${v.dirs}
    audit: { enabled: ${v.audit} }
    ip_allowlist: { cidrs: ${v.cidrs} }
    auth: { bearer_tokens: [{ token: ${v.token}, role: admin, actor_id: live-keys }] }
`;

// --- clients -----------------------------------------------------------------------------------

interface Answer {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
}

/** One HTTPS request on a new connection to the listener (HTTP/1.1). */
/**
 * One HTTPS request on a new connection, from 127.0.0.1 or `from`. B allows 3 connections per
 * source: the observations that make several requests in a row use a source of their own, so a
 * connection the server has not yet seen close cannot push another check over that cap.
 */
function request(p: string, o: { method?: string; headers?: Record<string, string>; body?: string; from?: string } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port: lport, path: p, method: o.method ?? 'GET', ca: caPem, servername: 'localhost', agent: false, headers: o.headers ?? {}, ...(o.from === undefined ? {} : { localAddress: o.from }) }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.setTimeout(15_000, () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(o.body);
  });
}

/** One control API call from `localAddress`; the status, or 0 when the connection was refused or reset. */
function controlFrom(localAddress: string, method: string, p: string, token: string): Promise<number> {
  return new Promise((resolve) => {
    const req = https.request({ host: '127.0.0.1', port: cport, path: p, method, ca: caPem, servername: 'localhost', agent: false, localAddress, headers: { authorization: `Bearer ${token}` } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve(0));
    req.end();
  });
}

/** A compact JWS (HS256) over `claims` with B's secret. */
function hs256(claims: Record<string, unknown>): string {
  const part = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64url');
  const input = `${part({ alg: 'HS256', typ: 'JWT' })}.${part(claims)}`;
  return `${input}.${createHmac('sha256', JWT_SECRET).update(input).digest('base64url')}`;
}

const fingerprint = (file: string): string => new X509Certificate(readFileSync(file)).fingerprint256;

/** The fingerprint of the certificate a TLS server on `port` presents. */
function presented(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] }, () => {
      const fp = s.getPeerCertificate().fingerprint256;
      s.end();
      resolve(fp);
    });
    s.on('error', reject);
  });
}

/** A TCP connection that sends nothing; resolves with how long the server kept it open. */
async function silentFor(port: number): Promise<number> {
  const s = net.connect({ host: '127.0.0.1', port });
  s.on('error', () => undefined);
  await once(s, 'connect');
  const opened = Date.now();
  await once(s, 'close');
  return Date.now() - opened;
}

/** gtlsclient (ngtcp2), resuming with the session file of its previous run: its output. */
function gtls(session: string): Promise<string> {
  return new Promise((resolve) => {
    execFile(
      'gtlsclient',
      ['--no-quic-dump', '--exit-on-all-streams-close', '--timeout=10s', '--handshake-timeout=5s', `--session-file=${session}`, `--tp-file=${session}.tp`, '127.0.0.1', String(lport), `https://localhost:${lport}/zero-rtt`],
      { timeout: 30_000 },
      (_err, stdout, stderr) => resolve(`${stdout}${stderr}`),
    );
  });
}

const routeDecisions = (p: string) => served.lines.filter((l) => l['path'] === p && l['decision'] !== undefined);

/**
 * Requests `p` until a line of it matching `kind` shows in the log: a worker writes its log in
 * 4 KB blocks, so a few dozen lines are needed before the first one is seen.
 */
async function loggedLine(p: string, kind: (l: Record<string, unknown>) => boolean): Promise<Record<string, unknown>> {
  const found = served.waitFor((l) => l['path'] === p && kind(l), 30_000);
  let seen = false;
  void found.then(() => (seen = true), () => undefined);
  for (let i = 0; i < 200 && !seen; i++) await request(p);
  return found;
}

const decisionLogged = (p: string): Promise<Record<string, unknown>> => loggedLine(p, (l) => l['decision'] === 'match');
const accessLogged = (p: string): Promise<Record<string, unknown>> => loggedLine(p, (l) => l['log_type'] === 'access');

// --- observations: A is served, the test activates B, then C -----------------------------------

const served = await serve(path.join(dir, 'a.yaml'), configText(A));
t.teardown(() => served.stop());
const metricsNow = async (p: string): Promise<string> => scrape(mport, p);
const before: Record<string, unknown> = {};

// What A does, for the observations that compare.
before['alt-svc'] = (await request('/')).headers['alt-svc'];
before['route'] = (await request('/')).body;
before['body-limit'] = (await request('/', { method: 'POST', body: 'x'.repeat(1000) })).status;
before['backend-timeout'] = (await request('/slow')).status;
// Two refused connections: under A's failure_threshold (3) the breaker stays closed.
before['overload'] = [(await request('/brk')).status, (await request('/brk')).status, ((await api(cport, caPem, 'GET', '/admin/runtime', { token: TOKEN_A })).body['admission'] as { max_limit: number }).max_limit];
{
  // Two requests over a pool of a refusing backend and a working one: round-robin sends one of them to the refusing one.
  const retries0 = metricValue(await metricsNow('/metrics'), 'svc_retries_total');
  const statuses = [(await request('/rty')).status, (await request('/rty')).status].sort();
  before['retries'] = [statuses, metricValue(await metricsNow('/metrics'), 'svc_retries_total') - retries0];
}
{
  // Hedging off: of two requests, the one round-robin sends to the slow backend waits its 1.5 s.
  const hedges0 = metricValue(await metricsNow('/metrics'), 'svc_hedge_triggered_total');
  const t0 = performance.now();
  const bodies = [(await request('/hdg')).body, (await request('/hdg')).body].sort();
  before['hedging'] = [bodies, metricValue(await metricsNow('/metrics'), 'svc_hedge_triggered_total') - hedges0, performance.now() - t0 >= 1500];
}
before['request-auth'] = [(await request('/au')).status, (await request('/ax')).status];
before['limits'] = [(await request('/rl')).status, (await request('/rl')).status, (await request('/ql')).status, (await request('/ql')).status];
before['protocol-policy'] = [(await request('/', { method: 'DELETE' })).status, (await request('/denied/x')).status];
before['metrics-path'] = [(await metricsNow('/metrics')).length > 0];
before['control-paths'] = (await api(cport, caPem, 'POST', '/ops/reload-certs', { token: TOKEN_A }, {})).status;
before['control-body'] = (await api(cport, caPem, 'POST', '/admin/runtime/validate', { token: TOKEN_A }, { reason: 'r'.repeat(600) })).status;
before['control-allowlist'] = await controlFrom('127.0.0.2', 'GET', '/admin/runtime/history', TOKEN_A);
before['control-tls'] = await presented(cport);
before['liveness'] = ((await api(cport, caPem, 'GET', '/admin/runtime', { token: TOKEN_A })).body['workers'] as { unresponsive_after_ms: number }).unresponsive_after_ms;
await request('/rd-a');
await request('/al-a');
before['request-id'] = (await request('/x%00', { headers: { 'x-request-id': 'live-keys-a' } })).headers['x-request-id'];
{
  // 0-RTT with allow_0rtt false: the resumed connection's early data is rejected by the server.
  const session = path.join(dir, 'session-a.pem');
  await gtls(session);
  before['0-rtt'] = await gtls(session);
}
{
  const degraded0 = metricValue(await metricsNow('/metrics'), 'svc_watchdog_degraded_windows');
  await new Promise((r) => setTimeout(r, 1500)); // the measurement window itself
  before['watchdog'] = metricValue(await metricsNow('/metrics'), 'svc_watchdog_degraded_windows') - degraded0;
}

const bFile = path.join(dir, 'b.yaml');
writeFileSync(bFile, configText(B));
const activated = await api(cport, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN_A }, { config_path: bFile, expected_generation: 1 });
const auditAfterActivation = auditEvents(served).length;

/** A source address of its own for each check of B that makes several requests in a row (see `request`). */
const SOURCE: Readonly<Record<string, string>> = { retries: '127.0.0.21', hedging: '127.0.0.22', 'body-replay': '127.0.0.23', 'rate-limits': '127.0.0.24', quota: '127.0.0.25', 'request-auth': '127.0.0.26' };

type Check = (t: Test) => Promise<void>;
const OBSERVED = new Map<string, Check>([
  [
    'alt-svc',
    async (t) => {
      t.equal(before['alt-svc'], `h3=":${lport}"; ma=100`, 'A advertises ma=100');
      t.equal((await request('/')).headers['alt-svc'], `h3=":${lport}"; ma=200`, 'after the activation: ma=200');
    },
  ],
  [
    'route',
    async (t) => {
      t.equal(before['route'], 'one', 'A routes / to backend one');
      t.equal((await request('/')).body, 'two', 'B routes / to backend two');
    },
  ],
  [
    'body-limit',
    async (t) => {
      t.equal(before['body-limit'], 200, 'A: a 1000-byte body passes (limit 1 MiB)');
      t.equal((await request('/', { method: 'POST', body: 'x'.repeat(1000) })).status, 413, 'B: 413 above 100 bytes');
    },
  ],
  [
    'backend-timeout',
    async (t) => {
      t.equal(before['backend-timeout'], 200, 'A: a backend answering in 1.5 s is waited for (10 s)');
      t.equal((await request('/slow')).status, 504, 'B: 504 after backend_request_ms 500');
    },
  ],
  [
    'overload',
    async (t) => {
      t.same(before['overload'], [502, 502, 4096], 'A: two refused connections answer 502 (breaker closed under threshold 3); adaptive max_limit is global_inflight_limit');
      t.equal((await request('/brk')).status, 502, 'B: the next failure is the first one B counts past its threshold of 1: 502, and the breaker opens');
      const shed = await request('/brk');
      t.match(shed, { status: 503, headers: { 'retry-after': '7' }, body: /EDGE_SHED_CIRCUIT_OPEN/ }, 'B: then 503 circuit open, Retry-After from B (7)');
      const admission = (await api(cport, caPem, 'GET', '/admin/runtime', { token: TOKEN_B })).body['admission'] as { min_limit: number; max_limit: number };
      t.same([admission.min_limit, admission.max_limit], [1, 100], 'B: the snapshot shows B\'s adaptive limits');
      // per_upstream_inflight_limit 1 and caps.hold 0: a second request while one is in flight is shed at once.
      const first = request('/hold');
      const deadline = Date.now() + 10_000;
      while (metricValue(await metricsNow('/m2'), 'svc_inflight_requests') < 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      t.match(await request('/hold'), { status: 503, headers: { 'retry-after': '7' }, body: /EDGE_SHED_QUEUE_FULL/ }, 'B: the second /hold request finds the upstream limit (1) full and its queue cap 0: queue_full');
      t.equal((await first).status, 200, 'B: the first one is served');
    },
  ],
  [
    'retries',
    async (t) => {
      t.same(before['retries'], [[200, 502], 0], 'A (max_attempts 1): the request sent to the refusing backend answers 502, nothing is retried');
      const retries0 = metricValue(await metricsNow('/m2'), 'svc_retries_total');
      const statuses = [(await request('/rty', { from: SOURCE['retries'] })).status, (await request('/rty', { from: SOURCE['retries'] })).status];
      t.same(statuses, [200, 200], 'B (max_attempts 2): both requests are answered 200');
      t.equal(metricValue(await metricsNow('/m2'), 'svc_retries_total') - retries0, 1, 'B: the one sent to the refusing backend was retried on the other');
    },
  ],
  [
    'hedging',
    async (t) => {
      t.same(before['hedging'], [['one', 'slow'], 0, true], 'A (hedging off): the slow backend is waited for (1.5 s), no hedge');
      const m0 = await metricsNow('/m2');
      const t0 = performance.now();
      const bodies = [(await request('/hdg', { from: SOURCE['hedging'] })).body, (await request('/hdg', { from: SOURCE['hedging'] })).body];
      const ms = performance.now() - t0;
      const m1 = await metricsNow('/m2');
      t.same(bodies, ['one', 'one'], 'B (hedging after 100 ms): both answered by the fast backend');
      t.ok(ms < 1500, `B: both within ${ms.toFixed(0)} ms (the slow one would take 1.5 s)`);
      t.equal(metricValue(m1, 'svc_hedge_triggered_total') - metricValue(m0, 'svc_hedge_triggered_total'), 1, 'B: one hedge sent');
      t.equal(metricValue(m1, 'svc_hedge_won_total') - metricValue(m0, 'svc_hedge_won_total'), 1, 'B: and it won');
    },
  ],
  [
    'body-replay',
    async (t) => {
      // B keeps bodies up to 40 bytes: an 80-byte PUT sent to the refusing backend is not replayed.
      const denied0 = metricValue(await metricsNow('/m2'), 'svc_retry_denied_total', { reason: 'body_not_buffered' });
      const statuses = [(await request('/rtb', { from: SOURCE['body-replay'], method: 'PUT', body: 'p'.repeat(80) })).status, (await request('/rtb', { from: SOURCE['body-replay'], method: 'PUT', body: 'p'.repeat(80) })).status].sort();
      t.same(statuses, [200, 502], 'B: the PUT sent to the refusing backend answers 502');
      t.equal(metricValue(await metricsNow('/m2'), 'svc_retry_denied_total', { reason: 'body_not_buffered' }) - denied0, 1, 'B: its retry is refused, body_not_buffered (request_buffer_bytes 40)');
    },
  ],
  [
    'rate-limits',
    async (t) => {
      t.same((before['limits'] as number[]).slice(0, 2), [200, 200], 'A (no rate limit): two requests to /rl at once are served');
      const first = await request('/rl', { from: SOURCE['rate-limits'] });
      const second = await request('/rl', { from: SOURCE['rate-limits'] });
      t.same([first.status, second.status], [200, 429], 'B (1/s, burst 1): the second is refused');
      t.match(second, { headers: { 'retry-after': '1' }, body: /EDGE_RATE_LIMITED/ }, 'B: 429 EDGE_RATE_LIMITED with Retry-After');
    },
  ],
  [
    'quota',
    async (t) => {
      t.same((before['limits'] as number[]).slice(2), [200, 200], 'A (quota off): two requests to /ql are served');
      const first = await request('/ql', { from: SOURCE['quota'] });
      const second = await request('/ql', { from: SOURCE['quota'] });
      t.same([first.status, second.status], [200, 429], 'B (a local quota of 1 per minute): the second is refused');
      t.match(second.body, /EDGE_QUOTA_EXCEEDED/, 'B: 429 EDGE_QUOTA_EXCEEDED');
    },
  ],
  [
    'request-auth',
    async (t) => {
      t.same(before['request-auth'], [200, 200], 'A (no auth on /au nor /ax): requests without a token are served');
      t.same(authzAsked, [], 'A: the authorization service was never asked');
      const from = SOURCE['request-auth'];
      const missing = await request('/au', { from });
      t.match(missing, { status: 401, headers: { 'www-authenticate': 'Bearer' }, body: /EDGE_AUTH_TOKEN_MISSING/ }, 'B (JWT HS256): no token → 401 EDGE_AUTH_TOKEN_MISSING');
      const now = Math.floor(Date.now() / 1000);
      t.equal((await request('/au', { from, headers: { authorization: `Bearer ${hs256({ iss: 'live-keys', exp: now + 60 })}` } })).status, 200, 'B: a token B\'s secret signed, from B\'s issuer → served');
      t.match(await request('/au', { from, headers: { authorization: `Bearer ${hs256({ iss: 'other', exp: now + 60 })}` } }), { status: 401, headers: { 'www-authenticate': 'Bearer error="invalid_token"' } }, 'B: another issuer → 401 invalid_token');
      t.match(await request('/ax/x', { from: '127.0.0.27' }), { status: 403, body: /EDGE_AUTH_DENIED/ }, 'B (external authorization on /ax): the service denies → 403 EDGE_AUTH_DENIED');
      t.same(authzAsked, ['/ax/x'], 'B: the service was asked about that request');
    },
  ],
  [
    'quic-idle',
    async (t) => {
      const { status, idleMs: ms } = await quicIdleClose({ lport, ca: caPem });
      t.equal(status, 200);
      t.ok(ms >= 900 && ms < 8000, `B: a new QUIC connection closed after ${ms.toFixed(0)} ms idle (quic_idle_ms 1000; A had 30000)`);
    },
  ],
  [
    'connections-per-source',
    async (t) => {
      // Eight connections held open from 127.0.0.9; a ninth from it is refused at accept. (The
      // other checks connect from 127.0.0.1, a source of its own.)
      const held: net.Socket[] = [];
      t.teardown(() => held.forEach((s) => s.destroy()));
      const connect = (): net.Socket => {
        const s = net.connect({ host: '127.0.0.1', port: lport, localAddress: '127.0.0.9' });
        s.on('error', () => undefined);
        held.push(s);
        return s;
      };
      for (let i = 0; i < 8; i++) await once(connect(), 'connect');
      const rejects0 = metricValue(await metricsNow('/m2'), 'svc_connection_cap_rejects');
      // Refused once the node's ledger answered (its lease held the eight): reset then, so the
      // client hears an error before the close (docs/overload.md "Connection caps").
      const ninth = connect();
      await new Promise<void>((resolve) => ninth.once('close', () => resolve()));
      t.pass('B: the ninth connection from one source is closed by the proxy (max_connections_per_source 8; A allowed 1000)');
      t.equal(metricValue(await metricsNow('/m2'), 'svc_connection_cap_rejects') - rejects0, 1, 'and counted as one connection cap reject');
      t.equal(held.slice(0, 8).filter((s) => !s.destroyed).length, 8, 'the eight held connections stay open');
    },
  ],
  [
    'protocol-policy',
    async (t) => {
      t.same(before['protocol-policy'], [200, 200], 'A: DELETE and /denied/x pass');
      t.equal((await request('/', { method: 'DELETE' })).status, 405, 'B: DELETE 405 (allowed_methods)');
      t.equal((await request('/denied/x')).status, 403, 'B: /denied/x 403 (denied_path_prefixes)');
      const many = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`x-h${i}`, '1']));
      t.equal((await request('/', { headers: many })).status, 431, 'B: 50 headers 431 (max_headers_count 40)');
    },
  ],
  [
    '0-rtt',
    async (t) => {
      // The transport's half of allow_0rtt: early data accepted or rejected by the QUIC server.
      // (The request's half, 425 for methods not in early_data_safe_methods, is the Runtime's.)
      t.match(before['0-rtt'], /:status: 200/, 'A: the resumed connection is answered');
      t.match(before['0-rtt'], /Early data was rejected by server/, 'A (allow_0rtt false): the early data it tried was rejected');
      const session = path.join(dir, 'session-b.pem');
      t.match(await gtls(session), /:status: 200/, 'B: a first connection is answered and gets a ticket');
      const resumed = await gtls(session);
      t.match(resumed, /type=0RTT/, 'B: the resumed connection sends its request as 0-RTT');
      t.notMatch(resumed, /Early data was rejected/, 'B (allow_0rtt true): and the server accepts it');
      t.match(resumed, /:status: 200/, 'B: and answers it');
    },
  ],
  [
    'watchdog',
    async (t) => {
      t.equal(before['watchdog'], 0, 'A: no watchdog window in 1.5 s (check_interval_ms 60000)');
      const d0 = metricValue(await metricsNow('/m2'), 'svc_watchdog_degraded_windows');
      await new Promise((r) => setTimeout(r, 1500)); // the measurement window itself
      const d1 = metricValue(await metricsNow('/m2'), 'svc_watchdog_degraded_windows');
      t.ok(d1 - d0 >= 5, `B: windows of 100 ms, most without a heartbeat (every 1000 ms), judged worker_silent: ${d1 - d0} degraded windows in 1.5 s`);
    },
  ],
  [
    'liveness',
    async (t) => {
      t.equal(before['liveness'], 8000, 'A: silence limit 8 × 1000 ms');
      t.match((await api(cport, caPem, 'GET', '/admin/runtime', { token: TOKEN_B })).body, { workers: { unresponsive_after_ms: 4000 } }, 'B: 4 × 1000 ms');
    },
  ],
  [
    'route-decisions',
    async (t) => {
      const line = await decisionLogged('/rd-b');
      t.match(line, { route: 'app', generation: 2, reason: /./ }, 'B (routing.enabled): the route decision is logged, with its reason');
      t.same(routeDecisions('/rd-a'), [], 'A (routing.enabled false): the request before the activation logged none (the worker logs in order)');
    },
  ],
  [
    'access-log',
    async (t) => {
      const line = await accessLogged('/al-b');
      t.match(line, { generation: 2, status: 200, upstream: 'app', backend: 'b', request_id: /^[0-9a-f-]{36}$/ }, 'B (access_log.enabled): the request is logged');
      t.same(
        served.lines.filter((l) => l['path'] === '/al-a' && l['log_type'] === 'access'),
        [],
        'A (access_log.enabled false): the request before the activation logged none (the worker logs in order)',
      );
    },
  ],
  [
    'request-id',
    async (t) => {
      t.equal(before['request-id'], 'live-keys-a', 'A (accept_incoming): the client\'s id is kept and returned on the error answer');
      const id = (await request('/x%00', { headers: { 'x-request-id': 'live-keys-b' } })).headers['x-request-id'];
      t.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'B (accept_incoming false): the proxy generated its own (a UUID)');
    },
  ],
  [
    'metrics-path',
    async (t) => {
      t.same(before['metrics-path'], [true], 'A: /metrics answers');
      t.ok((await metricsNow('/m2')).includes('svc_'), 'B: /m2 answers');
      await t.rejects(metricsNow('/metrics'), /404/, 'B: /metrics is 404');
    },
  ],
  [
    'metrics-limits',
    async (t) => {
      const took = await silentFor(mport);
      t.ok(took >= 800 && took < 10_000, `B: an idle connection closed after ${took} ms (idle_timeout_ms 1000; A had 60000)`);
    },
  ],
  [
    'control-auth',
    async (t) => {
      t.equal((await api(cport, caPem, 'GET', '/admin/runtime/history', { token: TOKEN_A })).status, 401, 'B: the token of A is refused');
      t.equal((await api(cport, caPem, 'GET', '/admin/runtime/history', { token: TOKEN_B })).status, 200, 'B: its own token is accepted');
    },
  ],
  [
    'control-tls',
    async (t) => {
      t.equal(before['control-tls'], fingerprint(server.cert), 'A: the control API presents the listener certificate (no tls.cert of its own)');
      t.equal(await presented(cport), fingerprint(apiLeaf.cert), 'B: it presents its own tls.cert to new connections');
    },
  ],
  [
    'control-allowlist',
    async (t) => {
      t.equal(before['control-allowlist'], 200, 'A: a call from 127.0.0.2 is served');
      t.equal(await controlFrom('127.0.0.2', 'GET', '/admin/runtime/history', TOKEN_B), 0, 'B: a connection from 127.0.0.2 is refused (cidrs 127.0.0.1/32)');
      t.equal(await controlFrom('127.0.0.1', 'GET', '/admin/runtime/history', TOKEN_B), 200, 'B: 127.0.0.1 is served');
    },
  ],
  [
    'control-audit',
    async (t) => {
      t.ok(auditAfterActivation > 0, 'A: operations were audited (the activation among them)');
      await api(cport, caPem, 'POST', '/admin/runtime/validate', { token: TOKEN_B }, {});
      await api(cport, caPem, 'GET', '/admin/runtime/history', { token: TOKEN_A }); // a refused call: audited when enabled
      await new Promise((r) => setTimeout(r, 1000)); // an absence: nothing can be awaited
      t.equal(auditEvents(served).length, auditAfterActivation, 'B (audit.enabled false): no audit event since the activation');
    },
  ],
  [
    'control-paths',
    async (t) => {
      t.equal(before['control-paths'], 404, 'A: /ops/reload-certs is 404');
      t.equal((await api(cport, caPem, 'POST', '/ops/reload-certs', { token: TOKEN_B }, {})).status, 200, 'B: /ops/reload-certs reloads');
      t.equal((await api(cport, caPem, 'POST', '/admin/runtime/reload-certs', { token: TOKEN_B }, {})).status, 404, 'B: the old path is 404');
      t.not((await api(cport, caPem, 'POST', '/ops/reload', { token: TOKEN_B }, { expected_generation: 0 })).status, 404, 'B: /ops/reload is routed');
    },
  ],
  [
    'control-body',
    async (t) => {
      t.not(before['control-body'], 413, `A: a 600-byte body is read (${String(before['control-body'])})`);
      t.match(await api(cport, caPem, 'POST', '/admin/runtime/validate', { token: TOKEN_B }, { reason: 'r'.repeat(600) }), { status: 413, body: { reason: 'body_too_large' } }, 'B: 413 above 256 bytes');
    },
  ],
  [
    'control-limits',
    async (t) => {
      const took = await silentFor(cport);
      t.ok(took >= 800 && took < 8000, `B: no ClientHello, closed after ${took} ms (handshake_timeout_ms 1000; A had 10000)`);
    },
  ],
  [
    'control-dirs',
    async (t) => {
      t.match(await api(cport, caPem, 'POST', '/admin/runtime/validate', { token: TOKEN_B }, { config_path: bFile }), { status: 403, body: { reason: 'config_path_not_allowed' } }, 'B: the directory A allowed (where b.yaml is) is refused');
      const inside = path.join(allowedDir, 'b.yaml');
      writeFileSync(inside, configText(B));
      t.equal((await api(cport, caPem, 'POST', '/admin/runtime/validate', { token: TOKEN_B }, { config_path: inside })).status, 200, 'B: a file in the allowed directory validates');
    },
  ],
  [
    'log-level',
    async (t) => {
      // C: the same as B with log.level warn (route decisions are logged at info); then B again.
      const cFile = path.join(allowedDir, 'c.yaml');
      writeFileSync(cFile, configText(C));
      t.match(await api(cport, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN_B }, { config_path: cFile, expected_generation: 2 }), { status: 202, body: { generation: 3 } });
      for (let i = 0; i < 5; i++) await request('/rd-c');
      const dFile = path.join(allowedDir, 'd.yaml');
      writeFileSync(dFile, configText(B));
      t.match(await api(cport, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN_B }, { config_path: dFile, expected_generation: 3 }), { status: 202, body: { generation: 4 } });
      t.match(await decisionLogged('/rd-d'), { generation: 4 }, 'info again: decisions are logged');
      t.same(routeDecisions('/rd-c'), [], 'C (log.level warn): none was logged while routing stayed enabled (the worker logs in order)');
    },
  ],
]);

t.test('the activation of B is live', async (t) => {
  t.match(activated, { status: 202, body: { generation: 2, rejected_changes: [] } }, JSON.stringify(activated.body).slice(0, 400));
});

// In table order; log-level last (it activates C).
for (const name of [...new Set(ROWS.flatMap((r) => ('observed' in r.proof ? [r.proof.observed] : [])))].sort((a, b) => Number(a === 'log-level') - Number(b === 'log-level'))) {
  const check = OBSERVED.get(name);
  if (check === undefined) continue;
  const keys = ROWS.filter((r) => 'observed' in r.proof && r.proof.observed === name).flatMap((r) => r.keys);
  t.test(`${name}: ${keys.join(', ')}`, check);
}

// --- the table is complete ---------------------------------------------------------------------

t.test('every key the reference calls live has a row, and every row names live keys and an existing proof', async (t) => {
  t.ok(livePaths.length > 100, `${livePaths.length} live keys in the reference`);
  const uncovered = livePaths.filter((p) => !ROWS.some((r) => r.keys.some((k) => covers(k, p))));
  t.same(uncovered, [], 'no live key without a row (add a row that observes it, or reclassify it restart-required in activation.ts)');
  const stale = ROWS.flatMap((r) => r.keys).filter((k) => !livePaths.some((p) => covers(k, p)));
  t.same(stale, [], 'no row names a key that is not documented live');
  for (const row of ROWS) {
    const proof = row.proof;
    if ('test' in proof) {
      const file = path.join(root, proof.test);
      t.ok(existsSync(file), `${proof.test} exists`);
      const text = existsSync(file) ? readFileSync(file, 'utf8') : '';
      t.ok(text.includes(`t.test('${proof.name}'`) || text.includes(`t.test("${proof.name}"`), `${proof.test} has the test "${proof.name.slice(0, 60)}…"`);
    } else if ('observed' in proof) {
      t.ok(OBSERVED.has(proof.observed), `observation ${proof.observed} is defined here`);
    } else if ('alias' in proof) {
      const twin = proof.alias;
      t.ok(ROWS.some((r) => !('alias' in r.proof) && r.keys.some((k) => covers(k, twin))), `${row.keys[0]}: its twin ${twin} has a proof`);
    } else if ('reserved' in proof) {
      for (const k of row.keys) t.match(reference.find((r) => r.path === k)?.description, /^reserved: /, `${k} is documented as reserved`);
    } else {
      for (const k of row.keys) {
        const type = reference.find((r) => r.path === k)?.type ?? '';
        t.ok(/^`[^`]+`$/.test(type) || k === 'version', `${k} allows one value (${type})`);
      }
    }
  }
  // `version`: only 1 validates.
  const v2 = await loadConfigText('version: 2\nupstream: { a: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:1" }] } }\n', dir);
  t.notOk(v2.ok, 'version 2 is rejected: there is no other value to activate');
  // `listen.*` is normalized into `listeners[]`: the same field serves both.
  const legacy = await loadConfigText(`listen: { address: 127.0.0.1, port: ${lport}, name: legacy, alt_svc_max_age_s: 7, tls: { cert: ${server.cert}, key: ${server.key} } }\nupstream: { a: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:1" }] } }\n`, dir);
  t.match(legacy.ok ? legacy.value.config.listeners : legacy, [{ name: 'legacy', alt_svc_max_age_s: 7 }], 'listen.* becomes listeners[0].*');
});
