// Generation history: the retained generations with their statuses and bundles, and the operation
// log (preview, activate, rollback, reload). Pure data and rules; the supervisor owns the I/O.
//
// Status rules (SPEC lists the statuses; when each is taken is "not shown", decided here and in
// docs/decisions.md):
// - activation of N: N → active; the generation active before → previous; the one that was
//   previous → superseded. A candidate that failed to prepare → failed_prepare (no bundle, note).
// - rollback to T: T → active; the generation active before → rolled_back; the one that was
//   previous (if not T) → superseded.
// - a rollback candidate is a retained generation that still has its bundle and is neither active
//   nor failed_prepare; `rolled_back` ones included (undoing a rollback).
// - bundles are kept for the newest `maxBundles` generations that had one; older ones keep their
//   record with `has_bundle: false`. At most `maxRecords` records and `maxEntries` log entries.
// - `records()` / `restore()` carry all of it across a process restart (state/generation-store.ts).
// - every number kept is a generation number (generation-number.ts): what the state file can hold.
import { isGenerationCounter, isGenerationNumber } from './generation-number.ts';

/** SPEC "Retained generation record" statuses. */
export type GenerationStatus = 'active' | 'previous' | 'failed_prepare' | 'rolled_back' | 'superseded';

/** A retained generation as the API shows it (SPEC field names). */
export interface RetainedGeneration {
  readonly generation: number;
  readonly status: GenerationStatus;
  readonly rollback_candidate: boolean;
  readonly has_bundle: boolean;
  readonly note?: string;
}

/**
 * Operations recorded in the log (validate is never recorded). `resume`: the active generation
 * started again from the state directory after a process restart (same number).
 */
export type Operation = 'preview' | 'activate' | 'rollback' | 'reload' | 'resume';

/** One operation log entry (field names decided here: docs/control-api.md). */
export interface HistoryEntry {
  readonly entry_id: number;
  readonly operation: Operation;
  readonly generation: number;
  readonly result: 'succeeded' | 'rejected' | 'failed' | 'recorded';
  readonly time_unix_ms: number;
  /** The authenticated actor (token `actor_id`, certificate CN; `SIGHUP`, `startup`). */
  readonly requested_by?: string;
  /** The `requested_by` text of the request body (printable, bounded): a note, not an identity. */
  readonly requested_by_note?: string;
  readonly reason?: string;
  /** Sanitized config source (the active source path for file reloads). */
  readonly config_source?: string;
  /** Rollback: the generation restored. */
  readonly target_generation?: number;
  /** Activation, reload and preview: the domain diff (paths only, never values). */
  readonly diff?: unknown;
  readonly rejected_changes?: readonly unknown[];
  readonly note?: string;
}

interface Slot<B> {
  generation: number;
  status: GenerationStatus;
  bundle: B | undefined;
  note: string | undefined;
}

export interface HistoryLimits {
  readonly maxBundles: number;
  readonly maxRecords: number;
  readonly maxEntries: number;
}

/** Everything the history holds, as plain data: what the state directory keeps across restarts. */
export interface HistoryRecords<B> {
  /** The highest generation number ever given (the next candidate gets one more). */
  readonly last_generation: number;
  /** The highest entry id ever given. */
  readonly last_entry_id: number;
  /** Oldest first. */
  readonly slots: readonly { readonly generation: number; readonly status: GenerationStatus; readonly bundle: B | undefined; readonly note?: string }[];
  /** Oldest first. */
  readonly entries: readonly HistoryEntry[];
}

export const DEFAULT_HISTORY_LIMITS: HistoryLimits = { maxBundles: 16, maxRecords: 64, maxEntries: 256 };

/** Why a rollback target is not acceptable. */
export type RollbackRefusal = { status: 404; reason: 'generation_not_retained' } | { status: 409; reason: 'not_rollback_candidate' | 'already_active' };

export class GenerationHistory<B> {
  private readonly slots: Slot<B>[] = [];
  private readonly log: HistoryEntry[] = [];
  private readonly limits: HistoryLimits;
  private lastGeneration = 0;
  private lastEntry = 0;

  constructor(limits: HistoryLimits = DEFAULT_HISTORY_LIMITS) {
    this.limits = limits;
  }

  /** The generation serving traffic (0 before the first activation). */
  get activeGeneration(): number {
    return this.slots.find((s) => s.status === 'active')?.generation ?? 0;
  }

  /** The number the next candidate gets. Numbers are never reused, failed candidates included. */
  nextGeneration(): number {
    return this.lastGeneration + 1;
  }

  /** The bundle of the active generation. */
  activeBundle(): B | undefined {
    return this.slots.find((s) => s.status === 'active')?.bundle;
  }

  bundle(generation: number): B | undefined {
    return this.slots.find((s) => s.generation === generation)?.bundle;
  }

  /** Records generation `generation` as activated with `bundle`. */
  activated(generation: number, bundle: B): void {
    this.claim(generation);
    for (const s of this.slots) {
      if (s.status === 'active') s.status = 'previous';
      else if (s.status === 'previous') s.status = 'superseded';
    }
    // The one just demoted from active is now previous; there is exactly one previous.
    this.slots.push({ generation, status: 'active', bundle, note: undefined });
    this.trim();
  }

  /** Records a candidate that failed to prepare: never active, no bundle. */
  failedPrepare(generation: number, note: string): void {
    this.claim(generation);
    this.slots.push({ generation, status: 'failed_prepare', bundle: undefined, note });
    this.trim();
  }

  /** Whether `target` may be rolled back to. */
  checkRollback(target: number): RollbackRefusal | undefined {
    const slot = this.slots.find((s) => s.generation === target);
    if (slot === undefined) return { status: 404, reason: 'generation_not_retained' };
    if (slot.status === 'active') return { status: 409, reason: 'already_active' };
    if (!this.isCandidate(slot)) return { status: 409, reason: 'not_rollback_candidate' };
    return undefined;
  }

  /**
   * Records a successful rollback to `target` (checked with `checkRollback` first); `bundle`, when
   * given, replaces the target's (its secret material as re-read for the rollback).
   */
  rolledBack(target: number, bundle?: B): void {
    const slot = this.slots.find((s) => s.generation === target);
    if (slot === undefined) throw new Error(`generation ${target} is not retained`);
    if (bundle !== undefined) slot.bundle = bundle;
    for (const s of this.slots) {
      if (s === slot) continue;
      if (s.status === 'active') s.status = 'rolled_back';
      else if (s.status === 'previous') s.status = 'superseded';
    }
    slot.status = 'active';
  }

  /** Appends an operation to the log; returns it with its id. */
  record(entry: Omit<HistoryEntry, 'entry_id'>): HistoryEntry {
    // The API refuses such numbers first; one reaching here is a programming error, not a record.
    if (!isGenerationNumber(entry.generation) || (entry.target_generation !== undefined && !isGenerationNumber(entry.target_generation))) throw new Error(`history entry with a number that is not a generation number (${String(entry.generation)}, ${String(entry.target_generation)})`);
    const full = { entry_id: ++this.lastEntry, ...entry };
    this.log.push(full);
    if (this.log.length > this.limits.maxEntries) this.log.splice(0, this.log.length - this.limits.maxEntries);
    return full;
  }

  /** Retained generations, newest first. */
  retained(): RetainedGeneration[] {
    return [...this.slots].reverse().map((s) => ({
      generation: s.generation,
      status: s.status,
      rollback_candidate: this.isCandidate(s),
      has_bundle: s.bundle !== undefined,
      ...(s.note === undefined ? {} : { note: s.note }),
    }));
  }

  /** The operation log, newest first; optionally only entries about `generation`. */
  entries(generation?: number): HistoryEntry[] {
    const list = generation === undefined ? this.log : this.log.filter((e) => e.generation === generation || e.target_generation === generation);
    return [...list].reverse();
  }

  retainedGeneration(generation: number): RetainedGeneration | undefined {
    return this.retained().find((r) => r.generation === generation);
  }

  /** Retained records (the `svc_runtime_history_depth` gauge). */
  get depth(): number {
    return this.slots.length;
  }

  /** The whole history as plain data, each bundle mapped by `f` (oldest first). */
  records<S>(f: (bundle: B) => S): HistoryRecords<S> {
    return {
      last_generation: this.lastGeneration,
      last_entry_id: this.lastEntry,
      slots: this.slots.map((s) => ({ generation: s.generation, status: s.status, bundle: s.bundle === undefined ? undefined : f(s.bundle), ...(s.note === undefined ? {} : { note: s.note }) })),
      entries: [...this.log],
    };
  }

  /**
   * Replaces an empty history with `r` (a process restart). Throws when `r` breaks the history's
   * invariants (at most one active generation, numbers unique, ascending and within
   * `last_generation`, entry ids within `last_entry_id`); the limits are applied.
   */
  restore(r: HistoryRecords<B>): void {
    if (this.slots.length > 0 || this.log.length > 0 || this.lastGeneration > 0) throw new Error('history is not empty');
    if (!isGenerationCounter(r.last_generation)) throw new Error(`last generation ${String(r.last_generation)} is not a generation number`);
    let prev = 0;
    for (const s of r.slots) {
      if (!isGenerationNumber(s.generation) || s.generation <= prev || s.generation > r.last_generation) throw new Error(`generation ${s.generation} out of order`);
      prev = s.generation;
    }
    if (r.slots.filter((s) => s.status === 'active').length > 1) throw new Error('more than one active generation');
    if (r.entries.some((e) => e.entry_id > r.last_entry_id)) throw new Error('entry id beyond the last one given');
    this.lastGeneration = r.last_generation;
    this.lastEntry = r.last_entry_id;
    for (const s of r.slots) this.slots.push({ generation: s.generation, status: s.status, bundle: s.bundle, note: s.note });
    this.log.push(...r.entries.slice(-this.limits.maxEntries));
    this.trim();
  }

  /** Replaces the bundle of a retained generation (the active one once it is resolved again). */
  setBundle(generation: number, bundle: B): void {
    const slot = this.slots.find((s) => s.generation === generation);
    if (slot === undefined) throw new Error(`generation ${generation} is not retained`);
    slot.bundle = bundle;
  }

  private isCandidate(s: Slot<B>): boolean {
    return s.bundle !== undefined && s.status !== 'active' && s.status !== 'failed_prepare';
  }

  private claim(generation: number): void {
    if (!isGenerationNumber(generation)) throw new Error(`${String(generation)} is not a generation number`);
    if (generation <= this.lastGeneration) throw new Error(`generation ${generation} is not newer than ${this.lastGeneration}`);
    this.lastGeneration = generation;
  }

  private trim(): void {
    // Drop bundles beyond the newest maxBundles (the active one always keeps its bundle).
    let kept = 0;
    for (let i = this.slots.length - 1; i >= 0; i--) {
      const s = this.slots[i] as Slot<B>;
      if (s.bundle === undefined) continue;
      kept++;
      if (kept > this.limits.maxBundles && s.status !== 'active') s.bundle = undefined;
    }
    while (this.slots.length > this.limits.maxRecords) {
      const i = this.slots.findIndex((s) => s.status !== 'active');
      if (i === -1) break;
      this.slots.splice(i, 1);
    }
  }
}
