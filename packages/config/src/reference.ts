// The configuration reference (docs/configuration.md), generated from the schema so that every key,
// type, default, unit and activation class in the docs is the one the code enforces.
import { dump } from 'js-yaml';
import { ConfigSchema } from './schema/root.ts';
import { classifySchemaPath } from './activation.ts';
import { NOT_ACTIVE_PATHS, NOT_BUILT_PATHS } from './features.ts';

interface Node {
  type?: string | string[];
  description?: string;
  default?: unknown;
  enum?: unknown[];
  const?: unknown;
  properties?: Record<string, Node>;
  patternProperties?: Record<string, Node>;
  items?: Node;
  minimum?: number;
  maximum?: number;
  'x-unit'?: string;
  'x-example'?: unknown;
}

/** One documented key. */
export interface ReferenceRow {
  readonly path: string;
  readonly type: string;
  readonly default: string;
  readonly unit: string;
  readonly activation: string;
  readonly description: string;
  readonly example: string;
}

function typeOf(n: Node): string {
  if (n.enum !== undefined) return n.enum.map((v) => `\`${String(v)}\``).join(' \\| ');
  if (n.type === 'array') return `list of ${n.items === undefined ? 'values' : typeOf(n.items)}`;
  if (n.patternProperties !== undefined) return 'map';
  if (n.type === 'integer' || n.type === 'number') {
    const range = n.minimum !== undefined || n.maximum !== undefined ? ` ${n.minimum ?? ''}..${n.maximum ?? ''}` : '';
    return `${n.type}${range}`;
  }
  return typeof n.type === 'string' ? n.type : 'any';
}

function inline(value: unknown): string {
  return JSON.stringify(value).replace(/\|/g, '\\|');
}

function exampleOf(key: string, n: Node): string {
  const value = n['x-example'] ?? n.default;
  if (value === undefined || (typeof value === 'object' && value !== null && Object.keys(value).length === 0)) return '';
  const flow = dump({ [key]: value }, { flowLevel: 0, lineWidth: -1 }).trim().replace(/^\{/, '').replace(/\}$/, '');
  return `\`${flow.replace(/\|/g, '\\|')}\``;
}

const under = (path: string, roots: readonly string[]): boolean => roots.some((r) => path === r || path.startsWith(`${r}.`) || path.startsWith(`${r}[`));

/**
 * The activation column: a key of a feature nothing enforces yet is not called `live` (a change
 * to it takes effect on nothing), whatever its activation class.
 */
function activationText(path: string, byClass: string): string {
  if (under(path, NOT_ACTIVE_PATHS)) return 'not active yet';
  if (under(path, NOT_BUILT_PATHS)) return 'not built (refused when on)';
  return byClass;
}

/** Every key of the schema in document order, with nested objects flattened into dotted paths. */
export function referenceRows(): ReferenceRow[] {
  const rows: ReferenceRow[] = [];
  const visit = (n: Node, path: string, key: string): void => {
    const isObject = n.properties !== undefined;
    const c = classifySchemaPath(path);
    rows.push({
      path,
      type: isObject ? 'object' : typeOf(n),
      default: n.default === undefined || isObject ? '' : `\`${inline(n.default)}\``,
      unit: n['x-unit'] ?? '',
      activation: activationText(path, c.activation === 'live' ? 'live' : `restart (${c.reason ?? ''})`),
      description: (n.description ?? '').replace(/\|/g, '\\|'),
      example: isObject ? '' : exampleOf(key, n),
    });
    for (const [k, child] of Object.entries(n.properties ?? {})) visit(child, `${path}.${k}`, k);
    const record = Object.values(n.patternProperties ?? {})[0];
    if (record?.properties !== undefined) for (const [k, child] of Object.entries(record.properties)) visit(child, `${path}.*.${k}`, k);
    if (n.items?.properties !== undefined) for (const [k, child] of Object.entries(n.items.properties)) visit(child, `${path}[].${k}`, k);
  };
  for (const [k, child] of Object.entries((ConfigSchema as unknown as Node).properties ?? {})) visit(child, k, k);
  // An object row summarizes its keys: `mixed` when some are live and some need a restart.
  return rows.map((r) => {
    if (r.type !== 'object') return r;
    const kinds = new Set(rows.filter((c) => c.type !== 'object' && (c.path.startsWith(`${r.path}.`) || c.path.startsWith(`${r.path}[`))).map((c) => c.activation.split(' ')[0]));
    return kinds.size > 1 ? { ...r, activation: 'mixed (see keys)' } : r;
  });
}

/** Renders docs/configuration.md. */
export function renderReference(): string {
  const rows = referenceRows();
  const sections = new Map<string, ReferenceRow[]>();
  for (const r of rows) {
    const top = r.path.split(/[.[]/)[0] as string;
    sections.set(top, [...(sections.get(top) ?? []), r]);
  }
  const out: string[] = [
    '# Configuration reference',
    '',
    '<!-- Generated from packages/config/src/schema by `npm run docs`; a test fails when this file is stale. -->',
    '',
    'The configuration is one YAML file (`edge-proxy -c FILE`, default `/etc/edge-proxy/config.yaml`).',
    'Unknown keys are rejected everywhere. Relative file paths resolve against the directory of the',
    'configuration file. Durations are integer milliseconds unless the unit says otherwise.',
    '',
    '**Activation**: `live` keys take effect through `activate` / `reload` (a new generation, swapped',
    'atomically); `restart` keys are rejected by activation planning (HTTP 409 with `rejected_changes`)',
    'and need a process restart. A listener added by activation is live; a listener removed is not.',
    '`not active yet` keys validate and are reported by `edge-proxy -c`, the start log and the runtime',
    'snapshot, but nothing enforces them yet; `not built` features are refused (EDGE_CONFIG_NOT_BUILT)',
    'when turned on.',
    '',
    'Secret fields come in pairs: a plaintext field and its `_ref` twin (`{ ref: "literal:<value>" }` or',
    '`{ ref: "file://<path>", provider: <name> }`); setting both is an error. `upstream.*` is a pool name',
    '(also its route name); `[]` marks list items.',
    '',
    'Precedence: a non-empty `listeners` replaces `listen`; a pool\'s `load_balancing` replaces the global one;',
    'a pool\'s `tls` overrides `upstream_tls` key by key; a backend\'s `health_check` replaces the pool\'s.',
    '',
  ];
  for (const [section, list] of sections) {
    out.push(`## \`${section}\``, '', list[0]?.description ?? '', '', '| key | type | default | unit | activation | description | example |', '|---|---|---|---|---|---|---|');
    for (const r of list) out.push(`| \`${r.path}\` | ${r.type} | ${r.default} | ${r.unit} | ${r.activation} | ${r.description} | ${r.example} |`);
    out.push('');
  }
  return out.join('\n');
}
