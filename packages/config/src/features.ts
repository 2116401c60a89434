// Features the configuration can describe but the service does not carry out yet, declared once.
//
// Two kinds, so no key validates and silently does nothing:
// - `refused`: turning the feature on is a validation error (EDGE_CONFIG_NOT_BUILT). These are
//   protections an operator relies on to keep traffic out, or behaviour that would change what is
//   sent (a response header): accepting them would fail open, so the configuration is refused, at
//   startup and at activation alike. Request authentication (`upstream.*.auth`) was the first such
//   protection and was built with issue 16; span export (`observability.tracing`) with issue 17.
// - `inactive`: features the specification enables by default, and limits with a default, that
//   nothing enforces yet. Refusing their defaults would refuse every spec-shaped configuration, so
//   they validate, and `edge-proxy -c`, the log at start and the runtime snapshot report them as
//   "not active yet" instead of letting an operator believe in them. None is left: the last ones
//   (the retry budget, request body replay, the response prebuffer) were built with issue 14; the
//   reporting stays, for the next feature that needs it.
// An entry leaves this file in the change that builds the feature.
import type { RawConfig } from './schema/root.ts';
import { issue } from './errors.ts';
import type { ConfigIssue } from './errors.ts';

/** A feature the configuration enables but the service does not enforce yet. */
export interface InactiveFeature {
  /** Configuration path of the feature's block, e.g. `resilience.circuit_breaker`. */
  readonly path: string;
  /** What an operator would expect it to do, and what happens instead. */
  readonly message: string;
}

type Doc = Partial<RawConfig> | undefined;

const REFUSAL = 'is not built yet; the configuration is refused rather than run without it (fail closed)';

/**
 * Configuration blocks of the features above, for the reference (docs/configuration.md marks their
 * keys instead of calling them `live`). `inactiveFeatures` of the defaults reports exactly
 * `NOT_ACTIVE_PATHS` (packages/config/test/rules.test.ts).
 */
export const NOT_ACTIVE_PATHS: readonly string[] = [];
export const NOT_BUILT_PATHS: readonly string[] = ['observability.routing.expose_header', 'observability.routing.header_name', 'resilience.protocol.allow_connect', 'resilience.protocol.connect_allowed_ports', 'resilience.protocol.connect_allowed_authorities'];
/**
 * Keys every value of which is refused by a validation rule with its own code (kept in the schema
 * so that the refusal names them): `restart_hook` (EDGE_CONFIG_WATCHDOG_RESTART_HOOK, use
 * `restart_command`).
 */
export const REFUSED_PATHS: readonly string[] = ['resilience.watchdog.restart_hook'];

/** Issues for every enabled feature that is refused until built. Reads a possibly malformed document. */
export function unbuiltFeatureIssues(doc: Doc): ConfigIssue[] {
  const out: ConfigIssue[] = [];
  if (doc?.observability?.routing?.expose_header === true) out.push(issue('observability.routing.expose_header', 'EDGE_CONFIG_NOT_BUILT', `the route-decision response header ${REFUSAL}`));
  // CONNECT tunnelling (the tunnels issue, #42): until it is built every CONNECT is answered 405
  // by the protocol policy. Turning it on, or listing what it would allow, would otherwise validate
  // and do nothing (or, as before, route a CONNECT to a pool as a plain request).
  const p = doc?.resilience?.protocol;
  if (p?.allow_connect === true) out.push(issue('resilience.protocol.allow_connect', 'EDGE_CONFIG_NOT_BUILT', `CONNECT tunnelling ${REFUSAL}; every CONNECT is answered 405`));
  for (const key of ['connect_allowed_ports', 'connect_allowed_authorities'] as const) {
    const v = p?.[key] as unknown;
    if (Array.isArray(v) && v.length > 0) out.push(issue(`resilience.protocol.${key}`, 'EDGE_CONFIG_NOT_BUILT', `a CONNECT allowlist only matters with CONNECT tunnelling, which ${REFUSAL}`));
  }
  return out;
}

/** Enabled-by-default features that a valid configuration turns on but nothing enforces yet (none today). */
export function inactiveFeatures(_config: Pick<RawConfig, 'resilience' | 'performance'>): InactiveFeature[] {
  return [];
}
