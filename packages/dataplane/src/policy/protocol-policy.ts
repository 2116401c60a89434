// Protocol policy (`resilience.protocol`) as one pure check run before routing, the same on both
// ingresses. Each rejection names its HTTP status and a stable reason used in logs and metrics.
import { pathPolicyForm, prefixPolicyForm } from '@edge-proxy/config';
import type { RawConfig } from '@edge-proxy/config';
import { DEFAULT_ALLOW } from './request-validation.ts';
import { normalizeOriginForm } from '../routing/normalize-target.ts';

export type ProtocolPolicy = RawConfig['resilience']['protocol'];

/** The parts of a request the policy reads. Header names are lower case. */
export interface PolicyRequest {
  readonly method: string;
  /** Path with query, or for CONNECT the authority form. */
  readonly path: string;
  /** `:authority` (HTTP/2, HTTP/3) or the request target's authority. */
  readonly authority: string | undefined;
  /** `Host` header, when present. */
  readonly host: string | undefined;
  readonly headerCount: number;
  /** Sum of name and value lengths of all header fields. */
  readonly headerBytes: number;
  /** `Upgrade` header or `Connection: upgrade` present. */
  readonly upgrade: boolean;
  readonly ingress: 'quic' | 'bootstrap-h1' | 'bootstrap-h2';
  /** Arrived in 0-RTT early data. */
  readonly earlyData: boolean;
}

export type PolicyVerdict =
  | { readonly ok: true }
  | { readonly ok: false; readonly status: 400 | 403 | 405 | 421 | 425 | 431 | 501; readonly reason: PolicyReason; readonly allow?: readonly string[] };

/** Stable rejection reasons (log field `reason`, metric labels). */
export type PolicyReason =
  | 'header_count'
  | 'header_bytes'
  | 'authority_host_mismatch'
  | 'method_not_allowed'
  | 'denied_path'
  | 'connect_disabled'
  | 'upgrade_not_supported'
  | 'early_data_unsafe';

const reject = (status: 400 | 403 | 405 | 421 | 425 | 431 | 501, reason: PolicyReason, allow?: readonly string[]): PolicyVerdict => ({ ok: false, status, reason, ...(allow === undefined ? {} : { allow }) });

function hostOf(authority: string): string {
  return authority.toLowerCase().replace(/:\d+$/, '');
}

/** Checks a request against the policy; the first failing rule decides. */
export function checkProtocolPolicy(p: ProtocolPolicy, r: PolicyRequest): PolicyVerdict {
  if (r.headerCount > p.max_headers_count) return reject(431, 'header_count');
  if (r.headerBytes > p.max_headers_bytes) return reject(431, 'header_bytes');
  // RFC 9110 §7.2 / RFC 9113 §8.3.1: a Host that differs from :authority is a misdirected or smuggling attempt.
  // (HTTP/1.1 gives its Host as both: the same string matches itself without normalising.)
  if (p.enforce_authority_host_match && r.authority !== undefined && r.host !== undefined && r.authority !== r.host && hostOf(r.authority) !== hostOf(r.host)) {
    return reject(400, 'authority_host_mismatch');
  }
  if (p.allowed_methods.length > 0 && !p.allowed_methods.includes(r.method)) return reject(405, 'method_not_allowed', p.allowed_methods);
  if (r.method === 'CONNECT') return checkConnect(p);
  if (p.denied_path_prefixes.length > 0 && deniedPath(p.denied_path_prefixes, r.path)) return reject(403, 'denied_path');
  // Upgrades exist only in HTTP/1.1 (RFC 9110 §7.8); HTTP/3 and HTTP/2 forbid the header.
  if (r.upgrade && r.ingress !== 'bootstrap-h1') return reject(400, 'upgrade_not_supported');
  // RFC 8470 §5.2: early data that is not safe to replay gets 425 Too Early; the client retries after the handshake.
  if (r.earlyData && (!p.allow_0rtt || !p.early_data_safe_methods.includes(r.method))) return reject(425, 'early_data_unsafe');
  return OK;
}

const OK: PolicyVerdict = { ok: true };

/**
 * Denied prefixes as they are compared: in the policy form of a path (`pathPolicyForm`, shared with
 * the router and config validation: @edge-proxy/config's path-form.ts), without a
 * trailing slash. Built once per policy object (a generation's config is frozen).
 */
const DENIED = new WeakMap<readonly string[], readonly string[]>();

function deniedForm(prefixes: readonly string[]): readonly string[] {
  let out = DENIED.get(prefixes);
  if (out === undefined) {
    out = prefixes.map((d) => {
      const n = normalizeOriginForm(d);
      return prefixPolicyForm(typeof n === 'string' ? n : d);
    });
    DENIED.set(prefixes, out);
  }
  return out;
}

/**
 * Whether the path (query left out; already normalized, see routing/normalize-target.ts) is a
 * denied prefix or lies under one, compared in the policy form (case, path parameters and the
 * name tails Windows trims ignored) on a segment boundary: `/privately` and `/private.html` are
 * not under `/private`.
 */
export function deniedPath(prefixes: readonly string[], target: string): boolean {
  const q = target.indexOf('?');
  const path = pathPolicyForm(q === -1 ? target : target.slice(0, q));
  for (const d of deniedForm(prefixes)) {
    if (d === '/') return true;
    if (!path.startsWith(d)) continue;
    if (path.length === d.length || path.charCodeAt(d.length) === 0x2f /* / */) return true;
  }
  return false;
}

/** The methods a policy without `allowed_methods` accepts, as `Allow` lists them (the set `OPTIONS *` answers). */
const DEFAULT_METHODS: readonly string[] = DEFAULT_ALLOW.split(', ');

/**
 * CONNECT (RFC 9110 §9.3.6) asks for a tunnel, and tunnelling is not built (the tunnels issue,
 * #42): `allow_connect: true` does not validate (EDGE_CONFIG_NOT_BUILT), and every CONNECT is
 * refused here whatever the policy holds, before routing. So a CONNECT never reaches a pool as a
 * plain request (a backend that closed on one was charged a failure: a dozen ejected it), and is
 * always answered: 405 with `Allow` (RFC 9110 §15.5.6: a 405 must carry it), the methods accepted.
 */
function checkConnect(p: ProtocolPolicy): PolicyVerdict {
  return reject(405, 'connect_disabled', p.allowed_methods.length > 0 ? p.allowed_methods.filter((m) => m !== 'CONNECT') : DEFAULT_METHODS);
}
