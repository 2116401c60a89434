// `performance`: worker model, in-flight and connection limits, timeouts and body/buffer limits.
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Defaulted, Millis, Obj } from './common.ts';

const Count = (def: number, description: string, maximum = 10_000_000) => Type.Integer({ minimum: 1, maximum, default: def, description });

/** Named timeouts, all in milliseconds and all > 0. */
export const Timeouts = Obj(
  {
    connect_ms: Millis(5000, 'backend TCP+TLS connect timeout (502 on expiry); set without it, at most `backend_request_ms`'),
    backend_request_ms: Millis(30_000, 'time from forwarding a request to the backend response headers, connect included (504 on expiry); set without it, at least `connect_ms`'),
    backend_body_idle_ms: Millis(30_000, 'longest pause between backend response body chunks; set without it, at most `backend_body_total_ms`'),
    backend_body_total_ms: Millis(300_000, 'whole backend response body transfer; set without it, at least `backend_body_idle_ms`'),
    client_body_idle_ms: Millis(30_000, 'longest pause between client request body chunks (408 on expiry); set without it, at most `client_body_total_ms`'),
    client_body_total_ms: Millis(600_000, 'whole client request body transfer, from the request head to its last byte (408 on expiry, the backend request is aborted); see also `body.client_body_min_bytes_per_s`; set without it, at least `client_body_idle_ms`'),
    tls_handshake_ms: Millis(10_000, 'TLS handshake of a bootstrap (TCP) connection, from accept to the handshake finished; the connection is closed on expiry', { maximum: 600_000 }),
    client_header_ms: Millis(10_000, 'HTTP/1.1: time from the connection (or the previous response) to the complete request head, 408 and close on expiry (slowloris); HTTP/2: time from the connection to the first stream', { maximum: 600_000 }),
    client_send_idle_ms: Millis(60_000, 'longest time a client may leave a response blocked (not reading it, or a zero HTTP/2 or HTTP/3 flow-control window) before the response is cut and the backend request aborted; also how long an HTTP/2 connection whose output moves no byte may hold its frames before the connection is cut', { maximum: 3_600_000 }),
    client_idle_ms: Millis(60_000, 'idle downstream connection: HTTP/1.1 keep-alive between requests, an HTTP/2 or HTTP/3 connection with no request in progress (GOAWAY, then close; PINGs do not count as activity)', { minimum: 100, maximum: 3_600_000 }),
    shutdown_drain_ms: Millis(30_000, 'time in-flight work gets on shutdown before it is closed'),
    backend_dns_refresh_ms: Millis(30_000, 'interval of backend DNS re-resolution'),
    quic_idle_ms: Millis(30_000, 'QUIC connection idle timeout advertised to clients', { minimum: 1000, maximum: 600_000 }),
  },
  { description: 'timeouts' },
);

/** Request and response body limits. */
export const BodyLimits = Obj(
  {
    max_request_body_bytes: Type.Integer({
      minimum: 0,
      maximum: 1_099_511_627_776,
      default: 1_073_741_824,
      description: 'largest request body accepted (413 above); 0 means unlimited',
      'x-unit': 'bytes',
    }),
    request_buffer_bytes: Type.Integer({
      minimum: 0,
      maximum: 67_108_864,
      default: 65_536,
      description: 'request body kept in memory so that a retry or hedge can replay it; larger bodies stream and are not retried; set without it, at most a non-zero `max_request_body_bytes`',
      'x-unit': 'bytes',
    }),
    response_prebuffer_bytes: Type.Integer({
      minimum: 0,
      maximum: 67_108_864,
      default: 65_536,
      description: 'response body held before the response is committed downstream, so a failure inside it can still be retried',
      'x-unit': 'bytes',
    }),
    client_body_min_bytes_per_s: Type.Integer({
      minimum: 0,
      maximum: 1_073_741_824,
      default: 1024,
      description:
        'slowest average request body rate accepted: after the first `timeouts.client_body_idle_ms`, each byte received extends the body deadline by 1/rate s (Apache mod_reqtimeout MinRate); slower bodies get 408. 0 disables (then only `client_body_total_ms` bounds a body)',
      'x-unit': 'bytes/s',
    }),
  },
  { description: 'body and buffer limits' },
);

/** Returning the heap's peak to the kernel once a worker has gone quiet (docs/performance.md, "Worker memory"). */
export const MemoryTrim = Obj(
  {
    enabled: Type.Boolean({
      default: false,
      description:
        "after a busy period, once the worker has been quiet for `idle_ms` and its resident memory has grown by `min_growth_bytes` or more since the last trim (or since its first second), run one memory-reducing garbage collection, which gives back to the kernel the heap pages V8 keeps after a load peak (a worker's RSS falls from about 300 to about 150 MiB after a load test). Off by default: the collection stops the worker's event loop for 50-200 ms, and the load that follows a trim runs 10-30 % slower for its first seconds while V8 rebuilds its heap (docs/performance.md \"Memory trim after load\")",
    }),
    idle_ms: Millis(10_000, 'how long the worker must stay quiet before it trims', { minimum: 1000, maximum: 3_600_000 }),
    quiet_rps: Type.Integer({
      minimum: 0,
      maximum: 1_000_000,
      default: 10,
      description: 'a second with at most this many new requests (and upgrades) counts as quiet; 0: only a second with none',
      'x-unit': 'requests/s',
    }),
    min_growth_bytes: Type.Integer({
      minimum: 0,
      maximum: 1_099_511_627_776,
      default: 33_554_432,
      description: 'RSS growth since the last trim below which a trim is not worth its pause; 0: every quiet period trims once',
      'x-unit': 'bytes',
    }),
  },
  { description: 'memory trim after load' },
);

/** The `performance` section. */
export const Performance = Obj(
  {
    worker_threads: Type.Optional(Type.Integer({ minimum: 1, maximum: 256, description: 'number of worker processes; default the CPU count', 'x-example': 2 })),
    reuseport: Type.Boolean({
      default: true,
      description:
        'bind every worker socket with SO_REUSEPORT so the kernel spreads connections (a QUIC connection stays on one worker by its 4-tuple). `false`: one socket per listener and protocol, which no other process can bind beside it; needs `worker_threads: 1` (EDGE_CONFIG_REUSEPORT)',
    }),
    pin_workers: Type.Boolean({
      default: false,
      description:
        "pin every thread of worker i to the i-th CPU (modulo their number) of the supervisor's CPU set, with util-linux `taskset` (Linux only; without `taskset` the start fails: EDGE_STARTUP_PIN_WORKERS). A re-forked worker is pinned again",
    }),
    global_inflight_limit: Count(4096, 'proxied requests in flight on the node, all workers together (leased to the workers by the supervisor, docs/overload.md "One node, one set of limits"); set without it, at least `per_upstream_inflight_limit`'),
    per_upstream_inflight_limit: Count(2048, 'proxied requests in flight per upstream pool on the node, all workers together (leased); set without it, at most `global_inflight_limit` and at least `per_backend_inflight_limit`'),
    per_backend_inflight_limit: Count(512, 'proxied requests in flight per backend on the node, all workers together (leased while below `per_upstream_inflight_limit` and `global_inflight_limit`, docs/overload.md "One node, one set of limits"); set without it, at most `per_upstream_inflight_limit`'),
    max_connections: Count(16_384, 'downstream connections open on the node, all workers and listeners together (leased from the supervisor, docs/overload.md "Connection caps"); new ones beyond are refused (`svc_connection_cap_rejects`)'),
    max_connections_per_source: Count(
      256,
      'downstream connections open on the node from one source, all workers together: an IPv4 address, or an IPv6 /64 (one subscriber); new ones beyond are refused at accept (`svc_connection_cap_rejects`)',
    ),
    new_connections_per_sec: Count(2000, 'sustained new downstream connections per second on the node (one token bucket for all workers)'),
    new_connections_burst: Count(4000, 'burst size of the node\'s new-connection bucket'),
    worker_heartbeat_ms: Millis(1000, 'interval at which each worker reports to the supervisor (heartbeat); live', { minimum: 100, maximum: 60_000 }),
    worker_unresponsive_heartbeats: Type.Integer({
      minimum: 2,
      maximum: 1000,
      default: 5,
      description:
        'heartbeat intervals a worker may stay silent (frozen, stopped, its event loop blocked) before the supervisor kills it (SIGKILL) and re-forks it on the active generation; live. Checked whether or not the watchdog is enabled',
    }),
    control_plane_threads: Type.Integer({
      minimum: 1,
      maximum: 64,
      default: 4,
      description:
        "the supervisor's libuv thread pool size (file reads, DNS, crypto of the control plane). libuv reads UV_THREADPOOL_SIZE once, when the pool starts: `serve` re-executes itself once at start (same pid) with it set when the environment's value (libuv's default: 4) differs; workers and `restart_command` keep the environment's value",
    }),
    timeouts: Defaulted(Timeouts),
    body: Defaulted(BodyLimits),
    memory_trim: Defaulted(MemoryTrim),
  },
  { description: 'performance' },
);

export type PerformanceConfig = Static<typeof Performance>;
export type TimeoutsConfig = Static<typeof Timeouts>;
