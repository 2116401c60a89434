// The generation operations behind the control API: validate, preview, activate, rollback and
// reload (SPEC "States and transitions / Runtime generation"). One operation at a time; a rejected
// or failed one leaves the active generation unchanged. Results are plain data with the HTTP status
// the endpoint answers with; they carry paths and codes, never secret values.
import path from 'node:path';
import { describeReadFailure, diffConfigs, keyedFingerprint, parseConfigText, publicIssue, readBoundedFile, resolveConfig, validateConfig } from '@edge-proxy/config';
import type { ConfigDiff, ConfigIssue, FieldChange, ReadFailure, ResolvedConfig, ValidatedConfig } from '@edge-proxy/config';
import type { GenerationBundle } from '@edge-proxy/ipc';
import { GenerationHistory } from './history.ts';
import { publicAndStored, storedIssue } from './stored-issue.ts';
import { OperationQueue, checkpoint } from './operation-queue.ts';
import type { HistoryEntry, HistoryLimits, HistoryRecords, Operation } from './history.ts';

/**
 * What the operations need from the workers (the WorkerPool, or a fake in unit tests). `ok: true`
 * means every live worker serves the candidate (`note` says which workers were re-forked on the
 * way); `ok: false` means every live worker serves the generation that was active before.
 */
export interface Activator {
  activate(bundle: GenerationBundle): Promise<{ ok: true; note?: string } | { ok: false; phase: 'prepare' | 'commit'; code: string; note: string }>;
}

/** Body fields of validate, preview, activate and reload (SPEC "Request body fields"). */
export interface ActivationRequest {
  readonly config_path?: string;
  readonly expected_generation?: number;
  /** The authenticated actor (token actor_id, certificate CN, `SIGHUP`, `startup`). */
  readonly requested_by?: string;
  /** The body's `requested_by` text, sanitized: a note, not an identity. */
  readonly requested_by_note?: string;
  readonly reason?: string;
}

/** Who waits for an operation: its signal aborts when the caller leaves or the deadline passes. */
export interface OperationContext {
  readonly signal?: AbortSignal;
}

/** Body of rollback (SPEC "Rollback request body"). */
export interface RollbackRequest {
  readonly target_generation: number;
  readonly expected_active_generation?: number;
  readonly requested_by?: string;
  readonly requested_by_note?: string;
  readonly reason?: string;
}

/** `candidate_status` values of a plan. */
export type CandidateStatus = 'activatable' | 'unchanged' | 'invalid' | 'restart_required' | 'stale_generation';

/** What validate and preview return (SPEC "Plan"). */
export interface Plan {
  readonly candidate: { readonly generation: number; readonly config_source: string; readonly config_fingerprint?: string };
  readonly candidate_status: CandidateStatus;
  readonly active_generation: number;
  readonly diff?: ConfigDiff;
  readonly rejected_changes: readonly (FieldChange | { readonly path: string; readonly code: string; readonly message: string })[];
  readonly errors?: readonly ConfigIssue[];
}

/**
 * A retained generation's bundle: enough to re-resolve it (rollback re-reads secret files). `text`
 * is the configuration as read (what the state directory keeps); `resolved` is absent on a
 * generation restored from the state directory until it is activated again.
 */
export interface Retained {
  readonly validated: ValidatedConfig;
  readonly source: string;
  readonly text: string;
  readonly resolved?: ResolvedConfig;
}

/** A retained generation's source as the state directory keeps it: the path and the text, never secret material. */
export interface SourceRecord {
  readonly source: string;
  readonly text: string;
}

export type OperationResult = { readonly status: number; readonly body: Record<string, unknown>; readonly entry?: HistoryEntry; readonly generation?: number; readonly reason?: string };

interface Candidate {
  readonly source: string;
  readonly fingerprint: string | undefined;
  readonly text?: string;
  readonly validated?: ValidatedConfig;
  readonly resolved?: ResolvedConfig;
  readonly errors?: ConfigIssue[];
  /** The source may not or cannot be read as a configuration at all: a request error, not a plan. */
  readonly refusal?: { readonly status: number; readonly reason: string; readonly message: string };
}

/** API reason and status of a source that is refused before it is parsed. */
const REFUSALS: Partial<Record<ReadFailure, { status: number; reason: string }>> = {
  not_allowed: { status: 403, reason: 'config_path_not_allowed' },
  not_regular_file: { status: 400, reason: 'config_path_not_regular_file' },
  too_large: { status: 400, reason: 'config_path_too_large' },
};

/** The refusal answer of a candidate that was refused (nothing recorded in history). */
function refused(c: Candidate): OperationResult | undefined {
  const r = c.refusal;
  return r === undefined ? undefined : { status: r.status, reason: r.reason, body: { reason: r.reason, message: r.message } };
}

/** Display form of a config source: the path as given (no secrets live in paths we accept). */
function sourceOf(p: string): string {
  return path.resolve(p);
}

export class GenerationManager {
  readonly history: GenerationHistory<Retained>;
  private readonly activator: Activator;
  private activeSource: string;
  /** The path given on the command line: trusted, read without the directory check. */
  private readonly startupSource: string;
  private readonly queue = new OperationQueue();
  private readonly now: () => number;
  /** Called after every successful activation or rollback (supervisor-side live settings). */
  onActivated: ((resolved: ResolvedConfig, generation: number) => void) | undefined;
  /** Key of secret and config-file fingerprints (the node-local key); unset: a per-process key. */
  fingerprintKey: Uint8Array | undefined;
  /**
   * Called after every operation that recorded something, before it answers (the state directory
   * write: an answered activation survives a restart). Must not throw.
   */
  persist: (() => Promise<void>) | undefined;
  /** The active generation of restored records, with its kept source (what `resume` activates). */
  private restoredActive: (SourceRecord & { readonly generation: number }) | undefined;

  constructor(activator: Activator, initialSource: string, limits?: HistoryLimits, now: () => number = Date.now) {
    this.activator = activator;
    this.activeSource = sourceOf(initialSource);
    this.startupSource = this.activeSource;
    this.history = new GenerationHistory<Retained>(limits);
    this.now = now;
  }

  get activeGeneration(): number {
    return this.history.activeGeneration;
  }

  get configSource(): string {
    return this.activeSource;
  }

  active(): Retained | undefined {
    return this.history.activeBundle();
  }

  /** Operations waiting behind the running one. */
  get queuedOperations(): number {
    return this.queue.queued;
  }

  /**
   * One operation at a time: activations, rollbacks, previews and certificate reloads are
   * serialized; one whose caller left or whose deadline passed while it waited is not carried out.
   */
  exclusive<T>(ctx: OperationContext, f: () => Promise<T>): Promise<T> {
    return this.queue.run(ctx.signal, f);
  }

  /** `exclusive`, then `persist` when the operation recorded an entry. */
  private recorded(ctx: OperationContext, f: () => Promise<OperationResult>): Promise<OperationResult> {
    return this.exclusive(ctx, async () => {
      const r = await f();
      if (r.entry !== undefined) await this.persist?.();
      return r;
    });
  }

  /** The history with each retained generation's source (path and text): what the state directory keeps. */
  records(): HistoryRecords<SourceRecord> {
    return this.history.records((b) => ({ source: b.source, text: b.text }));
  }

  /** Directories a `config_path` may lie in: the active generation's list, else the startup file's directory. */
  private allowedDirs(): readonly string[] {
    return this.active()?.resolved?.config.observability.control_api.config_path_allowed_dirs ?? [path.dirname(this.startupSource)];
  }

  /**
   * Reads and checks a candidate. Any source but the startup file is confined to allowedDirs();
   * every source is read only if it is a regular file within the size cap, without blocking.
   * Issues are made public (codes and paths only): the file's content never leaves this function.
   */
  private async load(configPath: string | undefined): Promise<Candidate> {
    const source = configPath === undefined ? this.activeSource : sourceOf(configPath);
    const trusted = source === this.startupSource;
    const read = await readBoundedFile(source, trusted ? {} : { allowedDirs: this.allowedDirs() });
    if (!read.ok) {
      const refusal = REFUSALS[read.failure];
      const message = `${source}: ${describeReadFailure(read.failure)}`;
      if (refusal !== undefined) return { source, fingerprint: undefined, refusal: { ...refusal, message } };
      return { source, fingerprint: undefined, errors: [{ path: '', code: 'EDGE_CONFIG_READ', message }] };
    }
    return this.check(source, read.bytes);
  }

  /** Checks configuration `content` read from `source`: parsed, validated and resolved, or its public issues. */
  private async check(source: string, content: Buffer | string): Promise<Candidate> {
    // Keyed: a config file may hold inline tokens, and viewers read this fingerprint.
    const fp = keyedFingerprint(content, this.fingerprintKey);
    const text = typeof content === 'string' ? content : content.toString('utf8');
    const validated = validateText(source, text);
    if (!validated.ok) return { source, fingerprint: fp, errors: validated.issues };
    const resolved = await resolveConfig(validated.value, { fingerprintKey: this.fingerprintKey });
    if (!resolved.ok) return { source, fingerprint: fp, errors: resolved.issues.map(publicIssue) };
    return { source, fingerprint: fp, text, validated: validated.value, resolved: resolved.value };
  }

  private plan(c: Candidate, expected: number | undefined): Plan {
    const active = this.history.activeBundle();
    const base = {
      candidate: { generation: this.history.nextGeneration(), config_source: c.source, ...(c.fingerprint === undefined ? {} : { config_fingerprint: c.fingerprint }) },
      active_generation: this.history.activeGeneration,
    };
    if (c.resolved === undefined) return { ...base, candidate_status: 'invalid', rejected_changes: [], errors: c.errors ?? [] };
    const diff = active?.resolved === undefined ? undefined : diffConfigs(active.resolved, c.resolved);
    if (expected !== undefined && expected !== this.history.activeGeneration) {
      return {
        ...base,
        candidate_status: 'stale_generation',
        ...(diff === undefined ? {} : { diff }),
        rejected_changes: [{ path: 'expected_generation', code: 'stale_generation', message: `expected generation ${expected}, active is ${this.history.activeGeneration}` }],
      };
    }
    if (diff !== undefined && diff.restart_required) return { ...base, candidate_status: 'restart_required', diff, rejected_changes: diff.rejected_changes };
    return { ...base, candidate_status: diff !== undefined && !diff.changed ? 'unchanged' : 'activatable', ...(diff === undefined ? {} : { diff }), rejected_changes: [] };
  }

  /** POST validate: a plan, nothing recorded, nothing changed. Always 200. */
  async validate(req: ActivationRequest, ctx: OperationContext = {}): Promise<OperationResult> {
    const c = await this.loadAndPlan(req, ctx);
    if ('refusal' in c) return c.refusal;
    return { status: 200, body: c.plan as unknown as Record<string, unknown> };
  }

  /**
   * Reads and plans the candidate of a validate, preview or activate. The checkpoint after the
   * read is the last point where an abandoned operation leaves no trace: nothing recorded, nothing
   * prepared. A file refused before parsing (confinement, type, size) is answered as it is.
   */
  private async loadAndPlan(req: ActivationRequest, ctx: OperationContext): Promise<{ candidate: Candidate; plan: Plan } | { refusal: OperationResult }> {
    const candidate = await this.load(req.config_path);
    checkpoint(ctx.signal);
    const refusal = refused(candidate);
    if (refusal !== undefined) return { refusal };
    return { candidate, plan: this.plan(candidate, req.expected_generation) };
  }

  /** POST preview: validate, and record the plan in history as an operator preview. Always 200. */
  preview(req: ActivationRequest, ctx: OperationContext = {}): Promise<OperationResult> {
    return this.recorded(ctx, async () => {
      const c = await this.loadAndPlan(req, ctx);
      if ('refusal' in c) return c.refusal;
      const plan = c.plan;
      const entry = this.history.record({
        operation: 'preview',
        generation: plan.candidate.generation,
        result: 'recorded',
        time_unix_ms: this.now(),
        config_source: plan.candidate.config_source,
        ...actor(req),
        note: `candidate_status: ${plan.candidate_status}`,
        ...(plan.diff === undefined ? {} : { diff: plan.diff }),
        rejected_changes: plan.rejected_changes,
      });
      return { status: 200, body: { ...(plan as unknown as Record<string, unknown>), history_entry: entry }, entry };
    });
  }

  /** The first generation at startup (no diff, no expected generation), from the `-c` file. */
  async bootstrap(reason = 'initial configuration'): Promise<OperationResult> {
    return this.activate({ requested_by: 'startup', reason }, 'activate');
  }

  /**
   * A process restart: restores `records` (the history the state directory kept) into the empty
   * history. Each retained source is validated again; one that no longer validates keeps its
   * record without a bundle. Numbers continue from `records.last_generation`. Nothing is activated
   * (`resume` or `bootstrap` does that); throws when the records break the history's invariants.
   */
  restore(records: HistoryRecords<SourceRecord>): void {
    const restored = records.slots.map((s) => {
      if (s.bundle === undefined) return { ...s, bundle: undefined };
      const v = validateText(s.bundle.source, s.bundle.text);
      if (!v.ok) return { ...s, bundle: undefined, note: `not restored after a restart: ${v.issues.map((i) => i.code).join(', ')}` };
      return { ...s, bundle: { validated: v.value, source: s.bundle.source, text: s.bundle.text } };
    });
    this.history.restore({ ...records, slots: restored });
    const active = records.slots.find((s) => s.status === 'active');
    this.restoredActive = active?.bundle === undefined ? undefined : { generation: active.generation, ...active.bundle };
  }

  /**
   * Activates the restored active generation again, under the same number, from its kept text
   * (secret files re-read from disk, as a rollback does). 202 when it serves; otherwise (nothing
   * was active, the text no longer validates or resolves, the workers failed it) the failure is
   * recorded and the caller starts from the `-c` file with `bootstrap` (a new number).
   */
  resume(): Promise<OperationResult> {
    return this.recorded({}, async () => {
      const kept = this.restoredActive;
      if (kept === undefined) return { status: 404, reason: 'nothing_to_resume', body: { reason: 'nothing_to_resume', message: 'the state directory holds no active generation with its source' } };
      const generation = kept.generation;
      const common = { operation: 'resume', generation, time_unix_ms: this.now(), config_source: kept.source, requested_by: 'startup', reason: 'process restart: resumed from the state directory' } as const;
      const c = await this.check(kept.source, kept.text);
      if (c.resolved === undefined) {
        const errors = c.errors ?? [];
        const entry = this.history.record({ ...common, result: 'failed', note: 'the kept configuration no longer validates or resolves', rejected_changes: errors.map(storedIssue) });
        return { status: 400, reason: 'invalid_config', body: { reason: 'invalid_config', message: 'the kept configuration no longer validates or resolves', errors, history_entry: entry }, entry, generation };
      }
      const outcome = await this.activator.activate({ generation, resolved: c.resolved });
      if (!outcome.ok) {
        const reason = outcome.phase === 'prepare' ? 'prepare_failed' : 'swap_failed';
        const entry = this.history.record({ ...common, result: 'failed', note: outcome.note });
        return { status: 500, reason, body: { reason, message: outcome.note, history_entry: entry }, entry, generation };
      }
      this.history.setBundle(generation, { validated: c.validated as ValidatedConfig, source: c.source, text: c.text as string, resolved: c.resolved });
      this.activeSource = c.source;
      const note = outcome.note === undefined ? {} : { note: outcome.note };
      const entry = this.history.record({ ...common, result: 'succeeded', ...note });
      this.onActivated?.(c.resolved, generation);
      return { status: 202, body: { generation, status: 'active', config_source: c.source, ...(c.fingerprint === undefined ? {} : { config_fingerprint: c.fingerprint }), ...note, history_entry: entry }, entry, generation };
    });
  }

  /** POST activate (and reload, its legacy twin). */
  activate(req: ActivationRequest, operation: Extract<Operation, 'activate' | 'reload'> = 'activate', ctx: OperationContext = {}): Promise<OperationResult> {
    return this.recorded(ctx, async () => {
      const c = await this.loadAndPlan(req, ctx);
      if ('refusal' in c) return c.refusal;
      const { candidate, plan } = c;
      const generation = plan.candidate.generation;
      const common = { operation, time_unix_ms: this.now(), config_source: candidate.source, ...actor(req) } as const;
      if (plan.candidate_status === 'invalid') {
        const entry = this.history.record({ ...common, generation, result: 'rejected', note: 'candidate config invalid', rejected_changes: (plan.errors ?? []).map(storedIssue) });
        return { status: 400, reason: 'invalid_config', body: { reason: 'invalid_config', message: 'the candidate configuration is invalid', plan, history_entry: entry }, entry };
      }
      if (plan.candidate_status === 'stale_generation' || plan.candidate_status === 'restart_required') {
        const reason = plan.candidate_status;
        const entry = this.history.record({ ...common, generation, result: 'rejected', note: reason, rejected_changes: plan.rejected_changes, ...(plan.diff === undefined ? {} : { diff: plan.diff }) });
        const message = reason === 'stale_generation' ? 'expected_generation does not match the active generation' : 'the candidate changes settings that require a restart';
        return { status: 409, reason, body: { reason, message, plan, history_entry: entry }, entry };
      }
      const resolved = candidate.resolved as ResolvedConfig;
      const outcome = await this.activator.activate({ generation, resolved });
      if (!outcome.ok) {
        // Never active on any surviving worker (a commit nobody acknowledged included): the
        // candidate is recorded like one that failed to prepare; the active generation is unchanged.
        this.history.failedPrepare(generation, outcome.note);
        const reason = outcome.phase === 'prepare' ? 'prepare_failed' : 'swap_failed';
        const entry = this.history.record({ ...common, generation, result: 'failed', note: outcome.note, ...(plan.diff === undefined ? {} : { diff: plan.diff }) });
        return { status: 500, reason, body: { reason, code: outcome.code, message: outcome.note, generation, active_generation: this.history.activeGeneration, history_entry: entry }, entry, generation };
      }
      this.history.activated(generation, { validated: candidate.validated as ValidatedConfig, source: candidate.source, text: candidate.text as string, resolved });
      this.activeSource = candidate.source;
      const note = outcome.note === undefined ? {} : { note: outcome.note };
      const entry = this.history.record({ ...common, generation, result: 'succeeded', ...(plan.diff === undefined ? {} : { diff: plan.diff }), rejected_changes: [], ...note });
      this.onActivated?.(resolved, generation);
      return { status: 202, body: { generation, status: 'active', config_source: candidate.source, diff: plan.diff ?? null, rejected_changes: [], ...note, history_entry: entry }, entry, generation };
    });
  }

  /** POST rollback: restore a retained generation; `file://` secrets are re-read from disk. */
  rollback(req: RollbackRequest, ctx: OperationContext = {}): Promise<OperationResult> {
    return this.recorded(ctx, async () => {
      checkpoint(ctx.signal);
      const common = { operation: 'rollback' as const, time_unix_ms: this.now(), target_generation: req.target_generation, ...actor(req) };
      const activeNow = this.history.activeGeneration;
      if (req.expected_active_generation !== undefined && req.expected_active_generation !== activeNow) {
        const entry = this.history.record({ ...common, generation: activeNow, result: 'rejected', note: 'stale_generation' });
        return { status: 409, reason: 'stale_generation', body: { reason: 'stale_generation', message: `expected active generation ${req.expected_active_generation}, active is ${activeNow}`, history_entry: entry }, entry };
      }
      const refusal = this.history.checkRollback(req.target_generation);
      if (refusal !== undefined) {
        const entry = this.history.record({ ...common, generation: activeNow, result: 'rejected', note: refusal.reason });
        return { status: refusal.status, reason: refusal.reason, body: { reason: refusal.reason, message: `generation ${req.target_generation} cannot be restored (${refusal.reason.replace(/_/g, ' ')})`, history_entry: entry }, entry };
      }
      const retained = this.history.bundle(req.target_generation) as Retained;
      const re = await resolveConfig(retained.validated, { fingerprintKey: this.fingerprintKey });
      checkpoint(ctx.signal);
      if (!re.ok) {
        const note = re.issues.map((i) => `${i.path}: ${i.code}`).join('; ');
        const entry = this.history.record({ ...common, generation: activeNow, result: 'failed', note });
        return { status: 500, reason: 'prepare_failed', body: { reason: 'prepare_failed', message: `secret material of generation ${req.target_generation} could not be resolved: ${note}`, history_entry: entry }, entry };
      }
      const before = this.history.activeBundle()?.resolved;
      const diff = before === undefined ? null : diffConfigs(before, re.value);
      // Restoring a generation from before a listener was added would remove it: restart-required
      // as any listener removal (the workers keep the sockets they bound).
      if (diff?.restart_required === true) {
        const entry = this.history.record({ ...common, generation: activeNow, result: 'rejected', note: 'restart_required', rejected_changes: diff.rejected_changes, diff });
        return { status: 409, reason: 'restart_required', body: { reason: 'restart_required', message: `restoring generation ${req.target_generation} changes settings that require a restart`, rejected_changes: diff.rejected_changes, history_entry: entry }, entry };
      }
      const outcome = await this.activator.activate({ generation: req.target_generation, resolved: re.value });
      if (!outcome.ok) {
        const reason = outcome.phase === 'prepare' ? 'prepare_failed' : 'swap_failed';
        const entry = this.history.record({ ...common, generation: activeNow, result: 'failed', note: outcome.note });
        return { status: 500, reason, body: { reason, code: outcome.code, message: outcome.note, active_generation: activeNow, history_entry: entry }, entry };
      }
      this.history.rolledBack(req.target_generation, { ...retained, resolved: re.value });
      this.activeSource = retained.source;
      const note = outcome.note === undefined ? {} : { note: outcome.note };
      const entry = this.history.record({ ...common, generation: req.target_generation, result: 'succeeded', config_source: retained.source, diff, ...note });
      this.onActivated?.(re.value, req.target_generation);
      return { status: 202, body: { generation: req.target_generation, status: 'active', diff, ...note, history_entry: entry }, entry, generation: req.target_generation };
    });
  }
}

/** Parses and validates configuration text read from `source` (relative paths against its directory); public issues. */
function validateText(source: string, text: string): { ok: true; value: ValidatedConfig } | { ok: false; issues: ConfigIssue[] } {
  const parsed = parseConfigText(text);
  // Public for the immediate answer; storedIssue() gives what history and logs keep (no unknown key's name).
  if (!parsed.ok) return { ok: false, issues: parsed.issues.map(publicAndStored) };
  const validated = validateConfig(parsed.value, path.dirname(source));
  if (!validated.ok) return { ok: false, issues: validated.issues.map(publicAndStored) };
  return validated;
}

function actor(req: { requested_by?: string; requested_by_note?: string; reason?: string }): { requested_by?: string; requested_by_note?: string; reason?: string } {
  return {
    ...(req.requested_by === undefined ? {} : { requested_by: req.requested_by }),
    ...(req.requested_by_note === undefined ? {} : { requested_by_note: req.requested_by_note }),
    ...(req.reason === undefined ? {} : { reason: req.reason }),
  };
}
