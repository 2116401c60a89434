// The worker process under a supervisor: answers the IPC contract (@edge-proxy/ipc). `prepare`
// builds the runtime of a candidate generation off to the side (and checks that the listeners it
// adds can be bound); `commit` binds the listeners (all on the first commit, the added ones later)
// and then swaps the runtime in, all or nothing; `abort` drops it. Metrics are pulled as JSON for the supervisor's
// aggregation; heartbeats carry one watchdog window each.
import { availableParallelism } from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { dropSendError, isNotice, isToWorker, serveRequests } from '@edge-proxy/ipc';
import type { JwksKeySet } from '@edge-proxy/auth';
import type { GenerationBundle, IpcEndpoint, NodeAdmissionNotice, SharedKeys, ToWorker, WorkerWindow } from '@edge-proxy/ipc';
import { Metrics, createLogging } from '@edge-proxy/telemetry';
import { Dataplane, TRACER_SHUTDOWN_MS } from '../runtime/dataplane.ts';
import type { Runtime } from '../runtime/provision.ts';
import { probeBind } from './bind-probe.ts';
import { LISTENER_BIND_FAILED, serveAddedListeners, serveListeners } from './serve-listeners.ts';
import { TestHook } from './test-hook.ts';
import { LOOP_DELAY_RESOLUTION_MS, loopDelayP99Seconds } from './loop-delay.ts';
import { anonymousMemoryBytes } from './anonymous-memory.ts';
import { NO_ADMISSION, NO_QUOTA, inflightOf, overloadReport, registerOverloadGauges } from './overload-report.ts';
import { dropPrivileges, pinToCpu, processPlan } from './process-setup.ts';
import { workerTracer } from './worker-tracer.ts';
import type { ListenerHandle } from './serve-listeners.ts';

/** A coded error the supervisor records as the failed-prepare note. */
function prepareError(generation: number, err: unknown): Error {
  const code = (err as { code?: unknown })?.code === LISTENER_BIND_FAILED ? LISTENER_BIND_FAILED : 'EDGE_PREPARE_FAILED';
  return Object.assign(new Error(`generation ${generation} failed to prepare: ${err instanceof Error ? err.message : String(err)}`), { code });
}

/** This process's worker slot, from the supervisor's fork environment (-1 outside a supervisor). */
function workerIndex(env: NodeJS.ProcessEnv = process.env): number {
  const n = Number(env['EDGE_WORKER_INDEX'] ?? -1);
  return Number.isInteger(n) ? n : -1;
}

export interface WorkerOptions {
  readonly endpoint: IpcEndpoint;
  /** Heartbeat (watchdog window) interval until a generation says otherwise, ms. */
  readonly heartbeatMs?: number;
  /** Test-only activation hook (worker/test-hook.ts); read from the environment by default. */
  readonly testHook?: TestHook;
}

export class IpcWorker {
  private readonly metrics = new Metrics('worker');
  /** Created with the first generation: log format and destination, and tracing, come from its configuration. */
  private dp: Dataplane | undefined;
  /** The data plane while it is being created (the tracer loads the OpenTelemetry SDK first). */
  private dpCreating: Promise<Dataplane> | undefined;
  private readonly endpoint: IpcEndpoint;
  private keys: SharedKeys | undefined;
  private pending: { generation: number; runtime: Runtime; bundle: GenerationBundle } | undefined;
  private listeners: ListenerHandle[] | undefined;
  private readonly loop = monitorEventLoopDelay({ resolution: LOOP_DELAY_RESOLUTION_MS });
  private heartbeat: NodeJS.Timeout | undefined;
  private heartbeatMs: number;
  private readonly hook: TestHook;
  private windowRequests = 0;
  private windowFailures = 0;
  private stopServing: (() => void) | undefined;
  /** JWKS key sets the supervisor sent before the data plane existed (its key store holds them after). */
  private readonly keySets = new Map<string, JwksKeySet>();
  /** Node breaker notices that arrived before the data plane existed (applied in order when it does). */
  private readonly breakerNotices: Extract<ToWorker, { type: 'breakers' }>[] = [];
  /** The node's adaptive limit and brownout state told before the data plane existed (the latest). */
  private nodeAdmission: NodeAdmissionNotice | undefined;
  /** The log destination is open (a worker drops privileges only then). */
  private logOpened: Promise<void> = Promise.resolve();

  constructor(opts: WorkerOptions) {
    this.endpoint = opts.endpoint;
    this.loop.enable();
    this.hook = opts.testHook ?? new TestHook();
    this.heartbeatMs = opts.heartbeatMs ?? 1000;
    this.heartbeat = setInterval(() => this.sendHeartbeat(), this.heartbeatMs);
    this.heartbeat.unref();
    registerOverloadGauges(this.metrics, () => overloadReport(this.dp));
  }

  /** `performance.worker_heartbeat_ms` is live: the committed generation sets the interval. */
  private setHeartbeat(ms: number): void {
    if (ms === this.heartbeatMs || this.heartbeat === undefined) return;
    clearInterval(this.heartbeat);
    this.heartbeatMs = ms;
    this.heartbeat = setInterval(() => this.sendHeartbeat(), ms);
    this.heartbeat.unref();
  }

  private dataplaneFor(bundle: GenerationBundle): Promise<Dataplane> {
    if (this.dp !== undefined) return Promise.resolve(this.dp);
    this.dpCreating ??= this.createDataplane(bundle).finally(() => (this.dpCreating = undefined));
    return this.dpCreating;
  }

  private async createDataplane(bundle: GenerationBundle): Promise<Dataplane> {
    const l = bundle.resolved.config.log;
    // `worker`: the slot index the supervisor's lines use too (a re-forked process keeps it).
    const { logger, opened } = createLogging({ level: l.level, format: l.format, ...(l.file === undefined ? {} : { file: l.file }), async: true, fields: { role: 'worker', worker: workerIndex() } });
    this.logOpened = opened;
    const askJwksRefresh = (sourceId: string): void => {
      try {
        this.endpoint.send({ type: 'jwks-refresh', sourceId });
      } catch {
        /* the supervisor is gone: the wait for keys ends at its deadline */
      }
    };
    // Tracing is restart-required: the first generation's `observability.tracing` holds for the process.
    const tracer = await workerTracer(bundle.resolved.config, workerIndex(), this.metrics, logger).catch((err: unknown) => {
      logger.error({ err: err instanceof Error ? err.message : String(err) }, 'tracing could not be started: the generation fails to prepare');
      throw err;
    });
    this.dp = new Dataplane(this.metrics, (err) => this.endpoint.send({ type: 'panic', message: err instanceof Error ? err.message : String(err) }), logger, bundle.resolved.config.performance.worker_threads ?? availableParallelism(), askJwksRefresh, tracer, (r) => this.endpoint.send(r));
    for (const set of this.keySets.values()) this.dp.deps.auth.keys.update(set);
    this.keySets.clear();
    // Rate limits and connection caps are the node's: tokens leased from the supervisor's ledger.
    this.dp.leaseTokens((asks, settles, deposits) => this.endpoint.send({ type: 'tokens', asks, settles, ...(deposits.length === 0 ? {} : { deposits }) }));
    // In-flight limits (global, per upstream) are the node's: slots leased from the supervisor's ledger.
    // Adaptive admission and brownout are the node's: this worker reports its response windows and in-flight count.
    this.dp.deps.overload.joinNode(
      (asks) => this.endpoint.send({ type: 'lease', asks }, undefined, dropSendError),
      (r) => this.endpoint.send({ type: 'admission', ...r }, undefined, dropSendError),
    );
    if (this.nodeAdmission !== undefined) this.dp.deps.overload.nodeAdmission(this.nodeAdmission);
    for (const n of this.breakerNotices) this.dp.nodeBreakers?.apply(n.states, n.sentAt);
    this.breakerNotices.length = 0;
    return this.dp;
  }

  private get dataplane(): Dataplane | undefined {
    return this.dp;
  }

  /** Starts answering the supervisor and tells it this worker is ready for `init`. */
  start(): void {
    this.endpoint.on('message', (m: unknown) => {
      if (!isToWorker(m)) return;
      if (m.type === 'init') this.keys = m.keys;
      else if (m.type === 'jwks') this.keySetsArrived(m.sets);
      else if (m.type === 'token-grants') this.dp?.tokens?.granted(m.grants);
      else if (m.type === 'lease') this.dp?.deps.overload.leaseGrants(m.grants);
      else if (m.type === 'admission') this.nodeAdmissionArrived({ limit: m.limit, brownout: m.brownout, sentAt: m.sentAt });
      else if (m.type === 'breakers') {
        if (this.dp === undefined) this.breakerNotices.push(m);
        else this.dp.nodeBreakers?.apply(m.states, m.sentAt);
      }
    });
    this.stopServing = serveRequests(this.endpoint, (m) => this.handle(m as ToWorker), (m) => isToWorker(m) && !isNotice(m));
    this.endpoint.send({ type: 'ready', pid: process.pid });
  }

  /**
   * The node's adaptive limit and brownout state: applied, or kept until there is a data plane. A
   * brownout transition is one info line with how long after the supervisor sent it (`lag_ms`).
   */
  private nodeAdmissionArrived(n: NodeAdmissionNotice): void {
    if (this.dp === undefined) {
      this.nodeAdmission = n;
      return;
    }
    if (!this.dp.deps.overload.nodeAdmission(n)) return;
    const appliedAt = performance.timeOrigin + performance.now();
    this.dp.deps.log?.info({ active: n.brownout, limit: n.limit, sent_at: n.sentAt, applied_at: appliedAt, lag_ms: Math.round((appliedAt - n.sentAt) * 1000) / 1000 }, 'brownout state applied from the node');
  }

  /** Key sets from the supervisor: to the key store (which wakes requests waiting on them), or kept until there is one. */
  private keySetsArrived(sets: readonly JwksKeySet[]): void {
    for (const set of sets) {
      if (this.dp === undefined) this.keySets.set(set.sourceId, set);
      else this.dp.deps.auth.keys.update(set);
    }
  }

  /** Counts a finished request for the watchdog window (the handler reports through metrics). */
  private async windowCounts(): Promise<{ requests: number; failures: number }> {
    const sum = async (name: string): Promise<number> => (await this.metrics.counter(name).get()).values.reduce((s, v) => s + v.value, 0);
    const requests = await sum('svc_requests_total');
    const failures = (await sum('svc_backend_timeouts')) + (await sum('svc_backend_errors'));
    const out = { requests: requests - this.windowRequests, failures: failures - this.windowFailures };
    this.windowRequests = requests;
    this.windowFailures = failures;
    return out;
  }

  private sendHeartbeat(): void {
    void this.windowCounts().then(({ requests, failures }) => {
      const rt = this.dataplane?.current;
      const inflight = inflightOf(this.dataplane);
      const overload = overloadReport(this.dataplane);
      const stats: WorkerWindow = {
        maxLoopDelayMs: Math.round(this.loop.max / 1e6),
        requests,
        timeoutsOrErrors: failures,
        inflight,
        inflightLimit: rt?.config.performance.global_inflight_limit ?? 0,
        generation: rt?.generation ?? 0,
        ...this.healthCounts(),
        admission: overload?.admission ?? NO_ADMISSION,
        breakers: overload?.breakers ?? [],
        quota: this.dataplane?.deps.quota.health() ?? NO_QUOTA,
      };
      // The process gauges (declared extensions) hold the last window until the next heartbeat;
      // `worker` is the slot index, so the supervisor's sum keeps one series per worker.
      const worker = { worker: String(workerIndex()) };
      this.metrics.gauge('svc_worker_resident_memory_bytes').set(worker, process.memoryUsage.rss());
      const anon = anonymousMemoryBytes();
      if (anon !== undefined) this.metrics.gauge('svc_worker_anonymous_memory_bytes').set(worker, anon);
      this.metrics.gauge('svc_worker_event_loop_delay_p99_seconds').set(worker, loopDelayP99Seconds(this.loop));
      this.loop.reset();
      try {
        this.endpoint.send({ type: 'heartbeat', stats });
      } catch {
        /* the supervisor is gone; the process exits when the IPC channel closes */
      }
    });
  }

  /** Eligible and ineligible backends of the active generation, as this worker sees them. */
  private healthCounts(): { backendsHealthy: number; backendsUnhealthy: number } {
    const dp = this.dataplane;
    const rt = dp?.current;
    if (dp === undefined || rt === undefined) return { backendsHealthy: 0, backendsUnhealthy: 0 };
    let healthy = 0;
    for (const key of rt.backendKeys) if (dp.deps.health.eligible(key)) healthy++;
    return { backendsHealthy: healthy, backendsUnhealthy: rt.backendKeys.size - healthy };
  }

  private async handle(m: ToWorker): Promise<unknown> {
    switch (m.type) {
      case 'prepare': {
        await this.hook.at('prepare', m.bundle.generation);
        try {
          const runtime = (await this.dataplaneFor(m.bundle)).prepare(m.bundle.resolved, m.bundle.generation);
          // A listener the candidate adds must be bindable now: a port in use fails here, before commit.
          for (const l of this.addedListeners(m.bundle)) await probeBind(l);
          this.pending = { generation: m.bundle.generation, runtime, bundle: m.bundle };
        } catch (err) {
          this.logBindFailure(m.bundle.generation, 'prepare', err);
          throw prepareError(m.bundle.generation, err);
        }
        this.hook.after('prepared', m.bundle.generation);
        return undefined;
      }
      case 'commit': {
        await this.hook.at('commit', m.generation);
        const p = this.pending;
        if (p === undefined || p.generation !== m.generation) throw Object.assign(new Error(`generation ${m.generation} is not prepared`), { code: 'EDGE_NOT_PREPARED' });
        const dataplane = await this.dataplaneFor(p.bundle);
        // The candidate stays pending until everything succeeded, so a failed commit can be retried.
        if (this.listeners === undefined) {
          if (this.keys === undefined) throw Object.assign(new Error('no shared keys (init) received'), { code: 'EDGE_NOT_INITIALIZED' });
          // First commit: nothing served before, so the runtime is active before the sockets accept
          // (a re-forked worker's first connection must find it); committing it again is harmless.
          dataplane.commit(p.runtime);
          // CPU pinning before the sockets, the privilege drop once every one is bound (process-setup.ts).
          const plan = processPlan(process.env, Number(process.env['EDGE_WORKER_INDEX'] ?? -1));
          if (plan.cpu !== undefined) {
            pinToCpu(plan.cpu);
            dataplane.deps.log?.info({ cpu: plan.cpu }, 'worker pinned to CPU');
          }
          dataplane.trimAtStart();
          this.listeners = await serveListeners(p.bundle.resolved, dataplane, this.metrics, this.keys);
          if (plan.drop !== undefined) {
            await this.logOpened;
            const ids = dropPrivileges(plan.drop);
            dataplane.deps.log?.info({ user: plan.drop.user ?? null, uid: ids.uid, gid: ids.gid }, 'worker privileges dropped');
          }
          this.announce(p.generation);
        } else {
          // Later commits, all or nothing: the added listeners are bound before the swap, so a bind
          // failure leaves this worker serving the active generation on the listeners it had.
          const added = await serveAddedListeners(p.bundle.resolved, new Set(this.listeners.map((l) => l.name)), dataplane, this.metrics, this.keys as SharedKeys).catch((err: unknown) => {
            this.logBindFailure(p.generation, 'commit', err);
            throw err;
          });
          dataplane.commit(p.runtime);
          this.listeners = [...this.listeners, ...added];
          this.applyListenerSettings(p.bundle);
          if (added.length > 0) this.announce(p.generation);
        }
        this.pending = undefined;
        this.setHeartbeat(p.bundle.resolved.config.performance.worker_heartbeat_ms);
        this.hook.after('committed', p.generation);
        return undefined;
      }
      case 'abort':
        if (this.pending?.generation === m.generation) this.pending = undefined;
        return undefined;
      case 'reload-certs':
        for (const l of this.listeners ?? []) {
          const material = m.listeners[l.name];
          if (material === undefined) continue;
          l.bootstrap.updateMaterial(material);
          l.quic.updateMaterial(material);
        }
        return undefined;
      case 'metrics':
        return this.metrics.registry.getMetricsAsJSON();
      case 'drain': {
        const handles = this.listeners ?? [];
        const log = this.dataplane?.deps.log;
        const t0 = performance.now();
        const inflight = [...(this.dataplane?.inflight().values() ?? [])].reduce((s, n) => s + n, 0);
        // Flushed at once (the worker's log is buffered): the drain's lines land in order with the supervisor's.
        log?.info({ grace_ms: m.graceMs, requests_in_flight: inflight }, 'drain started: listeners closed to new connections');
        log?.flush();
        await Promise.all(handles.map((h) => Promise.all([h.quic.close(m.graceMs), h.bootstrap.close()])));
        // The worker is about to be replaced: the spans of the drained requests go out now.
        await this.dataplane?.deps.tracer?.shutdown(TRACER_SHUTDOWN_MS);
        log?.info({ duration_ms: Math.round(performance.now() - t0) }, 'drain finished');
        log?.flush();
        return undefined;
      }
      case 'ping':
      case 'init':
      case 'jwks':
      case 'breakers':
      case 'token-grants':
      case 'lease':
      case 'admission':
        return undefined;
    }
  }

  /** The listeners of `bundle` this worker does not serve yet (none before the first commit). */
  private addedListeners(bundle: GenerationBundle): GenerationBundle['resolved']['config']['listeners'] {
    const bound = this.listeners;
    if (bound === undefined) return [];
    return bundle.resolved.config.listeners.filter((l) => !bound.some((h) => h.name === l.name));
  }

  /** One error line for an added listener this worker cannot bind (the activation fails, coded). */
  private logBindFailure(generation: number, phase: 'prepare' | 'commit', err: unknown): void {
    if ((err as { code?: unknown })?.code !== LISTENER_BIND_FAILED) return;
    this.dp?.deps.log?.error({ code: LISTENER_BIND_FAILED, generation, phase, err: (err as Error).message }, 'added listener cannot be bound: the activation fails, the active generation keeps serving');
  }

  /** Tells the supervisor which listeners this worker serves (after the first commit, and after one adds some). */
  private announce(generation: number): void {
    this.endpoint.send({ type: 'listening', generation, listeners: (this.listeners ?? []).map((l) => ({ name: l.name, udp: l.udpPort, tcp: l.tcpPort })) });
  }

  /** The live listener keys of a committed generation: certificates, Alt-Svc `ma`, 0-RTT, QUIC idle timeout. */
  private applyListenerSettings(bundle: GenerationBundle): void {
    const c = bundle.resolved.config;
    for (const l of this.listeners ?? []) {
      const listener = c.listeners.find((x) => x.name === l.name);
      const material = bundle.resolved.material.listeners[l.name];
      if (listener === undefined || material === undefined) continue;
      l.bootstrap.updateMaterial(material);
      l.quic.updateMaterial(material);
      l.bootstrap.setAltSvcMaxAge(listener.alt_svc_max_age_s);
      l.quic.setEarlyData(c.resilience.protocol.allow_0rtt);
      l.quic.setIdleTimeout(c.performance.timeouts.quic_idle_ms);
    }
  }

  async close(): Promise<void> {
    if (this.heartbeat !== undefined) clearInterval(this.heartbeat);
    this.loop.disable();
    this.stopServing?.();
    await Promise.all((this.listeners ?? []).map((h) => Promise.all([h.quic.close(0), h.bootstrap.close()])));
    await this.dataplane?.close();
  }
}
