// What survives a process restart (issue 12 item 2): the supervisor keeps, in its state directory,
// the active configuration source (path and text), the generation counter, the history records
// with the text of every retained generation, and the watchdog's last restart time.
//
// Files (JSON, `version` 1, mode 0600, written atomically by atomic-file.ts):
// - `generations.json`: `SavedGenerations`, rewritten after every operation that records history;
// - `watchdog.json`: `SavedWatchdog`, rewritten when the watchdog asks for a restart.
// Configuration text is kept as read (inline tokens included, hence 0600); files it references
// (certificates, keys, `file://` secrets, CA bundles) are not copied: they are read again at start.
//
// At start (`firstConfig`, then `boot`): the saved active generation is resumed under its own
// number when the state is usable, the `-c` file is the one the state was saved with and holds
// what the state last saw in it, and `--force-config` is not given; otherwise the service starts
// from the `-c` file, as a new generation after the saved ones (history kept) or, with no usable
// state, as generation 1. An edited `-c` file is the operator's new intent (and the only way a
// restart-required change can apply); an edited file that does not validate resumes the saved one.
// docs/operations.md "State directory" is the operator's view; docs/decisions.md says why.
import { createHash } from 'node:crypto';
import { lstat, rename } from 'node:fs/promises';
import path from 'node:path';
import { describeReadFailure, loadConfigFile, loadConfigText, readBoundedFile } from '@edge-proxy/config';
import type { ConfigIssue, NormalizedConfig } from '@edge-proxy/config';
import type { Logger, Metrics } from '@edge-proxy/telemetry';
import type { GenerationManager, OperationResult, SourceRecord } from '../generations/activation.ts';
import type { GenerationStatus, HistoryEntry, HistoryRecords, Operation } from '../generations/history.ts';
import { removeStaleTemps, writeFileAtomic } from './atomic-file.ts';
import { isGenerationCounter, isGenerationNumber } from '../generations/generation-number.ts';

export const GENERATIONS_FILE = 'generations.json';
export const WATCHDOG_FILE = 'watchdog.json';
/** Where an unusable generations file is moved, for inspection (one copy, replaced each time). */
export const INVALID_SUFFIX = '.invalid';
export const STATE_VERSION = 1;
/**
 * Largest state file read or written: 16 retained texts of at most 4 MiB each, JSON-escaped, with
 * the log. Saving drops the texts of the oldest non-active generations (then the oldest entries)
 * until it fits; reading refuses anything larger.
 */
export const MAX_STATE_BYTES = 64 * 1024 * 1024;
const MAX_WATCHDOG_BYTES = 4096;

/** `generations.json`. */
export interface SavedGenerations {
  readonly version: typeof STATE_VERSION;
  readonly saved_at_unix_ms: number;
  /** Absolute path of the `-c` file of the process that saved it. */
  readonly boot_config: string;
  /** SHA-256 (hex) of the `-c` file's bytes as the service last read them: an edit shows as a mismatch. */
  readonly boot_config_sha256: string;
  /** The active source path: what SIGHUP and a body-less reload read again. */
  readonly active_source: string;
  readonly history: HistoryRecords<SourceRecord>;
}

/** `watchdog.json`. */
export interface SavedWatchdog {
  readonly version: typeof STATE_VERSION;
  /** Unix ms of the last restart the watchdog asked for; null when none. */
  readonly last_restart_at_unix_ms: number | null;
}

/**
 * A record of `generations.json` the loader left out (a slot or an entry that is malformed, out of
 * order or beyond the counters), named by where it was and why: never a value from the file.
 */
export interface DroppedRecord {
  /** `history.slots[3]`, `history.entries[12]`, `history.last_generation`. */
  readonly at: string;
  /** The entry's id or the slot's generation when that much of it was readable. */
  readonly id?: number;
  /** What was wrong: the first bad field, or `out_of_order`, `duplicate`, `beyond_last_entry_id`, ... */
  readonly problem: string;
}

/** A state file as read: absent, unusable (with why, no file content), or its value (with the records left out). */
export type StateRead<T> = { readonly kind: 'none' } | { readonly kind: 'invalid'; readonly problem: string } | { readonly kind: 'ok'; readonly value: T; readonly dropped: readonly DroppedRecord[] };

type Parsed<T> = { ok: true; value: T; dropped?: readonly DroppedRecord[] } | { ok: false; problem: string };

const STATUSES: readonly GenerationStatus[] = ['active', 'previous', 'failed_prepare', 'rolled_back', 'superseded'];
const OPERATIONS: readonly Operation[] = ['preview', 'activate', 'rollback', 'reload', 'resume'];
const RESULTS: readonly HistoryEntry['result'][] = ['succeeded', 'rejected', 'failed', 'recorded'];
const ENTRY_STRINGS = ['requested_by', 'requested_by_note', 'reason', 'config_source', 'note'] as const;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isId = (v: unknown): v is number => isCount(v) && v > 0;
const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;
const optString = (o: Record<string, unknown>, k: string): boolean => o[k] === undefined || typeof o[k] === 'string';

/** Checks one history entry as kept; the name of the first bad field, else undefined. */
function badEntry(e: unknown): string | undefined {
  if (!isObject(e)) return 'not_an_object';
  if (!isId(e['entry_id'])) return 'entry_id';
  if (!OPERATIONS.includes(e['operation'] as Operation)) return 'operation';
  if (!isGenerationNumber(e['generation'])) return 'generation';
  if (!RESULTS.includes(e['result'] as HistoryEntry['result'])) return 'result';
  if (!isTime(e['time_unix_ms'])) return 'time_unix_ms';
  for (const k of ENTRY_STRINGS) if (!optString(e, k)) return k;
  if (e['target_generation'] !== undefined && !isGenerationNumber(e['target_generation'])) return 'target_generation';
  if (e['rejected_changes'] !== undefined && !Array.isArray(e['rejected_changes'])) return 'rejected_changes';
  return undefined;
}

/** A state file's JSON object of this build's version, or what is wrong (never quoting the file). */
function parseStateObject(text: string): Parsed<Record<string, unknown>> {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return { ok: false, problem: 'not JSON' };
  }
  if (!isObject(v)) return { ok: false, problem: 'not a JSON object' };
  if (v['version'] !== STATE_VERSION) return { ok: false, problem: `unsupported version ${JSON.stringify(v['version'] ?? null).slice(0, 20)} (this build reads ${STATE_VERSION})` };
  return { ok: true, value: v };
}

/** Checks one retained-generation slot as kept; the name of the first bad field, else undefined. */
function badSlot(s: unknown): string | undefined {
  if (!isObject(s)) return 'not_an_object';
  if (!isGenerationNumber(s['generation'])) return 'generation';
  if (!STATUSES.includes(s['status'] as GenerationStatus)) return 'status';
  if (!optString(s, 'note')) return 'note';
  const b = s['bundle'];
  if (b !== undefined && b !== null && !(isObject(b) && typeof b['source'] === 'string' && path.isAbsolute(b['source']) && typeof b['text'] === 'string')) return 'bundle';
  return undefined;
}

type RawSlot = { generation: number; status: GenerationStatus; note?: string; bundle?: SourceRecord | null };

/**
 * Parses `generations.json` text: its value, or what is wrong (never quoting the file). The file's
 * frame (version, paths, the history object and its two lists) must be sound; within it, a slot or
 * an entry that is malformed or contradicts the others (numbers out of order or beyond the
 * counters, a second active generation) is left out and named in `dropped`, so one bad record
 * costs that record, not the node's history. A counter that is malformed is rebuilt from the
 * records kept (numbers are never given twice: the highest one seen). What is returned always
 * satisfies `GenerationHistory.restore`.
 */
export function parseGenerations(text: string): Parsed<SavedGenerations> {
  const o = parseStateObject(text);
  if (!o.ok) return o;
  const v = o.value;
  const bad = (field: string): Parsed<SavedGenerations> => ({ ok: false, problem: `malformed field ${field}` });
  if (!isTime(v['saved_at_unix_ms'])) return bad('saved_at_unix_ms');
  if (typeof v['boot_config'] !== 'string' || !path.isAbsolute(v['boot_config'])) return bad('boot_config');
  if (typeof v['boot_config_sha256'] !== 'string' || !/^[0-9a-f]{64}$/.test(v['boot_config_sha256'])) return bad('boot_config_sha256');
  if (typeof v['active_source'] !== 'string' || !path.isAbsolute(v['active_source'])) return bad('active_source');
  const h = v['history'];
  if (!isObject(h)) return bad('history');
  const rawSlots = h['slots'];
  const rawEntries = h['entries'];
  if (!Array.isArray(rawSlots)) return bad('history.slots');
  if (!Array.isArray(rawEntries)) return bad('history.entries');
  const dropped: DroppedRecord[] = [];
  const drop = (at: string, problem: string, id: unknown): void => {
    dropped.push({ at, problem, ...(isCount(id) ? { id } : {}) });
  };
  // Counters first (a malformed one is rebuilt below from what the records hold).
  let lastGeneration = isGenerationCounter(h['last_generation']) ? h['last_generation'] : undefined;
  if (lastGeneration === undefined) drop('history.last_generation', 'malformed', undefined);
  let lastEntry = isCount(h['last_entry_id']) ? h['last_entry_id'] : undefined;
  if (lastEntry === undefined) drop('history.last_entry_id', 'malformed', undefined);

  const slots: RawSlot[] = [];
  // The last active slot wins: activations append, so the newest "active" is the one that served.
  const lastActive = rawSlots.findLastIndex((s) => isObject(s) && s['status'] === 'active' && badSlot(s) === undefined);
  for (const [i, s] of rawSlots.entries()) {
    const at = `history.slots[${i}]`;
    const id = isObject(s) ? s['generation'] : undefined;
    const field = badSlot(s);
    if (field !== undefined) {
      drop(at, `malformed ${field}`, id);
      continue;
    }
    const slot = s as RawSlot;
    const prev = slots.at(-1)?.generation ?? 0;
    if (slot.generation <= prev) drop(at, slot.generation === prev ? 'duplicate' : 'out_of_order', id);
    else if (lastGeneration !== undefined && slot.generation > lastGeneration) drop(at, 'beyond_last_generation', id);
    else if (slot.status === 'active' && i !== lastActive) drop(at, 'second_active', id);
    else slots.push(slot);
  }
  const entries: HistoryEntry[] = [];
  const ids = new Set<number>();
  for (const [i, e] of rawEntries.entries()) {
    const at = `history.entries[${i}]`;
    const id = isObject(e) ? e['entry_id'] : undefined;
    const field = badEntry(e);
    if (field !== undefined) drop(at, `malformed ${field}`, id);
    else if (ids.has((e as HistoryEntry).entry_id)) drop(at, 'duplicate', id);
    else if (lastEntry !== undefined && (e as HistoryEntry).entry_id > lastEntry) drop(at, 'beyond_last_entry_id', id);
    else {
      ids.add((e as HistoryEntry).entry_id);
      entries.push(e as HistoryEntry);
    }
  }
  lastGeneration ??= Math.max(0, ...slots.map((s) => s.generation), ...entries.flatMap((e) => [e.generation, e.target_generation ?? 0]));
  lastEntry ??= Math.max(0, ...entries.map((e) => e.entry_id));
  const history: HistoryRecords<SourceRecord> = {
    last_generation: lastGeneration,
    last_entry_id: lastEntry,
    slots: slots.map((s) => ({ generation: s.generation, status: s.status, bundle: s.bundle === undefined || s.bundle === null ? undefined : { source: s.bundle.source, text: s.bundle.text }, ...(s.note === undefined ? {} : { note: s.note }) })),
    entries,
  };
  return { ok: true, value: { version: STATE_VERSION, saved_at_unix_ms: v['saved_at_unix_ms'], boot_config: v['boot_config'], boot_config_sha256: v['boot_config_sha256'], active_source: v['active_source'], history }, dropped };
}

/** Parses `watchdog.json` text. */
export function parseWatchdog(text: string): Parsed<SavedWatchdog> {
  const o = parseStateObject(text);
  if (!o.ok) return o;
  const v = o.value;
  const at = v['last_restart_at_unix_ms'];
  if (at !== null && !isTime(at)) return { ok: false, problem: 'malformed field last_restart_at_unix_ms' };
  return { ok: true, value: { version: STATE_VERSION, last_restart_at_unix_ms: at } };
}

/**
 * `saved` as JSON of at most `maxBytes`: while it is larger, the text of the oldest non-active
 * retained generation is dropped (its record stays, `has_bundle: false`), then the oldest entries.
 */
export function serializeGenerations(saved: SavedGenerations, maxBytes = MAX_STATE_BYTES): string {
  let slots = [...saved.history.slots];
  let entries = [...saved.history.entries];
  for (;;) {
    const text = JSON.stringify({ ...saved, history: { ...saved.history, slots, entries } });
    if (Buffer.byteLength(text) <= maxBytes) return text;
    const i = slots.findIndex((s) => s.bundle !== undefined && s.status !== 'active');
    if (i !== -1) {
      const s = slots[i] as (typeof slots)[number];
      slots = slots.with(i, { ...s, bundle: undefined, note: 'source not kept: the state file size limit' });
      continue;
    }
    if (entries.length === 0) return text;
    entries = entries.slice(Math.ceil(entries.length / 4));
  }
}

/** Reads and parses `<dir>/<name>`: bounded, never follows a link, never blocks on a FIFO. */
export async function readStateFile<T>(dir: string, name: string, maxBytes: number, parse: (text: string) => Parsed<T>): Promise<StateRead<T>> {
  // readBoundedFile resolves links; a state file is never one (the service writes it by rename):
  // a link put in its place is not followed to whatever file it names.
  const st = await lstat(path.join(dir, name)).catch(() => undefined);
  if (st?.isSymbolicLink() === true) return { kind: 'invalid', problem: 'a symbolic link (not followed)' };
  const read = await readBoundedFile(path.join(dir, name), { maxBytes });
  if (!read.ok) return read.failure === 'not_found' ? { kind: 'none' } : { kind: 'invalid', problem: describeReadFailure(read.failure, maxBytes) };
  const parsed = parse(read.bytes.toString('utf8'));
  return parsed.ok ? { kind: 'ok', value: parsed.value, dropped: parsed.dropped ?? [] } : { kind: 'invalid', problem: parsed.problem };
}

/** The first configuration's settings (log, workers, liveness), or the `-c` file's issues. */
export type FirstConfig = { ok: true; value: { config: NormalizedConfig } } | { ok: false; issues: ConfigIssue[] };

/** How this start goes: the saved generation resumed, or the `-c` file (after the saved history, if any). */
type Decision = { readonly mode: 'resume'; readonly saved: SavedGenerations } | { readonly mode: 'file'; readonly saved: SavedGenerations | undefined; readonly reason: string };

/** Issue codes and paths only: an issue's message may quote what a file held. */
const codes = (issues: readonly ConfigIssue[]): { path: string; code: string }[] => issues.map((i) => ({ path: i.path, code: i.code }));

/** Whether the last write of the state succeeded (the runtime snapshot shows it). */
export type SaveStatus = 'not_saved' | 'saved' | 'write_failed';

export interface GenerationStoreOptions {
  readonly dir: string;
  /** The `-c` file. */
  readonly configPath: string;
  /** `serve --force-config`: start from the `-c` file even when a saved generation could resume. */
  readonly forceConfig?: boolean;
  /** Where `svc_state_records_dropped_total` is counted (the supervisor's registry). */
  readonly metrics?: Metrics;
}

/** Most dropped records named in the one warning line (the count covers the rest). */
const MAX_DROPPED_NAMED = 16;

/** `svc_state_records_dropped_total`'s `record` label of a dropped record. */
const recordKind = (d: DroppedRecord): 'slot' | 'entry' | 'counter' => (d.at.startsWith('history.slots[') ? 'slot' : d.at.startsWith('history.entries[') ? 'entry' : 'counter');

export class GenerationStore {
  readonly dir: string;
  private readonly configPath: string;
  private readonly force: boolean;
  private readonly metrics: Metrics | undefined;
  private decision: Decision | undefined;
  /** SHA-256 of the `-c` file as this process last read it (or, resuming, as the state last saw it). */
  private seenHash = '';
  /**
   * What was decided before the logger exists (it is configured from the first configuration): the
   * lines, and the one change to the directory (moving an unusable file aside). `firstConfig` itself
   * changes nothing on disk, since `serve` may re-execute the process after it (control_plane_threads).
   */
  private readonly notices: ((log: Logger) => void | Promise<void>)[] = [];
  private logger: Logger | undefined;
  /** Writes one after the other, in the order asked. */
  private writes: Promise<void> = Promise.resolve();
  status: SaveStatus = 'not_saved';

  /** The supervisor already reported the state directory unusable: a failed save adds no line. */
  assumeUnwritable(): void {
    this.status = 'write_failed';
  }

  constructor(opts: GenerationStoreOptions) {
    this.dir = opts.dir;
    this.configPath = path.resolve(opts.configPath);
    this.force = opts.forceConfig === true;
    this.metrics = opts.metrics;
  }

  private get file(): string {
    return path.join(this.dir, GENERATIONS_FILE);
  }

  /**
   * Reads the state and decides how this start goes; the configuration the service starts on (the
   * saved active one when it resumes, else the `-c` file), whose settings set up logging and workers.
   */
  async firstConfig(): Promise<FirstConfig> {
    const read = await readStateFile(this.dir, GENERATIONS_FILE, MAX_STATE_BYTES, parseGenerations);
    const file = await readBoundedFile(this.configPath);
    this.seenHash = file.ok ? sha256(file.bytes) : '';
    this.decision = await this.decide(read);
    if (this.decision.mode === 'resume') this.seenHash = this.decision.saved.boot_config_sha256;
    if (this.decision.mode === 'resume') {
      const kept = activeSource(this.decision.saved) as SourceRecord;
      const first = await loadConfigText(kept.text, path.dirname(kept.source));
      if (first.ok) return first;
      const { generation } = this.decision.saved.history.slots.find((s) => s.status === 'active') as { generation: number };
      const errors = codes(first.issues);
      this.notices.push((log) => log.error({ code: 'EDGE_STATE_SOURCE_INVALID', state_dir: this.dir, generation, config_source: kept.source, errors }, `the saved configuration of generation ${generation} no longer loads (${errors.map((e) => `${e.path}: ${e.code}`).join('; ')}): starting from -c ${this.configPath} as a new generation, history kept`));
      this.decision = { mode: 'file', saved: this.decision.saved, reason: `startup: the saved generation ${generation} no longer loads` };
      this.seenHash = file.ok ? sha256(file.bytes) : '';
    }
    return loadConfigFile(this.configPath);
  }

  private async decide(read: StateRead<SavedGenerations>): Promise<Decision> {
    const from = `-c ${this.configPath}`;
    if (read.kind === 'none') {
      this.notices.push((log) => log.info({ state_dir: this.dir }, `no saved state: first start from ${from}`));
      return { mode: 'file', saved: undefined, reason: 'initial configuration' };
    }
    if (read.kind === 'invalid') {
      this.notices.push(async (log) => {
        const aside = await this.moveAside();
        log.error({ code: 'EDGE_STATE_INVALID', file: this.file, problem: read.problem, ...(aside === undefined ? {} : { moved_to: aside }) }, `saved state unusable (${read.problem}): starting from ${from} as generation 1, history lost`);
      });
      return { mode: 'file', saved: undefined, reason: 'initial configuration (the saved state was unusable)' };
    }
    const saved = read.value;
    if (read.dropped.length > 0) this.notices.push((log) => this.reportDropped(log, read.dropped));
    if (this.force) {
      this.notices.push((log) => log.warn({ state_dir: this.dir }, `--force-config: starting from ${from} as a new generation, history kept`));
      return { mode: 'file', saved, reason: 'startup with --force-config' };
    }
    if (saved.boot_config !== this.configPath) {
      this.notices.push((log) => log.warn({ state_dir: this.dir, saved_with: saved.boot_config }, `the saved state was written by a service started with -c ${saved.boot_config}: starting from ${from} as a new generation, history kept`));
      return { mode: 'file', saved, reason: `startup: -c ${this.configPath} is not the file the state was saved with` };
    }
    if (this.seenHash !== '' && this.seenHash !== saved.boot_config_sha256) {
      const edited = await loadConfigFile(this.configPath);
      if (edited.ok) {
        this.notices.push((log) => log.warn({ state_dir: this.dir }, `${this.configPath} changed since the service last read it: starting from ${from} as a new generation, history kept`));
        return { mode: 'file', saved, reason: `startup: -c ${this.configPath} changed` };
      }
      if (activeSource(saved) !== undefined) {
        const errors = codes(edited.issues);
        this.notices.push((log) => log.error({ code: 'EDGE_STATE_EDIT_INVALID', state_dir: this.dir, errors }, `${this.configPath} changed but is invalid (${errors.map((e) => `${e.path}: ${e.code}`).join('; ')}): resuming the saved generation`));
        return { mode: 'resume', saved };
      }
    }
    if (activeSource(saved) === undefined) {
      this.notices.push((log) => log.info({ state_dir: this.dir }, `the saved state has no active generation to resume: starting from ${from} as a new generation, history kept`));
      return { mode: 'file', saved, reason: 'initial configuration (nothing to resume)' };
    }
    return { mode: 'resume', saved };
  }

  /**
   * One warning line for the records the loader left out (where and why, no value), their count,
   * and a copy of the file as it was for inspection (`generations.json.invalid`); the next save (the
   * first activation of this start) rewrites the file without them.
   */
  private async reportDropped(log: Logger, dropped: readonly DroppedRecord[]): Promise<void> {
    for (const d of dropped) this.metrics?.counter('svc_state_records_dropped_total').inc({ record: recordKind(d) });
    const aside = `${this.file}${INVALID_SUFFIX}`;
    const read = await readBoundedFile(this.file, { maxBytes: MAX_STATE_BYTES });
    const copied = read.ok ? await writeFileAtomic(this.dir, path.basename(aside), read.bytes).then(() => true, () => false) : false;
    const named = dropped.slice(0, MAX_DROPPED_NAMED);
    const list = named.map((d) => `${d.at}${d.id === undefined ? '' : ` (${d.at.includes('slots') ? 'generation' : 'entry'} ${d.id})`}: ${d.problem}`).join('; ');
    const more = dropped.length > named.length ? ` and ${dropped.length - named.length} more` : '';
    log.warn({ code: 'EDGE_STATE_RECORD_DROPPED', file: this.file, dropped: named, dropped_count: dropped.length, ...(copied ? { copied_to: aside } : {}) }, `saved state: ${dropped.length} unusable record${dropped.length === 1 ? '' : 's'} left out (${list}${more}); the rest of the history is kept and the file is rewritten without ${dropped.length === 1 ? 'it' : 'them'}`);
  }

  /** Moves an unusable generations file aside (the next save must not destroy what an operator may want to inspect); where, if it could. */
  private async moveAside(): Promise<string | undefined> {
    const aside = `${this.file}${INVALID_SUFFIX}`;
    return rename(this.file, aside).then(
      () => aside,
      () => undefined,
    );
  }

  /**
   * Brings the first generation up (after `firstConfig`): restores the saved history into
   * `manager`, resumes the saved active generation or activates the `-c` file, and from then on
   * saves the state after every recorded operation. The result is the first activation's.
   */
  async boot(manager: GenerationManager, logger: Logger): Promise<OperationResult> {
    this.logger = logger;
    for (const n of this.notices.splice(0)) await n(logger);
    await removeStaleTemps(this.dir, GENERATIONS_FILE);
    await removeStaleTemps(this.dir, WATCHDOG_FILE);
    const decision = this.decision ?? { mode: 'file', saved: undefined, reason: 'initial configuration' };
    manager.persist = () => this.save(manager);
    if (decision.saved !== undefined) {
      try {
        manager.restore(decision.saved.history);
      } catch (err) {
        // Records that parse but contradict each other: as unusable as a torn file.
        const aside = await this.moveAside();
        logger.error({ code: 'EDGE_STATE_INVALID', file: this.file, problem: (err as Error).message, ...(aside === undefined ? {} : { moved_to: aside }) }, `saved state unusable (${(err as Error).message}): starting from -c ${this.configPath} as generation 1, history lost`);
        return manager.bootstrap('initial configuration (the saved state was unusable)');
      }
    }
    if (decision.mode === 'file') return manager.bootstrap(decision.reason);
    const r = await manager.resume();
    if (r.status === 202) {
      logger.info({ generation: r.generation, config_source: manager.configSource, state_dir: this.dir }, `resumed generation ${r.generation} from the state directory`);
      await this.checkDrift(manager);
      return r;
    }
    const errors = (r.body['errors'] as ConfigIssue[] | undefined) ?? [];
    const why = errors.length > 0 ? errors.map((e) => `${e.path}: ${e.code}`).join('; ') : String(r.body['message'] ?? r.reason);
    logger.error({ code: 'EDGE_STATE_SOURCE_INVALID', state_dir: this.dir, generation: r.generation ?? null, reason: r.reason ?? null, errors: codes(errors) }, `the saved generation ${r.generation ?? ''} could not be resumed (${why}): starting from -c ${this.configPath} as a new generation, history kept`);
    return manager.bootstrap(`startup: the saved generation ${r.generation ?? ''} could not be resumed`);
  }

  /** One warning when the file at the active source path no longer holds what was activated. */
  private async checkDrift(manager: GenerationManager): Promise<void> {
    const kept = manager.active()?.text;
    const read = await readBoundedFile(manager.configSource);
    const state = !read.ok ? 'unreadable' : read.bytes.toString('utf8') === kept ? 'unchanged' : 'changed';
    if (state === 'unchanged') return;
    this.logger?.warn({ config_source: manager.configSource, file_state: state }, `${manager.configSource} is ${state === 'changed' ? 'not what was activated' : 'unreadable'}: the activated configuration serves; a reload (SIGHUP) reads the file`);
  }

  /** Saves the history and active source; a failure is logged and the service keeps serving. Never throws. */
  save(manager: GenerationManager): Promise<void> {
    // The -c file as last read: by this start, or by an activation or reload of it since.
    const active = manager.active();
    if (manager.configSource === this.configPath && active !== undefined) this.seenHash = sha256(active.text);
    const saved: SavedGenerations = { version: STATE_VERSION, saved_at_unix_ms: Date.now(), boot_config: this.configPath, boot_config_sha256: this.seenHash, active_source: manager.configSource, history: manager.records() };
    return this.enqueue(GENERATIONS_FILE, () => serializeGenerations(saved));
  }

  /**
   * The last restart time the watchdog kept (Unix ms), for its cooldown. An unusable file counts as
   * a restart just now: a damaged file must not let a restart loop past the cooldown.
   */
  async lastRestartAt(now: number): Promise<number | undefined> {
    const read = await readStateFile(this.dir, WATCHDOG_FILE, MAX_WATCHDOG_BYTES, parseWatchdog);
    if (read.kind === 'none') return undefined;
    if (read.kind === 'ok') return read.value.last_restart_at_unix_ms ?? undefined;
    this.logger?.error({ code: 'EDGE_STATE_INVALID', file: path.join(this.dir, WATCHDOG_FILE), problem: read.problem }, `saved watchdog state unusable (${read.problem}): the restart cooldown counts from now`);
    return now;
  }

  /** Saves the watchdog's last restart time. Never throws. */
  saveWatchdog(lastRestartAt: number | undefined): Promise<void> {
    const saved: SavedWatchdog = { version: STATE_VERSION, last_restart_at_unix_ms: lastRestartAt ?? null };
    return this.enqueue(WATCHDOG_FILE, () => JSON.stringify(saved));
  }

  /** Waits for the writes asked so far (stop). */
  flush(): Promise<void> {
    return this.writes;
  }

  private enqueue(name: string, data: () => string): Promise<void> {
    const next = this.writes.then(async () => {
      try {
        await writeFileAtomic(this.dir, name, data());
        if (this.status === 'write_failed') this.logger?.info({ state_dir: this.dir, file: name }, 'state saved again');
        this.status = 'saved';
      } catch (err) {
        const already = this.status === 'write_failed';
        this.status = 'write_failed';
        const e = err as NodeJS.ErrnoException;
        // One line when saving stops working (the snapshot's state.generations says it meanwhile).
        if (!already) this.logger?.error({ code: 'EDGE_STATE_WRITE_FAILED', state_dir: this.dir, file: name, errno: e.code ?? null }, `state not saved (${e.code ?? e.message}): the service keeps serving; a restart would resume the last state saved`);
      }
    });
    this.writes = next;
    return next;
  }
}

const sha256 = (data: string | Uint8Array): string => createHash('sha256').update(data).digest('hex');

/** The source of the saved active generation, when it has one. */
function activeSource(saved: SavedGenerations): SourceRecord | undefined {
  return saved.history.slots.find((s) => s.status === 'active')?.bundle;
}
