// The operator bundle's SLO series (SPEC "Events"): recorded by bundle/rules/recording.yaml from
// the catalogue's metrics, read by the dashboards and proven in a real Prometheus. Declared once;
// the bundle's tests check the rules record exactly these names.

export const SLO_SERIES = {
  availability: 'svc:slo_availability_ratio:30m',
  serverErrors: 'svc:slo_request_server_error_ratio:rate30m',
  p50: 'svc:slo_request_latency_ms:p50_30m',
  p95: 'svc:slo_request_latency_ms:p95_30m',
  p99: 'svc:slo_request_latency_ms:p99_30m',
  shed: 'svc:slo_overload_shed_ratio:30m',
  timeouts: 'svc:slo_backend_timeout_ratio:30m',
  auth: 'svc:slo_auth_denial_ratio:30m',
  quota: 'svc:slo_quota_denial_ratio:30m',
} as const;

/** The nine names, in the order above. */
export const SLO_SERIES_NAMES: readonly string[] = Object.values(SLO_SERIES);
