// The operator bundle's dashboards (SPEC "Events": operator bundle; "Versioning" 2 and 5): the
// repository paths `/admin/runtime` advertises as `observability.dashboard_packages`. A test
// (test/bundle-dashboards.test.ts) holds this list equal to the files in bundle/dashboards/.

/** Packaged dashboard definitions, as repository asset paths (stable identifiers, not UI URLs). */
export const DASHBOARD_PACKAGES: readonly string[] = [
  'bundle/dashboards/edge-traffic.json',
  'bundle/dashboards/admission-overload.json',
  'bundle/dashboards/backend-health.json',
  'bundle/dashboards/retries-hedges.json',
  'bundle/dashboards/tls-certificates.json',
  'bundle/dashboards/control-plane.json',
];
