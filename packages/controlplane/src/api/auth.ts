// Control API authentication and authorization (SPEC "Authentication"), decided in one place.
// Order: source-address allowlist (403 source_ip_not_allowed) → identity from the client
// certificate (mTLS) and/or a bearer token (401 missing_authentication / invalid_bearer_token) →
// role check against the route (403 insufficient_role). Tokens are compared in constant time on
// their SHA-256 digests, so neither content nor length leaks through timing.
import { createHash, timingSafeEqual } from 'node:crypto';
import net from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { NormalizedConfig, ResolvedMaterial } from '@edge-proxy/config';

export type Role = 'viewer' | 'operator' | 'admin';
const RANK: Record<Role, number> = { viewer: 1, operator: 2, admin: 3 };

/** Whether `have` includes `need` (viewer < operator < admin). */
export function roleAtLeast(have: Role, need: Role): boolean {
  return RANK[have] >= RANK[need];
}

/** Who called: attribution for audit events, never the credential itself. */
export interface Identity {
  readonly actor: string;
  readonly role: Role;
  /** `bearer`, `mtls` or `mtls+bearer` (SPEC authentication shapes). */
  readonly authn: 'bearer' | 'mtls' | 'mtls+bearer';
}

export type AuthDecision =
  | { readonly ok: true; readonly identity: Identity }
  | { readonly ok: false; readonly status: 401 | 403; readonly reason: 'missing_authentication' | 'invalid_bearer_token' | 'insufficient_role' | 'source_ip_not_allowed'; readonly identity?: Identity };

interface TokenEntry {
  readonly digest: Buffer;
  readonly role: Role;
  readonly actor: string;
}

interface Cidr {
  readonly family: 4 | 6;
  readonly bytes: Buffer;
  readonly prefix: number;
}

function ipBytes(address: string): { family: 4 | 6; bytes: Buffer } | undefined {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  const a = mapped !== null ? (mapped[1] as string) : address;
  if (net.isIPv4(a)) return { family: 4, bytes: Buffer.from(a.split('.').map(Number)) };
  if (!net.isIPv6(a)) return undefined;
  // Expand `::` to eight groups.
  const [head, tail] = a.toLowerCase().split('::') as [string, string | undefined];
  const h = head === '' ? [] : head.split(':');
  const tl = tail === undefined ? [] : tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? h : [...h, ...Array(8 - h.length - tl.length).fill('0'), ...tl];
  const b = Buffer.alloc(16);
  groups.forEach((g, i) => b.writeUInt16BE(parseInt(g, 16), i * 2));
  return { family: 6, bytes: b };
}

function parseCidr(c: string): Cidr | undefined {
  const [addr, len] = c.split('/');
  const ip = ipBytes(addr ?? '');
  const prefix = Number(len);
  if (ip === undefined || !Number.isInteger(prefix)) return undefined;
  return { family: ip.family, bytes: ip.bytes, prefix };
}

function inCidr(ip: { family: 4 | 6; bytes: Buffer }, c: Cidr): boolean {
  if (ip.family !== c.family) return false;
  let bits = c.prefix;
  for (let i = 0; bits > 0; i++, bits -= 8) {
    const mask = bits >= 8 ? 0xff : (0xff << (8 - bits)) & 0xff;
    if (((ip.bytes[i] as number) & mask) !== ((c.bytes[i] as number) & mask)) return false;
  }
  return true;
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** Whether a subject attribute names a role. */
function asRole(v: string | undefined): Role | undefined {
  return v === 'viewer' || v === 'operator' || v === 'admin' ? v : undefined;
}

/** The authenticator of one generation's control API settings. Rebuilt on activation. */
export class Authenticator {
  private readonly tokens: TokenEntry[] = [];
  private readonly cidrs: Cidr[] | undefined;
  private readonly mtlsIdentity: { roleAttribute: 'OU' | 'O' | 'CN' } | undefined;

  constructor(config: NormalizedConfig, material: ResolvedMaterial) {
    const api = config.observability.control_api;
    const legacy = material.secrets['observability.control_api.auth_token'];
    // SPEC: the legacy auth_token maps to a static admin identity.
    if (legacy !== undefined) this.tokens.push({ digest: digest(legacy.value), role: 'admin', actor: 'legacy-auth-token' });
    api.auth.bearer_tokens.forEach((t, i) => {
      const s = material.secrets[`observability.control_api.auth.bearer_tokens[${i}].token`];
      if (s !== undefined) this.tokens.push({ digest: digest(s.value), role: t.role, actor: t.actor_id });
    });
    this.cidrs = api.ip_allowlist?.cidrs.map(parseCidr).filter((c): c is Cidr => c !== undefined);
    this.mtlsIdentity = api.auth.identity_source === undefined ? undefined : { roleAttribute: api.auth.identity_source.role_attribute };
  }

  /** Whether the source address passes the allowlist (true when none is configured). */
  sourceAllowed(address: string | undefined): boolean {
    if (this.cidrs === undefined) return true;
    const ip = ipBytes(address ?? '');
    return ip !== undefined && this.cidrs.some((c) => inCidr(ip, c));
  }

  /** Finds the token's entry; every entry is compared so the time does not depend on which matched. */
  private tokenEntry(presented: string): TokenEntry | undefined {
    const d = digest(presented);
    let found: TokenEntry | undefined;
    for (const t of this.tokens) if (timingSafeEqual(d, t.digest) && found === undefined) found = t;
    return found;
  }

  /** The identity carried by a verified client certificate, if the config maps one. */
  private certificateIdentity(socket: TLSSocket): { actor: string; role: Role | undefined } | undefined {
    if (this.mtlsIdentity === undefined || !socket.authorized) return undefined;
    const cert = socket.getPeerCertificate();
    if (cert === null || Object.keys(cert).length === 0) return undefined;
    const subject = cert.subject as unknown as Record<string, string | string[] | undefined>;
    const pick = (k: string): string | undefined => {
      const v = subject[k];
      return Array.isArray(v) ? v[0] : v;
    };
    return { actor: pick('CN') ?? 'unknown', role: asRole(pick(this.mtlsIdentity.roleAttribute)) };
  }

  /**
   * Authenticates a request and checks `need`. `authorization` is the raw header (never logged).
   * With both a client identity and a token, the token decides the role (mTLS plus bearer shape).
   */
  decide(socket: TLSSocket, remoteAddress: string | undefined, authorization: string | undefined, need: Role | undefined): AuthDecision {
    if (!this.sourceAllowed(remoteAddress)) return { ok: false, status: 403, reason: 'source_ip_not_allowed' };
    if (need === undefined) return { ok: true, identity: { actor: 'anonymous', role: 'viewer', authn: 'bearer' } };
    const cert = this.certificateIdentity(socket);
    let identity: Identity | undefined;
    if (authorization !== undefined) {
      const m = /^Bearer[ \t]+(\S{1,4096})\s*$/i.exec(authorization);
      const entry = m === null ? undefined : this.tokenEntry(m[1] as string);
      if (entry === undefined) return { ok: false, status: 401, reason: 'invalid_bearer_token' };
      identity = { actor: entry.actor, role: entry.role, authn: cert !== undefined ? 'mtls+bearer' : 'bearer' };
    } else if (cert?.role !== undefined) {
      identity = { actor: cert.actor, role: cert.role, authn: 'mtls' };
    }
    if (identity === undefined) return { ok: false, status: 401, reason: 'missing_authentication' };
    if (!roleAtLeast(identity.role, need)) return { ok: false, status: 403, reason: 'insufficient_role', identity };
    return { ok: true, identity };
  }
}
