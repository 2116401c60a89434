// Quota policies compiled once per generation: which routes a policy applies to, how its selector
// key is built from the request (the dimension extractors of balancing/request-key.ts, shared with
// consistent hashing and rate limits), and its contracts (burst, sustained) as fixed windows.
//
// A selector key is `key_prefix + policy + ':' + digest`, where the digest is SHA-256 over the
// dimension values, each tagged with the kind of selector that produced it (`compileSelector`: a
// header's `10.1.2.3` and a client address 10.1.2.3 differ) and length-prefixed (so `a|bc` and
// `ab|c` differ), base64url, truncated to 128 bits: a fixed-length key whatever the client sends. SHA-256 rather than a fast non-cryptographic hash because the values come from the
// client: with FNV or xxHash a client could craft a header value that collides with another
// tenant's key and spend that tenant's quota; 128 bits of SHA-256 cannot be collided on purpose.
// The cost (about a microsecond for a short key) is small next to the Redis round trip. Raw values
// never reach Redis keys, logs or metrics: they may be tokens.
import { hash } from 'node:crypto';
import type { ResolvedConfig } from '@edge-proxy/config';
import { compileSelector } from '../../balancing/request-key.ts';
import type { SelectorExtractor } from '../../balancing/request-key.ts';

/** The `resilience.quota` block of a generation's configuration. */
export type QuotaConfig = ResolvedConfig['config']['resilience']['quota'];
type PolicyConfig = QuotaConfig['policies'][number];

/** Default `resilience.quota.redis.key_prefix`, also used by local counters when `redis` is absent. */
export const DEFAULT_KEY_PREFIX = 'edge-proxy:quota:';

/**
 * What the quota reads from a request. Header names are lower case. A dimension whose value is
 * missing (no such header, cookie or query parameter; no Host) follows the policy's
 * `key_fallback`: counted under the client address in its own key space (`client_ip`, the
 * default), or the policy does not apply (`none`).
 */
export interface QuotaRequestFacts {
  readonly clientIp: string;
  readonly host: string;
  /** The route (upstream pool) name. */
  readonly route: string;
  /** The request target (path and query). */
  readonly path: string;
  header(name: string): string | undefined;
}

/** Which contract of a policy decided (`reason` `burst_exceeded` / `sustained_exceeded`). */
export type ContractKind = 'burst' | 'sustained';

/** One contract: at most `limit` requests per fixed window of `windowMs`. */
export interface QuotaContract {
  readonly kind: ContractKind;
  readonly limit: number;
  readonly windowMs: number;
  /** Suffix of the counter key (`:b` or `:s`); the window index follows it. */
  readonly suffix: string;
  /** `limit` and `windowMs` as the script's arguments (made once, not per request). */
  readonly argv: readonly [string, string];
}

/** A quota policy ready for the request path. */
export interface CompiledPolicy {
  readonly name: string;
  /** Routes the policy applies to; `undefined`: every route. */
  readonly routes: ReadonlySet<string> | undefined;
  /** The `selector_dimensions` label: the dimension specs joined by ','. */
  readonly selectorDimensions: string;
  /** Burst first, then sustained; at least one. */
  readonly contracts: readonly QuotaContract[];
  /** `max_keys_per_window`: new selector keys one worker may send per window of each contract. */
  readonly maxKeysPerWindow: number;
  /** `max_new_keys_per_source`: new selector keys one client source may send per window of each contract, per worker. */
  readonly maxNewKeysPerSource: number;
  /**
   * The counter key of `facts` without contract suffix or window: `key_prefix + name + ':' +
   * digest`; `undefined` when a dimension's value is missing and `key_fallback` is `none` (the
   * policy does not apply to the request).
   */
  key(facts: QuotaRequestFacts): string | undefined;
}

/** Length of the selector digest in base64url characters (22 × 6 = 132 bits, 128 of them from SHA-256). */
const DIGEST_CHARS = 22;

function contractsOf(p: PolicyConfig): QuotaContract[] {
  const out: QuotaContract[] = [];
  const contract = (kind: ContractKind, w: { limit: number; window_ms: number }): QuotaContract =>
    ({ kind, limit: w.limit, windowMs: w.window_ms, suffix: kind === 'burst' ? ':b' : ':s', argv: [String(w.limit), String(w.window_ms)] });
  if (p.burst !== undefined) out.push(contract('burst', p.burst));
  if (p.sustained !== undefined) out.push(contract('sustained', p.sustained));
  return out;
}

/** The digest of (tagged) dimension values: SHA-256 over each value length-prefixed, base64url, 128 bits. */
export function selectorDigest(values: readonly string[]): string {
  let s = '';
  for (const v of values) s += `${v.length}:${v}`;
  return hash('sha256', s, 'base64url').slice(0, DIGEST_CHARS);
}

function compileOne(p: PolicyConfig, keyPrefix: string): CompiledPolicy | undefined {
  const contracts = contractsOf(p);
  if (contracts.length === 0) return undefined; // refused by validation; nothing to enforce
  const extractors: SelectorExtractor[] = p.dimensions.map((d) => compileSelector(d, p.key_fallback));
  const base = `${keyPrefix}${p.name}:`;
  const values: string[] = new Array<string>(extractors.length);
  return {
    name: p.name,
    routes: p.routes.length === 0 ? undefined : new Set(p.routes),
    selectorDimensions: p.dimensions.join(','),
    contracts,
    maxKeysPerWindow: p.max_keys_per_window,
    maxNewKeysPerSource: Math.min(p.max_new_keys_per_source, p.max_keys_per_window),
    key(facts) {
      for (let i = 0; i < extractors.length; i++) {
        const v = (extractors[i] as SelectorExtractor)(facts);
        if (v === undefined) return undefined;
        values[i] = v;
      }
      return base + selectorDigest(values);
    },
  };
}

/** What `compilePolicies` reads of a whole generation: the quota block and the route names. */
export interface QuotaRoutesSource {
  readonly resilience: { readonly quota: QuotaConfig };
  readonly upstream: Readonly<Record<string, unknown>>;
}

/**
 * Compiles the policies of `quota` (an empty list when quota is disabled); given a whole
 * generation's configuration, the policies per route instead (routes with none are absent), in
 * the shape of the rate limits' `compileLimits`.
 */
export function compilePolicies(quota: QuotaConfig): CompiledPolicy[];
export function compilePolicies(config: QuotaRoutesSource): ReadonlyMap<string, readonly CompiledPolicy[]>;
export function compilePolicies(arg: QuotaConfig | QuotaRoutesSource): CompiledPolicy[] | ReadonlyMap<string, readonly CompiledPolicy[]> {
  if ('resilience' in arg) return byRoute(compilePolicies(arg.resilience.quota), Object.keys(arg.upstream));
  if (!arg.enabled) return [];
  const prefix = arg.redis?.key_prefix ?? DEFAULT_KEY_PREFIX;
  const out: CompiledPolicy[] = [];
  for (const p of arg.policies) {
    const c = compileOne(p, prefix);
    if (c !== undefined) out.push(c);
  }
  return out;
}

function byRoute(policies: readonly CompiledPolicy[], routes: readonly string[]): ReadonlyMap<string, readonly CompiledPolicy[]> {
  const out = new Map<string, CompiledPolicy[]>();
  for (const route of routes) {
    const list = policies.filter((p) => p.routes === undefined || p.routes.has(route));
    if (list.length > 0) out.set(route, list);
  }
  return out;
}
