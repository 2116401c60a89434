// Which connection the control API gives up when a new one arrives at a limit (pure; the guard
// owns the sockets). Connections that have authenticated a request ("proven") are never given up
// for a newcomer; among the others the oldest goes: at the per-source limit the newcomer's own
// source pays, at the global limit the source holding the most connections does. So idle or
// half-open connections, however many one address opens, cannot keep an administrator out: a new
// connection from anywhere displaces the oldest unproven one, and a connection that has proven
// itself keeps its place.

/** What the policy needs to know about an open connection. */
export interface ConnectionView {
  readonly id: number;
  readonly source: string;
  readonly openedAt: number;
  readonly proven: boolean;
}

export interface AdmissionLimits {
  readonly maxConnections: number;
  readonly maxPerSource: number;
}

export type AdmissionDecision = { readonly admit: true; readonly evict?: number; readonly limit?: 'per_source' | 'global' } | { readonly admit: false; readonly limit: 'per_source' | 'global' };

function oldestUnproven(open: readonly ConnectionView[], source: string | undefined): ConnectionView | undefined {
  let victim: ConnectionView | undefined;
  for (const c of open) {
    if (c.proven || (source !== undefined && c.source !== source)) continue;
    if (victim === undefined || c.openedAt < victim.openedAt || (c.openedAt === victim.openedAt && c.id < victim.id)) victim = c;
  }
  return victim;
}

/** Decides on a new connection from `source` given the open ones. */
export function admitConnection(open: readonly ConnectionView[], source: string, limits: AdmissionLimits): AdmissionDecision {
  const perSource = new Map<string, number>();
  for (const c of open) perSource.set(c.source, (perSource.get(c.source) ?? 0) + 1);
  if ((perSource.get(source) ?? 0) >= limits.maxPerSource) {
    const victim = oldestUnproven(open, source);
    return victim === undefined ? { admit: false, limit: 'per_source' } : { admit: true, evict: victim.id, limit: 'per_source' };
  }
  if (open.length >= limits.maxConnections) {
    // The sources by how many connections they hold, most first; the first with an unproven one pays.
    const bySize = [...perSource.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    for (const [s] of bySize) {
      const victim = oldestUnproven(open, s);
      if (victim !== undefined) return { admit: true, evict: victim.id, limit: 'global' };
    }
    return { admit: false, limit: 'global' };
  }
  return { admit: true };
}
