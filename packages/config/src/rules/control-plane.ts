// Control plane and observability rules: control API exposure and auth combinations, tokens,
// allowlist CIDRs, binds shared between surfaces, paths, routing header, tracing.
import net from 'node:net';
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';
import { effectiveListeners } from '../normalize.ts';
import { bindsOverlap, isLoopback, itemsOf } from './context.ts';
import type { Rule } from './context.ts';

/** Shortest accepted control API token: 16 characters (≈ 96 bits as base64). */
export const MIN_TOKEN_LENGTH = 16;

/** Built-in control API routes a configured reload path must not shadow. */
export const BUILTIN_CONTROL_PATHS = ['/health', '/ready', '/admin/runtime', '/admin/runtime/history', '/admin/runtime/validate', '/admin/runtime/preview', '/admin/runtime/activate', '/admin/runtime/rollback', '/admin/runtime/restart'];

type Check = (ctx: Parameters<Rule['check']>[0]) => ConfigIssue[];
const rule = (name: string, check: Check): Rule => ({ name, check });

/** Parses `a.b.c.d/n` or `x::y/n`; `undefined` when malformed. */
export function parseCidr(cidr: string): { address: string; prefix: number; family: 4 | 6 } | undefined {
  const m = /^([^/]+)\/(\d{1,3})$/.exec(cidr);
  if (m === null) return undefined;
  const family = net.isIP(m[1] as string);
  const prefix = Number(m[2]);
  if (family === 0 || prefix > (family === 4 ? 32 : 128)) return undefined;
  return { address: m[1] as string, prefix, family: family as 4 | 6 };
}

export const controlApiAddresses = rule('control-plane-addresses', (ctx) => {
  const o = ctx.doc.observability;
  const out: ConfigIssue[] = [];
  for (const [at, address] of [
    ['observability.control_api.address', o?.control_api?.address],
    ['observability.metrics.address', o?.metrics?.address],
  ] as const) {
    if (typeof address === 'string' && net.isIP(address) === 0) out.push(issue(at, 'EDGE_CONFIG_INVALID_IP', `'${address}' is not an IPv4 or IPv6 address`));
  }
  return out;
});

export const controlApiExposure = rule('control-api-exposure', (ctx) => {
  const c = ctx.doc.observability?.control_api;
  if (c?.enabled !== true || typeof c.address !== 'string' || net.isIP(c.address) === 0 || isLoopback(c.address)) return [];
  const hasToken = ctx.secrets.has('observability.control_api.auth_token') || itemsOf(c.auth?.bearer_tokens).length > 0;
  const hasMtlsIdentity = c.tls?.client_auth?.mode === 'required' && c.auth?.identity_source !== undefined;
  if (hasToken || hasMtlsIdentity) return [];
  return [issue('observability.control_api.auth_token', 'EDGE_CONFIG_CONTROL_API_AUTH', `the control API binds non-loopback ${c.address}: configure auth_token (or bearer tokens, or required mTLS with identity_source)`)];
});

export const controlApiAuthCombination = rule('control-api-auth-combination', (ctx) => {
  const c = ctx.doc.observability?.control_api;
  const out: ConfigIssue[] = [];
  if (c === undefined || c === null) return out;
  const mode = c.tls?.client_auth?.mode;
  if (c.auth?.identity_source !== undefined && mode === undefined) {
    out.push(issue('observability.control_api.auth.identity_source', 'EDGE_CONFIG_AUTH_COMBINATION', 'identity_source needs `tls.client_auth` to obtain client certificates'));
  }
  const hasToken = ctx.secrets.has('observability.control_api.auth_token') || itemsOf(c.auth?.bearer_tokens).length > 0;
  if (mode !== undefined && c.auth?.identity_source === undefined && !hasToken) {
    out.push(issue('observability.control_api.auth', 'EDGE_CONFIG_AUTH_COMBINATION', 'mTLS without identity_source grants no role: add identity_source or bearer tokens'));
  }
  return out;
});

export const controlApiTokens = rule('control-api-tokens', (ctx) => {
  const out: ConfigIssue[] = [];
  const seen = new Map<string, string>();
  for (const [at, source] of ctx.secrets) {
    const isToken = at === 'observability.control_api.auth_token' || /^observability\.control_api\.auth\.bearer_tokens\[\d+\]\.token$/.test(at);
    if (!isToken || source.kind === 'file') continue; // file tokens are checked when resolved
    if (source.value.length < MIN_TOKEN_LENGTH) out.push(issue(at, 'EDGE_CONFIG_TOKEN_WEAK', `tokens need at least ${MIN_TOKEN_LENGTH} characters`));
    const first = seen.get(source.value);
    if (first !== undefined) out.push(issue(at, 'EDGE_CONFIG_DUPLICATE_TOKEN', `this token equals the one at ${first}`));
    else seen.set(source.value, at);
  }
  itemsOf(ctx.doc.observability?.control_api?.auth?.bearer_tokens).forEach((t, i) => {
    if (t !== null && typeof t === 'object' && !ctx.secretFieldsPresent.has(`observability.control_api.auth.bearer_tokens[${i}].token`)) {
      out.push(issue(`observability.control_api.auth.bearer_tokens[${i}].token`, 'EDGE_CONFIG_REQUIRED', 'a bearer token needs `token` or `token_ref`'));
    }
  });
  return out;
});

export const allowlistCidrs = rule('ip-allowlist-cidrs', (ctx) =>
  itemsOf(ctx.doc.observability?.control_api?.ip_allowlist?.cidrs)
    .map((c, i) => ({ c, i }))
    .filter(({ c }) => typeof c === 'string' && parseCidr(c) === undefined)
    .map(({ c, i }) => issue(`observability.control_api.ip_allowlist.cidrs[${i}]`, 'EDGE_CONFIG_CIDR', `'${c}' is not a CIDR block (address/prefix)`)),
);

export const surfaceBinds = rule('surface-binds', (ctx) => {
  const o = ctx.doc.observability;
  const tcp: { at: string; address: string; port: number }[] = [];
  itemsOf(effectiveListeners(ctx.doc)).forEach((l, i) => {
    if (typeof l?.address === 'string' && typeof l.port === 'number') tcp.push({ at: `listener ${i} (${l.address}:${l.port})`, address: l.address, port: l.port });
  });
  const out: ConfigIssue[] = [];
  for (const [at, s] of [
    ['observability.control_api', o?.control_api],
    ['observability.metrics', o?.metrics],
  ] as const) {
    if (s?.enabled !== true || typeof s.address !== 'string' || typeof s.port !== 'number') continue;
    const clash = tcp.find((t) => t.port === s.port && bindsOverlap(t.address, s.address));
    if (clash !== undefined) out.push(issue(`${at}.port`, 'EDGE_CONFIG_BIND_CONFLICT', `${s.address}:${s.port} overlaps ${clash.at}`));
    tcp.push({ at, address: s.address, port: s.port });
  }
  return out;
});

export const controlApiPaths = rule('control-api-paths', (ctx) => {
  const c = ctx.doc.observability?.control_api;
  const out: ConfigIssue[] = [];
  if (typeof c?.reload_path !== 'string' || typeof c.reload_certs_path !== 'string') return out;
  if (c.reload_path === c.reload_certs_path) out.push(issue('observability.control_api.reload_certs_path', 'EDGE_CONFIG_PATH_CONFLICT', 'reload_path and reload_certs_path must differ'));
  for (const key of ['reload_path', 'reload_certs_path'] as const) {
    const p = c[key];
    if (BUILTIN_CONTROL_PATHS.includes(p) || p.startsWith('/admin/runtime/history')) out.push(issue(`observability.control_api.${key}`, 'EDGE_CONFIG_RESERVED_PATH', `${p} is a built-in control API route`));
  }
  const metricsPath = ctx.doc.observability?.metrics?.path;
  if (typeof metricsPath === 'string' && !metricsPath.startsWith('/')) out.push(issue('observability.metrics.path', 'EDGE_CONFIG_FORMAT', 'the metrics path starts with `/`'));
  return out;
});

export const routingHeader = rule('routing-header', (ctx) => {
  const r = ctx.doc.observability?.routing;
  if (r?.expose_header !== true) return [];
  if (typeof r.header_name !== 'string' || r.header_name.length === 0) return [issue('observability.routing.header_name', 'EDGE_CONFIG_ROUTING_HEADER', 'header_name must be non-empty when expose_header is true')];
  return /^[a-z0-9!#$%&'*+.^_`|~-]+$/.test(r.header_name) ? [] : [issue('observability.routing.header_name', 'EDGE_CONFIG_ROUTING_HEADER', 'header_name must be a lower-case HTTP field name')];
});

/**
 * The OTLP endpoint is a URL without credentials: a URL's userinfo would end up wherever the URL
 * is shown (a collector's credential goes in a header, from the environment: docs/observability.md). Without an endpoint the OTLP default (a local collector)
 * is used, so `enabled: true` alone is a valid configuration.
 */
export const tracingEndpoint = rule('tracing-endpoint', (ctx) => {
  const endpoint = ctx.doc.observability?.tracing?.endpoint;
  if (typeof endpoint !== 'string') return [];
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    return [issue('observability.tracing.endpoint', 'EDGE_CONFIG_TRACING_ENDPOINT', 'the tracing endpoint is not a valid URL')];
  }
  if (url.username !== '' || url.password !== '') return [issue('observability.tracing.endpoint', 'EDGE_CONFIG_TRACING_ENDPOINT', 'the tracing endpoint carries credentials (user:password@): refused, they would be shown wherever the URL is; give a collector credential as a header in OTEL_EXPORTER_OTLP_TRACES_HEADERS of the service\'s environment')];
  return [];
});

export const CONTROL_PLANE_RULES: readonly Rule[] = [
  controlApiAddresses,
  controlApiExposure,
  controlApiAuthCombination,
  controlApiTokens,
  allowlistCidrs,
  surfaceBinds,
  controlApiPaths,
  routingHeader,
  tracingEndpoint,
];
