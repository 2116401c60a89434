// The catalogue against SPEC "Metrics endpoint": every metric the specification names exists with
// exactly its labels and type, and the catalogue names nothing the specification does not, except
// the declared extensions (each with its reason).
import t from 'tap';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DECLARED_EXTENSIONS, METRIC_CATALOGUE, Metrics } from '../src/index.ts';

const specPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../shared/spec/SPEC.md');

interface SpecMetric {
  name: string;
  labels: string[];
  type?: 'counter' | 'gauge' | 'histogram';
}

/** Reads the metrics table of the specification, resolving its shorthand (`_sum`, `_p95`, shared labels). */
function specMetrics(): SpecMetric[] {
  const text = readFileSync(specPath, 'utf8');
  const start = text.indexOf('| Family | Metrics (type; labels) |');
  const rows = text.slice(start).split('\n').slice(2).filter((l) => l.startsWith('| ') && !l.startsWith('| Status'));
  const out = new Map<string, SpecMetric>();
  for (const row of rows.slice(0, rows.findIndex((r, i) => i > 0 && !r.includes('svc_')) === -1 ? rows.length : rows.findIndex((r, i) => i > 0 && !r.includes('svc_')))) {
    const cells = row.split(' | ');
    const body = cells.slice(1).join(' | ');
    let sharedLabels: string[] = [];
    let last = '';
    let gaugeMode = false;
    const token = /(gauges? |and with label `([a-z_]+)`: )|`((?:svc)?_[a-z0-9_]+)(\{([^}]*)\})?`( \((gauge|histogram)[^)]*\))?/g;
    for (const m of body.matchAll(token)) {
      if (m[1] !== undefined) {
        if (m[2] !== undefined) sharedLabels = [m[2]];
        else gaugeMode = true;
        continue;
      }
      let name = m[3] as string;
      let labels = m[5] === undefined ? [...sharedLabels] : (m[5] as string).split(',');
      if (name.startsWith('_')) {
        // `_sum`, `_count` of a histogram, or `_p95` after `..._p50`
        name = last.replace(/_(bucket|p50)$/, '') + name;
        if (m[5] === undefined) labels = out.get(last)?.labels ?? labels;
      }
      // "gauges a, b" names gauges until a `_total` name, which is always a counter.
      if (name.endsWith('_total')) gaugeMode = false;
      let type: SpecMetric['type'] =
        (m[7] as SpecMetric['type']) ?? (gaugeMode ? 'gauge' : name.endsWith('_total') || /all counters|\(counters\)/.test(body) ? 'counter' : undefined);
      if (name.endsWith('_bucket')) {
        name = name.replace(/_bucket$/, '');
        labels = labels.filter((l) => l !== 'le');
        type = 'histogram';
      }
      if (/_(sum|count)$/.test(name) && out.has(name.replace(/_(sum|count)$/, ''))) continue;
      out.set(name, { name, labels, ...(type === undefined ? {} : { type }) });
      if ((m[3] as string).startsWith('svc_')) last = m[3] as string;
    }
  }
  return [...out.values()];
}

t.test('every metric of the specification is in the catalogue with its labels and type', async (t) => {
  const spec = specMetrics();
  t.ok(spec.length >= 95, `read ${spec.length} metrics from the specification`);
  for (const s of spec) {
    const def = METRIC_CATALOGUE.find((d) => d.name === s.name);
    t.ok(def, `${s.name} in catalogue`);
    if (def === undefined) continue;
    if (s.name === 'svc_upstream_tls_failure_total') {
      // SPEC: {backend,phase,reason}, "also labelled upstream in the rotation context".
      t.same([...def.labels].sort(), [...s.labels, 'upstream'].sort(), `${s.name} labels`);
    } else {
      t.same([...def.labels].sort(), [...s.labels].sort(), `${s.name} labels`);
    }
    if (s.type !== undefined) t.equal(def.type, s.type, `${s.name} type`);
  }
  const specNames = new Set(spec.map((s) => s.name));
  t.same(outsideSpec(METRIC_CATALOGUE, specNames), [], 'no metric outside the specification but the declared extensions');
});

/** Catalogue names neither in the specification nor declared as an extension. */
function outsideSpec(catalogue: readonly { name: string }[], specNames: ReadonlySet<string>): string[] {
  const declared = new Set(DECLARED_EXTENSIONS.map((d) => d.name));
  return catalogue.filter((d) => !specNames.has(d.name) && !declared.has(d.name)).map((d) => d.name);
}

t.test('declared extensions: exactly the overload gauges, the tracing counters, the worker process gauges, the rate limiter gauge and counter, the quota key counters, the external authorization overflow and fail-open counters and the HTTP/2 send-stall counter, each with its reason, none a SPEC name, all in the catalogue', async (t) => {
  const specNames = new Set(specMetrics().map((s) => s.name));
  t.same(DECLARED_EXTENSIONS.map((d) => [d.name, d.type, [...d.labels], d.aggregate]), [
    ['svc_state_records_dropped_total', 'counter', ['record'], 'sum'],
    ['svc_circuit_breaker_state', 'gauge', ['upstream', 'backend'], 'first'],
    ['svc_circuit_breaker_ejections_capped_total', 'counter', ['upstream'], 'sum'],
    ['svc_route_queue_depth', 'gauge', ['route'], 'sum'],
    ['svc_adaptive_admission_limit', 'gauge', [], 'first'],
    ['svc_inflight_requests', 'gauge', [], 'sum'],
    ['svc_tracing_spans_exported_total', 'counter', [], 'sum'],
    ['svc_tracing_spans_dropped_total', 'counter', ['reason'], 'sum'],
    ['svc_tracing_export_failures_total', 'counter', [], 'sum'],
    ['svc_worker_resident_memory_bytes', 'gauge', ['worker'], 'sum'],
    ['svc_worker_anonymous_memory_bytes', 'gauge', ['worker'], 'sum'],
    ['svc_worker_event_loop_delay_p99_seconds', 'gauge', ['worker'], 'sum'],
    ['svc_worker_memory_trims_total', 'counter', [], 'sum'],
    ['svc_rate_limit_buckets', 'gauge', [], 'sum'],
    ['svc_rate_limit_evictions_total', 'counter', [], 'sum'],
    ['svc_quota_keys_created_total', 'counter', ['policy', 'selector_dimensions'], 'sum'],
    ['svc_quota_keys_refused_total', 'counter', ['policy', 'selector_dimensions', 'reason'], 'sum'],
    ['svc_external_auth_overflow', 'counter', [], 'sum'],
    ['svc_external_auth_fail_open_refused', 'counter', [], 'sum'],
    ['svc_downstream_send_stalls_total', 'counter', [], 'sum'],
    ['svc_downstream_h2_refused_block_closes_total', 'counter', [], 'sum'],
  ]);
  for (const d of DECLARED_EXTENSIONS) {
    t.ok(d.reason.length > 20, `${d.name} says why it exists`);
    t.notOk(specNames.has(d.name), `${d.name} is not a SPEC metric (a SPEC metric needs no declaration)`);
    t.equal(METRIC_CATALOGUE.filter((m) => m.name === d.name).length, 1, `${d.name} is in the catalogue once`);
  }
  // The check still fails on anything else: an undeclared name outside the specification is reported.
  t.same(outsideSpec([...METRIC_CATALOGUE, { name: 'svc_made_up_gauge' }], specNames), ['svc_made_up_gauge']);
});

t.test('names are unique, prefixed svc_, and labels never carry endpoint URLs', async (t) => {
  const names = METRIC_CATALOGUE.map((d) => d.name);
  t.equal(new Set(names).size, names.length);
  for (const d of METRIC_CATALOGUE) {
    t.match(d.name, /^svc_[a-z0-9_]+$/);
    t.notOk(d.labels.some((l) => /url|endpoint|token|secret/.test(l)), `${d.name} has no URL/secret label`);
  }
});

t.test('registries hold exactly their scope and render the exposition format', async (t) => {
  const worker = new Metrics('worker');
  const supervisor = new Metrics('supervisor');
  worker.counter('svc_requests_total').inc();
  worker.histogram('svc_upstream_request_latency_ms').observe({ upstream: 'api', outcome: 'success' }, 3.2);
  supervisor.gauge('svc_runtime_active_generation').set(7);
  const text = await worker.registry.metrics();
  t.match(text, /^svc_requests_total 1$/m);
  t.match(text, /^svc_upstream_request_latency_ms_bucket\{le="5",upstream="api",outcome="success"\} 1$/m);
  t.notMatch(text, /svc_runtime_active_generation/);
  t.match(await supervisor.registry.metrics(), /^svc_runtime_active_generation 7$/m);
  t.throws(() => worker.counter('svc_nope'), /not a counter/);
  t.throws(() => worker.counter('svc_active_connections'), /not a counter/);
});
