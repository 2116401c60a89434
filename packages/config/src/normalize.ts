// Normalization: the schema-defaulted document becomes the plain, frozen configuration that the
// rest of the product consumes. Precedence rules are applied here once:
// - `listeners` (when non-empty) replaces `listen`; every listener gets a name;
// - a pool's `load_balancing` replaces the global one; a pool's `tls` overrides `upstream_tls` field by field;
// - a backend's `health_check` replaces the pool's;
// - backend addresses are parsed into scheme, host and port.
import type { RawConfig } from './schema/root.ts';
import type { ListenerConfig } from './schema/listener.ts';
import type { BackendConfig, DefaultRequestAuthConfig, HealthCheckConfig, LoadBalancingConfig, UpstreamConfig, UpstreamTlsConfig } from './schema/upstream.ts';
import type { SecretSlot } from './secrets/refs.ts';

/** A parsed backend address. */
export interface BackendAddress {
  readonly scheme: 'http' | 'https';
  /** Host name or IP address (IPv6 without brackets). */
  readonly host: string;
  readonly port: number;
}

/** Parses `host`, `host:port`, `http://host[:port]` or `https://host[:port]`; `undefined` when malformed. */
export function parseBackendAddress(address: string): BackendAddress | undefined {
  const m = /^(?:(https?):\/\/)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?\/?$/.exec(address);
  if (m === null) return undefined;
  const scheme = (m[1] ?? 'http') as 'http' | 'https';
  const rawHost = m[2] as string;
  const host = rawHost.startsWith('[') ? rawHost.slice(1, -1) : rawHost;
  if (host.length === 0 || host.length > 253) return undefined;
  const port = m[3] === undefined ? (scheme === 'https' ? 443 : 80) : Number(m[3]);
  if (port < 1 || port > 65535) return undefined;
  return { scheme, host, port };
}

/** A listener after normalization: always named. */
export interface NormalizedListener extends ListenerConfig {
  readonly name: string;
}

/** Effective TLS policy of a pool toward its `https://` backends (global merged with the pool's). */
export interface EffectiveUpstreamTls {
  readonly verify_certificates: boolean;
  readonly strict_sni: boolean;
  readonly server_name?: string;
  readonly ca_file?: string;
  readonly ca_dir?: string;
  /** Path of the secret slot holding the client certificate (pool's own or `upstream_tls.client_certificate`). */
  readonly client_certificate_slot?: string;
  readonly client_key_slot?: string;
}

/** A backend after normalization. */
export interface NormalizedBackend extends BackendConfig, BackendAddress {}

/** A pool after normalization. */
export interface NormalizedUpstream extends Omit<UpstreamConfig, 'backends' | 'load_balancing' | 'tls' | 'health_check' | 'auth'> {
  readonly name: string;
  /**
   * The pool's effective request authentication: its own `auth`, else `default_auth`; absent when
   * it has none (no `auth` and no default, or `auth: { public: true }`).
   */
  readonly auth?: DefaultRequestAuthConfig;
  /** Document path of the block `auth` comes from (`upstream.<name>.auth` or `default_auth`): where its secret slots are. */
  readonly auth_at?: string;
  readonly backends: readonly NormalizedBackend[];
  readonly load_balancing: LoadBalancingConfig;
  readonly tls: EffectiveUpstreamTls;
}

/**
 * The normalized configuration: plain frozen data with every default filled in and every secret
 * replaced by a slot (see `secret_slots`), so it can be logged, diffed and serialized safely.
 */
export interface NormalizedConfig extends Omit<RawConfig, 'listen' | 'listeners' | 'upstream' | 'default_auth'> {
  readonly listeners: readonly NormalizedListener[];
  readonly upstream: Readonly<Record<string, NormalizedUpstream>>;
  /** Every secret field of the document, without values, in document order. */
  readonly secret_slots: readonly SecretSlot[];
}

/** Default name of a listener: `<address>:<port>` (IPv6 in brackets). */
export function listenerName(l: { address: string; port: number; name?: string | undefined }): string {
  if (l.name !== undefined) return l.name;
  return l.address.includes(':') ? `[${l.address}]:${l.port}` : `${l.address}:${l.port}`;
}

/** The effective listener set: `listeners` when non-empty, else `listen` (if any). */
export function effectiveListeners(doc: Pick<RawConfig, 'listen' | 'listeners'>): ListenerConfig[] {
  if (Array.isArray(doc.listeners) && doc.listeners.length > 0) return doc.listeners;
  return doc.listen === undefined ? [] : [doc.listen];
}

function effectiveTls(doc: RawConfig, name: string, pool: UpstreamConfig, slots: ReadonlySet<string>): EffectiveUpstreamTls {
  const g = doc.upstream_tls;
  const p: Partial<UpstreamTlsConfig> = pool.tls ?? {};
  const pick = (field: 'client_certificate' | 'client_key'): string | undefined => {
    const own = `upstream.${name}.tls.${field}`;
    if (slots.has(own)) return own;
    const global = `upstream_tls.${field}`;
    return slots.has(global) ? global : undefined;
  };
  const out: Record<string, unknown> = {
    verify_certificates: p.verify_certificates ?? g.verify_certificates,
    strict_sni: p.strict_sni ?? g.strict_sni,
    server_name: p.server_name ?? g.server_name,
    ca_file: p.ca_file ?? g.ca_file,
    ca_dir: p.ca_dir ?? g.ca_dir,
    client_certificate_slot: pick('client_certificate'),
    client_key_slot: pick('client_key'),
  };
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out as unknown as EffectiveUpstreamTls;
}

/**
 * A pool's effective authentication: its own `auth` replaces `default_auth` as a whole;
 * `public: true` (validated to stand alone) leaves it without. `default_auth` itself is folded
 * into the pools here and not kept: the diff and the snapshot show each pool's effective checks.
 */
function effectiveAuth(doc: RawConfig, name: string, pool: UpstreamConfig): { auth?: DefaultRequestAuthConfig; auth_at?: string } {
  const own = pool.auth;
  if (own !== undefined) {
    if (own.public === true || (own.jwt === undefined && own.external === undefined)) return {};
    const { public: _public, ...checks } = own;
    return { auth: checks, auth_at: `upstream.${name}.auth` };
  }
  return doc.default_auth === undefined ? {} : { auth: doc.default_auth, auth_at: 'default_auth' };
}

function normalizeBackend(b: BackendConfig, poolCheck: HealthCheckConfig | undefined): NormalizedBackend {
  const addr = parseBackendAddress(b.address) as BackendAddress; // checked by the address rule
  const health_check = b.health_check ?? poolCheck;
  return { ...b, ...(health_check === undefined ? {} : { health_check }), ...addr };
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}

/** Builds the normalized config from a schema-valid, rule-clean, secret-extracted document. */
export function normalize(doc: RawConfig, slots: readonly SecretSlot[]): NormalizedConfig {
  const slotPaths = new Set(slots.map((s) => s.path));
  const { listen: _listen, listeners: _listeners, upstream, default_auth: _defaultAuth, ...rest } = doc;
  const listeners = effectiveListeners(doc).map((l) => ({ ...l, name: listenerName(l) }));
  const pools: Record<string, NormalizedUpstream> = {};
  for (const [name, pool] of Object.entries(upstream)) {
    const { backends, load_balancing, tls: _tls, health_check, auth: _auth, ...poolRest } = pool;
    pools[name] = {
      ...poolRest,
      ...effectiveAuth(doc, name, pool),
      name,
      backends: backends.map((b) => normalizeBackend(b, health_check)),
      load_balancing: load_balancing ?? doc.load_balancing,
      tls: effectiveTls(doc, name, pool, slotPaths),
    };
  }
  const adaptive = rest.resilience.adaptive_admission;
  const resilience = {
    ...rest.resilience,
    adaptive_admission: { ...adaptive, max_limit: adaptive.max_limit ?? rest.performance.global_inflight_limit },
  };
  return deepFreeze({ ...rest, resilience, listeners, upstream: pools, secret_slots: [...slots] });
}
