// Route resolution: deterministic by host, then longest path prefix, then method. Both ingresses
// (QUIC and the TLS bootstrap) resolve through the same router built from one generation.
//
// Precedence: exact host > wildcard host (longest suffix first) > routes without a host; within a
// host group the longest prefix (matched on whole path segments) wins; at one prefix an explicit
// method list that contains the method wins over an all-methods route. A request whose path
// matches but whose method no route accepts gets 405 with the accepted methods.
import type { NormalizedUpstream } from '@edge-proxy/config';

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
}

/** Routes of one host group, by normalized prefix. */
type PrefixTable = Map<string, RouteEntry[]>;

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
      const entry: RouteEntry = { upstream: u.name, methods: new Set(u.route.methods) };
      const prefix = normalizePrefix(u.route.path_prefix);
      const host = u.route.host?.toLowerCase();
      if (host === undefined) insert(this.anyHost, prefix, entry);
      else if (host.startsWith('*.')) {
        const suffix = host.slice(1); // ".example.com"
        const table = wild.get(suffix) ?? new Map();
        wild.set(suffix, table);
        insert(table, prefix, entry);
      } else {
        const table = this.exact.get(host) ?? new Map();
        this.exact.set(host, table);
        insert(table, prefix, entry);
      }
    }
    for (const [suffix, table] of wild) this.wildcards.push({ suffix, table });
    this.wildcards.sort((a, b) => b.suffix.length - a.suffix.length);
  }

  /** Resolves a request. `path` may carry a query string; it is ignored. */
  resolve(authority: string | undefined, path: string, method: string): RouteResult {
    const host = normalizeHost(authority);
    const q = path.indexOf('?');
    const cleanPath = q === -1 ? path : path.slice(0, q);
    const allowed = new Set<string>();
    let sawAllowedList = false;
    const groups: [RouteReason['host'], PrefixTable | undefined][] = [['exact', this.exact.get(host)]];
    for (const w of this.wildcards) if (host.endsWith(w.suffix) && host.length > w.suffix.length) groups.push(['wildcard', w.table]);
    groups.push(['any', this.anyHost]);
    for (const [hostKind, table] of groups) {
      if (table === undefined || table.size === 0) continue;
      for (const prefix of prefixesOf(cleanPath)) {
        const entries = table.get(prefix);
        if (entries === undefined) continue;
        const explicit = entries.find((e) => e.methods.size > 0 && e.methods.has(method));
        if (explicit !== undefined) return { kind: 'match', upstream: explicit.upstream, reason: { host: hostKind, prefix, method: 'explicit' } };
        const any = entries.find((e) => e.methods.size === 0);
        if (any !== undefined) return { kind: 'match', upstream: any.upstream, reason: { host: hostKind, prefix, method: 'any' } };
        for (const e of entries) for (const m of e.methods) allowed.add(m);
        sawAllowedList = true;
      }
    }
    return sawAllowedList ? { kind: 'method_not_allowed', allowed: [...allowed].sort() } : { kind: 'not_found' };
  }
}

/** The segment prefixes of a path, longest first: `/a/b` → `/a/b`, `/a`, `/`. Bounded by the segment count. */
export function* prefixesOf(path: string): Generator<string> {
  let p = path.length > 1 ? path.replace(/\/+$/, '') : path;
  if (!p.startsWith('/')) p = `/${p}`;
  while (true) {
    yield p;
    if (p === '/') return;
    const cut = p.lastIndexOf('/');
    p = cut <= 0 ? '/' : p.slice(0, cut);
  }
}
