// The state directory (issue 12 item 2) with a fake activator: atomic writes (0600, no temporary
// file left, none left by a failed write), the versioned and bounded format, and what a restart
// does with the saved history — resume under the same number with history and numbers continued,
// rollback to a generation of the previous process, --force-config, a different -c file, a torn
// or unknown-version file, a saved source that no longer resolves, an unwritable directory — and
// the watchdog cooldown across a restart.
import t from 'tap';
import { Writable } from 'node:stream';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { validateConfig } from '@edge-proxy/config';
import { createLogging } from '@edge-proxy/telemetry';
import type { GenerationBundle } from '@edge-proxy/ipc';
import { GenerationManager } from '../src/generations/activation.ts';
import type { Activator } from '../src/generations/activation.ts';
import { GenerationHistory } from '../src/generations/history.ts';
import { removeStaleTemps, writeFileAtomic } from '../src/state/atomic-file.ts';
import { GENERATIONS_FILE, GenerationStore, STATE_VERSION, WATCHDOG_FILE, parseGenerations, serializeGenerations } from '../src/state/generation-store.ts';
import type { SavedGenerations } from '../src/state/generation-store.ts';
import { WATCHDOG_INITIAL, resumeWatchdog, stepWatchdog } from '../src/watchdog/policy.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca);

/** Writes `<name>.yaml` with backend `weight` (a live change) and returns its path. */
function config(name: string, weight = 1, cert = server.cert): string {
  const file = path.join(dir, `${name}.yaml`);
  writeFileSync(
    file,
    `
listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert}, key: ${server.key} } }
upstream: { api: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:8080", weight: ${weight} }] } }
`,
  );
  return file;
}

class FakePool implements Activator {
  readonly seen: GenerationBundle[] = [];
  async activate(bundle: GenerationBundle) {
    this.seen.push(bundle);
    return { ok: true as const };
  }
}

/** A logger whose JSON lines are kept. */
function capture(): { logger: ReturnType<typeof createLogging>['logger']; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l.length > 0) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: createLogging({ level: 'info', format: 'json', destination }).logger, lines };
}

/** One process start: a manager on `boot` with a store on `stateDir`, booted. */
async function start(stateDir: string, boot: string, forceConfig = false) {
  const pool = new FakePool();
  const m = new GenerationManager(pool, boot);
  const store = new GenerationStore({ dir: stateDir, configPath: boot, forceConfig });
  const first = await store.firstConfig();
  const log = capture();
  const r = first.ok ? await store.boot(m, log.logger) : undefined;
  return { m, store, pool, first, r, lines: log.lines, errors: () => log.lines.filter((l) => l['level'] === 'error') };
}

const op = { requested_by: 'deploy-bot' };

t.test('writeFileAtomic: content, mode 0600, no temporary file left; a failed write leaves none either', async (t) => {
  const d = path.join(dir, 'atomic');
  await writeFileAtomic(d, 'x.json', '{"a":1}');
  await writeFileAtomic(d, 'x.json', '{"a":2}');
  t.equal(readFileSync(path.join(d, 'x.json'), 'utf8'), '{"a":2}');
  t.equal(statSync(path.join(d, 'x.json')).mode & 0o777, 0o600);
  t.equal(statSync(d).mode & 0o777, 0o700, 'a directory it creates is 0700');
  t.same(readdirSync(d), ['x.json'], 'no temporary file left');
  // The target is a directory: rename fails after the temporary file was written and synced.
  mkdirSync(path.join(d, 'busy.json', 'inside'), { recursive: true });
  await t.rejects(writeFileAtomic(d, 'busy.json', 'x'));
  t.same(readdirSync(d).sort(), ['busy.json', 'x.json'], 'the failed write removed its temporary file');
  // Leftovers of a crash are recognised by their shape; other files are left alone.
  writeFileSync(path.join(d, 'x.json.123.0a1b2c3d.tmp'), 'torn');
  writeFileSync(path.join(d, 'x.json.keep'), 'mine');
  await removeStaleTemps(d, 'x.json');
  t.same(readdirSync(d).sort(), ['busy.json', 'x.json', 'x.json.keep']);
});

t.test('format: versioned, every field checked, bounded on save', async (t) => {
  const h = new GenerationHistory<{ source: string; text: string }>();
  h.activated(1, { source: '/etc/a.yaml', text: 'a'.repeat(1000) });
  h.record({ operation: 'activate', generation: 1, result: 'succeeded', time_unix_ms: 1 });
  h.activated(2, { source: '/etc/b.yaml', text: 'b'.repeat(1000) });
  h.activated(3, { source: '/etc/c.yaml', text: 'c' });
  const saved: SavedGenerations = { version: STATE_VERSION, saved_at_unix_ms: 5, boot_config: '/etc/a.yaml', boot_config_sha256: 'ab'.repeat(32), active_source: '/etc/c.yaml', history: h.records((b) => b) };
  const text = serializeGenerations(saved);
  t.same(parseGenerations(text), { ok: true, value: saved, dropped: [] }, 'round trip');
  const cases: [string, string][] = [
    ['{"version":1', 'not JSON'],
    ['[]', 'not a JSON object'],
    [JSON.stringify({ ...saved, version: 2 }), 'unsupported version 2 (this build reads 1)'],
    [JSON.stringify({ ...saved, version: undefined }), 'unsupported version null (this build reads 1)'],
    [JSON.stringify({ ...saved, boot_config: 'relative.yaml' }), 'malformed field boot_config'],
    [JSON.stringify({ ...saved, boot_config_sha256: 'xyz' }), 'malformed field boot_config_sha256'],
    [JSON.stringify({ ...saved, history: [] }), 'malformed field history'],
    [JSON.stringify({ ...saved, history: { ...saved.history, slots: {} } }), 'malformed field history.slots'],
    [JSON.stringify({ ...saved, history: { ...saved.history, entries: null } }), 'malformed field history.entries'],
  ];
  for (const [input, problem] of cases) t.same(parseGenerations(input), { ok: false, problem }, problem);
  // Over the bound: the oldest non-active texts go first (records stay), the active one never.
  const bound = Buffer.byteLength(text) - 500;
  const small = serializeGenerations(saved, bound);
  t.ok(Buffer.byteLength(small) <= bound);
  const kept = parseGenerations(small);
  t.ok(kept.ok);
  if (!kept.ok) return;
  t.same(
    kept.value.history.slots.map((s) => [s.generation, s.bundle?.text.length ?? null]),
    [
      [1, null],
      [2, 1000],
      [3, 1],
    ],
    'generation 1 lost its text, 2 and the active 3 kept theirs',
  );
});

t.test('format: a bad record costs that record, not the history (issue 38 finding 7)', async (t) => {
  const bundle = { source: '/etc/a.yaml', text: 'a' };
  const slot = (generation: unknown, status = 'superseded', extra: Record<string, unknown> = {}) => ({ generation, status, bundle, ...extra });
  const entry = (entry_id: unknown, extra: Record<string, unknown> = {}) => ({ entry_id, operation: 'rollback', generation: 2, result: 'rejected', time_unix_ms: 1, ...extra });
  const file = (h: Record<string, unknown>) => JSON.stringify({ version: 1, saved_at_unix_ms: 5, boot_config: '/etc/a.yaml', boot_config_sha256: 'ab'.repeat(32), active_source: '/etc/a.yaml', history: { last_generation: 3, last_entry_id: 9, slots: [slot(1), slot(2, 'active'), slot(3, 'previous')], entries: [entry(1), entry(2)], ...h } });
  const cases: { name: string; h: Record<string, unknown>; slots: number[]; entries: number[]; counters?: [number, number]; dropped: { at: string; problem: string; id?: number }[] }[] = [
    { name: 'the finding: a rollback to -1 recorded', h: { entries: [entry(1), entry(2, { target_generation: -1 }), entry(3)] }, slots: [1, 2, 3], entries: [1, 3], dropped: [{ at: 'history.entries[1]', id: 2, problem: 'malformed target_generation' }] },
    ...[0, -0, 1.5, 2 ** 31, '2', null].map((g) => ({ name: `entry generation ${JSON.stringify(g)}`, h: { entries: [entry(1, { generation: g }), entry(2)] }, slots: [1, 2, 3], entries: [2], dropped: [{ at: 'history.entries[0]', id: 1, problem: 'malformed generation' }] })),
    { name: 'an entry that is not an object', h: { entries: ['x', entry(2)] }, slots: [1, 2, 3], entries: [2], dropped: [{ at: 'history.entries[0]', problem: 'malformed not_an_object' }] },
    { name: 'an unknown operation', h: { entries: [entry(1, { operation: 'drop' }), entry(2)] }, slots: [1, 2, 3], entries: [2], dropped: [{ at: 'history.entries[0]', id: 1, problem: 'malformed operation' }] },
    { name: 'a duplicate entry id', h: { entries: [entry(1), entry(1)] }, slots: [1, 2, 3], entries: [1], dropped: [{ at: 'history.entries[1]', id: 1, problem: 'duplicate' }] },
    { name: 'an entry id beyond last_entry_id', h: { entries: [entry(1), entry(10)] }, slots: [1, 2, 3], entries: [1], dropped: [{ at: 'history.entries[1]', id: 10, problem: 'beyond_last_entry_id' }] },
    { name: 'a slot with an unknown status', h: { slots: [slot(1, 'gone'), slot(2, 'active'), slot(3, 'previous')] }, slots: [2, 3], entries: [1, 2], dropped: [{ at: 'history.slots[0]', id: 1, problem: 'malformed status' }] },
    { name: 'a slot with a bad bundle', h: { slots: [slot(1, 'superseded', { bundle: { source: '/a', text: 3 } }), slot(2, 'active'), slot(3, 'previous')] }, slots: [2, 3], entries: [1, 2], dropped: [{ at: 'history.slots[0]', id: 1, problem: 'malformed bundle' }] },
    { name: 'a slot numbered -1', h: { slots: [slot(-1), slot(2, 'active'), slot(3, 'previous')] }, slots: [2, 3], entries: [1, 2], dropped: [{ at: 'history.slots[0]', problem: 'malformed generation' }] },
    { name: 'slots out of order', h: { slots: [slot(2), slot(1), slot(3, 'active')] }, slots: [2, 3], entries: [1, 2], dropped: [{ at: 'history.slots[1]', id: 1, problem: 'out_of_order' }] },
    { name: 'a duplicate slot', h: { slots: [slot(1), slot(1), slot(3, 'active')] }, slots: [1, 3], entries: [1, 2], dropped: [{ at: 'history.slots[1]', id: 1, problem: 'duplicate' }] },
    { name: 'a slot beyond last_generation', h: { slots: [slot(1), slot(2, 'active'), slot(4)] }, slots: [1, 2], entries: [1, 2], dropped: [{ at: 'history.slots[2]', id: 4, problem: 'beyond_last_generation' }] },
    { name: 'two active slots: the newest stays active', h: { slots: [slot(1, 'active'), slot(2), slot(3, 'active')] }, slots: [2, 3], entries: [1, 2], dropped: [{ at: 'history.slots[0]', id: 1, problem: 'second_active' }] },
    { name: 'counters malformed: rebuilt from the records', h: { last_generation: -1, last_entry_id: 'x', entries: [entry(1, { target_generation: 7 }), entry(2)] }, slots: [1, 2, 3], entries: [1, 2], counters: [7, 2], dropped: [{ at: 'history.last_generation', problem: 'malformed' }, { at: 'history.last_entry_id', problem: 'malformed' }] },
  ];
  for (const c of cases) {
    const r = parseGenerations(file(c.h));
    t.ok(r.ok, `${c.name}: the file is usable`);
    if (!r.ok) continue;
    t.same(r.value.history.slots.map((s) => s.generation), c.slots, `${c.name}: slots kept`);
    t.same(r.value.history.entries.map((e) => e.entry_id), c.entries, `${c.name}: entries kept`);
    t.same(r.dropped, c.dropped, `${c.name}: dropped, named`);
    if (c.counters !== undefined) t.same([r.value.history.last_generation, r.value.history.last_entry_id], c.counters, `${c.name}: counters`);
    // What the loader returns always restores.
    t.doesNotThrow(() => new GenerationHistory<typeof bundle>().restore(r.value.history), `${c.name}: restores`);
  }
});

t.test('restore refuses records that break the invariants', async (t) => {
  const bundle = { source: '/a', text: 'x' };
  const bad = [
    { last_generation: 2, last_entry_id: 0, entries: [], slots: [{ generation: 2, status: 'active' as const, bundle }, { generation: 1, status: 'previous' as const, bundle }] },
    { last_generation: 2, last_entry_id: 0, entries: [], slots: [{ generation: 1, status: 'active' as const, bundle }, { generation: 2, status: 'active' as const, bundle }] },
    { last_generation: 1, last_entry_id: 0, entries: [], slots: [{ generation: 2, status: 'active' as const, bundle }] },
  ];
  for (const r of bad) t.throws(() => new GenerationHistory<typeof bundle>().restore(r));
});

t.test('restart: the activated generation resumes under its number; history, numbers and rollback continue', async (t) => {
  const stateDir = path.join(dir, 'state-resume');
  const boot = config('boot');
  const green = config('green', 7);
  const a = await start(stateDir, boot);
  t.match(a.r, { status: 202, generation: 1 });
  t.match(a.lines, [{ msg: `no saved state: first start from -c ${boot}` }]);
  t.match(await a.m.activate({ config_path: green, ...op }), { status: 202, generation: 2 });
  t.match(await a.m.preview({ config_path: boot, ...op }), { status: 200 });
  t.same(readdirSync(stateDir), [GENERATIONS_FILE], 'one file, no temporary file left');
  t.equal(statSync(path.join(stateDir, GENERATIONS_FILE)).mode & 0o777, 0o600);
  t.equal(a.store.status, 'saved');
  const before = a.m.history.entries();

  const b = await start(stateDir, boot);
  t.match(b.r, { status: 202, generation: 2, body: { config_source: green } });
  t.equal(b.m.activeGeneration, 2, 'the same number');
  t.equal(b.m.configSource, green, 'the active source path is the activated one: SIGHUP reads it');
  t.equal(b.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 7, 'the workers got the activated configuration');
  t.equal(b.first.ok && b.first.value.config.upstream['api']?.backends[0]?.weight, 7, 'the first configuration (logging, workers) is the activated one');
  const after = b.m.history.entries();
  t.same(after.slice(1), before, 'every entry kept, in order');
  t.match(after[0], { entry_id: (before[0]?.entry_id ?? 0) + 1, operation: 'resume', generation: 2, result: 'succeeded', requested_by: 'startup', config_source: green });
  t.match(b.m.history.retained(), [
    { generation: 2, status: 'active', has_bundle: true },
    { generation: 1, status: 'previous', rollback_candidate: true, has_bundle: true },
  ]);
  t.match(b.lines, [{ msg: 'resumed generation 2 from the state directory' }]);
  t.same(b.errors(), []);
  // Rollback to the generation of the previous process, then the next number is 3.
  t.match(await b.m.rollback({ target_generation: 1, ...op }), { status: 202, generation: 1 });
  t.equal(b.pool.seen.at(-1)?.resolved.config.upstream['api']?.backends[0]?.weight, 1);
  t.match(await b.m.activate({ config_path: green, ...op }), { status: 202, generation: 3 });

  // A third process: the drift of the active file is reported once, the kept text serves.
  config('green', 9);
  const c = await start(stateDir, boot);
  t.match(c.r, { status: 202, generation: 3 });
  t.equal(c.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 7, 'the activated text, not the edited file');
  t.match(
    c.lines.filter((l) => l['level'] === 'warn'),
    [{ config_source: green, file_state: 'changed' }],
  );
  // A reload (what SIGHUP does) reads the active path.
  t.match(await c.m.activate({ requested_by: 'SIGHUP' }, 'reload'), { status: 202, generation: 4 });
  t.equal(c.pool.seen.at(-1)?.resolved.config.upstream['api']?.backends[0]?.weight, 9);
});

t.test('--force-config and another -c file start from the file as a new generation, history kept', async (t) => {
  const stateDir = path.join(dir, 'state-force');
  const boot = config('boot-f');
  const a = await start(stateDir, boot);
  t.match(await a.m.activate({ config_path: config('green-f', 7), ...op }), { status: 202, generation: 2 });
  const b = await start(stateDir, boot, true);
  t.match(b.r, { status: 202, generation: 3 });
  t.equal(b.m.configSource, boot);
  t.equal(b.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 1, 'the -c file serves');
  t.match(b.m.history.entries()[0], { operation: 'activate', generation: 3, reason: 'startup with --force-config' });
  t.match(b.m.history.retained().map((r) => [r.generation, r.status]), [
    [3, 'active'],
    [2, 'previous'],
    [1, 'superseded'],
  ]);
  t.match(await b.m.rollback({ target_generation: 2, ...op }), { status: 202 }, 'the pre-restart generation is a rollback target');
  const other = config('other-f', 3);
  const c = await start(stateDir, other);
  t.match(c.r, { status: 202, generation: 4 });
  t.equal(c.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 3);
  t.match(c.lines, [{ level: 'warn', saved_with: boot }]);
});

t.test('an edited -c file starts as a new generation (how restart-required changes apply); an invalid edit resumes', async (t) => {
  const stateDir = path.join(dir, 'state-edit');
  const boot = config('boot-e');
  const a = await start(stateDir, boot);
  t.match(await a.m.activate({ config_path: config('green-e', 7), ...op }), { status: 202, generation: 2 });
  // A reload of the -c file itself is what the service last read: no edit at the next start.
  config('boot-e', 2);
  t.match(await a.m.activate({ config_path: boot, ...op }), { status: 202, generation: 3 });
  const b = await start(stateDir, boot);
  t.match(b.r, { status: 202, generation: 3 }, 'resumed: the file is what generation 3 read');
  config('boot-e', 4);
  const c = await start(stateDir, boot);
  t.match(c.r, { status: 202, generation: 4 });
  t.equal(c.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 4, 'the edited file serves');
  t.match(c.m.history.entries()[0], { operation: 'activate', generation: 4, reason: `startup: -c ${boot} changed` });
  t.match(c.lines, [{ level: 'warn', msg: `${boot} changed since the service last read it: starting from -c ${boot} as a new generation, history kept` }]);
  t.match(await c.m.activate({ config_path: config('green-e', 8), ...op }), { status: 202, generation: 5 });
  writeFileSync(boot, 'listen: {tls: {cert: x}}\nupstream: {}\n');
  const d = await start(stateDir, boot);
  t.match(d.r, { status: 202, generation: 5 }, 'an invalid edit: the saved generation resumes');
  t.equal(d.pool.seen[0]?.resolved.config.upstream['api']?.backends[0]?.weight, 8);
  t.match(d.errors(), [{ code: 'EDGE_STATE_EDIT_INVALID', errors: [{ code: /^EDGE_CONFIG_/ }] }]);
  config('boot-e', 6);
  const e = await start(stateDir, boot);
  t.match(e.r, { status: 202, generation: 6 }, 'once fixed, the edit applies at the next start');
});

t.test('a torn, unknown-version or unreadable state file: one coded error line, start from -c as generation 1', async (t) => {
  const boot = config('boot-c');
  for (const [name, content, problem] of [
    ['torn', '{"version":1,"saved_at_unix_ms":', 'not JSON'],
    ['future', JSON.stringify({ version: 9 }), 'unsupported version 9 (this build reads 1)'],
  ] as const) {
    const stateDir = path.join(dir, `state-${name}`);
    mkdirSync(stateDir);
    writeFileSync(path.join(stateDir, GENERATIONS_FILE), content);
    const s = await start(stateDir, boot);
    t.match(s.r, { status: 202, generation: 1 }, name);
    t.match(s.errors(), [{ code: 'EDGE_STATE_INVALID', problem }], `${name}: one error line`);
    t.equal(s.errors().length, 1);
    t.equal(readFileSync(path.join(stateDir, `${GENERATIONS_FILE}.invalid`), 'utf8'), content, 'moved aside for inspection');
    t.ok(parseGenerations(readFileSync(path.join(stateDir, GENERATIONS_FILE), 'utf8')).ok, 'a fresh state saved');
  }
  // Well-formed, but two active generations: the older "active" is left out, the rest kept.
  const contradictory = path.join(dir, 'state-contradictory');
  mkdirSync(contradictory);
  const bundle = { source: boot, text: readFileSync(boot, 'utf8') };
  const two: SavedGenerations = { version: STATE_VERSION, saved_at_unix_ms: 1, boot_config: boot, boot_config_sha256: '0'.repeat(64), active_source: boot, history: { last_generation: 2, last_entry_id: 0, entries: [], slots: [{ generation: 1, status: 'active', bundle }, { generation: 2, status: 'active', bundle }] } };
  writeFileSync(path.join(contradictory, GENERATIONS_FILE), JSON.stringify(two));
  const c = await start(contradictory, boot);
  // The -c file's hash differs from the saved one: it starts as a new generation after the saved ones.
  t.match(c.r, { status: 202, generation: 3 });
  t.same(c.errors(), [], 'no error line: the state is usable');
  t.match(c.lines.filter((l) => l['code'] === 'EDGE_STATE_RECORD_DROPPED'), [{ level: 'warn', dropped: [{ at: 'history.slots[0]', id: 1, problem: 'second_active' }], dropped_count: 1, copied_to: path.join(contradictory, `${GENERATIONS_FILE}.invalid`) }]);
  t.same(c.m.history.retained().map((r) => [r.generation, r.status]), [[3, 'active'], [2, 'previous']], 'generation 2 kept, demoted by the new one');
  const stateDir = path.join(dir, 'state-fifo');
  mkdirSync(path.join(stateDir, GENERATIONS_FILE), { recursive: true });
  const s = await start(stateDir, boot);
  t.match(s.r, { status: 202, generation: 1 });
  t.match(s.errors()[0], { code: 'EDGE_STATE_INVALID', problem: /not a regular file/ });
});

t.test('a saved source that no longer resolves: one coded error line, the -c file as a new generation, history kept', async (t) => {
  const stateDir = path.join(dir, 'state-gone');
  const boot = config('boot-g');
  const doomed = path.join(dir, 'doomed.crt');
  copyFileSync(server.cert, doomed);
  const a = await start(stateDir, boot);
  t.match(await a.m.activate({ config_path: config('green-g', 7, doomed), ...op }), { status: 202, generation: 2 });
  rmSync(doomed);
  const b = await start(stateDir, boot);
  t.match(b.r, { status: 202, generation: 3 });
  t.equal(b.pool.seen.length, 1, 'the workers were only asked for the -c file');
  t.equal(b.m.configSource, boot);
  t.match(b.errors(), [{ code: 'EDGE_STATE_SOURCE_INVALID', generation: 2, errors: [{ path: 'listen.tls.cert', code: 'EDGE_CONFIG_TLS_UNREADABLE' }] }]);
  t.equal(b.errors().length, 1);
  t.match(b.m.history.retained().map((r) => [r.generation, r.status]), [
    [3, 'active'],
    [2, 'previous'],
    [1, 'superseded'],
  ]);
});

t.test('an unwritable state directory: the operation succeeds, one coded error line when saving stops working, status write_failed', async (t) => {
  // Under a regular file: unwritable for root too (ENOTDIR).
  const blocker = path.join(dir, 'not-a-dir');
  writeFileSync(blocker, '');
  const stateDir = path.join(blocker, 'state');
  const s = await start(stateDir, config('boot-ro'));
  t.match(s.r, { status: 202, generation: 1 });
  t.match(await s.m.activate({ config_path: config('green-ro', 7), ...op }), { status: 202, generation: 2 });
  // Two saves failed (boot, activation): one line, at the first.
  t.match(s.errors(), [{ code: 'EDGE_STATE_WRITE_FAILED', errno: 'ENOTDIR' }]);
  t.equal(s.errors().length, 1);
  t.equal(s.store.status, 'write_failed');
});

t.test('watchdog cooldown across a restart', async (t) => {
  const r = validateConfig({ listen: { tls: { cert: 'c', key: 'k' } }, upstream: { a: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: 'h' }] } }, resilience: { watchdog: { enabled: true, unhealthy_consecutive_windows: 1, restart_cooldown_ms: 120_000 } } }, '/tmp');
  if (!r.ok) throw new Error('config');
  const cfg = r.value.config.resilience.watchdog;
  const stateDir = path.join(dir, 'state-watchdog');
  const s = await start(stateDir, config('boot-w'));
  // Process 1 trips at t=1000 and saves the time before its restart command runs.
  const tripped = stepWatchdog(cfg, WATCHDOG_INITIAL, ['poll_stall'], 1000);
  t.ok(tripped.restart);
  await s.store.saveWatchdog(tripped.state.lastRestartAt);
  t.equal(statSync(path.join(stateDir, WATCHDOG_FILE)).mode & 0o777, 0o600);
  // Process 2, started by that command: the cooldown still holds, then lets the next one through.
  const saved = await new GenerationStore({ dir: stateDir, configPath: config('boot-w') }).lastRestartAt(5000);
  t.equal(saved, 1000);
  const resumed = resumeWatchdog(saved, 5000);
  t.notOk(stepWatchdog(cfg, resumed, ['poll_stall'], 5000).restart, 'unhealthy 4 s later: held by the cooldown');
  t.ok(stepWatchdog(cfg, resumed, ['poll_stall'], 121_000).restart, 'after the cooldown: restarts');
  t.ok(stepWatchdog(cfg, WATCHDOG_INITIAL, ['poll_stall'], 5000).restart, 'without the saved time the loop would restart at once');
  // A clock set back counts from now; a damaged file counts as a restart just now.
  t.equal(resumeWatchdog(10_000_000, 5000).lastRestartAt, 5000);
  t.equal(resumeWatchdog(undefined, 5000).lastRestartAt, undefined);
  writeFileSync(path.join(stateDir, WATCHDOG_FILE), '{"version":1,"last_restart_at_unix_ms":"soon"}');
  const log = capture();
  const store = new GenerationStore({ dir: stateDir, configPath: config('boot-w') });
  await store.firstConfig();
  await store.boot(new GenerationManager(new FakePool(), config('boot-w')), log.logger);
  t.equal(await store.lastRestartAt(7000), 7000);
  t.match(
    log.lines.filter((l) => l['level'] === 'error'),
    [{ code: 'EDGE_STATE_INVALID', problem: 'malformed field last_restart_at_unix_ms' }],
  );
  t.same(readdirSync(stateDir).filter((f) => f.endsWith('.tmp')), [], 'no temporary file left');
});
