// Generated documentation must match the code: docs/configuration.md (schema) and docs/errors.md
// (error registries). Run `npm run docs` after changing either.
import t from 'tap';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderErrorsDoc, renderReferenceDoc } from '../scripts/lib/docs.ts';
import { CONFIG_ERROR_CODES } from '@edge-proxy/config';
import { H3_ERROR_CODES } from '@edge-proxy/http3';
import { SERVICE_ERROR_CODES } from '@edge-proxy/controlplane';
import { requestErrorDocs } from '@edge-proxy/dataplane';
import { IPC_ERROR_CODES } from '@edge-proxy/ipc';

const docs = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../docs');

t.test('docs/configuration.md is generated from the current schema', async (t) => {
  t.equal(readFileSync(path.join(docs, 'configuration.md'), 'utf8'), renderReferenceDoc(), 'stale: run `npm run docs`');
});

t.test('docs/errors.md documents every error code', async (t) => {
  const text = readFileSync(path.join(docs, 'errors.md'), 'utf8');
  t.equal(text, renderErrorsDoc(), 'stale: run `npm run docs`');
  for (const code of [...Object.keys(CONFIG_ERROR_CODES), ...Object.keys(H3_ERROR_CODES), ...Object.keys(SERVICE_ERROR_CODES)]) t.ok(text.includes(`\`${code}\``), `${code} documented`);
});

/** `EDGE_*` names in the sources that are environment variables, not error codes. */
const ENVIRONMENT_NAMES = new Set(['EDGE_PROXY_CA', 'EDGE_PROXY_CERT', 'EDGE_PROXY_KEY', 'EDGE_PROXY_TOKEN_FILE', 'EDGE_PROXY_URL', 'EDGE_PROXY_UV_THREADPOOL_SIZE_WAS', 'EDGE_PROXY_WORKER_FLAGS', 'EDGE_WORKER_CPUS', 'EDGE_WORKER_DROP', 'EDGE_WORKER_WARMUP', 'EDGE_WORKER_INCARNATION', 'EDGE_WORKER_INDEX', 'EDGE_TEST_PAUSE', 'EDGE_TEST_FAIL', 'EDGE_TEST_HOOKS']);

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? sourceFiles(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : []));
}

t.test('every EDGE_* code written in a package source is registered (and so documented)', async (t) => {
  const registered = new Set([...Object.keys(CONFIG_ERROR_CODES), ...Object.keys(H3_ERROR_CODES), ...Object.keys(SERVICE_ERROR_CODES), ...Object.keys(requestErrorDocs()), ...Object.keys(IPC_ERROR_CODES)]);
  const packages = path.resolve(docs, '../packages');
  const unregistered = new Set<string>();
  let seen = 0;
  for (const pkg of readdirSync(packages)) {
    const src = path.join(packages, pkg, 'src');
    if (!existsSync(src)) continue;
    for (const file of sourceFiles(src)) {
      for (const m of readFileSync(file, 'utf8').matchAll(/['`](EDGE_[A-Z0-9_]+)['`]/g)) {
        const code = m[1] as string;
        seen++;
        if (!registered.has(code) && !ENVIRONMENT_NAMES.has(code)) unregistered.add(`${code} (${path.relative(packages, file)})`);
      }
    }
  }
  t.ok(seen > 50, `read ${seen} EDGE_* literals`);
  t.same([...unregistered], [], 'every code is in a registry');
});

t.test('every key of SPEC "Configuration (YAML)" tables appears in the reference', async (t) => {
  const text = readFileSync(path.join(docs, 'configuration.md'), 'utf8');
  const keys = [
    'version', 'listen', 'listeners', 'upstream_tls', 'upstream', 'load_balancing', 'log', 'performance', 'resilience', 'observability', 'security', 'secrets',
    'listen.protocol', 'listen.address', 'listen.port', 'listen.tls', 'listen.tls.certificates[].server_name',
    'upstream_tls.verify_certificates', 'upstream_tls.strict_sni', 'upstream_tls.ca_file',
    'upstream.*.route.path_prefix', 'upstream.*.route.host', 'upstream.*.route.methods', 'upstream.*.backends[].id', 'upstream.*.backends[].address', 'upstream.*.backends[].weight',
    'upstream.*.backends[].health_check.path', 'upstream.*.backends[].health_check.interval', 'upstream.*.load_balancing.type', 'upstream.*.load_balancing.key', 'upstream.*.tls.client_certificate_ref', 'upstream.*.tls.ca_dir', 'upstream.*.host_policy.mode', 'upstream.*.host_policy.host',
    'log.level', 'log.format', 'log.file',
    'performance.worker_threads', 'performance.reuseport', 'performance.pin_workers', 'performance.global_inflight_limit', 'performance.per_upstream_inflight_limit', 'performance.per_backend_inflight_limit', 'performance.new_connections_per_sec', 'performance.new_connections_burst', 'performance.control_plane_threads',
    'resilience.adaptive_admission.min_limit', 'resilience.adaptive_admission.max_limit', 'resilience.adaptive_admission.decrease_step', 'resilience.adaptive_admission.increase_step', 'resilience.adaptive_admission.high_latency_ms',
    'resilience.circuit_breaker.failure_threshold', 'resilience.circuit_breaker.open_ms', 'resilience.circuit_breaker.half_open_max_probes',
    'resilience.retry_budget.ratio_percent', 'resilience.retry_budget.per_route_ratio_percent',
    'resilience.hedging.delay_ms', 'resilience.hedging.safe_methods', 'resilience.hedging.route_allowlist',
    'resilience.brownout.trigger_inflight_percent', 'resilience.brownout.recover_inflight_percent', 'resilience.brownout.core_routes',
    'resilience.route_queue.default_cap', 'resilience.route_queue.global_cap', 'resilience.route_queue.shed_retry_after_seconds', 'resilience.route_queue.caps',
    'resilience.protocol.allow_0rtt', 'resilience.protocol.early_data_safe_methods', 'resilience.protocol.max_headers_count', 'resilience.protocol.max_headers_bytes', 'resilience.protocol.enforce_authority_host_match', 'resilience.protocol.allow_connect', 'resilience.protocol.connect_allowed_ports', 'resilience.protocol.connect_allowed_authorities', 'resilience.protocol.allowed_methods', 'resilience.protocol.denied_path_prefixes',
    'resilience.watchdog.enabled', 'resilience.watchdog.check_interval_ms', 'resilience.watchdog.poll_stall_timeout_ms', 'resilience.watchdog.timeout_error_rate_percent', 'resilience.watchdog.min_requests_per_window', 'resilience.watchdog.overload_inflight_percent', 'resilience.watchdog.unhealthy_consecutive_windows', 'resilience.watchdog.drain_grace_ms', 'resilience.watchdog.restart_cooldown_ms', 'resilience.watchdog.restart_command', 'resilience.watchdog.restart_hook',
    'resilience.quota',
    'observability.metrics.path', 'observability.metrics.max_connections', 'observability.metrics.connection_timeout_ms',
    'observability.control_api.enabled', 'observability.control_api.required', 'observability.control_api.address', 'observability.control_api.port', 'observability.control_api.auth_token', 'observability.control_api.auth.bearer_tokens', 'observability.control_api.auth.bearer_tokens[].role', 'observability.control_api.auth.bearer_tokens[].actor_id',
    'observability.control_api.auth.identity_source.kind', 'observability.control_api.auth.identity_source.role_attribute', 'observability.control_api.tls.client_auth.mode', 'observability.control_api.tls.client_auth.ca_file', 'observability.control_api.ip_allowlist.cidrs',
    'observability.control_api.audit.enabled', 'observability.control_api.audit.format', 'observability.control_api.audit.sink', 'observability.control_api.reload_path', 'observability.control_api.reload_certs_path', 'observability.control_api.max_connections', 'observability.control_api.connection_timeout_ms',
    'observability.tracing', 'observability.routing.enabled', 'observability.routing.include_reason', 'observability.routing.expose_header', 'observability.routing.header_name',
    'secrets.default_provider', 'secrets.providers.*.kind', 'secrets.providers.*.base_dir',
  ];
  for (const k of keys) t.ok(text.includes(`| \`${k}\` |`), k);
});

t.test('spec defaults are the schema defaults', async (t) => {
  const text = readFileSync(path.join(docs, 'configuration.md'), 'utf8');
  const row = (k: string): string => text.split('\n').find((l) => l.startsWith(`| \`${k}\` |`)) ?? '';
  const defaults: [string, string][] = [
    ['listen.port', '9889'], ['listen.address', '"0.0.0.0"'], ['listen.protocol', '"http3"'], ['upstream_tls.verify_certificates', 'true'],
    ['resilience.adaptive_admission.enabled', 'true'], ['resilience.adaptive_admission.min_limit', '64'], ['resilience.adaptive_admission.decrease_step', '16'], ['resilience.adaptive_admission.increase_step', '16'], ['resilience.adaptive_admission.high_latency_ms', '500'],
    ['resilience.circuit_breaker.enabled', 'true'], ['resilience.circuit_breaker.failure_threshold', '3'], ['resilience.circuit_breaker.open_ms', '30000'], ['resilience.circuit_breaker.half_open_max_probes', '1'],
    ['resilience.retry_budget.enabled', 'true'], ['resilience.retry_budget.ratio_percent', '10'],
    ['resilience.hedging.enabled', 'false'], ['resilience.hedging.delay_ms', '100'], ['resilience.hedging.safe_methods', '["GET","HEAD"]'],
    ['resilience.brownout.enabled', 'true'], ['resilience.brownout.trigger_inflight_percent', '90'], ['resilience.brownout.recover_inflight_percent', '60'],
    ['resilience.route_queue.default_cap', '512'], ['resilience.route_queue.global_cap', '2048'], ['resilience.route_queue.shed_retry_after_seconds', '1'],
    ['resilience.protocol.allow_0rtt', 'false'], ['resilience.protocol.early_data_safe_methods', '["GET","HEAD"]'], ['resilience.protocol.max_headers_count', '128'], ['resilience.protocol.max_headers_bytes', '16384'], ['resilience.protocol.enforce_authority_host_match', 'true'], ['resilience.protocol.allow_connect', 'false'],
    ['resilience.watchdog.enabled', 'false'], ['resilience.watchdog.check_interval_ms', '1000'], ['resilience.watchdog.poll_stall_timeout_ms', '5000'], ['resilience.watchdog.timeout_error_rate_percent', '60'], ['resilience.watchdog.min_requests_per_window', '20'], ['resilience.watchdog.overload_inflight_percent', '95'], ['resilience.watchdog.unhealthy_consecutive_windows', '3'], ['resilience.watchdog.drain_grace_ms', '8000'], ['resilience.watchdog.restart_cooldown_ms', '120000'], ['resilience.watchdog.restart_command', '[]'],
    ['observability.metrics.path', '"/metrics"'], ['observability.metrics.max_connections', '512'], ['observability.metrics.connection_timeout_ms', '30000'],
    ['observability.control_api.reload_path', '"/admin/runtime/reload"'], ['observability.control_api.reload_certs_path', '"/admin/runtime/reload-certs"'], ['observability.control_api.max_connections', '256'], ['observability.control_api.connection_timeout_ms', '30000'],
    ['observability.routing.enabled', 'false'], ['observability.routing.include_reason', 'true'], ['observability.routing.expose_header', 'false'], ['observability.routing.header_name', '"x-svc-route-decision"'],
  ];
  for (const [k, v] of defaults) t.ok(row(k).includes(`| \`${v}\` |`), `${k} defaults to ${v}`);
});

// README and docs/ name scripts, files and other documents; each must exist, so a renamed script
// or a moved file cannot leave a doc pointing at nothing (a newcomer's first command included).
t.test('every `npm run` name, repository path and link cited in README.md and docs/ exists', async (t) => {
  const root = path.dirname(docs);
  const files = ['README.md', ...readdirSync(docs).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
  const scripts = Object.keys((JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts);
  const missing: string[] = [];
  let cited = 0;
  for (const f of files) {
    const text = readFileSync(path.join(root, f), 'utf8');
    for (const m of text.matchAll(/npm run ([a-z][a-z0-9:-]*)/g)) {
      cited++;
      if (!scripts.includes(m[1] ?? '')) missing.push(`${f}: npm run ${m[1]}`);
    }
    // Paths under the repository's top-level folders; patterns (`*`, `<name>`, `{a,b}`) are not files.
    for (const m of text.matchAll(/(?<![\w./-])((?:packages|scripts|test|deploy|docs|bundle|patches|\.ci)\/[A-Za-z0-9_./*{}<>-]*[A-Za-z0-9_*}>])/g)) {
      const p = m[1] ?? '';
      if (/[*{}<>]/.test(p)) continue;
      cited++;
      if (!existsSync(path.join(root, p))) missing.push(`${f}: ${p}`);
    }
    // Relative markdown links, resolved against the citing file.
    for (const m of text.matchAll(/\]\(([^)#\s]+)/g)) {
      const p = m[1] ?? '';
      if (/^[a-z][a-z0-9+.-]*:/.test(p)) continue;
      cited++;
      if (!existsSync(path.resolve(root, path.dirname(f), p))) missing.push(`${f}: link ${p}`);
    }
  }
  t.ok(cited > 100, `${cited} citations checked`);
  t.same(missing, [], 'every cited script, path and link exists');
});
