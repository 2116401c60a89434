// Resolution: the I/O half of loading. Reads every secret reference eagerly and every certificate,
// key and CA file; checks PEM, key/certificate pairs and SNI coverage; computes fingerprints.
// A failure here fails validate/activate before the candidate goes live (SPEC "Secret references").
import { readdir } from 'node:fs/promises';
import { describeReadFailure, readBoundedFile } from './source-file.ts';
import path from 'node:path';
import type { X509Certificate } from 'node:crypto';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';
import { fingerprint, keyedFingerprint, notAfterUnixSeconds, parseCertificates, parsePrivateKey, subjectAltNames } from './secrets/pem.ts';
import type { SecretSlot } from './secrets/refs.ts';
import type { NormalizedConfig } from './normalize.ts';
import type { ValidatedConfig } from './validate.ts';
import { MIN_TOKEN_LENGTH } from './rules/control-plane.ts';

/** A resolved secret: the value (only ever sent to workers) and what may be shown about it. */
export interface ResolvedSecret extends SecretSlot {
  readonly value: string;
  /** Keyed fingerprint of the value (`hmac-sha256:`): shows a rotation, reveals nothing offline. */
  readonly fingerprint: string;
  readonly kind: 'certificate' | 'private_key' | 'value';
  readonly not_after_unix_seconds?: number;
}

/** A certificate chain with its private key. */
export interface PemIdentity {
  readonly cert_pem: string;
  readonly key_pem: string;
  /** Keyed fingerprint (`hmac-sha256:`) over certificate and key bytes: it covers a private key. */
  readonly fingerprint: string;
  readonly not_after_unix_seconds: number;
  readonly subject_alt_names: readonly string[];
}

/** A trust bundle (CA certificates). */
export interface TrustBundle {
  readonly pems: readonly string[];
  readonly fingerprint: string;
}

/** TLS material of one listener. */
export interface ListenerMaterial {
  readonly default?: PemIdentity;
  readonly certificates: readonly { readonly server_name: string; readonly identity: PemIdentity }[];
  readonly client_ca?: TrustBundle;
}

/** Everything read from disk for one configuration. Holds secret bytes: only for workers, never for output. */
export interface ResolvedMaterial {
  readonly loaded_at_unix_ms: number;
  readonly secrets: Readonly<Record<string, ResolvedSecret>>;
  readonly listeners: Readonly<Record<string, ListenerMaterial>>;
  /** Effective CA trust per upstream pool (absent: system store). */
  readonly upstream_ca: Readonly<Record<string, TrustBundle>>;
  readonly control_api: { readonly identity?: PemIdentity; readonly client_ca?: TrustBundle };
}

/** A configuration ready to become a generation: normalized data plus resolved material. */
export interface ResolvedConfig {
  readonly config: NormalizedConfig;
  readonly material: ResolvedMaterial;
}

export type ResolveResult = { ok: true; value: ResolvedConfig } | { ok: false; issues: ConfigIssue[] };

/** Options of `resolveConfig`. */
export interface ResolveOptions {
  /** Clock for `loaded_at_unix_ms` (tests). */
  readonly now?: () => number;
  /**
   * Key of the fingerprints of secret values and private-key identities (HMAC-SHA256; see
   * `keyedFingerprint`). Default: a random key made once per process.
   */
  readonly fingerprintKey?: Uint8Array;
}

class Collector {
  readonly issues: ConfigIssue[] = [];
  private readonly cache: Map<string, Promise<string | Error>>;
  private readonly baseDir: string;
  private readonly fingerprintKey: Uint8Array | undefined;
  constructor(baseDir: string, fingerprintKey: Uint8Array | undefined, cache = new Map<string, Promise<string | Error>>()) {
    this.baseDir = baseDir;
    this.fingerprintKey = fingerprintKey;
    this.cache = cache;
  }
  /**
   * Runs `fn` for every item at once, each with a collector of its own (sharing the file cache),
   * and keeps their issues in the items' order: the order of the errors an operator reads does
   * not depend on which file read finished first.
   */
  async inOrder<T, R>(items: readonly T[], fn: (c: Collector, item: T, index: number) => Promise<R>): Promise<R[]> {
    const forks = items.map(() => new Collector(this.baseDir, this.fingerprintKey, this.cache));
    const results = await Promise.all(items.map((item, i) => fn(forks[i] as Collector, item, i)));
    for (const f of forks) this.issues.push(...f.issues);
    return results;
  }
  /** The keyed fingerprint of secret bytes (see `keyedFingerprint`). */
  secretFingerprint(content: string): string {
    return keyedFingerprint(content, this.fingerprintKey);
  }
  abs(p: string): string {
    return path.resolve(this.baseDir, p);
  }
  /** Reads a file once per resolution (the same CA may be named by many pools). */
  read(file: string): Promise<string | Error> {
    let pending = this.cache.get(file);
    if (pending === undefined) {
      // Bounded and non-blocking: a FIFO or device named as a certificate cannot stall an activation.
      pending = readBoundedFile(file).then((r) => (r.ok ? r.bytes.toString('utf8') : Object.assign(new Error(describeReadFailure(r.failure)), { describe: describeReadFailure(r.failure) })));
      this.cache.set(file, pending);
    }
    return pending;
  }
}

function describeReadError(e: Error): string {
  const described = (e as { describe?: string }).describe;
  if (described !== undefined) return described;
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' ? 'no such file' : code === 'EACCES' ? 'permission denied' : code === 'EISDIR' ? 'is a directory' : (code ?? 'unreadable');
}

async function readIdentity(c: Collector, at: string, certPath: string, keyPath: string): Promise<{ identity: PemIdentity; x509: X509Certificate } | undefined> {
  const [cert, key] = await Promise.all([c.read(c.abs(certPath)), c.read(c.abs(keyPath))]);
  let ok = true;
  if (cert instanceof Error) {
    c.issues.push(issue(`${at}.cert`, 'EDGE_CONFIG_TLS_UNREADABLE', `certificate ${certPath}: ${describeReadError(cert)}`));
    ok = false;
  }
  if (key instanceof Error) {
    c.issues.push(issue(`${at}.key`, 'EDGE_CONFIG_TLS_UNREADABLE', `key ${keyPath}: ${describeReadError(key)}`));
    ok = false;
  }
  if (!ok || typeof cert !== 'string' || typeof key !== 'string') return undefined;
  const chain = parseCertificates(cert);
  const keyObj = parsePrivateKey(key);
  if (chain === undefined || chain.length === 0) c.issues.push(issue(`${at}.cert`, 'EDGE_CONFIG_TLS_INVALID_MATERIAL', `${certPath} holds no well-formed PEM certificate`));
  if (keyObj === undefined) c.issues.push(issue(`${at}.key`, 'EDGE_CONFIG_TLS_INVALID_MATERIAL', `${keyPath} holds no well-formed PEM private key`));
  if (chain === undefined || chain.length === 0 || keyObj === undefined) return undefined;
  const leaf = chain[0] as X509Certificate;
  if (!leaf.checkPrivateKey(keyObj)) {
    c.issues.push(issue(`${at}.key`, 'EDGE_CONFIG_TLS_KEY_MISMATCH', `${keyPath} is not the private key of ${certPath}`));
    return undefined;
  }
  return {
    identity: { cert_pem: cert, key_pem: key, fingerprint: c.secretFingerprint(cert + key), not_after_unix_seconds: notAfterUnixSeconds(leaf), subject_alt_names: subjectAltNames(leaf) },
    x509: leaf,
  };
}

async function readTrust(c: Collector, at: string, file: string | undefined, dir: string | undefined): Promise<TrustBundle | undefined> {
  const pems: string[] = [];
  const sources: { at: string; file: string }[] = [];
  if (file !== undefined) sources.push({ at: `${at}.ca_file`, file: c.abs(file) });
  if (dir !== undefined) {
    const abs = c.abs(dir);
    try {
      const names = (await readdir(abs)).filter((n) => n.endsWith('.pem')).sort();
      if (names.length === 0) c.issues.push(issue(`${at}.ca_dir`, 'EDGE_CONFIG_TLS_INVALID_MATERIAL', `${dir} holds no *.pem file`));
      for (const n of names) sources.push({ at: `${at}.ca_dir`, file: path.join(abs, n) });
    } catch (e) {
      c.issues.push(issue(`${at}.ca_dir`, 'EDGE_CONFIG_TLS_UNREADABLE', `${dir}: ${describeReadError(e as Error)}`));
    }
  }
  if (sources.length === 0) return undefined;
  let ok = true;
  for (const s of sources) {
    const content = await c.read(s.file);
    if (content instanceof Error) {
      c.issues.push(issue(s.at, 'EDGE_CONFIG_TLS_UNREADABLE', `${path.basename(s.file)}: ${describeReadError(content)}`));
      ok = false;
    } else if (parseCertificates(content) === undefined) {
      c.issues.push(issue(s.at, 'EDGE_CONFIG_TLS_INVALID_MATERIAL', `${path.basename(s.file)} holds no well-formed PEM certificate`));
      ok = false;
    } else {
      pems.push(content);
    }
  }
  return ok ? { pems, fingerprint: fingerprint(pems.join('\n')) } : undefined;
}

/** The key as the file spells it: `client_key_ref` for a reference, `client_key` for an inline value. */
export function writtenSecretPath(slot: SecretSlot): string {
  return slot.source_kind === 'inline' ? slot.path : `${slot.path}_ref`;
}

async function resolveSecret(c: Collector, slot: SecretSlot, v: ValidatedConfig): Promise<ResolvedSecret | undefined> {
  const at = writtenSecretPath(slot);
  const source = v.secretSources.get(slot.path);
  if (source === undefined) return undefined;
  let value: string;
  if (source.kind === 'file') {
    const content = await c.read(source.file);
    if (content instanceof Error) {
      c.issues.push(issue(at, 'EDGE_CONFIG_SECRET_UNREADABLE', `${slot.reference}: ${describeReadError(content)}`));
      return undefined;
    }
    value = content;
  } else {
    value = source.value;
  }
  // Token-like values are commonly written with a trailing newline; PEM keeps its bytes as they are.
  const isPem = slot.field === 'client_certificate' || slot.field === 'client_key';
  if (!isPem) value = value.replace(/\r?\n$/, '');
  if (value.trim().length === 0) {
    c.issues.push(issue(at, 'EmptySecret', `${slot.reference}: the secret is empty`));
    return undefined;
  }
  const base = { ...slot, value, fingerprint: c.secretFingerprint(value) };
  if (slot.field === 'client_certificate') {
    const chain = parseCertificates(value);
    if (chain === undefined || chain.length === 0) {
      c.issues.push(issue(at, 'MalformedPemCertificate', `${slot.reference}: not a well-formed PEM certificate`));
      return undefined;
    }
    return { ...base, kind: 'certificate', not_after_unix_seconds: notAfterUnixSeconds(chain[0] as X509Certificate) };
  }
  if (slot.field === 'client_key') {
    if (parsePrivateKey(value) === undefined) {
      c.issues.push(issue(at, 'MalformedPemPrivateKey', `${slot.reference}: not a well-formed PEM private key`));
      return undefined;
    }
    return { ...base, kind: 'private_key' };
  }
  const isToken = slot.field === 'token' || slot.path === 'observability.control_api.auth_token';
  if (isToken && source.kind === 'file' && value.length < MIN_TOKEN_LENGTH) {
    c.issues.push(issue(at, 'EDGE_CONFIG_TOKEN_WEAK', `tokens need at least ${MIN_TOKEN_LENGTH} characters`));
    return undefined;
  }
  return { ...base, kind: 'value' };
}

/** Upstream client certificate/key pairs: both or neither, and the key must belong to the certificate. */
function checkClientPairs(c: Collector, config: NormalizedConfig, secrets: Record<string, ResolvedSecret>): void {
  const checked = new Set<string>();
  for (const pool of Object.values(config.upstream)) {
    const { client_certificate_slot: certSlot, client_key_slot: keySlot } = pool.tls;
    const pairKey = `${certSlot ?? ''}|${keySlot ?? ''}`;
    if (checked.has(pairKey)) continue;
    checked.add(pairKey);
    if ((certSlot === undefined) !== (keySlot === undefined)) {
      c.issues.push(issue(`upstream.${pool.name}.tls`, 'EDGE_CONFIG_TLS_PARTIAL_PAIR', 'an upstream client identity needs both client_certificate and client_key'));
      continue;
    }
    const cert = certSlot === undefined ? undefined : secrets[certSlot];
    const key = keySlot === undefined ? undefined : secrets[keySlot];
    if (cert === undefined || key === undefined) continue;
    const leaf = parseCertificates(cert.value)?.[0];
    const keyObj = parsePrivateKey(key.value);
    if (leaf !== undefined && keyObj !== undefined && !leaf.checkPrivateKey(keyObj)) {
      c.issues.push(issue(writtenSecretPath(key), 'EDGE_CONFIG_SECRET_KEY_MISMATCH', `${key.reference} is not the private key of ${cert.reference}`));
    }
  }
}

/** Reads and checks everything a validated configuration refers to. Never throws for bad files. */
export async function resolveConfig(v: ValidatedConfig, options: ResolveOptions = {}): Promise<ResolveResult> {
  const c = new Collector(v.baseDir, options.fingerprintKey);
  const { config } = v;
  const secrets: Record<string, ResolvedSecret> = {};
  for (const s of await c.inOrder(config.secret_slots, (sc, slot) => resolveSecret(sc, slot, v))) {
    if (s !== undefined) secrets[s.path] = s;
  }
  checkClientPairs(c, config, secrets);

  const listeners: Record<string, ListenerMaterial> = {};
  await c.inOrder(config.listeners, async (lc, l, i) => {
    const at = `${v.listenerPaths?.[i] ?? `listeners[${i}]`}.tls`;
    const tls = l.tls;
    const def = tls.cert !== undefined && tls.key !== undefined ? await readIdentity(lc, at, tls.cert, tls.key) : undefined;
    const certificates: { server_name: string; identity: PemIdentity }[] = [];
    await lc.inOrder(tls.certificates, async (ec, entry, j) => {
      const eat = `${at}.certificates[${j}]`;
      const r = await readIdentity(ec, eat, entry.cert, entry.key);
      if (r === undefined) return;
      if (r.x509.checkHost(entry.server_name) === undefined) {
        ec.issues.push(issue(`${eat}.server_name`, 'EDGE_CONFIG_TLS_SAN_MISMATCH', `'${entry.server_name}' is not covered by the SANs of ${entry.cert} (${r.identity.subject_alt_names.join(', ') || 'none'})`));
        return;
      }
      certificates[j] = { server_name: entry.server_name, identity: r.identity };
    });
    const client_ca = tls.client_auth === undefined ? undefined : await readTrust(lc, `${at}.client_auth`, tls.client_auth.ca_file, undefined);
    listeners[l.name] = {
      ...(def === undefined ? {} : { default: def.identity }),
      certificates: certificates.filter((x) => x !== undefined),
      ...(client_ca === undefined ? {} : { client_ca }),
    };
  });

  const upstream_ca: Record<string, TrustBundle> = {};
  for (const pool of Object.values(config.upstream)) {
    const t = pool.tls;
    const bundle = await readTrust(c, `upstream.${pool.name}.tls`, t.ca_file, t.ca_dir);
    if (bundle !== undefined) upstream_ca[pool.name] = bundle;
  }

  const api = config.observability.control_api;
  const control_api: { identity?: PemIdentity; client_ca?: TrustBundle } = {};
  if (api.enabled) {
    if (api.tls.cert !== undefined || api.tls.key !== undefined) {
      if (api.tls.cert === undefined || api.tls.key === undefined) {
        c.issues.push(issue('observability.control_api.tls', 'EDGE_CONFIG_TLS_PARTIAL_PAIR', '`cert` and `key` must be given together'));
      } else {
        const r = await readIdentity(c, 'observability.control_api.tls', api.tls.cert, api.tls.key);
        if (r !== undefined) control_api.identity = r.identity;
      }
    } else {
      const first = config.listeners[0];
      const m = first === undefined ? undefined : listeners[first.name];
      const identity = m?.default ?? m?.certificates[0]?.identity;
      if (identity !== undefined) control_api.identity = identity;
    }
    if (api.tls.client_auth !== undefined) {
      const ca = await readTrust(c, 'observability.control_api.tls.client_auth', api.tls.client_auth.ca_file, undefined);
      if (ca !== undefined) control_api.client_ca = ca;
    }
  }

  if (c.issues.length > 0) return { ok: false, issues: c.issues };
  const now = options.now ?? Date.now;
  return { ok: true, value: { config, material: { loaded_at_unix_ms: now(), secrets, listeners, upstream_ca, control_api } } };
}

/** What may be shown about resolved secrets (runtime snapshot `secrets.material`): never values or full paths. */
export function publicSecretMaterial(material: ResolvedMaterial): {
  path: string;
  source_kind: string;
  reference: string;
  fingerprint: string;
  last_loaded_at_unix_ms: number;
  last_reload_status: 'ok';
  expiry_not_after_unix_seconds?: number;
}[] {
  return Object.values(material.secrets).map((s) => ({
    path: s.path,
    source_kind: s.source_kind,
    reference: s.reference,
    fingerprint: s.fingerprint,
    last_loaded_at_unix_ms: material.loaded_at_unix_ms,
    last_reload_status: 'ok' as const,
    ...(s.not_after_unix_seconds === undefined ? {} : { expiry_not_after_unix_seconds: s.not_after_unix_seconds }),
  }));
}
