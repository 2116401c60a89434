// Upstream rules: pools, routes (duplicates, overlap, ambiguity), backends, host policy,
// load-balancing keys, health checks, request authentication and route references.
import { issue } from '../errors.ts';
import type { ConfigIssue } from '../errors.ts';
import { parseBackendAddress } from '../normalize.ts';
import { prefixNotNormal, prefixPolicyForm } from '../path-form.ts';
import { entriesOf, isDnsName, itemsOf, KEY_SPEC, repeats } from './context.ts';
import type { Rule } from './context.ts';
import type { LoadBalancingConfig } from '../schema/upstream.ts';

export const upstreamPresent: Rule = {
  name: 'upstream-present',
  check: (ctx) => (entriesOf(ctx.doc.upstream).length === 0 && ctx.doc.upstream !== undefined ? [issue('upstream', 'EDGE_CONFIG_NO_UPSTREAM', 'define at least one upstream pool')] : []),
};

export const upstreamNamesUnique: Rule = {
  name: 'upstream-names-unique',
  check: (ctx) => {
    const names = entriesOf(ctx.doc.upstream).map(([name]) => name);
    return repeats(names, (n) => n.toLowerCase()).map(({ item, firstIndex }) =>
      issue(`upstream.${item}`, 'EDGE_CONFIG_DUPLICATE_UPSTREAM', `pool '${item}' differs from '${names[firstIndex] ?? ''}' only in case`),
    );
  },
};

/** The normalized form of a route matcher: lower-case host, prefix without trailing slash, sorted methods. */
export function routeMatcherKey(route: { host?: string | undefined; path_prefix: string; methods?: readonly string[] }): { host: string; prefix: string; methods: string[] } {
  const prefix = route.path_prefix.length > 1 ? route.path_prefix.replace(/\/+$/, '') || '/' : route.path_prefix;
  return { host: (route.host ?? '').toLowerCase(), prefix, methods: [...(route.methods ?? [])].sort() };
}

export const routesValid: Rule = {
  name: 'routes-valid',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      const route = pool?.route;
      if (route === null || typeof route !== 'object' || typeof route.path_prefix !== 'string') continue;
      const at = `upstream.${name}.route`;
      if (route.path_prefix.length === 0) out.push(issue(`${at}.path_prefix`, 'EDGE_CONFIG_EMPTY_ROUTE', 'a route needs a path prefix (use `/` for everything)'));
      else if (!route.path_prefix.startsWith('/')) out.push(issue(`${at}.path_prefix`, 'EDGE_CONFIG_FORMAT', 'a path prefix starts with `/`'));
      else {
        // Prefixes are matched against the normalized target: one that no normalized path spells matches nothing.
        const why = prefixNotNormal(route.path_prefix);
        if (why !== undefined) out.push(issue(`${at}.path_prefix`, 'EDGE_CONFIG_FORMAT', `the path prefix ${why}`));
      }
      if (typeof route.host === 'string' && !isDnsName(route.host, true)) out.push(issue(`${at}.host`, 'EDGE_CONFIG_FORMAT', `'${route.host}' is not a host name or a \`*.suffix\` wildcard`));
    }
    return out;
  },
};

export const routesUnambiguous: Rule = {
  name: 'routes-unambiguous',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    const seen: { name: string; key: ReturnType<typeof routeMatcherKey>; form: string }[] = [];
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      const route = pool?.route;
      if (typeof route?.path_prefix !== 'string' || route.path_prefix.length === 0) continue;
      const key = routeMatcherKey(route);
      const form = prefixPolicyForm(key.prefix);
      for (const other of seen) {
        if (other.key.host !== key.host) continue;
        if (other.key.prefix !== key.prefix) {
          // Routes match in the policy form of the path (path-form.ts): `/Api` and `/api;v=1` are
          // both `/api`, so a request could not tell them apart.
          if (other.form === form) {
            out.push(issue(`upstream.${name}.route.path_prefix`, 'EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS', `'${key.prefix}' and upstream.${other.name}.route's '${other.key.prefix}' are the same prefix once case, \`;params\` and trailing dots or spaces are ignored, as routing ignores them`));
          }
          continue;
        }
        const a = other.key.methods;
        const b = key.methods;
        if (a.join(',') === b.join(',')) {
          out.push(issue(`upstream.${name}.route`, 'EDGE_CONFIG_DUPLICATE_ROUTE', `same host, path prefix and methods as upstream.${other.name}.route`));
        } else if (a.length > 0 && b.length > 0 && a.some((m) => b.includes(m))) {
          // Explicit method lists beat an empty (all-methods) list, so only two overlapping explicit lists tie.
          const shared = a.filter((m) => b.includes(m)).join(', ');
          out.push(issue(`upstream.${name}.route`, 'EDGE_CONFIG_AMBIGUOUS_ROUTE', `overlaps upstream.${other.name}.route for ${shared} with equal precedence`));
        }
      }
      seen.push({ name, key, form });
    }
    return out;
  },
};

export const backendsValid: Rule = {
  name: 'backends-valid',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      const backends = itemsOf(pool?.backends);
      for (const { item, index, firstIndex } of repeats(backends, (b) => (typeof b?.id === 'string' ? b.id : undefined))) {
        out.push(issue(`upstream.${name}.backends[${index}].id`, 'EDGE_CONFIG_DUPLICATE_BACKEND_ID', `id '${item.id}' is also used by backends[${firstIndex}]`));
      }
      backends.forEach((b, i) => {
        if (typeof b?.address === 'string' && parseBackendAddress(b.address) === undefined) {
          out.push(issue(`upstream.${name}.backends[${i}].address`, 'EDGE_CONFIG_BACKEND_ADDRESS', `'${b.address}' is not host, host:port, http://host[:port] or https://host[:port]`));
        }
      });
    }
    return out;
  },
};

export const hostPolicy: Rule = {
  name: 'host-policy',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      const hp = pool?.host_policy;
      if (hp === null || typeof hp !== 'object') continue;
      const at = `upstream.${name}.host_policy`;
      if (hp.mode !== 'rewrite' && hp.host !== undefined) out.push(issue(`${at}.host`, 'EDGE_CONFIG_HOST_POLICY', '`host` is only allowed with `mode: rewrite`'));
      if (hp.mode === 'rewrite' && hp.host === undefined) out.push(issue(`${at}.host`, 'EDGE_CONFIG_HOST_POLICY', '`mode: rewrite` needs `host`'));
    }
    return out;
  },
};

function lbIssues(lb: LoadBalancingConfig | undefined, at: string): ConfigIssue[] {
  if (lb === null || typeof lb !== 'object' || lb.key === undefined) return [];
  if (lb.type !== 'consistent-hash') return [issue(`${at}.key`, 'EDGE_CONFIG_LB_KEY', `\`key\` applies to consistent-hash only, not ${String(lb.type)}`)];
  if (typeof lb.key === 'string' && !KEY_SPEC.test(lb.key)) return [issue(`${at}.key`, 'EDGE_CONFIG_LB_KEY', `'${lb.key}' is not a key spec (client_ip, host, path, route, header:NAME, cookie:NAME, query:NAME)`)];
  return [];
}

export const loadBalancingKeys: Rule = {
  name: 'load-balancing-keys',
  check: (ctx) => [
    ...lbIssues(ctx.doc.load_balancing, 'load_balancing'),
    ...entriesOf(ctx.doc.upstream).flatMap(([name, pool]) => lbIssues(pool?.load_balancing, `upstream.${name}.load_balancing`)),
  ],
};

export const healthChecks: Rule = {
  name: 'health-check-timing',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    const check = (hc: { interval?: number; timeout_ms?: number } | undefined, at: string): void => {
      if (typeof hc?.interval === 'number' && typeof hc.timeout_ms === 'number' && hc.timeout_ms >= hc.interval) {
        out.push(issue(`${at}.timeout_ms`, 'EDGE_CONFIG_TIMEOUT_ORDER', `probe timeout ${hc.timeout_ms} ms must be shorter than the interval ${hc.interval} ms`));
      }
    };
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      check(pool?.health_check, `upstream.${name}.health_check`);
      itemsOf(pool?.backends).forEach((b, i) => check(b?.health_check, `upstream.${name}.backends[${i}].health_check`));
    }
    return out;
  },
};

/** The request-authentication blocks of a document with their paths: `default_auth` and each pool's `auth`. */
function authBlocks(ctx: Parameters<Rule['check']>[0]): { at: string; auth: { jwt?: unknown; external?: unknown; public?: unknown } }[] {
  const out: { at: string; auth: { jwt?: unknown; external?: unknown; public?: unknown } }[] = [];
  const d = ctx.doc.default_auth;
  if (d !== null && typeof d === 'object') out.push({ at: 'default_auth', auth: d });
  for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
    const a = pool?.auth;
    if (a !== null && typeof a === 'object') out.push({ at: `upstream.${name}.auth`, auth: a });
  }
  return out;
}

export const requestAuth: Rule = {
  name: 'request-auth',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    for (const { at: authAt, auth } of authBlocks(ctx)) {
      const external = auth.external as { client_id?: unknown; failure_mode?: unknown; fail_open_per_second?: unknown } | null | undefined;
      if (external !== undefined && external !== null && ctx.secrets.has(`${authAt}.external.client_secret`) && external.client_id === undefined) {
        out.push(issue(`${authAt}.external.client_id`, 'EDGE_CONFIG_JWT', '`client_secret` is sent with a `client_id` (HTTP Basic): set both or neither'));
      }
      // The budget bounds what failures allow; under `deny` (the default) failures allow nothing.
      if (external !== undefined && external !== null && external.fail_open_per_second !== undefined && external.failure_mode !== 'allow') {
        out.push(issue(`${authAt}.external.fail_open_per_second`, 'EDGE_CONFIG_JWT', '`fail_open_per_second` bounds the requests `failure_mode: allow` lets through; with `deny` a failure allows none: drop it, or set `failure_mode: allow`'));
      }
      const jwt = auth.jwt as { algorithms?: unknown; jwks?: unknown } | null | undefined;
      if (jwt === undefined || jwt === null) continue;
      const at = `${authAt}.jwt`;
      // Absent: the schema default, RS256 and ES256.
      const algs = jwt.algorithms === undefined ? ['RS256', 'ES256'] : itemsOf(jwt.algorithms as unknown[]);
      const hmac = algs.filter((a) => typeof a === 'string' && a.startsWith('HS'));
      const hasSecret = ctx.secrets.has(`${at}.secret`);
      if (hmac.length > 0 && !hasSecret) out.push(issue(`${at}.secret`, 'EDGE_CONFIG_JWT', `${hmac.join(', ')} need \`secret\` or \`secret_ref\``));
      if (hmac.length === 0 && hasSecret) out.push(issue(`${at}.secret`, 'EDGE_CONFIG_JWT', '`secret` is only used by HS* algorithms'));
      if (hmac.length < algs.length && jwt.jwks === undefined) out.push(issue(`${at}.jwks`, 'EDGE_CONFIG_JWT', 'asymmetric algorithms need a `jwks` source'));
      if (hmac.length > 0 && hmac.length === algs.length && jwt.jwks !== undefined) out.push(issue(`${at}.jwks`, 'EDGE_CONFIG_JWT', '`jwks` is only used by asymmetric algorithms (RS*, PS*, ES*, EdDSA)'));
      if (hmac.length > 0 && hmac.length < algs.length) out.push(issue(`${at}.algorithms`, 'EDGE_CONFIG_JWT', 'do not mix HS* with asymmetric algorithms (algorithm confusion)'));
    }
    return out;
  },
};

/**
 * `default_auth` and the `public` opt-out: every combination either has an effect or is refused.
 * A default needs a check; `public: true` stands alone and only where there is a default to opt
 * out of; and under a default a pool's `auth` that names no check must say `public: true`, so an
 * empty block cannot open a pool without saying so.
 */
export const defaultAuth: Rule = {
  name: 'default-auth',
  check: (ctx) => {
    const out: ConfigIssue[] = [];
    const d = ctx.doc.default_auth;
    const hasDefault = d !== null && typeof d === 'object';
    if (hasDefault && d.jwt === undefined && d.external === undefined) out.push(issue('default_auth', 'EDGE_CONFIG_REQUIRED', '`default_auth` needs `jwt`, `external` or both'));
    for (const [name, pool] of entriesOf(ctx.doc.upstream)) {
      const a = pool?.auth;
      if (a === null || typeof a !== 'object') continue;
      const at = `upstream.${name}.auth`;
      const checks = a.jwt !== undefined || a.external !== undefined;
      if (a.public === true && checks) out.push(issue(`${at}.public`, 'EDGE_CONFIG_AUTH_PUBLIC', '`public: true` opts the pool out of authentication: drop `jwt`/`external`, or `public`'));
      else if (a.public === true && !hasDefault) out.push(issue(`${at}.public`, 'EDGE_CONFIG_AUTH_PUBLIC', '`public: true` opts out of `default_auth`, which is not set: drop it'));
      else if (a.public !== true && !checks && hasDefault) out.push(issue(at, 'EDGE_CONFIG_AUTH_PUBLIC', 'under `default_auth` a pool `auth` without `jwt` or `external` must say `public: true` to opt out'));
    }
    return out;
  },
};

/** Every place a policy names a route (pool), with its path. */
function routeReferences(ctx: Parameters<Rule['check']>[0]): { at: string; name: string }[] {
  const r = ctx.doc.resilience;
  const refs: { at: string; name: string }[] = [];
  itemsOf(r?.brownout?.core_routes).forEach((n, i) => refs.push({ at: `resilience.brownout.core_routes[${i}]`, name: n }));
  itemsOf(r?.hedging?.route_allowlist).forEach((n, i) => refs.push({ at: `resilience.hedging.route_allowlist[${i}]`, name: n }));
  for (const [n] of entriesOf(r?.retry_budget?.per_route_ratio_percent)) refs.push({ at: `resilience.retry_budget.per_route_ratio_percent.${n}`, name: n });
  for (const [n] of entriesOf(r?.route_queue?.caps)) refs.push({ at: `resilience.route_queue.caps.${n}`, name: n });
  itemsOf(r?.rate_limits).forEach((rl, i) => itemsOf(rl?.routes).forEach((n, j) => refs.push({ at: `resilience.rate_limits[${i}].routes[${j}]`, name: n })));
  itemsOf(r?.quota?.policies).forEach((p, i) => itemsOf(p?.routes).forEach((n, j) => refs.push({ at: `resilience.quota.policies[${i}].routes[${j}]`, name: n })));
  return refs;
}

export const routeReferencesExist: Rule = {
  name: 'route-references-exist',
  check: (ctx) => {
    const pools = new Set(entriesOf(ctx.doc.upstream).map(([n]) => n));
    return routeReferences(ctx)
      .filter((ref) => typeof ref.name === 'string' && !pools.has(ref.name))
      .map((ref) => issue(ref.at, 'EDGE_CONFIG_UNKNOWN_ROUTE_REFERENCE', `no upstream pool named '${ref.name}'`));
  },
};

export const UPSTREAM_RULES: readonly Rule[] = [
  upstreamPresent,
  upstreamNamesUnique,
  routesValid,
  routesUnambiguous,
  backendsValid,
  hostPolicy,
  loadBalancingKeys,
  healthChecks,
  requestAuth,
  defaultAuth,
  routeReferencesExist,
];
