// The supervisor's workers (node:cluster). Activation is two-phase (DESIGN "Generations"):
// `prepare(bundle)` on every worker, then `commit` everywhere, or `abort` everywhere if any worker
// failed or did not answer in time. A worker that exits is re-forked and handed the current active
// generation before it binds; readiness means every worker committed the active generation and
// nothing is draining.
import cluster from 'node:cluster';
import type { Worker } from 'node:cluster';
import { EventEmitter } from 'node:events';
import { RequestChannel, dropSendError, isFromWorker } from '@edge-proxy/ipc';
import type { FromWorker, GenerationBundle, SharedKeys, ToWorker, WorkerWindow } from '@edge-proxy/ipc';

type Req = Extract<ToWorker, { id: number }>;

interface Member {
  readonly index: number;
  worker: Worker;
  channel: RequestChannel<Req>;
  /** Generation this worker has committed (0: none yet). */
  generation: number;
  pid: number;
  listening: boolean;
}

export interface WorkerPoolOptions {
  /** Worker entry module (packages/dataplane/src/worker/main.ts). */
  readonly exec: string;
  readonly count: number;
  readonly keys: SharedKeys;
  /** Deadline for every worker to answer prepare, and then commit. */
  readonly phaseTimeoutMs: number;
  /** Extra arguments for the worker's Node (e.g. nothing; tests may pass flags). */
  readonly execArgv?: readonly string[];
}

/** Result of an activation across workers. */
export type ActivationOutcome = { readonly ok: true } | { readonly ok: false; readonly phase: 'prepare' | 'commit'; readonly code: string; readonly note: string };

/**
 * Events: `heartbeat` (index, WorkerWindow), `exit` (index, code, signal), `refork` (index, generation),
 * `panic` (index, message), `listening` (index, listeners).
 */
export class WorkerPool extends EventEmitter {
  private readonly opts: WorkerPoolOptions;
  private readonly members: Member[] = [];
  private active: GenerationBundle | undefined;
  private stopping = false;
  private draining = false;
  /** Workers re-forked since start (restart accounting, svc_runtime_panics). */
  reforks = 0;

  constructor(opts: WorkerPoolOptions) {
    super();
    this.opts = opts;
  }

  /** Forks every worker and waits until each has said `ready`. */
  async start(): Promise<void> {
    cluster.setupPrimary({ exec: this.opts.exec, serialization: 'advanced', execArgv: [...(this.opts.execArgv ?? process.execArgv)] });
    await Promise.all(Array.from({ length: this.opts.count }, (_, i) => this.fork(i)));
  }

  private fork(index: number): Promise<Member> {
    const worker = cluster.fork({ EDGE_WORKER_INDEX: String(index) });
    const member: Member = { index, worker, channel: new RequestChannel<Req>(worker), generation: 0, pid: 0, listening: false };
    this.members[index] = member;
    worker.on('message', (m: unknown) => this.onMessage(member, m));
    worker.on('exit', (code, signal) => void this.onExit(member, code, signal));
    return new Promise<Member>((resolve, reject) => {
      const onReady = (m: unknown): void => {
        if (!isFromWorker(m) || m.type !== 'ready') return;
        worker.off('message', onReady);
        member.pid = m.pid;
        // A worker that dies right after `ready` is re-forked by its exit handler.
        worker.send({ type: 'init', keys: this.opts.keys, workerIndex: index } satisfies ToWorker, undefined, dropSendError);
        resolve(member);
      };
      worker.on('message', onReady);
      worker.once('exit', () => reject(new Error(`worker ${index} exited before it was ready`)));
    });
  }

  private onMessage(member: Member, m: unknown): void {
    if (!isFromWorker(m) || member.worker !== this.members[member.index]?.worker) return;
    const msg = m as FromWorker;
    if (msg.type === 'heartbeat') this.emit('heartbeat', member.index, msg.stats satisfies WorkerWindow);
    else if (msg.type === 'panic') this.emit('panic', member.index, msg.message);
    else if (msg.type === 'listening') {
      member.listening = true;
      this.emit('listening', member.index, msg.listeners);
    }
  }

  private async onExit(member: Member, code: number | null, signal: string | null): Promise<void> {
    member.channel.close();
    if (this.members[member.index] !== member) return;
    member.generation = 0;
    member.listening = false;
    this.emit('exit', member.index, code, signal);
    if (this.stopping) return;
    this.reforks++;
    // Re-fork and hand the new worker the active generation before it binds any listener.
    try {
      const fresh = await this.fork(member.index);
      const bundle = this.active;
      if (bundle !== undefined) {
        await fresh.channel.request({ type: 'prepare', bundle }, this.opts.phaseTimeoutMs);
        await fresh.channel.request({ type: 'commit', generation: bundle.generation }, this.opts.phaseTimeoutMs);
        fresh.generation = bundle.generation;
      }
      this.emit('refork', member.index, bundle?.generation ?? 0);
    } catch (err) {
      this.emit('panic', member.index, `re-fork failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  /** Two-phase activation of `bundle` on every worker. Leaves the active generation unchanged on failure. */
  async activate(bundle: GenerationBundle): Promise<ActivationOutcome> {
    const members = this.live();
    const prepared = await Promise.allSettled(members.map((m) => m.channel.request({ type: 'prepare', bundle }, this.opts.phaseTimeoutMs)));
    const failed = prepared.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed !== undefined) {
      await Promise.allSettled(members.map((m) => m.channel.request({ type: 'abort', generation: bundle.generation }, this.opts.phaseTimeoutMs)));
      const err = failed.reason as { code?: string; message?: string };
      return { ok: false, phase: 'prepare', code: err.code ?? 'EDGE_PREPARE_FAILED', note: err.message ?? 'a worker failed to prepare' };
    }
    const committed = await Promise.allSettled(members.map((m) => m.channel.request({ type: 'commit', generation: bundle.generation }, this.opts.phaseTimeoutMs)));
    committed.forEach((r, i) => {
      const m = members[i];
      if (r.status === 'fulfilled' && m !== undefined) m.generation = bundle.generation;
    });
    const commitFailed = committed.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    // Commit is a reference swap; a worker that fails it is broken: it is killed and re-forked on the
    // generation that is now active on the others.
    this.active = bundle;
    if (commitFailed !== undefined) {
      members.forEach((m, i) => {
        if (committed[i]?.status === 'rejected') m.worker.kill('SIGKILL');
      });
      const err = commitFailed.reason as { code?: string; message?: string };
      return { ok: false, phase: 'commit', code: err.code ?? 'EDGE_COMMIT_FAILED', note: err.message ?? 'a worker failed to commit' };
    }
    return { ok: true };
  }

  /** Hands new listener certificate material to every worker (new handshakes only). */
  async reloadCerts(listeners: GenerationBundle['resolved']['material']['listeners']): Promise<void> {
    await Promise.all(this.live().map((m) => m.channel.request({ type: 'reload-certs', listeners }, this.opts.phaseTimeoutMs)));
  }

  /** Every worker's registry as prom-client JSON; a worker that does not answer in time is skipped. */
  async metrics(timeoutMs: number): Promise<{ values: unknown[]; missing: number }> {
    const results = await Promise.allSettled(this.live().map((m) => m.channel.request({ type: 'metrics' }, timeoutMs)));
    const values = results.filter((r): r is PromiseFulfilledResult<unknown> => r.status === 'fulfilled').map((r) => r.value);
    return { values, missing: results.length - values.length };
  }

  /** Ready: every worker committed the active generation, and nothing is draining. */
  get ready(): boolean {
    const g = this.active?.generation;
    return !this.draining && g !== undefined && this.members.length === this.opts.count && this.members.every((m) => m.generation === g && m.listening);
  }

  get activeGeneration(): number {
    return this.active?.generation ?? 0;
  }

  /** Worker facts for the runtime snapshot. */
  describe(): { index: number; pid: number; generation: number; listening: boolean }[] {
    return this.members.map((m) => ({ index: m.index, pid: m.worker.process.pid ?? m.pid, generation: m.generation, listening: m.listening }));
  }

  /** Stops admitting new connections on every worker and gives in-flight work `graceMs`. */
  async drain(graceMs: number): Promise<void> {
    this.draining = true;
    await Promise.allSettled(this.live().map((m) => m.channel.request({ type: 'drain', graceMs }, graceMs + this.opts.phaseTimeoutMs)));
  }

  /** Draining ended (a restart re-forked the workers, or it was cancelled). */
  undrain(): void {
    this.draining = false;
  }

  /** Re-forks every worker one at a time on the active generation (restart without restart_command). */
  async rollingRestart(): Promise<void> {
    for (const m of [...this.members]) {
      const exited = new Promise<void>((resolve) => m.worker.once('exit', () => resolve()));
      const back = new Promise<void>((resolve) => {
        const on = (index: number): void => {
          if (index === m.index) {
            this.off('refork', on);
            resolve();
          }
        };
        this.on('refork', on);
      });
      m.worker.kill('SIGTERM');
      await exited;
      await back;
    }
    this.draining = false;
  }

  /**
   * The service is shutting down: workers that exit from now on are not re-forked. Called first
   * thing on SIGTERM, since under systemd's default kill mode the workers get the signal too.
   */
  beginShutdown(): void {
    this.stopping = true;
  }

  /** Stops every worker (SIGTERM, then SIGKILL after `graceMs`). */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    await Promise.all(
      this.members.map(
        (m) =>
          new Promise<void>((resolve) => {
            if (m.worker.isDead()) return resolve();
            const timer = setTimeout(() => m.worker.kill('SIGKILL'), graceMs);
            m.worker.once('exit', () => {
              clearTimeout(timer);
              resolve();
            });
            m.worker.kill('SIGTERM');
          }),
      ),
    );
  }

  private live(): Member[] {
    return this.members.filter((m) => !m.worker.isDead());
  }
}
