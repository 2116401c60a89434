// The domain diff of two resolved configurations: which keys changed, grouped by domain, each
// classified live-activatable or restart-required, plus the per-pool `backend_policies` entries
// with `secret_material_changed`. Paths only: a diff never carries a value, so it never leaks one.
import { addedListenerNeedsRestart, classifySchemaPath, LISTENER_REMOVAL_REASON, PRIVILEGED_LISTENER_REASON } from './activation.ts';
import type { Activation } from './activation.ts';
import type { ResolvedConfig } from './resolve.ts';
import type { NormalizedConfig, NormalizedUpstream } from './normalize.ts';

/** Domains of the diff (SPEC: "Diff domains include `backend_policies`"). */
export const DIFF_DOMAINS = [
  'listeners',
  'routes',
  'upstreams',
  'backends',
  'load_balancing',
  'upstream_tls',
  'backend_policies',
  'resilience',
  'performance',
  'log',
  'observability',
  'security',
  'secrets',
] as const;
export type DiffDomain = (typeof DIFF_DOMAINS)[number];

/** One changed key. `material` marks a change of the bytes behind an unchanged reference or path. */
export interface FieldChange {
  readonly path: string;
  readonly change: 'added' | 'removed' | 'modified';
  readonly activation: Activation;
  readonly reason?: string;
  readonly material?: true;
}

/** Per-pool entry of the `backend_policies` domain. */
export interface BackendPolicyChange {
  readonly upstream: string;
  /** The TLS material (client certificate, key or CA trust) differs, same reference or not. */
  readonly secret_material_changed: boolean;
  /** The client identity (certificate/key fingerprint) differs: connections need a new pool. */
  readonly client_identity_changed: boolean;
  /** The pool's TLS policy keys differ. */
  readonly policy_changed: boolean;
}

export interface DomainDiff {
  readonly activation: Activation;
  readonly changes: readonly FieldChange[];
}

/** The diff between an active and a candidate configuration. */
export interface ConfigDiff {
  readonly changed: boolean;
  readonly restart_required: boolean;
  /** Only the domains that changed. */
  readonly domains: Partial<Record<DiffDomain, DomainDiff>>;
  readonly backend_policies: readonly BackendPolicyChange[];
  /** The restart-required changes: a candidate with any is not activatable. */
  readonly rejected_changes: readonly FieldChange[];
}

function domainOf(path: string): DiffDomain {
  const [head, , rawSection] = path.split('.');
  const section = rawSection?.replace(/\[.*$/, '');
  if (head === 'upstream') {
    if (section === 'route') return 'routes';
    if (section === 'backends' || section === 'health_check') return 'backends';
    if (section === 'load_balancing') return 'load_balancing';
    return 'upstreams';
  }
  if (head?.startsWith('listeners')) return 'listeners';
  if (head === 'secret_slots') return 'secrets';
  return (DIFF_DOMAINS as readonly string[]).includes(head ?? '') ? (head as DiffDomain) : 'secrets';
}

/** Concrete path → schema path: pool names become `*`, listener keys become `listeners[]`, indices `[]`. */
function schemaPathOf(path: string): string {
  return path
    .replace(/^upstream\.[^.]+/, 'upstream.*')
    .replace(/^listeners\[[^\]]*\]/, 'listeners[]')
    .replace(/\[\d+\]/g, '[]');
}

function change(path: string, kind: FieldChange['change'], material = false): FieldChange {
  const c = classifySchemaPath(schemaPathOf(path));
  return { path, change: kind, activation: c.activation, ...(c.reason === undefined ? {} : { reason: c.reason }), ...(material ? { material: true as const } : {}) };
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** Arrays whose items have identities, compared by key rather than by position. */
function keyedArray(path: string, items: unknown[]): Map<string, unknown> | undefined {
  const keyOf = (item: unknown): string | undefined => {
    if (!isObject(item)) return undefined;
    if (path === 'listeners') return typeof item['name'] === 'string' ? item['name'] : undefined;
    if (/^upstream\.[^.]+\.backends$/.test(path)) return typeof item['id'] === 'string' ? item['id'] : undefined;
    return undefined;
  };
  const keys = items.map(keyOf);
  if (keys.some((k) => k === undefined)) return undefined;
  return new Map(items.map((item, i) => [keys[i] as string, item]));
}

function walk(path: string, a: unknown, b: unknown, out: FieldChange[]): void {
  if (a === undefined && b === undefined) return;
  if (a === undefined) return void out.push(change(path, 'added'));
  if (b === undefined) return void out.push(change(path, 'removed'));
  if (Array.isArray(a) && Array.isArray(b)) {
    const ka = keyedArray(path, a);
    const kb = keyedArray(path, b);
    if (ka !== undefined && kb !== undefined) {
      for (const [k, v] of ka) walk(`${path}[${k}]`, v, kb.get(k), out);
      for (const [k, v] of kb) if (!ka.has(k)) walk(`${path}[${k}]`, undefined, v, out);
      return;
    }
    if (JSON.stringify(a) !== JSON.stringify(b)) out.push(change(path, 'modified'));
    return;
  }
  if (isObject(a) && isObject(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) walk(path === '' ? k : `${path}.${k}`, a[k], b[k], out);
    return;
  }
  if (a !== b) out.push(change(path, 'modified'));
}

function listenerChanges(changes: FieldChange[], after: Comparable): FieldChange[] {
  // A whole listener added is live (new sockets are bound at commit); a listener removed is restart-required.
  return changes.map((c) => {
    if (!/^listeners\[[^\]]+\]$/.test(c.path)) return c;
    if (c.change === 'removed') return { ...c, activation: 'restart_required', reason: LISTENER_REMOVAL_REASON };
    // ... unless the workers, which dropped privileges, could not bind its port (activation.ts).
    const added = after.listeners.find((l) => c.path === `listeners[${l.name}]`);
    if (added !== undefined && addedListenerNeedsRestart(after.security, added.port)) return { ...c, activation: 'restart_required', reason: PRIVILEGED_LISTENER_REASON };
    return { path: c.path, change: c.change, activation: 'live' };
  });
}

function materialChanges(before: ResolvedConfig, after: ResolvedConfig): FieldChange[] {
  const out: FieldChange[] = [];
  for (const [path, s] of Object.entries(after.material.secrets)) {
    const old = before.material.secrets[path];
    if (old !== undefined && old.reference === s.reference && old.fingerprint !== s.fingerprint) out.push(change(path, 'modified', true));
  }
  // A listener's material is reported at the key it came from, not at `tls`: `listeners[].tls` is
  // the parent of the restart-required `client_auth.mode`, and new certificate bytes are live
  // (docs/operations.md "Certificate rotation").
  for (const [name, m] of Object.entries(after.material.listeners)) {
    const old = before.material.listeners[name];
    if (old === undefined) continue;
    if (old.default?.fingerprint !== m.default?.fingerprint) out.push(change(`listeners[${name}].tls.cert`, 'modified', true));
    const sni = (x: typeof m): string => JSON.stringify(x.certificates.map((c) => c.identity.fingerprint));
    if (sni(old) !== sni(m)) out.push(change(`listeners[${name}].tls.certificates`, 'modified', true));
    if (old.client_ca?.fingerprint !== m.client_ca?.fingerprint) out.push(change(`listeners[${name}].tls.client_auth.ca_file`, 'modified', true));
  }
  for (const [pool, bundle] of Object.entries(after.material.upstream_ca)) {
    const old = before.material.upstream_ca[pool];
    if (old !== undefined && old.fingerprint !== bundle.fingerprint) out.push(change(`upstream.${pool}.tls.ca`, 'modified', true));
  }
  return out;
}

function clientFingerprints(r: ResolvedConfig, pool: NormalizedUpstream): string {
  const s = r.material.secrets;
  return `${s[pool.tls.client_certificate_slot ?? '']?.fingerprint ?? ''}|${s[pool.tls.client_key_slot ?? '']?.fingerprint ?? ''}`;
}

function backendPolicies(before: ResolvedConfig, after: ResolvedConfig): BackendPolicyChange[] {
  const out: BackendPolicyChange[] = [];
  for (const [name, pool] of Object.entries(after.config.upstream)) {
    const old: NormalizedUpstream | undefined = before.config.upstream[name];
    if (old === undefined) continue;
    const identityChanged = clientFingerprints(before, old) !== clientFingerprints(after, pool);
    const caChanged = before.material.upstream_ca[name]?.fingerprint !== after.material.upstream_ca[name]?.fingerprint;
    const policyChanged = JSON.stringify(old.tls) !== JSON.stringify(pool.tls);
    if (identityChanged || caChanged || policyChanged) {
      out.push({ upstream: name, secret_material_changed: identityChanged || caChanged, client_identity_changed: identityChanged, policy_changed: policyChanged });
    }
  }
  return out;
}

type Comparable = Omit<NormalizedConfig, 'secret_slots'>;

/** Diffs the active (`before`) and candidate (`after`) configurations. */
export function diffConfigs(before: ResolvedConfig, after: ResolvedConfig): ConfigDiff {
  const fields: FieldChange[] = [];
  const strip = ({ secret_slots: _s, ...rest }: NormalizedConfig): Comparable => rest;
  walk('', strip(before.config), strip(after.config), fields);
  // A secret slot whose reference changed is a modification of that key.
  const slotsBefore = new Map(before.config.secret_slots.map((s) => [s.path, s.reference]));
  const slotsAfter = new Map(after.config.secret_slots.map((s) => [s.path, s.reference]));
  for (const [path, ref] of slotsAfter) {
    if (!slotsBefore.has(path)) fields.push(change(path, 'added'));
    else if (slotsBefore.get(path) !== ref) fields.push(change(path, 'modified'));
  }
  for (const path of slotsBefore.keys()) if (!slotsAfter.has(path)) fields.push(change(path, 'removed'));
  // New bytes behind a key that itself changed (new paths, an added client_auth) say nothing more.
  const under = (path: string, key: string): boolean => path === key || path.startsWith(`${key}.`) || path.startsWith(`${key}[`);
  const written = [...fields];
  fields.push(...materialChanges(before, after).filter((m) => !written.some((f) => under(m.path, f.path))));

  const all = listenerChanges(fields, after.config);
  const domains: Partial<Record<DiffDomain, DomainDiff>> = {};
  const policies = backendPolicies(before, after);
  for (const c of all) {
    const d = domainOf(c.path);
    const current = domains[d];
    const changes = [...(current?.changes ?? []), c];
    domains[d] = { activation: changes.some((x) => x.activation === 'restart_required') ? 'restart_required' : 'live', changes };
  }
  if (policies.length > 0) {
    domains.backend_policies = {
      activation: 'live',
      changes: policies.map((p) => ({ path: `upstream.${p.upstream}.tls`, change: 'modified' as const, activation: 'live' as const, ...(p.secret_material_changed ? { material: true as const } : {}) })),
    };
  }
  const rejected = all.filter((c) => c.activation === 'restart_required');
  return { changed: all.length > 0 || policies.length > 0, restart_required: rejected.length > 0, domains, backend_policies: policies, rejected_changes: rejected };
}
