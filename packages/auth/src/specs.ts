// The JWKS sources a configuration names: one per distinct (URL, trust) pair, whichever pools
// share it. The supervisor runs these; a worker finds its pool's source by the same id.
import type { NormalizedUpstream, ResolvedConfig } from '@edge-proxy/config';
import { jwksSourceId } from './source-id.ts';
import type { JwksSourceSpec } from './types.ts';

/** The trust an `https://` JWKS or authorization URL of `pool` is verified with: the pool's upstream CA. */
export function poolCaPems(resolved: ResolvedConfig, pool: NormalizedUpstream): readonly string[] | undefined {
  return resolved.material.upstream_ca[pool.name]?.pems;
}

/** The JWKS source of `pool`, or undefined when it has none. */
export function poolJwksSpec(resolved: ResolvedConfig, pool: NormalizedUpstream): JwksSourceSpec | undefined {
  const jwks = pool.auth?.jwt?.jwks;
  if (jwks === undefined) return undefined;
  const caPems = poolCaPems(resolved, pool);
  return {
    id: jwksSourceId(jwks.url, caPems),
    url: jwks.url,
    refreshIntervalMs: jwks.refresh_interval_ms,
    timeoutMs: jwks.timeout_ms,
    staleAfterMs: jwks.stale_after_ms,
    unknownKidCooldownMs: jwks.unknown_kid_cooldown_ms,
    ...(caPems === undefined ? {} : { caPems }),
  };
}

/**
 * Every JWKS source of a configuration, once each. Pools naming the same URL under the same trust
 * share one source; its timings are those of the first such pool in document order.
 */
export function jwksSourceSpecs(resolved: ResolvedConfig): JwksSourceSpec[] {
  const out = new Map<string, JwksSourceSpec>();
  for (const pool of Object.values(resolved.config.upstream)) {
    const spec = poolJwksSpec(resolved, pool);
    if (spec !== undefined && !out.has(spec.id)) out.set(spec.id, spec);
  }
  return [...out.values()];
}
