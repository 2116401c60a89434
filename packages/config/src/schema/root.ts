// The whole configuration document (SPEC "Configuration (YAML)": top-level keys).
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Defaulted, Enum, Obj, POOL_NAME, Rec } from './common.ts';
import { Listener } from './listener.ts';
import { DefaultRequestAuth, LoadBalancing, Upstream, UpstreamTlsGlobal } from './upstream.ts';
import { Performance } from './performance.ts';
import { Resilience } from './resilience.ts';
import { Observability } from './observability.ts';

export const Log = Obj(
  {
    level: Enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal'], { default: 'info', description: 'log level (live-activatable)' }),
    format: Enum(['json', 'plain'], { default: 'json', description: 'line format; restart required' }),
    file: Type.Optional(Type.String({ minLength: 1, description: 'append to this file instead of stdout; restart required. `edge-proxy -c` checks that the user running it can append to it or create it (directory exists and is writable); `serve` refuses to start with `EDGE_STARTUP_LOG_FILE` when it cannot open it', 'x-example': '/var/log/edge-proxy/edge-proxy.log' })),
  },
  { description: 'logging' },
);

export const Security = Obj(
  {
    user: Type.Optional(
      Type.String({
        pattern: '^[a-z_][a-z0-9_-]*[$]?$',
        maxLength: 32,
        description:
          "user every worker switches to (with the user's supplementary groups) once it has bound every listener; the supervisor stays as started. Must exist on the host (EDGE_STARTUP_ACCOUNT, also reported by `edge-proxy -c`); a start that is neither root nor already this user fails (EDGE_STARTUP_PRIVILEGE)",
        'x-example': 'edge-proxy',
      }),
    ),
    group: Type.Optional(
      Type.String({
        pattern: '^[a-z_][a-z0-9_-]*[$]?$',
        maxLength: 32,
        description: "group every worker switches to after binding; default the user's primary group. Must exist on the host (EDGE_STARTUP_ACCOUNT)",
        'x-example': 'edge-proxy',
      }),
    ),
  },
  { description: 'privilege drop of the workers after binding (docs/operations.md, "Running as a service user"); a root start without `user` logs a warning' },
);

export const SecretProvider = Obj(
  {
    kind: Enum(['file'], { description: 'provider kind' }),
    base_dir: Type.String({ minLength: 1, description: 'directory that relative `file://` references resolve against', 'x-example': '/etc/edge-proxy/secrets' }),
  },
  { description: 'a secret provider' },
);

export const Secrets = Obj(
  {
    default_provider: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'provider used by references that name none', 'x-example': 'local' })),
    providers: Rec('^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$', SecretProvider, { default: {}, description: 'named secret providers' }),
  },
  { description: 'secret provider registry' },
);

/** The configuration document. */
export const ConfigSchema = Obj(
  {
    version: Type.Integer({ default: 1, description: 'schema version; only 1 is supported' }),
    listen: Type.Optional(Listener),
    listeners: Type.Array(Listener, { maxItems: 64, default: [], description: 'when non-empty, the only effective listeners (`listen` is ignored)' }),
    upstream_tls: Defaulted(UpstreamTlsGlobal),
    upstream: Rec(POOL_NAME, Upstream, { description: 'named upstream pools', 'x-example': {} }),
    default_auth: Type.Optional(DefaultRequestAuth),
    load_balancing: Defaulted(LoadBalancing),
    log: Defaulted(Log),
    performance: Defaulted(Performance),
    resilience: Defaulted(Resilience),
    observability: Defaulted(Observability),
    security: Defaulted(Security),
    secrets: Defaulted(Secrets),
  },
  { description: 'edge-proxy configuration' },
);

/** The document after schema defaults (before normalization). */
export type RawConfig = Static<typeof ConfigSchema>;
export type LogConfig = Static<typeof Log>;
export type SecretsConfig = Static<typeof Secrets>;
