// Header rules of a forwarding proxy: hop-by-hop fields are removed both ways (RFC 9110 §7.6.1),
// the client is recorded in `x-forwarded-*`, `forwarded` (RFC 7239) and `via` (RFC 9110 §7.6.3).
// `traceparent` / `tracestate` pass through untouched.

export type HeaderMap = Record<string, string | string[] | undefined>;

/**
 * Fields that describe one connection, never forwarded (plus any named in `Connection`). `expect`
 * is answered by the ingress itself (100-continue): the upstream request is sent with its body.
 */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'proxy-authenticate', 'http2-settings', 'expect']);

/** Our name in `via`. */
export const VIA_NAME = 'edge-proxy';

function listed(connection: string | string[] | undefined): Set<string> {
  const out = new Set<string>();
  for (const v of Array.isArray(connection) ? connection : connection === undefined ? [] : [connection]) {
    for (const token of v.split(',')) {
      const t = token.trim().toLowerCase();
      if (t.length > 0) out.add(t);
    }
  }
  return out;
}

/** Copies `headers` without hop-by-hop fields and HTTP/2-3 pseudo-headers. */
export function endToEnd(headers: HeaderMap, keep: { upgrade?: boolean } = {}): HeaderMap {
  const named = listed(headers['connection']);
  const out: HeaderMap = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || name.startsWith(':')) continue;
    if (keep.upgrade === true && (name === 'upgrade' || name === 'connection')) {
      out[name] = value;
      continue;
    }
    if (HOP_BY_HOP.has(name) || named.has(name)) continue;
    out[name] = value;
  }
  return out;
}

/** Who sent the request and how, for the forwarding headers. */
export interface ClientInfo {
  readonly ip: string;
  /** Host the client asked for (`:authority` or `Host`). */
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

/** Request headers sent upstream: end-to-end fields plus the forwarding record. */
export function upstreamRequestHeaders(headers: HeaderMap, client: ClientInfo, host: string | undefined, keep: { upgrade?: boolean } = {}): HeaderMap {
  const out = endToEnd(headers, keep);
  delete out['host'];
  if (host !== undefined) out['host'] = host;
  out['x-forwarded-for'] = append(headers['x-forwarded-for'], client.ip);
  out['x-forwarded-proto'] = 'https';
  if (client.host !== undefined && headers['x-forwarded-host'] === undefined) out['x-forwarded-host'] = client.host;
  const fwd = `for=${forwardedNode(client.ip)};proto=https${client.host === undefined ? '' : `;host="${client.host.replace(/["\\]/g, '')}"`}`;
  out['forwarded'] = append(headers['forwarded'], fwd);
  out['via'] = append(headers['via'], `${client.protocol} ${VIA_NAME}`);
  return out;
}

/** Response headers sent downstream: end-to-end fields plus our `via` entry. */
export function downstreamResponseHeaders(headers: HeaderMap, backendProtocol: '1.1' | '2'): HeaderMap {
  const out = endToEnd(headers);
  out['via'] = append(headers['via'], `${backendProtocol} ${VIA_NAME}`);
  return out;
}
