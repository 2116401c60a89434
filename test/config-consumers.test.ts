// "No key validates and does nothing" (developers' guide; issue 12 item 5): every leaf key of the
// configuration schema is read by the code that carries it out, or is declared in
// packages/config/src/features.ts as not built (refused when on), not active yet (reported by
// `edge-proxy -c`, the start log and the snapshot) or refused outright.
//
// A key counts as consumed when a consumer source file reads its name as a property (`.name`,
// `?.name`, `['name']` or a destructuring `{ name } =`) and, for a key inside a named block (not
// a list item or a map entry), names that block too, so that one block's `enabled` is not taken
// for another's. Consumer files: the packages that act on a configuration (controlplane,
// dataplane, auth, telemetry, cli) and the config modules that read files and secrets for them
// (resolve.ts, secrets/). Validation rules and the schema are not consumers: a key only they read
// validates and does nothing. Keys that normalization folds into others, and the few whose effect
// is their presence, are mapped below, each with its reason; every mapping is checked.
import t from 'tap';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { referenceRows, NOT_ACTIVE_PATHS, NOT_BUILT_PATHS, REFUSED_PATHS } from '@edge-proxy/config';

const root = path.resolve(import.meta.dirname, '..');

function tsFiles(p: string): string[] {
  if (!statSync(p).isDirectory()) return [p];
  return readdirSync(p).flatMap((e) => (e.endsWith('.ts') || statSync(path.join(p, e)).isDirectory() ? tsFiles(path.join(p, e)) : []));
}

const CONSUMER_ROOTS = ['packages/controlplane/src', 'packages/dataplane/src', 'packages/auth/src', 'packages/telemetry/src', 'packages/cli/src', 'packages/config/src/resolve.ts', 'packages/config/src/secrets'];
const sources = CONSUMER_ROOTS.flatMap((r) => tsFiles(path.join(root, r))).map((file) => ({ file: path.relative(root, file), text: readFileSync(file, 'utf8') }));

/** Prefix rewrites of normalize.ts: the consumer reads the key under the second name. */
const FOLDED: readonly (readonly [from: string, to: string, why: string])[] = [
  ['listen.', 'listeners[].', 'normalize.ts: `listen` is the one-listener form of `listeners`'],
  ['upstream.*.health_check.', 'upstream.*.backends[].health_check.', "normalize.ts: a pool's health_check is copied onto each backend without one"],
  ['load_balancing.', 'upstream.*.load_balancing.', "normalize.ts: the global load_balancing is each pool's unless it has its own"],
  ['upstream_tls.', 'upstream.*.tls.', "normalize.ts: upstream_tls is merged into each pool's effective tls"],
];

/** Keys whose consumer reads them under another name or whose effect is their presence: file and token checked. */
const MAPPED: Readonly<Record<string, { file: string; token: string; why: string }>> = {
  version: { file: 'packages/config/src/validate.ts', token: 'SUPPORTED_VERSION', why: 'only version 1 is accepted: the value selects the schema' },
  'upstream.*.tls.client_certificate': { file: 'packages/dataplane/src/runtime/provision.ts', token: 'client_certificate_slot', why: 'normalize.ts turns the secret into a slot the pool reads' },
  'upstream.*.tls.client_key': { file: 'packages/dataplane/src/runtime/provision.ts', token: 'client_key_slot', why: 'normalize.ts turns the secret into a slot the pool reads' },
  'upstream.*.auth.public': { file: 'packages/config/src/normalize.ts', token: 'own.public === true', why: 'normalize.ts: a public pool is given no checks (default_auth is not applied to it), so the request path sees a pool without authentication' },
  'observability.control_api.auth.identity_source.kind': { file: 'packages/controlplane/src/api/auth.ts', token: 'identity_source', why: 'its one allowed value: the presence of identity_source selects the certificate-subject identity' },
};

const under = (p: string, roots: readonly string[]): boolean => roots.some((r) => p === r || p.startsWith(`${r}.`) || p.startsWith(`${r}[`));
const esc = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The path as consumers see it: folded prefixes rewritten, a secret reference as its secret. */
function consumedAs(p: string): string {
  let out = p.replace(/_ref\.(ref|provider)$/, '');
  for (const [from, to] of FOLDED) if (out.startsWith(from)) out = to + out.slice(from.length);
  return out;
}

/** Consumer files that read `p`'s leaf name (and name its enclosing block, if it has one). */
function consumers(p: string): string[] {
  const segments = p.split('.');
  const leaf = (segments.at(-1) as string).replace(/\[\]$/, '');
  const parent = segments.at(-2);
  // A list item or a map entry is passed around under a name of its own (`listener`, `pool`).
  const block = parent === undefined || parent === '*' || parent.endsWith('[]') ? undefined : parent;
  const read = new RegExp(`\\??\\.${esc(leaf)}\\b|\\['${esc(leaf)}'\\]|\\{[^}=]*\\b${esc(leaf)}\\b[^}=]*\\}\\s*=`);
  const named = block === undefined ? undefined : new RegExp(`\\b${esc(block)}\\b`);
  return sources.filter((s) => read.test(s.text) && (named === undefined || named.test(s.text))).map((s) => s.file);
}

const rows = referenceRows();
const leaves = rows.filter((r) => !rows.some((c) => c.path.startsWith(`${r.path}.`) || c.path.startsWith(`${r.path}[`))).map((r) => r.path);

t.test('the walk sees the whole schema', async (t) => {
  t.ok(leaves.length > 200, `${leaves.length} leaf keys`);
  for (const p of ['security.user', 'performance.reuseport', 'performance.timeouts.connect_ms', 'upstream.*.backends[].address', 'secrets.providers.*.base_dir']) t.ok(leaves.includes(p), p);
});

t.test('every leaf key has a consumer or is declared not built, not active yet or refused (features.ts)', async (t) => {
  const declared = [...NOT_BUILT_PATHS, ...NOT_ACTIVE_PATHS, ...REFUSED_PATHS];
  const idle: string[] = [];
  for (const p of leaves) {
    if (under(p, declared)) continue;
    const mapped = MAPPED[p] ?? MAPPED[consumedAs(p)];
    if (mapped !== undefined) continue;
    if (consumers(consumedAs(p)).length === 0) idle.push(p);
  }
  t.same(idle, [], 'keys that validate and do nothing');
});

t.test('every mapping and declaration names something real', async (t) => {
  for (const [key, m] of Object.entries(MAPPED)) {
    t.ok(leaves.includes(key), `${key} is a schema key`);
    t.match(readFileSync(path.join(root, m.file), 'utf8'), m.token, `${m.file} reads ${m.token} (${key})`);
  }
  for (const p of [...NOT_BUILT_PATHS, ...NOT_ACTIVE_PATHS, ...REFUSED_PATHS]) t.ok(leaves.some((l) => under(l, [p])), `${p} is in the schema`);
  for (const [from, to] of FOLDED) {
    t.ok(leaves.some((l) => l.startsWith(from)), `${from} is in the schema`);
    t.ok(leaves.some((l) => l.startsWith(to)), `${to} is in the schema`);
  }
});

t.test('the check itself: a key read only by validation is caught', async (t) => {
  // `reuseport` is read by serve-listeners.ts; a name no consumer reads is not.
  t.not(consumers('performance.reuseport').length, 0, 'performance.reuseport has a consumer');
  t.same(consumers('performance.no_such_key'), [], 'an unread key has none');
  // The block is required: `enabled` alone is read everywhere, but no consumer names `no_such_block`.
  t.same(consumers('observability.no_such_block.enabled'), [], 'an `enabled` of an unread block has no consumer');
});
