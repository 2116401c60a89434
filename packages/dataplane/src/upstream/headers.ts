// Header rules of a forwarding proxy: hop-by-hop fields are removed both ways (RFC 9110 §7.6.1),
// the client is recorded in `x-forwarded-*` and `forwarded` (RFC 7239), replacing whatever the
// client sent there, and our hop is appended to `via` (RFC 9110 §7.6.3).
// `traceparent` / `tracestate` pass through untouched, unless tracing is on (the attempt's span
// then sets `traceparent`); `x-request-id` carries the request's id (proxy/request-id.ts).
// `content-length` is sent in canonical form (policy/content-length.ts: `005` and `5, 5` go as `5`).
// Underscore twins of those fields (`X_Forwarded_For`) are dropped on the way up (`isUnderscoreTwin`).

import { canonicalContentLength } from '../policy/content-length.ts';

export type HeaderMap = Record<string, string | string[] | undefined>;

/**
 * Fields that describe one connection, never forwarded (plus any named in `Connection`). `expect`
 * is answered by the ingress itself (100-continue): the upstream request is sent with its body.
 */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'proxy-authenticate', 'http2-settings', 'expect']);

/** Our name in `via`. */
export const VIA_NAME = 'edge-proxy';

/**
 * Field names listed in `Connection` (lower case) that are not hop-by-hop anyway, or undefined
 * when there are none. The usual values (`keep-alive`, `close`, `upgrade`) need no split.
 */
function listed(connection: string | string[] | undefined): string[] | undefined {
  if (connection === undefined) return undefined;
  if (!Array.isArray(connection)) return listedIn(connection, undefined);
  let out: string[] | undefined;
  for (const v of connection) out = listedIn(v, out);
  return out;
}

function listedIn(value: string, out: string[] | undefined): string[] | undefined {
  if (value === 'close' || HOP_BY_HOP.has(value)) return out;
  for (const token of value.split(',')) {
    const t = token.trim().toLowerCase();
    if (t.length > 0 && t !== 'close' && !HOP_BY_HOP.has(t)) (out ??= []).push(t);
  }
  return out;
}

/**
 * Hyphenated names of the fields a request's client must not be able to set through a twin: those
 * the proxy sets from what it saw (`x-request-id`; `x-forwarded-*` below), the client-address
 * fields backends are commonly told to trust, and the framing and hop-by-hop fields the proxy
 * drops or rewrites. A name without `-` has no twin (`host`, `te`, `via`, `forwarded`).
 */
const TWIN_TARGETS: ReadonlySet<string> = new Set(['x-request-id', 'x-real-ip', 'x-client-ip', 'true-client-ip', 'transfer-encoding', 'content-length', 'keep-alive', 'http2-settings']);
/** Prefixes of such fields: the de-facto forwarding fields, and `proxy-*` (RFC 9110 §11.7). */
const TWIN_PREFIXES: readonly string[] = ['x-forwarded-', 'proxy-'];

/**
 * Whether a field name holding `_` reads, with each `_` as `-` (any case), as a field of
 * `TWIN_TARGETS` or `TWIN_PREFIXES`: a name that CGI, WSGI and Rack servers map to the same
 * `HTTP_X_FORWARDED_FOR` variable as the real one (RFC 3875 §4.1.18), so a client's
 * `X_Forwarded_For` could stand in for, or be merged with, the `X-Forwarded-For` the proxy set
 * (Puma CVE-2024-45614). Such names are dropped before forwarding (nginx's
 * `underscores_in_headers off`, aimed at these names only). `guarded`: more names (lower case) of
 * the route whose twins are dropped too, those its authentication read (`RouteAuth.guarded`).
 * Callers test for `_` first.
 */
export function isUnderscoreTwin(name: string, guarded?: ReadonlySet<string>): boolean {
  const folded = name.replaceAll('_', '-').toLowerCase();
  if (TWIN_TARGETS.has(folded) || guarded?.has(folded) === true) return true;
  for (const p of TWIN_PREFIXES) if (folded.startsWith(p)) return true;
  return false;
}

/**
 * Copies the end-to-end fields of `headers` into `out`, in their order, leaving out hop-by-hop
 * fields, HTTP/2-3 pseudo-headers and `skip`, and with `dropTwins` the underscore twins
 * (`isUnderscoreTwin`; only names holding `_` are looked at, one `indexOf` each). Runs twice per
 * request: own keys rather than `Object.entries` (no array per pair), and a short list rather than
 * a Set for `Connection`.
 */
function copyEndToEnd(headers: HeaderMap, out: HeaderMap, keepUpgrade: boolean, skip: string | undefined, dropTwins = false, guarded?: ReadonlySet<string>): HeaderMap {
  const named = listed(headers['connection']);
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (value === undefined || name.charCodeAt(0) === 0x3a /* ':' */ || name === skip) continue;
    if (dropTwins && name.indexOf('_') !== -1 && isUnderscoreTwin(name, guarded)) continue;
    if (keepUpgrade && (name === 'upgrade' || name === 'connection')) {
      out[name] = value;
      continue;
    }
    if (HOP_BY_HOP.has(name) || (named !== undefined && named.includes(name))) continue;
    out[name] = value;
  }
  return out;
}

/**
 * Copies `headers` without hop-by-hop fields and HTTP/2-3 pseudo-headers; `keepUpgrade` keeps
 * `Upgrade` and `Connection` for an upgrade exchange.
 */
export function endToEnd(headers: HeaderMap, keepUpgrade = false): HeaderMap {
  return copyEndToEnd(headers, {}, keepUpgrade, undefined);
}

/**
 * Who sent the request and how, for the forwarding headers (the handler's downstream request has
 * this shape, so it is passed as it is).
 */
export interface ClientInfo {
  /** Client address, IPv4-mapped IPv6 unmapped. */
  readonly remoteAddress: string;
  /** Host the client asked for: `:authority`, else `Host`. */
  readonly authority: string | undefined;
  readonly host: string | undefined;
  /** Downstream protocol version for `via`: `1.1`, `2` or `3`. */
  readonly protocol: '1.1' | '2' | '3';
}

function append(existing: string | string[] | undefined, value: string): string {
  const prior = Array.isArray(existing) ? existing.join(', ') : existing;
  return prior === undefined || prior.length === 0 ? value : `${prior}, ${value}`;
}

/** RFC 7239 §6: IPv6 addresses are quoted and bracketed in `forwarded`. */
function forwardedNode(ip: string): string {
  return ip.includes(':') ? `"[${ip}]"` : ip;
}

/**
 * Request headers sent upstream: end-to-end fields plus the forwarding record (`keepUpgrade`: as in
 * `endToEnd`).
 *
 * The proxy is the edge: nothing in front of it is trusted to describe the client. A client's own
 * `x-forwarded-for`, `x-forwarded-proto`, `x-forwarded-host` and `forwarded` never reach the
 * backend; they are replaced by what the proxy saw (the peer address, `https`, the host the request
 * was routed on). `via` is different: it records the path a message took, not who the client is,
 * and RFC 9110 §7.6.3 has each intermediary append to it (loop detection reads it), so our entry
 * is appended to the client's (docs/decisions.md, "Forwarding headers"). `requestId`, when given,
 * replaces the client's `x-request-id`. Underscore twins of these fields, and of the framing ones,
 * are dropped (`isUnderscoreTwin`), and of `guarded`, the fields the route's authentication read.
 */
export function upstreamRequestHeaders(headers: HeaderMap, client: ClientInfo, host: string | undefined, keepUpgrade = false, requestId?: string, guarded?: ReadonlySet<string>): HeaderMap {
  // `host` is left out of the copy and set after it (same order as copying then deleting it, but
  // without `delete`, which turns the object into a slow dictionary that undici then walks). The
  // forwarding fields are overwritten below, and undici skips a field whose value is undefined.
  const out = copyEndToEnd(headers, {}, keepUpgrade, 'host', true, guarded);
  if (host !== undefined) out['host'] = host;
  // Validated by the protocol phase (an invalid one never gets here; undefined drops it if it did).
  const length = out['content-length'];
  if (length !== undefined) out['content-length'] = canonicalContentLength(length) ?? undefined;
  const ip = client.remoteAddress;
  const asked = client.authority ?? client.host;
  out['x-forwarded-for'] = ip;
  out['x-forwarded-proto'] = 'https';
  if (asked !== undefined || out['x-forwarded-host'] !== undefined) out['x-forwarded-host'] = asked;
  out['forwarded'] = `for=${forwardedNode(ip)};proto=https${asked === undefined ? '' : `;host="${quotable(asked)}"`}`;
  out['via'] = append(headers['via'], VIA[client.protocol]);
  // The request's id (proxy/request-id.ts): the client's own when it was kept, else ours.
  if (requestId !== undefined) out['x-request-id'] = requestId;
  return out;
}

/** Our `via` entry per protocol version (built once, not per request). */
const VIA = { '1.1': `1.1 ${VIA_NAME}`, '2': `2 ${VIA_NAME}`, '3': `3 ${VIA_NAME}` } as const;

/** `host` without the characters a quoted-string cannot hold as they are (`"` and `\\`). */
function quotable(host: string): string {
  return host.includes('"') || host.includes('\\') ? host.replace(/["\\]/g, '') : host;
}

/** Response headers sent downstream: end-to-end fields plus our `via` entry. */
export function downstreamResponseHeaders(headers: HeaderMap, backendProtocol: '1.1' | '2'): HeaderMap {
  const out = copyEndToEnd(headers, {}, false, undefined);
  out['via'] = append(headers['via'], VIA[backendProtocol]);
  return out;
}
