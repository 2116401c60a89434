// The supervisor's workers (node:cluster). Activation is two-phase (DESIGN "Generations"):
// `prepare(bundle)` on every worker, then `commit` everywhere, or `abort` everywhere if any worker
// failed or did not answer in time. A worker that exits is re-forked and handed the current active
// generation before it binds; readiness means every worker committed the active generation, was
// heard from recently, and nothing is draining.
//
// What happens when a worker dies or hangs part-way through an activation is two-phase.ts's
// protocol; activations and re-fork handovers are serialized here, so a re-forked worker is never
// handed a generation that an activation in progress is about to replace.
import cluster from 'node:cluster';
import type { Worker } from 'node:cluster';
import { EventEmitter } from 'node:events';
import { RequestChannel, dropSendError, isFromWorker } from '@edge-proxy/ipc';
import type { FromWorker, GenerationBundle, SharedKeys, ToWorker, WorkerWindow } from '@edge-proxy/ipc';
import { reforkDelayMs, silenceLimitMs, unresponsive } from './liveness.ts';
import type { LivenessConfig } from './liveness.ts';
import { describeError, twoPhase } from './two-phase.ts';
import type { ActivationOutcome, Participant } from './two-phase.ts';
import { RetiredCounters, countersOf } from './retired-counters.ts';
import { addedEndpoints, firstTakenPort, takenPortMessage } from './listener-probe.ts';
import type { MetricJson } from './retired-counters.ts';

export type { ActivationOutcome } from './two-phase.ts';

type Req = Extract<ToWorker, { id: number }>;

/** Why a worker process ended (restart accounting, logs, the snapshot). */
export type ExitReason = 'exited' | 'unresponsive' | 'ipc_timeout' | 'commit_failed' | 'handover_failed' | 'restart';
export const EXIT_REASONS: readonly ExitReason[] = ['exited', 'unresponsive', 'ipc_timeout', 'commit_failed', 'handover_failed', 'restart'];

interface Member {
  readonly index: number;
  readonly worker: Worker;
  readonly channel: RequestChannel<Req>;
  /** Generation this worker has committed (0: none yet). */
  generation: number;
  pid: number;
  listening: boolean;
  /** forking: not yet `ready`; handover: re-forked, being handed the active generation; serving. */
  state: 'forking' | 'handover' | 'serving';
  /** When the supervisor last heard from it (any message): monotonic ms (`performance.now()`), so a wall-clock step never makes a worker look silent. */
  lastSeen: number;
  /** Set when the supervisor itself takes the worker out. */
  exitReason: ExitReason | undefined;
  /** Its counters and histograms as last read (retired-counters.ts); added to the retired set when it is gone. */
  counters?: MetricJson[];
  /** Its counts were added to the retired set (it is gone). */
  retired?: boolean;
}

export interface WorkerPoolOptions {
  /** Worker entry module (packages/dataplane/src/worker/main.ts). */
  readonly exec: string;
  readonly count: number;
  readonly keys: SharedKeys;
  /** Deadline for every worker to answer prepare, and then commit (and a fork to say ready). */
  readonly phaseTimeoutMs: number;
  /** Extra arguments for the worker's Node (e.g. nothing; tests may pass flags). */
  readonly execArgv?: readonly string[];
  /** Liveness before the first generation is active (later: the active generation's `performance`). */
  readonly liveness?: LivenessConfig;
  /** Added to every worker's environment (CPU pinning, privilege drop: supervisor/process-keys.ts). */
  readonly env?: Readonly<Record<string, string>>;
  /** Notices every new worker gets right after `init` (the JWKS key sets the node holds now). */
  readonly greeting?: () => readonly ToWorker[];
}

/** Result of a rolling restart. */
export type RestartOutcome = { readonly ok: true } | { readonly ok: false; readonly index: number; readonly note: string };

const DEFAULT_LIVENESS: LivenessConfig = { heartbeatMs: 1000, unresponsiveHeartbeats: 5 };
/** Margin a worker gets beyond a drain grace to answer before it is killed. */
const DRAIN_MARGIN_MS = 1000;

/**
 * Events: `heartbeat` (index, WorkerWindow), `exit` (index, code, signal, ExitReason), `refork`
 * (index, generation), `refork-failed` (index, code, message), `unresponsive` (index, silentMs),
 * `restart-step` (index: a rolling restart drains it now), `panic` (index, message), `listening`
 * (index, listeners), `jwks-refresh` (index, sourceId), `port-taken` (generation, message: an
 * activation's new listener port is held by another process, listener-probe.ts), `lease` (index,
 * LeaseAsk[]: a worker's lease message, limits/lease-service.ts), `admission` (index, AdmissionReport:
 * a worker's response windows and in-use count, limits/node-admission.ts).
 */
export class WorkerPool extends EventEmitter {
  private readonly opts: WorkerPoolOptions;
  private readonly members: Member[] = [];
  private active: GenerationBundle | undefined;
  /** Listener material of the last reload-certs since the active generation was built, for re-forks. */
  private certs: GenerationBundle['resolved']['material']['listeners'] | undefined;
  private stopping = false;
  private draining = false;
  /** Activations and re-fork handovers, one at a time. */
  private chain: Promise<unknown> = Promise.resolve();
  /** Per slot: re-fork attempts in a row that died before serving (backoff). */
  private readonly failures: number[] = [];
  /** Per slot: processes forked so far (0 for the first). */
  private readonly incarnations: number[] = [];
  private readonly timers = new Set<NodeJS.Timeout>();
  private livenessTimer: NodeJS.Timeout | undefined;
  /** Final counts of the worker processes that are gone: aggregated counters never go back. */
  private readonly retiredCounters = new RetiredCounters();
  /** Workers re-forked since start. */
  reforks = 0;
  /** Worker processes ended since start, by reason. */
  readonly exits: Record<ExitReason, number> = { exited: 0, unresponsive: 0, ipc_timeout: 0, commit_failed: 0, handover_failed: 0, restart: 0 };

  constructor(opts: WorkerPoolOptions) {
    super();
    this.opts = opts;
  }

  /** Forks every worker and waits until each has said `ready`. */
  async start(): Promise<void> {
    cluster.setupPrimary({ exec: this.opts.exec, serialization: 'advanced', execArgv: [...(this.opts.execArgv ?? process.execArgv)] });
    const members = await Promise.all(Array.from({ length: this.opts.count }, (_, i) => this.fork(i)));
    // The first generation is handed to these by the bootstrap activation.
    for (const m of members) m.state = 'serving';
    this.scheduleLivenessCheck();
  }

  private liveness(): LivenessConfig {
    const p = this.active?.resolved.config.performance;
    return p === undefined ? (this.opts.liveness ?? DEFAULT_LIVENESS) : { heartbeatMs: p.worker_heartbeat_ms, unresponsiveHeartbeats: p.worker_unresponsive_heartbeats };
  }

  private fork(index: number): Promise<Member> {
    const incarnation = this.incarnations[index] ?? 0;
    this.incarnations[index] = incarnation + 1;
    const worker = cluster.fork({ ...this.opts.env, EDGE_WORKER_INDEX: String(index), EDGE_WORKER_INCARNATION: String(incarnation) });
    const member: Member = { index, worker, channel: new RequestChannel<Req>(worker), generation: 0, pid: 0, listening: false, state: 'forking', lastSeen: performance.now(), exitReason: undefined };
    this.members[index] = member;
    worker.on('message', (m: unknown) => this.onMessage(member, m));
    worker.on('exit', (code, signal) => this.onExit(member, code, signal));
    return new Promise<Member>((resolve, reject) => {
      // A process that never says ready (stuck at start) is killed; its exit re-forks the slot.
      const deadline = setTimeout(() => this.kill(member, 'unresponsive'), this.opts.phaseTimeoutMs);
      const onReady = (m: unknown): void => {
        if (!isFromWorker(m) || m.type !== 'ready') return;
        clearTimeout(deadline);
        worker.off('message', onReady);
        member.pid = m.pid;
        member.lastSeen = performance.now();
        // A worker that dies right after `ready` is re-forked by its exit handler.
        worker.send({ type: 'init', keys: this.opts.keys, workerIndex: index } satisfies ToWorker, undefined, dropSendError);
        for (const notice of this.opts.greeting?.() ?? []) worker.send(notice, undefined, dropSendError);
        resolve(member);
      };
      worker.on('message', onReady);
      worker.once('exit', () => {
        clearTimeout(deadline);
        reject(new Error(`worker ${index} exited before it was ready`));
      });
    });
  }

  private onMessage(member: Member, m: unknown): void {
    if (!isFromWorker(m) || member.worker !== this.members[member.index]?.worker) return;
    member.lastSeen = performance.now();
    const msg = m as FromWorker;
    if (msg.type === 'heartbeat') this.emit('heartbeat', member.index, msg.stats satisfies WorkerWindow);
    else if (msg.type === 'panic') this.emit('panic', member.index, msg.message);
    else if (msg.type === 'jwks-refresh') this.emit('jwks-refresh', member.index, msg.sourceId);
    else if (msg.type === 'breaker-report') this.emit('breaker-report', member.index, msg);
    else if (msg.type === 'tokens') this.emit('tokens', member.index, msg);
    else if (msg.type === 'lease') this.emit('lease', member.index, msg.asks);
    else if (msg.type === 'admission') this.emit('admission', member.index, { samples: msg.samples, high: msg.high, inUse: msg.inUse });
    else if (msg.type === 'listening') {
      member.listening = true;
      this.emit('listening', member.index, msg.listeners);
    }
  }

  /** Takes a worker out: SIGKILL (works on a stopped process too). Its exit re-forks the slot. */
  private kill(member: Member, reason: ExitReason): void {
    if (member.worker.isDead()) return;
    member.exitReason ??= reason;
    member.worker.process.kill('SIGKILL');
  }

  private onExit(member: Member, code: number | null, signal: string | null): void {
    member.channel.close();
    this.retire(member);
    if (this.members[member.index] !== member) return;
    const reason = member.exitReason ?? 'exited';
    const neverServed = member.state !== 'serving';
    member.generation = 0;
    member.listening = false;
    this.exits[reason]++;
    this.emit('exit', member.index, code, signal, reason);
    if (this.stopping) return;
    // A slot whose re-forks keep dying before they serve (a port taken, a generation that cannot
    // be committed) backs off; a worker that crashed while serving comes back at once.
    if (neverServed && reason !== 'restart') this.failures[member.index] = (this.failures[member.index] ?? 0) + 1;
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      void this.refork(member.index);
    }, reforkDelayMs(this.failures[member.index] ?? 0));
    this.timers.add(timer);
  }

  /** Forks a new worker for `index` and hands it the active generation before it binds. */
  private async refork(index: number): Promise<void> {
    if (this.stopping) return;
    this.reforks++;
    let fresh: Member;
    try {
      fresh = await this.fork(index);
    } catch (err) {
      // Its exit already scheduled the next attempt.
      const { code, message } = describeError(err);
      this.emit('refork-failed', index, code, message);
      return;
    }
    fresh.state = 'handover';
    try {
      const generation = await this.serial(async () => {
        const bundle = this.active;
        if (bundle === undefined) {
          // Before the first activation: the bootstrap activation hands it the first generation.
          fresh.state = 'serving';
          return 0;
        }
        await fresh.channel.request({ type: 'prepare', bundle }, this.opts.phaseTimeoutMs);
        await fresh.channel.request({ type: 'commit', generation: bundle.generation }, this.opts.phaseTimeoutMs);
        // Certificates reloaded since the generation was built: the others serve them, so does this one.
        if (this.certs !== undefined) await fresh.channel.request({ type: 'reload-certs', listeners: this.certs }, this.opts.phaseTimeoutMs);
        fresh.generation = bundle.generation;
        fresh.state = 'serving';
        return bundle.generation;
      });
      this.failures[index] = 0;
      this.emit('refork', index, generation);
    } catch (err) {
      const { code, message } = describeError(err);
      this.emit('refork-failed', index, code, message);
      // A worker that cannot take the active generation serves nothing useful: take it out; its
      // exit schedules the next attempt with backoff.
      this.kill(fresh, 'handover_failed');
    }
  }

  /** One activation or handover at a time. */
  private serial<T>(f: () => Promise<T>): Promise<T> {
    const next = this.chain.then(f, f);
    this.chain = next.catch(() => undefined);
    return next;
  }

  /** Two-phase activation of `bundle` on every serving worker (the protocol: two-phase.ts). */
  async activate(bundle: GenerationBundle): Promise<ActivationOutcome> {
    const outcome = await this.serial(() => this.twoPhase(bundle));
    const replaced = outcome.replaced ?? [];
    // A failed first activation has no generation to hand the replacements: nothing to wait for.
    if (replaced.length === 0 || (!outcome.ok && this.active === undefined)) return outcome;
    // The replacements are handed the now-active generation once the lock is released; the
    // caller learns the outcome only when they serve it (or could not be brought back in time).
    const missing = await this.awaitServing(replaced, 2 * this.opts.phaseTimeoutMs);
    if (missing.length === 0) return outcome;
    const more = `worker ${missing.join(', ')} not serving yet (being re-forked with backoff)`;
    return outcome.ok ? { ...outcome, note: `${outcome.note ?? ''}; ${more}` } : { ...outcome, note: `${outcome.note}; ${more}` };
  }

  private async twoPhase(bundle: GenerationBundle): Promise<ActivationOutcome> {
    // A port this pool does not hold yet must be free of every other program: the workers' reuseport
    // bind would otherwise join another process's group (listener-probe.ts). Their own ports are not probed.
    const taken = await firstTakenPort(addedEndpoints(bundle.resolved.config.listeners, this.active?.resolved.config.listeners));
    if (taken !== undefined) {
      const note = takenPortMessage(taken);
      this.emit('port-taken', bundle.generation, note);
      return { ok: false, phase: 'prepare', code: 'EDGE_LISTENER_BIND_FAILED', note };
    }
    // A worker on its way out (a rolling restart draining it) takes no part: its replacement is
    // handed whatever this activation settles on.
    const members = this.live().filter((m) => m.state === 'serving' && m.exitReason === undefined);
    const participants: Participant[] = members.map((m) => ({
      index: m.index,
      channel: m.channel,
      gone: () => m.worker.isDead() || m.exitReason !== undefined || this.members[m.index] !== m,
      kill: (reason) => this.kill(m, reason),
    }));
    const { outcome, acked } = await twoPhase(participants, bundle, this.opts.phaseTimeoutMs, this.active?.generation ?? 0);
    if (!outcome.ok) return outcome;
    for (const p of acked) (this.members[p.index] as Member).generation = bundle.generation;
    this.active = bundle;
    // The bundle's material was read when it was built, after any earlier reload-certs.
    this.certs = undefined;
    return outcome;
  }

  /**
   * Waits until the worker in each of `indices` serves the active generation, a re-fork of it
   * fails, or `timeoutMs` passes. Resolves with the slots that are not serving.
   */
  awaitServing(indices: readonly number[], timeoutMs: number): Promise<number[]> {
    const pending = new Set(indices);
    const failed = new Set<number>();
    const check = (): void => {
      for (const i of pending) if (this.isServing(i)) pending.delete(i);
    };
    check();
    if (pending.size === 0) return Promise.resolve([]);
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.off('refork', onRefork);
        this.off('refork-failed', onFailed);
        resolve([...pending, ...failed].sort((a, b) => a - b));
      };
      const onRefork = (): void => {
        check();
        if (pending.size === 0) done();
      };
      const onFailed = (index: number): void => {
        if (!pending.delete(index)) return;
        failed.add(index);
        if (pending.size === 0) done();
      };
      const timer = setTimeout(done, timeoutMs);
      this.on('refork', onRefork);
      this.on('refork-failed', onFailed);
    });
  }

  private isServing(index: number): boolean {
    const m = this.members[index];
    return m !== undefined && m.state === 'serving' && !m.worker.isDead() && m.exitReason === undefined && m.generation === this.active?.generation;
  }

  /**
   * Hands new listener certificate material to every worker (new handshakes only). Remembered
   * until the next activation, so a worker re-forked meanwhile is handed it too; a worker that
   * does not answer in time is killed and re-forked with it.
   */
  async reloadCerts(listeners: GenerationBundle['resolved']['material']['listeners']): Promise<void> {
    await this.serial(async () => {
      this.certs = listeners;
      const serving = this.live().filter((m) => m.state === 'serving');
      await Promise.all(
        serving.map((m) =>
          m.channel.request({ type: 'reload-certs', listeners }, this.opts.phaseTimeoutMs).catch((err: unknown) => {
            if (describeError(err).code === 'EDGE_IPC_TIMEOUT') this.kill(m, 'ipc_timeout');
          }),
        ),
      );
    });
  }

  /**
   * Every worker's registry as prom-client JSON, plus the final counts of the workers that are gone.
   * A worker that does not answer in time is left out, but its counters as last read stand in for
   * it (its gauges are left out): no aggregated counter goes back because a worker was slow or died.
   */
  async metrics(timeoutMs: number): Promise<{ values: unknown[]; missing: number }> {
    const members = [...this.members];
    const results = await Promise.allSettled(members.map((m) => (m.retired === true || m.worker.isDead() ? Promise.reject(new Error('gone')) : this.readCounters(m, timeoutMs))));
    const values: unknown[] = [];
    let missing = 0;
    members.forEach((m, i) => {
      // Gone meanwhile: what it counted is in the retired set now.
      if (m.retired === true) return;
      const r = results[i] as PromiseSettledResult<unknown>;
      if (r.status === 'fulfilled') return void values.push(r.value);
      missing++;
      if (m.counters !== undefined) values.push(m.counters);
    });
    const retired = this.retiredCounters.toJson();
    if (retired.length > 0) values.push(retired);
    return { values, missing };
  }

  /** Asks a worker for its registry and keeps its counters as its last known counts. */
  private async readCounters(m: Member, timeoutMs: number): Promise<unknown> {
    const json = await m.channel.request({ type: 'metrics' }, timeoutMs);
    m.counters = countersOf(json);
    return json;
  }

  /** A worker process is gone: its last known counts are kept for good (once). */
  private retire(m: Member): void {
    if (m.retired === true) return;
    m.retired = true;
    if (m.counters !== undefined) this.retiredCounters.add(m.counters);
  }

  /** Before a planned stop, read its final counts (bounded; a worker that does not answer keeps its last ones). */
  private async finalCounts(m: Member): Promise<void> {
    await this.readCounters(m, Math.max(1000, this.liveness().heartbeatMs)).catch(() => undefined);
  }

  /**
   * Ready: every worker committed the active generation, listens, and was heard from within the
   * silence limit; nothing is draining. A frozen worker makes the pool not ready until its
   * replacement serves.
   */
  get ready(): boolean {
    const g = this.active?.generation;
    const limit = silenceLimitMs(this.liveness());
    const now = performance.now();
    return (
      !this.draining &&
      g !== undefined &&
      this.members.length === this.opts.count &&
      this.members.every((m) => m.state === 'serving' && m.generation === g && m.listening && m.exitReason === undefined && !m.worker.isDead() && now - m.lastSeen <= limit)
    );
  }

  get activeGeneration(): number {
    return this.active?.generation ?? 0;
  }

  /** A notice (not answered) to every worker that said ready (one not ready yet gets the current state in its greeting). */
  broadcast(notice: Extract<ToWorker, { type: 'jwks' | 'breakers' | 'admission' }>): void {
    for (const m of this.members) if (m !== undefined && !m.worker.isDead() && m.pid !== 0) m.worker.send(notice, undefined, dropSendError);
  }

  /** A notice to one worker that said ready (dropped when it is not serving: a new one gets the greeting). */
  send(index: number, notice: Extract<ToWorker, { type: 'breakers' | 'token-grants' | 'lease' }>): void {
    const m = this.members[index];
    if (m !== undefined && !m.worker.isDead() && m.pid !== 0) m.worker.send(notice, undefined, dropSendError);
  }

  /** Worker facts for the runtime snapshot. */
  describe(): { index: number; pid: number; generation: number; listening: boolean; state: string; last_heard_ms_ago: number; incarnation: number }[] {
    const now = performance.now();
    return this.members.map((m) => ({
      index: m.index,
      pid: m.worker.process.pid ?? m.pid,
      generation: m.generation,
      listening: m.listening,
      state: m.worker.isDead() ? 'exited' : m.exitReason !== undefined ? 'stopping' : m.state,
      last_heard_ms_ago: Math.round(now - m.lastSeen),
      incarnation: (this.incarnations[m.index] ?? 1) - 1,
    }));
  }

  private scheduleLivenessCheck(): void {
    if (this.stopping) return;
    const cfg = this.liveness();
    this.livenessTimer = setTimeout(() => {
      this.checkLiveness();
      this.scheduleLivenessCheck();
    }, Math.max(25, Math.floor(cfg.heartbeatMs / 2)));
    this.livenessTimer.unref();
  }

  /** Kills (SIGKILL) every worker silent beyond the limit; its exit re-forks it on the active generation. */
  private checkLiveness(): void {
    const watched = this.members.filter((m) => m.state !== 'forking' && m.exitReason === undefined && !m.worker.isDead());
    for (const { index, silentMs } of unresponsive(this.liveness(), watched, performance.now())) {
      const m = this.members[index] as Member;
      this.emit('unresponsive', index, silentMs);
      this.kill(m, 'unresponsive');
    }
  }

  /** Stops admitting new connections on every worker and gives in-flight work `graceMs`. */
  async drain(graceMs: number): Promise<void> {
    this.draining = true;
    // A drained worker has closed its listeners (the snapshot says so).
    for (const m of this.live()) m.listening = false;
    await Promise.allSettled(this.live().map((m) => m.channel.request({ type: 'drain', graceMs }, graceMs + DRAIN_MARGIN_MS)));
  }

  /** Draining ended (a restart re-forked the workers, or it was cancelled). */
  undrain(): void {
    this.draining = false;
  }

  /**
   * Brings a drained pool back (a restart command that did not restart the service): every worker
   * has closed its listeners, so all are replaced at once — final counts read, SIGTERM (SIGKILL
   * after `stopGraceMs`), re-forked on the active generation — and the pool stops draining.
   * Resolves with the slots whose replacement does not serve yet (they keep being re-forked with
   * backoff; readiness waits for them).
   */
  async replaceAll(stopGraceMs: number): Promise<number[]> {
    const gone = this.live().map(async (m) => {
      m.exitReason ??= 'restart';
      m.listening = false;
      await this.finalCounts(m);
      await this.terminate(m, stopGraceMs);
    });
    await Promise.all(gone);
    this.draining = false;
    return this.awaitServing(
      this.members.map((m) => m.index),
      2 * this.opts.phaseTimeoutMs,
    );
  }

  /**
   * Re-forks every worker one at a time on the active generation (restart without
   * restart_command): frozen ones (no answer to a ping) first, killed at once; then one at a
   * time: drain it (it stops accepting; in-flight work gets `graceMs`), stop it (SIGTERM, SIGKILL
   * after `stopGraceMs`; a worker that did not answer the drain in time is killed at once), wait
   * until its replacement serves, then the next. The others keep accepting throughout.
   * A slot whose replacement does not come back stops the restart: the remaining workers keep
   * serving and the slot keeps being re-forked with backoff.
   */
  async rollingRestart(graceMs: number, stopGraceMs: number): Promise<RestartOutcome> {
    const comeBackMs = 2 * this.opts.phaseTimeoutMs;
    // Frozen workers first, and without a drain they cannot answer: draining a healthy worker
    // while a frozen one still holds its listening sockets would leave new connections nowhere to
    // go but the frozen one. A worker that does not answer a ping in time counts as frozen.
    const probeMs = Math.max(1000, this.liveness().heartbeatMs);
    const frozen = new Set(
      (await Promise.all(this.live().map((m) => m.channel.request({ type: 'ping' }, probeMs).then(() => -1, (err: unknown) => (describeError(err).code === 'EDGE_IPC_TIMEOUT' ? m.index : -1))))).filter((i) => i >= 0),
    );
    const order = this.members
      .map((m) => ({ index: m.index, frozen: frozen.has(m.index), lastSeen: m.lastSeen }))
      .sort((a, b) => Number(b.frozen) - Number(a.frozen) || a.lastSeen - b.lastSeen || a.index - b.index);
    for (const { index } of order) {
      if (this.stopping) return { ok: false, index, note: 'the service is stopping' };
      const m = this.members[index];
      if (m === undefined || m.state !== 'serving' || m.worker.isDead() || m.exitReason !== undefined) {
        // Already being replaced (it died or hung on its own): its replacement is a fresh process.
        const missing = await this.awaitServing([index], comeBackMs);
        if (missing.length > 0) return { ok: false, index, note: `worker ${index} did not come back` };
        continue;
      }
      m.exitReason = 'restart';
      this.emit('restart-step', index);
      const exited = new Promise<void>((resolve) => (m.worker.isDead() ? resolve() : m.worker.once('exit', () => resolve())));
      let answered = !frozen.has(index);
      if (answered) {
        try {
          await m.channel.request({ type: 'drain', graceMs }, graceMs + DRAIN_MARGIN_MS);
        } catch (err) {
          answered = describeError(err).code !== 'EDGE_IPC_TIMEOUT';
        }
      }
      if (!answered) m.worker.process.kill('SIGKILL');
      else if (!m.worker.isDead()) {
        m.listening = false;
        await this.finalCounts(m);
        void this.terminate(m, stopGraceMs);
      }
      await exited;
      const missing = await this.awaitServing([index], comeBackMs);
      if (missing.length > 0) return { ok: false, index, note: `worker ${index} did not come back` };
    }
    return { ok: true };
  }

  /**
   * The service is shutting down: workers that exit from now on are not re-forked. Called first
   * thing on SIGTERM, since under systemd's default kill mode the workers get the signal too.
   */
  beginShutdown(): void {
    this.stopping = true;
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
  }

  /** Stops every worker (SIGTERM, then SIGKILL after `graceMs`). */
  async stop(graceMs: number): Promise<void> {
    this.beginShutdown();
    if (this.livenessTimer !== undefined) clearTimeout(this.livenessTimer);
    await Promise.all(this.members.map((m) => this.terminate(m, graceMs)));
  }

  /** Stops one worker process: SIGTERM, SIGKILL after `graceMs`; resolves once it exited. */
  private terminate(m: Member, graceMs: number): Promise<void> {
    if (m.worker.isDead()) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => m.worker.process.kill('SIGKILL'), graceMs);
      m.worker.once('exit', () => {
        clearTimeout(timer);
        resolve();
      });
      m.worker.process.kill('SIGTERM');
    });
  }

  private live(): Member[] {
    return this.members.filter((m) => !m.worker.isDead());
  }
}
