// Every metric of the service, declared once: name, type, labels, help, who emits it and how the
// supervisor merges per-worker values. SPEC "Metrics endpoint" is checked against this by a test.

/** Metric type in the exposition format. */
export type MetricType = 'counter' | 'gauge' | 'histogram';

/** How the supervisor merges one metric across worker registries (prom-client aggregators). */
export type Aggregation = 'sum' | 'max' | 'min' | 'first' | 'omit';

/** Where a metric is recorded: in workers (merged by the supervisor) or in the supervisor itself. */
export type MetricScope = 'worker' | 'supervisor';

/** One metric definition. */
export interface MetricDef {
  readonly name: string;
  readonly type: MetricType;
  readonly help: string;
  readonly labels: readonly string[];
  readonly family: string;
  readonly scope: MetricScope;
  readonly aggregate: Aggregation;
  /** Histogram bucket upper bounds (milliseconds for latency). */
  readonly buckets?: readonly number[];
}

/** Latency buckets in milliseconds: sub-millisecond proxying up to the longest default timeout. */
export const LATENCY_BUCKETS_MS: readonly number[] = [0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000];

/** `status_class` label values (SPEC). */
export const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx', 'other', 'unknown'] as const;
/** `outcome` label values (SPEC). */
export const OUTCOMES = ['success', 'failure', 'timeout', 'backend_error', 'overload_shed', 'rate_limited'] as const;

type Def = Omit<MetricDef, 'family' | 'scope' | 'aggregate'> & { scope?: MetricScope; aggregate?: Aggregation };

function family(name: string, scope: MetricScope, defs: Def[]): MetricDef[] {
  return defs.map((d) => ({ ...d, family: name, scope: d.scope ?? scope, aggregate: d.aggregate ?? (d.type === 'gauge' && scope === 'supervisor' ? 'first' : 'sum') }));
}
const c = (name: string, help: string, labels: string[] = []): Def => ({ name, type: 'counter', help, labels });
const g = (name: string, help: string, labels: string[] = [], aggregate: Aggregation = 'sum'): Def => ({ name, type: 'gauge', help, labels, aggregate });

/** Why each declared extension exists (the catalogue test requires one for each). */
const EXTENSION_REASONS: Readonly<Record<string, string>> = {
  svc_circuit_breaker_state: "SPEC counts requests rejected by an open breaker but shows no breaker state; the supervisor holds the node's one state per backend and serves it",
  svc_circuit_breaker_ejections_capped_total: 'max_ejection_percent holds a failing backend closed so that a pool keeps serving; each breaker opening refused for it must show, per pool, or an operator cannot tell a bound that protects from a backend that is down',
  svc_route_queue_depth: 'SPEC counts admissions after a wait and sheds, not the waiting requests themselves; a growing queue precedes queue_full and queue_timeout sheds',
  svc_adaptive_admission_limit: 'the adaptive limit moves with latency; without it `svc_overload_shed` cannot be read against the limit that caused it (the node\'s one limit, served by the supervisor)',
  svc_inflight_requests: 'brownout and admission decide on in-flight ÷ limit; this is the numerator (sum over workers), `svc_adaptive_admission_limit` (the node\'s) the denominator',
  svc_tracing_spans_exported_total: 'SPEC lists tracing but no metric of it; without this an operator cannot tell spans reaching the collector from none',
  svc_tracing_spans_dropped_total: 'span export is bounded (a full queue or a failed export drops spans); the drops must show, by reason, or traces go missing silently',
  svc_tracing_export_failures_total: 'export requests the collector refused or never answered; the warning is logged once a minute, the count is exact',
  svc_worker_resident_memory_bytes: 'SPEC has no process metric; a soak (issue 19) must show each worker\'s RSS flat over time, and an operator must see a worker that leaks before the kernel kills it',
  svc_worker_anonymous_memory_bytes: 'RSS counts the node binary\'s pages, which every worker and the supervisor share (55-60 MiB of each worker\'s RSS); an operator sizing a node with many workers needs what each worker holds alone, and a leak shows there without the shared pages\' noise',
  svc_worker_memory_trims_total: 'performance.memory_trim pauses a quiet worker for one memory-reducing collection; an operator must be able to count those pauses against the RSS gauge they lower',
  svc_rate_limit_buckets: 'a flood of distinct keys fills the rate limiter up to its cap; without the count an operator cannot see how close a worker is to evicting keys',
  svc_quota_keys_created_total: 'each new selector value creates keys in the Redis the fleet shares, living for the window; the rate of creation is what sizes that Redis (docs/quota.md "Redis sizing") and what a client rotating a header value drives up',
  svc_quota_keys_refused_total: 'a request refused a new key is decided by the failure mode, not by the shared count; an operator must see a source or a policy at its key budget, or a flood of new selectors (or a cap set too low for real tenants) goes unseen',
  svc_rate_limit_evictions_total: 'an evicted key starts again from a full bucket, so evictions weaken every per-key limit; they must show, or a key flood that defeats the limits goes unseen',
  svc_downstream_send_stalls_total: 'an HTTP/2 connection whose output never drains holds its streams and memory for ever unless it is cut (nodejs/node#55804); each cut must show, or a client that provokes them unseen grows the worker',
  svc_downstream_h2_refused_block_closes_total: 'header blocks refused below JavaScript (an HPACK bomb) are reset stream by stream by node and cost the worker CPU with no request to count; each connection closed for sending too many must show, or the attack and a bound set too low are both invisible',
  svc_state_records_dropped_total: 'a state file with one bad record keeps the rest of the history (issue 38): the records it lost must show beside the warning line, by kind, or a damaged state file goes unseen',
  svc_external_auth_overflow: 'a client can fill the calls a worker keeps waiting for the authorization service (issue 38); the requests decided by failure_mode without asking must show, or `allow` lets them past unseen',
  svc_external_auth_fail_open_refused: 'fail_open_per_second bounds what failures of the authorization service let through under `allow`; the requests it refused must show, or a bound set too low for a real outage goes unseen',
  svc_worker_event_loop_delay_p99_seconds: 'the watchdog acts on the worst loop stall only; a p99 per worker shows a loop slowing under load or after activations before it stalls',
};

/**
 * Metrics the specification does not list, each declared with the reason it exists (the catalogue
 * test allows exactly these beyond the SPEC's list). Overload protection (issue 13): SPEC names
 * the shed and reject counters and `svc_brownout_active`, but nothing that shows how close a
 * worker is to shedding, which breaker is open, or how deep a queue is; the snapshot answers
 * that for one moment, these gauges for a dashboard over time. Tracing (issue 17): SPEC names no
 * metric of span export; its drops and failures must not be silent. Worker process (issue 19):
 * SPEC names no process metric; RSS, the anonymous memory each worker holds alone and event-loop
 * delay per worker show a leak or a slowing loop.
 * Rate limits (issue 15): SPEC counts the 429s only; the buckets kept and evicted show a key flood.
 * Stuck HTTP/2 output (issue 19): each connection cut for it must show.
 * State directory (issue 38): records of a damaged state file left out at start must show.
 * Quota keys (issue 38): the selector keys each worker creates in the shared Redis, and those its budgets refused.
 * External authorization (issue 38): requests decided without a call, and fail-open decisions refused.
 */
export const DECLARED_EXTENSIONS: readonly (MetricDef & { readonly reason: string })[] = [
  ...family('State directory', 'supervisor', [c('svc_state_records_dropped_total', 'Records of generations.json left out at start (malformed or contradicting the others), by record: slot, entry or counter', ['record'])]),
  ...family('Overload', 'worker', [
    { ...g('svc_circuit_breaker_state', "Circuit breaker state per backend, the node's (one state for every worker): 0 closed, 1 half-open, 2 open", ['upstream', 'backend'], 'first'), scope: 'supervisor' },
    { ...c('svc_circuit_breaker_ejections_capped_total', 'Breaker openings refused because max_ejection_percent of the pool was already ejected node-wide (the backend was held closed)', ['upstream']), scope: 'supervisor' },
    g('svc_route_queue_depth', 'Requests waiting in a route queue', ['route']),
    { ...g('svc_adaptive_admission_limit', "Global in-flight limit in force, the node's (the adaptive limit when adaptive admission is on)", [], 'first'), scope: 'supervisor' },
    g('svc_inflight_requests', 'Proxied requests holding a global in-flight slot'),
  ]),
  ...family('Tracing', 'worker', [
    c('svc_tracing_spans_exported_total', 'Spans the OTLP collector accepted'),
    c('svc_tracing_spans_dropped_total', 'Sampled spans not exported, by reason (queue_full, export_failed, error)', ['reason']),
    c('svc_tracing_export_failures_total', 'Span export requests that failed (after the exporter\'s retries)'),
  ]),
  ...family('Worker process', 'worker', [
    g('svc_worker_resident_memory_bytes', 'Resident set size of the worker process, bytes, at its last heartbeat', ['worker']),
    g('svc_worker_anonymous_memory_bytes', 'Anonymous resident memory of the worker process (RssAnon: its heaps, not the mapped binary every worker shares), bytes, at its last heartbeat', ['worker']),
    g('svc_worker_event_loop_delay_p99_seconds', 'p99 of the worker\'s event-loop delay over its last heartbeat window, seconds', ['worker']),
    c('svc_worker_memory_trims_total', 'Memory-reducing collections run by performance.memory_trim after the worker went quiet'),
  ]),
  ...family('Rate limits', 'worker', [
    g('svc_rate_limit_buckets', 'Token buckets the worker keeps for scoped rate limits (at most 100,000 per worker)'),
    c('svc_rate_limit_evictions_total', 'Token buckets dropped, least recently used first, to keep a worker under its bucket cap'),
  ]),
  ...family('Quota', 'worker', [
    c('svc_quota_keys_created_total', 'New selector keys a worker sent to the quota store (a selector not yet sent in the window of a contract): an upper bound of the keys created in Redis', ['policy', 'selector_dimensions']),
    c('svc_quota_keys_refused_total', 'Requests whose new selector key was over a budget (reason source_budget or policy_cap) and were decided by the failure mode, not Redis', ['policy', 'selector_dimensions', 'reason']),
  ]),
  ...family('External authorization', 'worker', [
    c('svc_external_auth_overflow', 'Requests decided by failure_mode without a call because max_pending calls were waiting for the authorization service'),
    c('svc_external_auth_fail_open_refused', 'Failures under failure_mode allow answered 503 because fail_open_per_second was spent'),
  ]),
  ...family('Connection/ingress', 'worker', [
    c('svc_downstream_send_stalls_total', 'HTTP/2 connections cut because their output moved no byte for client_send_idle_ms while frames waited'),
    c('svc_downstream_h2_refused_block_closes_total', 'HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM for sending more than 100 refused header blocks in 10 s (an HPACK bomb, oversized header lists)'),
  ]),
].map((d) => ({ ...d, reason: EXTENSION_REASONS[d.name] ?? '' }));

/** The catalogue, grouped by SPEC family, then the declared extensions. */
export const METRIC_CATALOGUE: readonly MetricDef[] = [
  ...family('Core requests', 'worker', [
    c('svc_requests_total', 'Downstream requests received'),
    c('svc_requests_success', 'Downstream requests answered without a failure outcome'),
    c('svc_requests_failure', 'Downstream requests that ended in a failure outcome'),
    c('svc_request_validation_rejects', 'Requests rejected by protocol validation'),
    c('svc_policy_denied', 'Requests denied by protocol policy (methods, denied paths, CONNECT rules)'),
    c('svc_external_auth_allowed', 'Requests allowed by external authorization'),
    c('svc_external_auth_denied', 'Requests denied by external authorization'),
    c('svc_external_auth_timeout', 'External authorization calls that timed out'),
    c('svc_external_auth_error', 'External authorization calls that failed'),
    c('svc_request_rate_limited', 'Requests rejected by a scoped rate limit'),
  ]),
  ...family('Request breakdown', 'worker', [
    c('svc_upstream_requests_total', 'Requests per upstream pool by status class and outcome', ['upstream', 'status_class', 'outcome']),
    c('svc_backend_requests_total', 'Requests per backend by status class and outcome', ['upstream', 'backend', 'status_class', 'outcome']),
  ]),
  ...family('Latency', 'worker', [
    { name: 'svc_upstream_request_latency_ms', type: 'histogram', help: 'Upstream request latency in milliseconds', labels: ['upstream', 'outcome'], buckets: LATENCY_BUCKETS_MS },
    g('svc_route_latency_ms_p50', 'Median route latency over the recent window, milliseconds', ['route'], 'max'),
    g('svc_route_latency_ms_p95', '95th percentile route latency over the recent window, milliseconds', ['route'], 'max'),
    g('svc_route_latency_ms_p99', '99th percentile route latency over the recent window, milliseconds', ['route'], 'max'),
  ]),
  ...family('Early data', 'worker', [c('svc_early_data_accepted', 'Requests accepted in 0-RTT early data'), c('svc_early_data_rejected', 'Requests refused in 0-RTT early data (replay-unsafe)')]),
  ...family('Health/backend', 'worker', [
    c('svc_health_checks_total', 'Active health probes sent'),
    c('svc_health_checks_success', 'Active health probes that passed'),
    c('svc_health_checks_failure', 'Active health probes that failed'),
    c('svc_backend_timeouts', 'Backend requests that timed out'),
    c('svc_backend_errors', 'Backend requests that failed at the transport'),
    c('svc_health_failures_total', 'Passive health failures by reason (5xx, timeout, transport, tls)', ['reason']),
  ]),
  ...family('Overload', 'worker', [
    c('svc_overload_shed', 'Requests shed by overload protection'),
    c('svc_overload_shed_by_reason_total', 'Requests shed by overload protection, by reason', ['reason']),
    c('svc_inflight_wait_admit_total', 'Requests admitted after waiting in a queue, by limit scope', ['scope']),
    { ...g('svc_brownout_active', "1 while the node's brownout sheds non-core routes", [], 'first'), scope: 'supervisor' },
    c('svc_circuit_breaker_rejected_total', 'Requests rejected because the backend breaker was open'),
  ]),
  ...family('Quota', 'worker', [
    c('svc_quota_policy_outcomes_total', 'Quota decisions', ['policy', 'decision', 'reason', 'selector_dimensions', 'backend_mode']),
    c('svc_quota_backend_health_total', 'Quota store health events', ['backend_mode', 'reason']),
  ]),
  ...family('Connection/ingress', 'worker', [
    g('svc_active_connections', 'Open downstream connections'),
    c('svc_connection_cap_rejects', 'Downstream connections refused by the connection cap'),
    c('svc_ingress_packets_total', 'QUIC datagrams received'),
    c('svc_ingress_queue_drops', 'Datagrams dropped because the ingress queue was full'),
    c('svc_ingress_queue_drop_bytes', 'Bytes of datagrams dropped because the ingress queue was full'),
    g('svc_ingress_queue_bytes', 'Bytes waiting in the ingress queue'),
    c('svc_ingress_bad_header_total', 'Datagrams with an unparsable QUIC header'),
    c('svc_ingress_rate_limited_total', 'New connections refused by the new-connection rate limit'),
    c('svc_ingress_unroutable_total', 'Datagrams for no known connection that could not start one'),
    c('svc_ingress_draining_drops_total', 'New connections refused while draining'),
    c('svc_ingress_connection_create_failed_total', 'QUIC connections that failed to be created'),
    c('svc_ingress_version_neg_failed_total', 'Version negotiations that failed'),
    c('svc_scid_rotations', 'Source connection id rotations'),
  ]),
  ...family('Buffers', 'worker', [
    g('svc_request_buffered_bytes', 'Request body bytes held in memory for replay'),
    g('svc_request_buffered_high_watermark_bytes', 'Highest request body bytes held at once', [], 'max'),
    c('svc_request_buffer_limit_rejects', 'Requests rejected for exceeding the request body limit'),
    c('svc_response_prebuffer_limit_rejects', 'Responses that exceeded the prebuffer limit'),
  ]),
  ...family('Retry/hedge', 'worker', [
    c('svc_retries_total', 'Retries sent'),
    c('svc_retry_denied_total', 'Retries not sent, by reason', ['reason']),
    c('svc_retry_attempts_total', 'Retry attempts, by reason', ['reason']),
    c('svc_hedge_triggered_total', 'Hedged requests sent'),
    c('svc_hedge_won_total', 'Hedged requests whose hedge answered first'),
    c('svc_hedge_wasted_total', 'Hedged requests whose hedge lost'),
    c('svc_hedge_primary_won_after_trigger_total', 'Primaries that answered first after the hedge was sent'),
    c('svc_hedge_primary_late_ms_total', 'Milliseconds primaries were late, summed'),
    c('svc_hedge_primary_late_samples_total', 'Samples in svc_hedge_primary_late_ms_total'),
  ]),
  ...family('TLS', 'worker', [
    c('svc_downstream_tls_handshake_success_total', 'Downstream TLS handshakes completed'),
    c('svc_downstream_tls_handshake_failure_total', 'Downstream TLS handshakes failed, by reason', ['listener', 'reason']),
    c('svc_downstream_tls_certificate_selection_total', 'Certificate selections (sni, default, first)', ['listener', 'selection']),
    c('svc_downstream_tls_alpn_total', 'Negotiated ALPN protocols', ['listener', 'protocol']),
    g('svc_downstream_tls_certificate_not_after_seconds', 'Certificate notAfter, unix seconds', ['listener', 'server_name'], 'min'),
    g('svc_downstream_tls_certificate_days_remaining', 'Days until the certificate expires', ['listener', 'server_name'], 'min'),
    // SPEC: labelled {backend,phase,reason}, "also labelled upstream in the rotation context": one label set carries all four.
    c('svc_upstream_tls_failure_total', 'Upstream TLS failures', ['upstream', 'backend', 'phase', 'reason']),
    g('svc_upstream_client_certificate_not_after_seconds', 'Upstream client certificate notAfter, unix seconds', ['upstream'], 'min'),
    g('svc_upstream_client_certificate_days_remaining', 'Days until the upstream client certificate expires', ['upstream'], 'min'),
  ]),
  ...family('DNS', 'worker', [
    c('svc_backend_dns_refresh_success_total', 'Backend DNS refreshes that succeeded'),
    c('svc_backend_dns_refresh_failure_total', 'Backend DNS refreshes that failed'),
    c('svc_backend_dns_address_set_changes_total', 'Refreshes that changed a backend address set'),
    c('svc_backend_client_rotations_total', 'Backend connection pools replaced after an address change'),
    g('svc_backend_dns_last_refresh_success_seconds', 'Unix time of the last successful backend DNS refresh', [], 'max'),
  ]),
  ...family('JWT/JWKS', 'worker', [
    c('svc_jwt_validation_failures_total', 'JWT validation failures by reason', ['reason']),
    c('svc_jwt_algorithm_rejections_total', 'JWTs rejected for their algorithm', ['algorithm']),
    c('svc_jwks_unknown_kid_total', 'JWTs naming a key id not in the key set', ['jwks_source_id']),
  ]),
  // The supervisor fetches every JWKS once per node and hands the keys to the workers.
  ...family('JWT/JWKS', 'supervisor', [
    c('svc_jwks_refresh_success_total', 'JWKS refreshes that succeeded', ['jwks_source_id']),
    c('svc_jwks_refresh_failure_total', 'JWKS refreshes that failed', ['jwks_source_id']),
    g('svc_jwks_age_seconds', 'Age of the key set in use', ['jwks_source_id']),
    g('svc_jwks_active_keys', 'Keys in the key set in use', ['jwks_source_id']),
    g('svc_jwks_last_refresh_attempt_seconds', 'Unix time of the last refresh attempt', ['jwks_source_id']),
    g('svc_jwks_last_refresh_success_seconds', 'Unix time of the last successful refresh', ['jwks_source_id']),
    g('svc_jwks_state', '1 on the current cache state of the key set', ['jwks_source_id', 'state']),
  ]),
  ...family('Control plane', 'supervisor', [
    c('svc_runtime_validation_attempts_total', 'validate calls'),
    c('svc_runtime_preview_attempts_total', 'preview calls'),
    c('svc_runtime_activation_total', 'Activations by result and reason', ['result', 'reason']),
    c('svc_runtime_rollback_total', 'Rollbacks by result and reason', ['result', 'reason']),
    c('svc_runtime_rejections_total', 'Rejected candidates by reason', ['reason']),
    g('svc_runtime_active_generation', 'Active runtime generation'),
    g('svc_runtime_history_depth', 'Retained generations'),
    g('svc_control_api_connection_limit_drops', 'Control API connections dropped at the connection limit'),
    g('svc_watchdog_restart_requests', 'Restarts requested by the watchdog or the API'),
    g('svc_watchdog_restart_hooks', 'Restart commands run'),
    g('svc_watchdog_degraded_windows', 'Unhealthy watchdog windows observed'),
    g('svc_runtime_panics', 'Unexpected errors caught in the runtime (worker crashes included)'),
  ]),
  ...family('Secrets', 'supervisor', [
    c('svc_secret_reload_total', 'Secret material reloads', ['scope', 'result', 'reason']),
    c('svc_secret_resolve_total', 'Secret reference resolutions', ['provider', 'result', 'reason']),
    g('svc_secret_last_success_unixtime', 'Unix time of the last successful secret reload', ['scope']),
    c('svc_control_plane_cert_reload_total', 'Certificate reloads (reload-certs)', ['result', 'reason']),
  ]),
  ...DECLARED_EXTENSIONS,
];

/** Looks a metric up by name; throws for a name outside the catalogue (a programming error). */
export function metricDef(name: string): MetricDef {
  const def = METRIC_CATALOGUE.find((m) => m.name === name);
  if (def === undefined) throw new Error(`metric ${name} is not in the catalogue`);
  return def;
}
