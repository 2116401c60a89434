// Route resolution: deterministic by host, then longest path prefix, then method. Both ingresses
// (QUIC and the TLS bootstrap) resolve through the same router built from one generation.
//
// Precedence: exact host > wildcard host (longest suffix first) > routes without a host; within a
// host group the longest prefix (matched on whole path segments) wins; at one prefix an explicit
// method list that contains the method wins over an all-methods route. A request whose path
// matches but whose method no route accepts gets 405 with the accepted methods.
//
// Prefixes are compared in the policy form of the path (@edge-proxy/config's path-form.ts, the
// deny list's form): case folded, each segment cut at `;`/`%3B` and trimmed of what Windows
// trims. A backend that ignores case or drops `;params` serves `/JWT;a/x` as `/jwt/x`; routing it
// to the catch-all instead of the `/jwt` pool skipped that pool's authentication (issue 38,
// finding 1). The forwarded path is untouched: the backend gets the normalized path as sent.
import { pathPolicyForm, prefixPolicyForm } from '@edge-proxy/config';
import type { NormalizedUpstream } from '@edge-proxy/config';
import { normalizeOriginForm } from './normalize-target.ts';

/** Why a route matched, for route-decision logs. */
export interface RouteReason {
  readonly host: 'exact' | 'wildcard' | 'any';
  readonly prefix: string;
  readonly method: 'explicit' | 'any';
}

export type RouteResult =
  | { readonly kind: 'match'; readonly upstream: string; readonly reason: RouteReason }
  | { readonly kind: 'not_found' }
  | { readonly kind: 'method_not_allowed'; readonly allowed: readonly string[] };

interface RouteEntry {
  readonly upstream: string;
  readonly methods: ReadonlySet<string>;
  /** The answer when this entry matches, built once (a router is immutable): no object per request. */
  readonly match: RouteResult;
}

function routeEntry(u: NormalizedUpstream, host: RouteReason['host'], prefix: string): RouteEntry {
  const methods = new Set(u.route.methods);
  const reason: RouteReason = Object.freeze({ host, prefix, method: methods.size === 0 ? 'any' : 'explicit' });
  return { upstream: u.name, methods, match: Object.freeze({ kind: 'match', upstream: u.name, reason }) };
}

/** Routes of one host group, by prefix in policy form (`routeKey`). */
type PrefixTable = Map<string, RouteEntry[]>;

/**
 * The key a route's prefix is stored under: normalized as a request target is (so `/%61pi` is
 * `/api`), then in policy form without a trailing slash. Validation refuses two routes of one host
 * whose keys are equal and prefixes differ (EDGE_CONFIG_ROUTE_PREFIX_AMBIGUOUS).
 */
export function routeKey(prefix: string): string {
  const n = normalizeOriginForm(prefix);
  return prefixPolicyForm(typeof n === 'string' ? n : prefix);
}

/** Normalizes a prefix as the config rules do: no trailing slash except for `/` itself. */
export function normalizePrefix(prefix: string): string {
  return prefix.length > 1 ? prefix.replace(/\/+$/, '') || '/' : prefix;
}

/** Lower-case host without port or trailing dot; IPv6 literals keep their brackets. */
export function normalizeHost(authority: string | undefined): string {
  if (authority === undefined || authority.length === 0) return '';
  let host = authority.toLowerCase();
  if (host.startsWith('[')) {
    const end = host.indexOf(']');
    return end === -1 ? host : host.slice(0, end + 1);
  }
  const colon = host.indexOf(':');
  if (colon !== -1) host = host.slice(0, colon);
  return host.endsWith('.') ? host.slice(0, -1) : host;
}

function insert(table: PrefixTable, prefix: string, entry: RouteEntry): void {
  const list = table.get(prefix);
  if (list === undefined) table.set(prefix, [entry]);
  else list.push(entry);
}

/** An immutable router over one generation's pools. */
export class Router {
  private readonly exact = new Map<string, PrefixTable>();
  /** Wildcard groups, longest suffix first: `*.api.example.com` before `*.example.com`. */
  private readonly wildcards: { suffix: string; table: PrefixTable }[] = [];
  private readonly anyHost: PrefixTable = new Map();

  constructor(upstreams: Iterable<NormalizedUpstream>) {
    const wild = new Map<string, PrefixTable>();
    for (const u of upstreams) {
      // The reason names the prefix as configured; the table holds it in policy form.
      const prefix = normalizePrefix(u.route.path_prefix);
      const key = routeKey(prefix);
      const host = u.route.host?.toLowerCase();
      if (host === undefined) insert(this.anyHost, key, routeEntry(u, 'any', prefix));
      else if (host.startsWith('*.')) {
        const suffix = host.slice(1); // ".example.com"
        const table = wild.get(suffix) ?? new Map();
        wild.set(suffix, table);
        insert(table, key, routeEntry(u, 'wildcard', prefix));
      } else {
        const table = this.exact.get(host) ?? new Map();
        this.exact.set(host, table);
        insert(table, key, routeEntry(u, 'exact', prefix));
      }
    }
    for (const [suffix, table] of wild) this.wildcards.push({ suffix, table });
    this.wildcards.sort((a, b) => b.suffix.length - a.suffix.length);
  }

  /**
   * Resolves a request. `path` is the normalized target (routing/normalize-target.ts) and may carry
   * a query string, which is ignored; its segments are matched in policy form.
   */
  resolve(authority: string | undefined, path: string, method: string): RouteResult {
    // Hot path: no generator, no per-request collections unless the answer is a 405; an ordinary
    // lower-case path without `;` is its own policy form (no copy).
    const host = normalizeHost(authority);
    const q = path.indexOf('?');
    const cleanPath = pathPolicyForm(q === -1 ? path : path.slice(0, q));
    let allowed: Set<string> | undefined;
    const exact = this.exact.get(host);
    if (exact !== undefined) {
      const r = this.lookup(exact, cleanPath, method);
      if (r.kind === 'match') return r;
      if (r.kind === 'method_not_allowed') allowed = merge(allowed, r.allowed);
    }
    for (const w of this.wildcards) {
      if (!(host.endsWith(w.suffix) && host.length > w.suffix.length)) continue;
      const r = this.lookup(w.table, cleanPath, method);
      if (r.kind === 'match') return r;
      if (r.kind === 'method_not_allowed') allowed = merge(allowed, r.allowed);
    }
    if (this.anyHost.size > 0) {
      const r = this.lookup(this.anyHost, cleanPath, method);
      if (r.kind === 'match') return r;
      if (r.kind === 'method_not_allowed') allowed = merge(allowed, r.allowed);
    }
    return allowed === undefined ? NOT_FOUND : { kind: 'method_not_allowed', allowed: [...allowed].sort() };
  }

  /** Longest segment prefix of `path` in one host group, then method precedence. */
  private lookup(table: PrefixTable, path: string, method: string): RouteResult {
    let allowed: string[] | undefined;
    for (let p: string | undefined = longestPrefix(path); p !== undefined; p = shorterPrefix(p)) {
      const entries = table.get(p);
      if (entries !== undefined) {
        let any: RouteEntry | undefined;
        for (const e of entries) {
          if (e.methods.size === 0) any ??= e;
          else if (e.methods.has(method)) return e.match;
        }
        if (any !== undefined) return any.match;
        allowed ??= [];
        for (const e of entries) for (const m of e.methods) allowed.push(m);
      }
    }
    return allowed === undefined ? NOT_FOUND : { kind: 'method_not_allowed', allowed };
  }
}

const NOT_FOUND: RouteResult = Object.freeze({ kind: 'not_found' });

function merge(into: Set<string> | undefined, add: readonly string[]): Set<string> {
  const out = into ?? new Set<string>();
  for (const m of add) out.add(m);
  return out;
}

/** The segment prefixes of a path, longest first: `/a/b` → `/a/b`, `/a`, `/`. Bounded by the segment count. */
export function* prefixesOf(path: string): Generator<string> {
  for (let p: string | undefined = longestPrefix(path); p !== undefined; p = shorterPrefix(p)) yield p;
}

/** The longest segment prefix `path` can match: without trailing slashes, with a leading one. */
function longestPrefix(path: string): string {
  const p = path.length > 1 ? path.replace(/\/+$/, '') : path;
  return p.startsWith('/') ? p : `/${p}`;
}

/** The next shorter segment prefix after `p` (`/a/b` → `/a` → `/`), or undefined after `/`. */
function shorterPrefix(p: string): string | undefined {
  if (p === '/') return undefined;
  const cut = p.lastIndexOf('/');
  return cut <= 0 ? '/' : p.slice(0, cut);
}
