// The supervisor (cluster primary): loads the configuration, forks the workers, owns the
// generation history, serves the control API and the aggregated metrics endpoint, runs the
// watchdog, and drains on SIGTERM. It never proxies traffic.
import { randomBytes, randomUUID } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { inactiveFeatures, printable, publicSecretMaterial, resolveConfig } from '@edge-proxy/config';
import type { ConfigIssue, ResolvedConfig } from '@edge-proxy/config';
import { Metrics, auditEvent, createLogging, logAuditSink, trimAfterStartup } from '@edge-proxy/telemetry';
import type { AuditSink, Logger } from '@edge-proxy/telemetry';
import type { AdmissionReport, FromWorker, LeaseAsk, WorkerWindow } from '@edge-proxy/ipc';
import { WorkerPool } from './worker-pool.ts';
import type { ExitReason } from './worker-pool.ts';
import { silenceLimitMs } from './liveness.ts';
import { restartWithCommand } from './restart-command.ts';
import { countActivation, logActivation } from './activation-log.ts';
import { describeSystemError, orStartupFailure, startupFailure } from './startup-failure.ts';
import { GenerationManager } from '../generations/activation.ts';
import type { ActivationRequest, OperationContext, OperationResult, RollbackRequest } from '../generations/activation.ts';
import { checkpoint, operationSignal } from '../generations/operation-queue.ts';
import type { OperationAbandoned } from '../generations/operation-queue.ts';
import { Authenticator } from '../api/auth.ts';
import type { Identity } from '../api/auth.ts';
import { ControlApiServer, MAX_NOTE_CHARS, abandonedAnswer, controlApiSettings } from '../api/server.ts';
import type { ApiAnswer, ControlPlaneHandlers } from '../api/server.ts';
import { MetricsEndpoint } from '../metrics/metrics-endpoint.ts';
import type { MetricsEndpointOptions } from '../metrics/metrics-endpoint.ts';
import { NoticeThrottle } from '../net/notice-throttle.ts';
import { WATCHDOG_INITIAL, judgeWindow, resumeWatchdog, stepWatchdog } from '../watchdog/policy.ts';
import type { UnhealthyReason, WatchdogState } from '../watchdog/policy.ts';
import { loadFingerprintKey } from '../state/fingerprint-key.ts';
import { prepareProcessKeys, reexecForThreadpool } from './process-keys.ts';
import { quotaSummary } from './quota-snapshot.ts';
import { DASHBOARD_PACKAGES } from './bundle.ts';
import { NodeJwks } from './node-jwks.ts';
import { NodeBreakers } from '../breakers/node-breakers.ts';
import { TokenService } from '../limits/token-service.ts';
import { LeaseService } from '../limits/lease-service.ts';
import { NodeAdmission } from '../limits/node-admission.ts';
import { operatorWorkerFlags, workerExecArgv, workerMallocTunables } from './worker-flags.ts';
import { planCompileCache, warmCompileCache, workerCacheEnv } from './compile-cache.ts';
import type { CompileCachePlan } from './compile-cache.ts';
import { overloadSnapshot } from './overload-snapshot.ts';
import { GenerationStore } from '../state/generation-store.ts';
import { acquireStateLock } from '../state/state-lock.ts';
import type { StateLock } from '../state/state-lock.ts';
import { addedEndpoints, firstTakenPort, takenPortMessage } from './listener-probe.ts';
import { SystemdNotifier } from '../systemd/notifier.ts';
import type { ServiceView } from '../systemd/notifier.ts';
import { stallLimitMs } from '../systemd/watchdog-gate.ts';

export interface SupervisorOptions {
  readonly configPath: string;
  /** Worker entry module. */
  readonly workerExec: string;
  /** Test overrides: bind these ports instead of the configured ones (0 = any). */
  readonly controlApiPort?: number;
  readonly metricsPort?: number;
  /** Log destination override (tests). */
  readonly logDestination?: NodeJS.WritableStream;
  readonly workerExecArgv?: readonly string[];
  /**
   * The service's state directory (node-local key of secret fingerprints). Default:
   * `$STATE_DIRECTORY` (systemd `StateDirectory=`), else `/var/lib/edge-proxy`.
   */
  readonly stateDir?: string;
  /**
   * Re-execute this process at start to size libuv's pool (`performance.control_plane_threads`;
   * supervisor/process-keys.ts). Only `edge-proxy serve` sets it: an embedded supervisor must not
   * replace its host process.
   */
  readonly reexecForThreads?: boolean;
  /** `serve --force-config`: start from `configPath` even when the state directory holds a generation to resume. */
  readonly forceConfig?: boolean;
}

/** The metrics endpoint's live settings from a configuration. */
function metricsEndpointSettings(config: ResolvedConfig['config']): MetricsEndpointOptions {
  const m = config.observability.metrics;
  return { address: m.address, port: m.port, path: m.path, maxConnections: m.max_connections, maxConnectionsPerSource: m.max_connections_per_source, idleTimeoutMs: m.idle_timeout_ms, connectionTimeoutMs: m.connection_timeout_ms };
}

/** The state directory: the option, else systemd's `$STATE_DIRECTORY` (first entry), else /var/lib/edge-proxy. */
export function defaultStateDir(env: NodeJS.ProcessEnv = process.env): string {
  const fromSystemd = env['STATE_DIRECTORY']?.split(':')[0];
  return fromSystemd !== undefined && fromSystemd.length > 0 ? fromSystemd : '/var/lib/edge-proxy';
}

/** Thrown when the initial configuration or a required surface cannot start. */
export class StartupError extends Error {
  readonly code: string;
  readonly issues: readonly ConfigIssue[];
  constructor(code: string, message: string, issues: readonly ConfigIssue[] = []) {
    super(message);
    this.name = 'StartupError';
    this.code = code;
    this.issues = issues;
  }
}

interface RestartState {
  requested: boolean;
  reason: string | undefined;
  requestedAt: number | undefined;
  id: string | undefined;
  drained: boolean;
  /** How the last restart ended (`in_progress` while it runs). */
  result: 'in_progress' | 'completed' | 'failed' | 'command_started' | undefined;
  note: string | undefined;
}

/** SIGTERM → SIGKILL grace of one worker in a rolling restart, once its drain ended. */
const RESTART_STOP_GRACE_MS = 2000;

const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);
const int = (v: unknown): number | undefined => (typeof v === 'number' ? v : undefined);
/** Longest `reason` kept (characters); it is caller-supplied text, recorded and shown to viewers. */
const MAX_REASON_CHARS = 1024;
/** Caller-supplied text as history and audit keep it: printable and bounded. */
const note = (v: unknown, max: number): string | undefined => (typeof v === 'string' ? printable(v, max) : undefined);

export class Supervisor implements ControlPlaneHandlers {
  private readonly opts: SupervisorOptions;
  readonly metrics = new Metrics('supervisor');
  private logger!: Logger;
  private sink!: AuditSink;
  private pool!: WorkerPool;
  private manager!: GenerationManager;
  private store!: GenerationStore;
  /** The state directory, held for the life of this process (state/state-lock.ts). */
  private stateLock: StateLock | undefined;
  private api: ControlApiServer | undefined;
  private metricsEndpoint: MetricsEndpoint | undefined;
  /** The node's JWKS sources (fetched here once for every worker). */
  private jwks: NodeJwks | undefined;
  /** The node's circuit breakers: one state per backend for every worker (breakers/node-breakers.ts). */
  private breakers: NodeBreakers | undefined;
  /** The node's token budgets: scoped rate limits and connection caps, leased to workers (limits/token-service.ts). */
  private tokens: TokenService | undefined;
  /** The node's in-flight budgets, leased to workers (limits/lease-service.ts). */
  private leases: LeaseService | undefined;
  /** The node's adaptive limit (the `global` budget's) and brownout state (limits/node-admission.ts). */
  private admission: NodeAdmission | undefined;
  /** Heartbeats of the current watchdog window (cleared every window). */
  private readonly heartbeats = new Map<number, WorkerWindow>();
  /** The latest heartbeat of each worker (the snapshot's view). */
  private readonly latest = new Map<number, WorkerWindow>();
  private watchdog: WatchdogState = WATCHDOG_INITIAL;
  private watchdogTimer: NodeJS.Timeout | undefined;
  /** The window length the watchdog timer runs at (`check_interval_ms` of the active generation). */
  private watchdogIntervalMs = 0;
  private lastUnhealthy: UnhealthyReason[] = [];
  private restartState: RestartState = { requested: false, reason: undefined, requestedAt: undefined, id: undefined, drained: true, result: undefined, note: undefined };
  private stateView: { dir: string; fingerprint_key: 'persisted' | 'ephemeral' } | undefined;
  private certGeneration = 0;
  private certLoadedAt = 0;
  private stopping = false;
  /** sd_notify (systemd/notifier.ts): reads $NOTIFY_SOCKET; start() unsets it before forking workers. */
  private readonly systemd = SystemdNotifier.fromEnvironment(() => this.logger);
  /** Bound ports (tests read them). */
  controlApiPort = 0;
  metricsPort = 0;

  constructor(opts: SupervisorOptions) {
    this.opts = opts;
  }

  private get resolved(): ResolvedConfig {
    const r = this.manager.active()?.resolved;
    if (r === undefined) throw new Error('no active generation');
    return r;
  }

  /** Starts everything; rejects with a StartupError (coded, with config issues) when it cannot. */
  async start(): Promise<void> {
    // First of all: a second service on the same state directory must not read, resume or write it.
    const stateDir = this.opts.stateDir ?? defaultStateDir();
    const lock = await acquireStateLock(stateDir);
    if (!lock.ok) throw startupFailure('EDGE_STARTUP_STATE_LOCKED', lock.message);
    this.stateLock = lock.lock;
    this.store = new GenerationStore({ dir: this.opts.stateDir ?? defaultStateDir(), configPath: this.opts.configPath, metrics: this.metrics, ...(this.opts.forceConfig === undefined ? {} : { forceConfig: this.opts.forceConfig }) });
    const first = await this.store.firstConfig();
    if (!first.ok) throw new StartupError('EDGE_STARTUP_CONFIG', `${this.opts.configPath}: invalid configuration`, first.issues);
    const c = first.value.config;
    if (this.opts.reexecForThreads === true) reexecForThreadpool(c.performance.control_plane_threads);
    const logging = orStartupFailure('EDGE_STARTUP_LOG_FILE', `log.file ${c.log.file ?? ''}`, () => createLogging({ level: c.log.level, format: c.log.format, fields: { role: 'supervisor' }, ...(c.log.file === undefined ? {} : { file: c.log.file }), ...(this.opts.logDestination === undefined ? {} : { destination: this.opts.logDestination }) }));
    this.logger = logging.logger;
    if (lock.stale !== undefined) this.logger.warn({ code: 'EDGE_STATE_LOCK_STALE', state_dir: stateDir, stale_pid: lock.stale.pid, stale_since_unix_ms: lock.stale.started_at_unix_ms }, `state directory lock of pid ${lock.stale.pid} taken over: that process no longer runs`);
    // Before any worker binds: a port held by another program (another serve's reuseport group) refuses the start.
    const taken = await firstTakenPort(addedEndpoints(c.listeners, undefined));
    if (taken !== undefined) throw startupFailure('EDGE_STARTUP_PORT_IN_USE', takenPortMessage(taken));
    // Audit events are JSON lines on the service log whatever log.format is (audit.format: json).
    const audit = logAuditSink(logging.writeLine);
    this.sink = (e) => {
      if (this.resolvedOrUndefined()?.config.observability.control_api.audit.enabled ?? true) audit(e);
    };
    const count = c.performance.worker_threads ?? availableParallelism();
    const processKeys = await prepareProcessKeys(c, count);
    for (const n of processKeys.notes) this.logger[n.level](n.fields, n.message);
    if (processKeys.problem !== undefined) throw new StartupError(processKeys.problem.code, `${processKeys.problem.path}: ${processKeys.problem.message}`);
    const execArgv = this.opts.workerExecArgv ?? (await this.workerFlags());
    const compileCache = planCompileCache(this.opts.stateDir ?? defaultStateDir());
    const tunables = workerMallocTunables(process.env);
    this.pool = new WorkerPool({
      exec: this.opts.workerExec,
      count,
      keys: { cryptoKey: randomBytes(32), ticketKey: randomBytes(48) },
      phaseTimeoutMs: 30_000,
      liveness: { heartbeatMs: c.performance.worker_heartbeat_ms, unresponsiveHeartbeats: c.performance.worker_unresponsive_heartbeats },
      env: { ...processKeys.workerEnv, ...workerCacheEnv(compileCache), ...(tunables === undefined ? {} : { GLIBC_TUNABLES: tunables }) },
      greeting: () => [...(this.jwks?.greeting() ?? []), ...(this.breakers?.greeting() ?? []), ...(this.admission?.greeting() ?? [])],
      execArgv,
    });
    const jwks = new NodeJwks(this.pool, this.metrics, this.logger);
    this.jwks = jwks;
    this.pool.on('jwks-refresh', (_i: number, sourceId: string) => jwks.refresh(sourceId));
    const pool = this.pool;
    const breakers = new NodeBreakers({ broadcast: (n) => pool.broadcast(n), send: (i, n) => pool.send(i, n) }, this.metrics, this.logger);
    this.breakers = breakers;
    this.pool.on('breaker-report', (i: number, r: Extract<FromWorker, { type: 'breaker-report' }>) => breakers.report(i, r));
    const tokens = new TokenService({ send: (i, n) => pool.send(i, n) });
    this.tokens = tokens;
    this.pool.on('tokens', (i: number, m: Extract<FromWorker, { type: 'tokens' }>) => tokens.receive(i, m));
    // The node's adaptive limit is the `global` budget's limit; brownout follows the node's in-flight count.
    const admission = new NodeAdmission({ broadcast: (n) => pool.broadcast(n), onLimit: (limit) => this.leases?.setGlobalLimit(limit), metrics: this.metrics, logger: this.logger });
    this.admission = admission;
    const leases = new LeaseService({ workers: count, send: (i, grants) => pool.send(i, { type: 'lease', grants }), globalLimit: () => admission.limit });
    this.leases = leases;
    this.pool.on('lease', (i: number, asks: readonly LeaseAsk[]) => {
      leases.receive(i, asks);
      for (const a of asks) if (a.key === 'global') admission.workerInUse(i, a.used);
    });
    this.pool.on('admission', (i: number, r: AdmissionReport) => admission.report(i, r));
    this.pool.on('heartbeat', (i: number, w: WorkerWindow) => {
      this.heartbeats.set(i, w);
      this.latest.set(i, w);
    });
    this.pool.on('exit', (i: number, code: number | null, signal: string | null, reason: ExitReason) => {
      // A worker stopped by a rolling restart is not a failure; every other exit is (the catalogue
      // has no per-reason worker restart counter: svc_runtime_panics counts worker crashes, and the
      // snapshot's workers.exits gives the reasons).
      const planned = reason === 'restart' || this.stopping;
      this.logger[planned ? 'info' : 'warn']({ worker: i, code, signal, reason }, 'worker exited');
      if (!planned) this.metrics.gauge('svc_runtime_panics').inc();
      // Its probe permits return to the node (a re-forked process starts with none).
      breakers.workerGone(i);
      // Its token leases: tokens count as spent, its connections' slots come back.
      tokens.workerGone(i);
      // Its in-flight slots come back to the node at once and go to workers waiting for them.
      leases.workerGone(i);
      // Its in-flight requests stop counting for brownout at once.
      admission.workerGone(i);
    });
    this.pool.on('port-taken', (generation: number, message: string) => this.logger.error({ code: 'EDGE_LISTENER_BIND_FAILED', generation, phase: 'prepare', err: message }, 'listener port held by another process: the activation fails in prepare, no worker was asked to bind'));
    this.pool.on('unresponsive', (i: number, silentMs: number) => this.logger.error({ worker: i, silent_ms: Math.round(silentMs) }, 'worker unresponsive: killed (SIGKILL), re-forking it'));
    this.pool.on('refork', (i: number, generation: number) => this.logger.info({ worker: i, generation }, 'worker re-forked on the active generation'));
    this.pool.on('restart-step', (i: number) => this.logger.info({ worker: i }, 'restart: draining and replacing worker'));
    this.pool.on('refork-failed', (i: number, code: string, message: string) => this.logger.error({ worker: i, code, err: message }, 'worker re-fork failed: retrying with backoff'));
    this.pool.on('panic', (i: number, message: string) => {
      this.metrics.gauge('svc_runtime_panics').inc();
      this.logger.error({ worker: i, message }, 'worker reported an unexpected error');
    });
    this.manager = new GenerationManager(this.pool, this.opts.configPath);
    this.manager.fingerprintKey = await this.loadFingerprintKey();
    this.manager.onActivated = (resolved, generation) => this.onActivated(resolved, generation);
    this.systemd.unsetEnvironment();
    const compileCacheState = await this.warmCompileCache(compileCache, execArgv);
    await this.pool.start().catch((err: unknown) => Promise.reject(startupFailure('EDGE_STARTUP_WORKERS', describeSystemError(err))));
    const boot = await this.store.boot(this.manager, this.logger);
    this.watchdog = resumeWatchdog(await this.store.lastRestartAt(Date.now()), Date.now());
    if (boot.status !== 202) throw new StartupError('EDGE_STARTUP_ACTIVATION', `the initial generation could not be activated: ${boot.reason ?? 'unknown'}: ${String((boot.body as { message?: unknown }).message ?? '').slice(0, 500)}`);
    await this.startSurfaces();
    this.startWatchdog();
    this.logger.info({ generation: this.manager.activeGeneration, workers: count, worker_flags: execArgv.filter((a) => a.startsWith('--')).join(' '), worker_malloc: tunables ?? process.env['GLIBC_TUNABLES'] ?? null, compile_cache: compileCacheState, control_api_port: this.controlApiPort, metrics_port: this.metricsPort }, 'edge-proxy serving');
    // Start-up (the code, the first activation, the forks) leaves garbage V8 would keep mapped for
    // the life of the process: one memory-reducing collection, a single 50-200 ms pause of the
    // control API; the supervisor carries no request load for it to slow down afterwards.
    trimAfterStartup(this.logger, 'supervisor');
    this.systemd.started(() => this.serviceView(), this.pool);
  }

  /**
   * The workers' execArgv, with the operator's EDGE_PROXY_WORKER_FLAGS: a malformed value, or flags
   * node refuses, stop the start with one coded line rather than a pool of workers that die at fork.
   */
  private async workerFlags(): Promise<string[]> {
    const operator = await operatorWorkerFlags(process.env, process.execPath);
    if ('problem' in operator) throw new StartupError(operator.problem.code, `${operator.problem.path}: ${operator.problem.message}`);
    return workerExecArgv(process.execArgv, process.env['NODE_OPTIONS'], operator.flags);
  }

  /**
   * Fills the workers' compile cache before they are forked (supervisor/compile-cache.ts). What the
   * "edge-proxy serving" line says of it: the directory, `off: NODE_DISABLE_COMPILE_CACHE`,
   * `operator: NODE_COMPILE_CACHE`, or `unused` after one warning line with the code. A failed
   * warm-up still leaves the workers the directory: they compile what it lacks, and one that has not
   * dropped privileges writes that into it when it exits.
   */
  private async warmCompileCache(plan: CompileCachePlan, execArgv: readonly string[]): Promise<string> {
    if ('off' in plan) return plan.off === 'disabled' ? 'off: NODE_DISABLE_COMPILE_CACHE' : 'operator: NODE_COMPILE_CACHE';
    if (plan.dir === undefined) {
      this.logger.warn({ code: plan.problem.code }, `compile cache unused: ${plan.problem.message}; each worker compiles its code itself (about 20 MiB more per worker)`);
      return 'unused';
    }
    const warm = await warmCompileCache({ exec: this.opts.workerExec, execArgv, dir: plan.dir });
    if (!warm.ok) {
      this.logger.warn({ code: 'EDGE_COMPILE_CACHE_UNUSABLE', dir: plan.dir }, `compile cache warm-up failed: ${warm.message}; each worker compiles what the cache lacks itself`);
      return plan.dir;
    }
    this.logger.debug({ dir: plan.dir, warmup_ms: warm.ms }, 'compile cache warmed');
    return plan.dir;
  }

  /** The node-local fingerprint key; an unusable state directory costs persistence, not the start. */
  private async loadFingerprintKey(): Promise<Buffer> {
    const dir = this.opts.stateDir ?? defaultStateDir();
    const k = await loadFingerprintKey(dir);
    this.stateView = { dir, fingerprint_key: k.mode };
    if (k.mode === 'persisted') this.logger.info({ state_dir: dir }, 'fingerprint key loaded from the state directory');
    else if (k.problem === 'EDGE_STATE_KEY_INVALID') this.logger.error({ state_dir: dir, file: k.file, code: k.problem }, 'fingerprint key unusable: secret fingerprints use a key of this process only and change at the next restart');
    else {
      // One line for the directory: the generations store's first failed save adds none.
      this.store.assumeUnwritable();
      this.logger.error({ state_dir: dir, file: k.file, code: 'EDGE_STATE_DIR_UNUSABLE', errno: k.problem }, `state directory unusable (${k.problem}): secret fingerprints use a key of this process only, and generations and history are not saved; the service keeps serving`);
    }
    return k.key;
  }

  private resolvedOrUndefined(): ResolvedConfig | undefined {
    return this.manager?.active()?.resolved;
  }

  private async startSurfaces(): Promise<void> {
    const { config, material } = this.resolved;
    const api = config.observability.control_api;
    if (api.enabled) {
      const identity = material.control_api.identity;
      try {
        if (identity === undefined) throw new Error('no certificate for the control API (set observability.control_api.tls.cert/key or a listener certificate)');
        this.api = new ControlApiServer(
          {
            address: api.address,
            port: api.port,
            cert: identity.cert_pem,
            key: identity.key_pem,
            clientAuth: api.tls.client_auth === undefined ? undefined : { mode: api.tls.client_auth.mode, ca: material.control_api.client_ca?.pems ?? [] },
            ...controlApiSettings(config),
            reloadPath: api.reload_path,
            reloadCertsPath: api.reload_certs_path,
            notice: (fields, message) => this.logger.warn(fields, message),
          },
          new Authenticator(config, material),
          this,
          this.metrics,
          this.sink,
        );
        this.controlApiPort = await this.api.listen(this.opts.controlApiPort);
      } catch (err) {
        // SPEC: a control API bind or TLS initialization failure is an explicit service failure when required.
        if (api.required) throw new StartupError('EDGE_STARTUP_CONTROL_API', `control API: ${err instanceof Error ? err.message : String(err)}`);
        this.logger.error({ err: err instanceof Error ? err.message : String(err) }, 'control API not started (not required)');
        this.api = undefined;
      }
    }
    const m = config.observability.metrics;
    if (m.enabled) {
      const notices = new NoticeThrottle(1000);
      this.metricsEndpoint = new MetricsEndpoint(metricsEndpointSettings(config), { workers: (ms) => this.pool.metrics(ms), supervisor: this.metrics.registry }, (e) => {
        const suppressed = notices.admit(e.kind);
        if (suppressed !== undefined) this.logger.warn({ peer_addr: e.source, ...('limit' in e ? { limit: e.limit } : {}), suppressed_since_last: suppressed }, `metrics endpoint connection ${e.kind === 'timeout' ? 'closed: idle timeout' : e.kind === 'evicted' ? 'displaced by a newer one: connection limit reached' : 'dropped: connection limit reached'}`);
      });
      this.metricsPort = await this.metricsEndpoint.listen(this.opts.metricsPort).catch((err: unknown) => Promise.reject(startupFailure('EDGE_STARTUP_METRICS', `metrics endpoint ${m.address}:${this.opts.metricsPort ?? m.port}: ${describeSystemError(err)}`)));
    }
  }


  private onActivated(resolved: ResolvedConfig, generation: number): void {
    this.metrics.gauge('svc_runtime_active_generation').set(generation);
    this.systemd.statusNow();
    this.metrics.gauge('svc_runtime_history_depth').set(this.manager.history.depth);
    this.logger.level = resolved.config.log.level;
    this.api?.setAuthenticator(new Authenticator(resolved.config, resolved.material));
    this.api?.setSettings(controlApiSettings(resolved.config));
    this.metricsEndpoint?.update(metricsEndpointSettings(resolved.config));
    this.jwks?.configure(resolved);
    this.breakers?.configure(resolved);
    this.tokens?.configure(resolved, resolved.config.performance.worker_threads ?? availableParallelism());
    // The node's limits of this generation hold from its commit on (a lowered one revokes the excess).
    // The adaptive policy first: the `global` budget's limit is the node's adaptive limit in force.
    this.admission?.configure(resolved.config);
    this.leases?.configure(resolved.config);
    // `resilience.watchdog.check_interval_ms` is live: the window timer follows the active generation.
    if (this.watchdogTimer !== undefined && resolved.config.resilience.watchdog.check_interval_ms !== this.watchdogIntervalMs) {
      clearInterval(this.watchdogTimer);
      this.startWatchdog();
    }
    const identity = resolved.material.control_api.identity;
    if (identity !== undefined) this.api?.setCertificate(identity.cert_pem, identity.key_pem, resolved.material.control_api.client_ca?.pems);
    this.certGeneration = generation;
    this.certLoadedAt = resolved.material.loaded_at_unix_ms;
    this.metrics.gauge('svc_secret_last_success_unixtime').set({ scope: 'upstreams' }, Math.floor(resolved.material.loaded_at_unix_ms / 1000));
    this.metrics.gauge('svc_secret_last_success_unixtime').set({ scope: 'listeners' }, Math.floor(resolved.material.loaded_at_unix_ms / 1000));
    for (const s of Object.values(resolved.material.secrets)) this.metrics.counter('svc_secret_resolve_total').inc({ provider: s.source_kind === 'file' ? s.reference.split('/')[2] ?? 'local' : s.source_kind, result: 'success', reason: 'resolved' });
    // Enabled (by default) but not enforced yet: one line per activation, so nobody assumes them.
    const inactive = inactiveFeatures(resolved.config);
    if (inactive.length > 0) this.logger.warn({ generation, not_active_yet: inactive.map((f) => f.path) }, `configured features not active yet: ${inactive.map((f) => f.path).join(', ')}`);
  }

  // --- watchdog -------------------------------------------------------------------------------

  private startWatchdog(): void {
    const wd = this.resolved.config.resilience.watchdog;
    this.watchdogIntervalMs = wd.check_interval_ms;
    this.watchdogTimer = setInterval(() => {
      const cfg = this.resolved.config.resilience.watchdog;
      const windows = this.pool.describe().map((w) => this.heartbeats.get(w.index));
      this.heartbeats.clear();
      const reasons = judgeWindow(cfg, windows);
      this.lastUnhealthy = reasons;
      const { state, restart } = stepWatchdog(cfg, this.watchdog, reasons, Date.now());
      if (state.degradedWindows !== this.watchdog.degradedWindows) this.metrics.gauge('svc_watchdog_degraded_windows').set(state.degradedWindows);
      this.watchdog = state;
      if (restart) void this.store.saveWatchdog(state.lastRestartAt);
      if (restart && !this.restartState.requested) void this.requestRestart(`watchdog: ${reasons.join(', ')}`, { id: 'watchdog', role: 'admin', authn: 'mtls' });
    }, wd.check_interval_ms);
    this.watchdogTimer.unref();
  }

  /** Drain, then run restart_command (argv, no shell) or re-fork workers one by one. */
  private async requestRestart(reason: string, who: { id: string; role: string; authn: string }): Promise<string> {
    const id = randomUUID();
    const cfg = this.resolved.config.resilience.watchdog;
    this.restartState = { requested: true, reason, requestedAt: Date.now(), id, drained: false, result: 'in_progress', note: undefined };
    this.metrics.gauge('svc_watchdog_restart_requests').inc();
    this.logger.warn({ restart_id: id, reason, actor: who.id }, 'restart requested');
    const ended = (result: RestartState['result'], note: string | undefined): void => {
      this.restartState = { ...this.restartState, requested: false, drained: true, result, note };
    };
    void (async () => {
      if (cfg.restart_command.length > 0) {
        // The command restarts the whole service; one that does not is recovered from (restart-command.ts).
        const ctx = { pool: this.pool, logger: this.logger, metrics: this.metrics, audit: this.sink, stopping: () => this.stopping, generation: () => this.manager.activeGeneration, stopGraceMs: RESTART_STOP_GRACE_MS };
        const r = await restartWithCommand(ctx, cfg, id, who, () => Object.assign(this.restartState, { drained: true, result: 'command_started' }));
        if (!r.ok) ended('failed', r.note);
        return;
      }
      // Rolling: one worker at a time drains, is replaced and serves again before the next one;
      // the others keep accepting new connections throughout.
      const outcome = await this.pool.rollingRestart(cfg.drain_grace_ms, RESTART_STOP_GRACE_MS);
      if (outcome.ok) {
        ended('completed', undefined);
        this.logger.info({ restart_id: id }, 'workers restarted');
      } else {
        ended('failed', outcome.note);
        this.logger.error({ restart_id: id, worker: outcome.index, err: outcome.note }, 'restart stopped: the other workers keep serving');
      }
    })().catch((err: unknown) => {
      ended('failed', err instanceof Error ? err.message : String(err));
      this.logger.error({ restart_id: id, err: err instanceof Error ? err.message : String(err) }, 'restart failed');
    });
    return id;
  }

  // --- handlers (ControlPlaneHandlers) --------------------------------------------------------

  private watchdogView(): Record<string, unknown> {
    const cfg = this.resolvedOrUndefined()?.config.resilience.watchdog;
    return {
      enabled: cfg?.enabled ?? false,
      degraded: this.lastUnhealthy.length > 0,
      unhealthy_reasons: this.lastUnhealthy,
      consecutive_unhealthy_windows: this.watchdog.consecutive,
      restart_requested: this.restartState.requested,
      restart_reason: this.restartState.reason ?? null,
      restart_requested_at_unix_ms: this.restartState.requestedAt ?? null,
      workers_drained: this.restartState.drained,
      restart_id: this.restartState.id ?? null,
      restart_result: this.restartState.result ?? null,
      restart_note: this.restartState.note ?? null,
    };
  }

  health(): ApiAnswer {
    return { status: 200, body: { status: 'ok', watchdog: this.watchdogView() } };
  }

  ready(): ApiAnswer {
    const ready = this.pool.ready && !this.restartState.requested;
    return { status: ready ? 200 : 503, body: { status: ready ? 'ready' : 'not_ready', generation: this.manager.activeGeneration } };
  }

  async snapshot(): Promise<ApiAnswer> {
    const { config, material } = this.resolved;
    const workers = this.pool.describe();
    const windows = workers.map((w) => this.latest.get(w.index)).filter((w): w is WorkerWindow => w !== undefined);
    const backendCount = Object.values(config.upstream).reduce((s, u) => s + u.backends.length, 0);
    // Each worker judges health on its own probes and traffic; a backend any worker holds
    // ineligible counts as unhealthy (the conservative merge). Before any heartbeat: unknown, 0/0.
    const reported = windows.filter((w) => w.generation === this.manager.activeGeneration);
    const unhealthy = reported.length === 0 ? 0 : Math.max(...reported.map((w) => w.backendsUnhealthy));
    const healthSummary = reported.length === 0 ? { healthy: 0, unhealthy: 0, reported_by_workers: 0 } : { healthy: backendCount - unhealthy, unhealthy, reported_by_workers: reported.length };
    return {
      status: 200,
      body: {
        generation: this.manager.activeGeneration,
        readiness: this.pool.ready && !this.restartState.requested ? 'ready' : 'not_ready',
        config_source: this.manager.configSource,
        observability: {
          contract_version: 'v1',
          audit_schema_version: 'v1',
          current_generation: this.manager.activeGeneration,
          dashboard_packages: [...DASHBOARD_PACKAGES],
          documentation: ['docs/control-api.md', 'docs/metrics.md', 'docs/operations.md', 'docs/configuration.md'],
          backend_health_summary: healthSummary,
          quota_backend_health_summary: quotaSummary(
            workers.flatMap((w) => this.latest.get(w.index)?.quota ?? []),
            config.resilience.quota,
          ),
          recent_admin_actions: this.manager.history.entries().slice(0, 10).map((e) => ({ operation: e.operation, generation: e.generation, result: e.result, time_unix_ms: e.time_unix_ms, requested_by: e.requested_by ?? null })),
          metrics_partial_scrapes: this.metricsEndpoint?.partialScrapes ?? 0,
        },
        tls: {
          listeners: Object.fromEntries(
            config.listeners.map((l) => {
              const m = material.listeners[l.name];
              const def = m?.default ?? m?.certificates[0]?.identity;
              return [l.name, { generation: this.certGeneration, last_loaded_at_unix_ms: this.certLoadedAt, default_cert_not_after_unix_seconds: def?.not_after_unix_seconds ?? null, certificates: m?.certificates.map((c) => ({ server_name: c.server_name, not_after_unix_seconds: c.identity.not_after_unix_seconds })) ?? [] }];
            }),
          ),
          upstreams: Object.fromEntries(
            Object.values(config.upstream).map((u) => [u.name, { verify_certificates: u.tls.verify_certificates, ca_fingerprint: material.upstream_ca[u.name]?.fingerprint ?? null, client_certificate_not_after_unix_seconds: u.tls.client_certificate_slot === undefined ? null : (material.secrets[u.tls.client_certificate_slot]?.not_after_unix_seconds ?? null) }]),
          ),
        },
        secrets: { material: publicSecretMaterial(material) },
        jwks: { sources: this.jwks?.views() ?? [] },
        features: { not_active_yet: inactiveFeatures(config) },
        state: this.stateView === undefined ? null : { ...this.stateView, generations: this.store.status },
        workers: {
          expected: workers.length,
          list: workers,
          exits: this.pool.exits,
          reforks: this.pool.reforks,
          unresponsive_after_ms: silenceLimitMs({ heartbeatMs: config.performance.worker_heartbeat_ms, unresponsiveHeartbeats: config.performance.worker_unresponsive_heartbeats }),
        },
        ...this.overloadBlocks(workers),
        watchdog: this.watchdogView(),
      },
    };
  }

  /** The `admission` block from each worker's latest heartbeat, and `circuit_breakers` from the node's breakers. */
  private overloadBlocks(workers: readonly { index: number; pid: number }[]): ReturnType<typeof overloadSnapshot> {
    const { config } = this.resolved;
    const breakers = this.breakers;
    const reporting = workers.flatMap((w) => {
      const window = this.latest.get(w.index);
      return window === undefined ? [] : [{ worker: w.index, pid: w.pid, window }];
    });
    return overloadSnapshot(reporting, {
      activeGeneration: this.manager.activeGeneration,
      adaptiveEnabled: config.resilience.adaptive_admission.enabled,
      globalInflightLimit: config.performance.global_inflight_limit,
      ...(this.admission === undefined ? {} : { nodeAdmission: this.admission.view() }),
      ...(this.leases === undefined ? {} : { leases: this.leases.view(), leaseTraffic: this.leases.traffic() }),
      ...(this.tokens === undefined ? {} : { tokenBudgets: this.tokens.view(), tokenTraffic: { asksIn: this.tokens.messages, grantsOut: this.tokens.answers }, windowBudgets: this.tokens.windowView() }),
      breakerEnabled: config.resilience.circuit_breaker.enabled,
      backends: Object.values(config.upstream).flatMap((u) => u.backends.map((b) => ({ upstream: u.name, backend: b.id }))),
      ...(breakers === undefined ? {} : { node: (upstream: string, backend: string) => breakers.view(upstream, backend) }),
    });
  }

  history(): ApiAnswer {
    const h = this.manager.history;
    return { status: 200, body: { active_generation: h.activeGeneration, retained_generations: h.retained(), entries: h.entries() } };
  }

  historyGeneration(generation: number): ApiAnswer {
    const g = this.manager.history.retainedGeneration(generation);
    if (g === undefined) return { status: 404, reason: 'generation_not_retained', body: { reason: 'generation_not_retained', message: `generation ${generation} is not retained` } };
    return { status: 200, body: { generation, retained_generation: g, entries: this.manager.history.entries(generation) } };
  }

  /** The record names the authenticated actor; the body's `requested_by` becomes a note. */
  private attribution(body: Record<string, unknown>, identity: Identity): { requested_by: string; requested_by_note?: string; reason?: string } {
    const requested_by_note = note(body['requested_by'], MAX_NOTE_CHARS);
    const reason = note(body['reason'], MAX_REASON_CHARS);
    return { requested_by: identity.actor, ...(requested_by_note === undefined ? {} : { requested_by_note }), ...(reason === undefined ? {} : { reason }) };
  }

  private asActivation(body: Record<string, unknown>, identity: Identity): ActivationRequest {
    const config_path = str(body['config_path']);
    const expected_generation = int(body['expected_generation']);
    return { ...(config_path === undefined ? {} : { config_path }), ...(expected_generation === undefined ? {} : { expected_generation }), ...this.attribution(body, identity) };
  }

  private answer(r: OperationResult): ApiAnswer {
    return { status: r.status, body: r.body, ...(r.reason === undefined ? {} : { reason: r.reason }), ...(r.generation === undefined ? {} : { generation: r.generation }) };
  }

  async validate(body: Record<string, unknown>, identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    this.metrics.counter('svc_runtime_validation_attempts_total').inc();
    return this.answer(await this.manager.validate(this.asActivation(body, identity), ctx));
  }

  async preview(body: Record<string, unknown>, identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    this.metrics.counter('svc_runtime_preview_attempts_total').inc();
    return this.answer(await this.manager.preview(this.asActivation(body, identity), ctx));
  }

  private async activateOrReload(body: Record<string, unknown>, identity: Identity, operation: 'activate' | 'reload', ctx: OperationContext): Promise<ApiAnswer> {
    const r = await this.manager.activate(this.asActivation(body, identity), operation, ctx);
    countActivation(this.metrics, r);
    this.auditMaterial(r);
    logActivation(this.logger, operation, identity.actor, r, this.manager.activeGeneration);
    return this.answer(r);
  }

  /** SPEC audit actions for upstream TLS material and secret resolution. */
  private auditMaterial(r: OperationResult): void {
    const body = r.body as { diff?: { backend_policies?: { upstream: string; secret_material_changed: boolean }[] }; plan?: { errors?: { code: string; path: string }[] } };
    for (const p of body.diff?.backend_policies ?? []) {
      if (p.secret_material_changed) this.sink(auditEvent({ event_type: 'material', action: 'upstream_mtls_material_changed', result: 'succeeded', target: `upstream.${p.upstream}`, ...(r.generation === undefined ? {} : { generation: r.generation }) }));
    }
    for (const e of body.plan?.errors ?? []) {
      const secret = ['EmptySecret', 'MalformedPemCertificate', 'MalformedPemPrivateKey', 'EDGE_CONFIG_SECRET_UNREADABLE', 'EDGE_CONFIG_SECRET_KEY_MISMATCH'].includes(e.code);
      if (!secret) continue;
      this.metrics.counter('svc_secret_resolve_total').inc({ provider: 'file', result: 'failure', reason: e.code });
      this.sink(auditEvent({ event_type: 'material', action: 'secret_resolution_failed', result: 'failed', target: e.path, reason: e.code }));
      if (e.path.startsWith('upstream')) this.sink(auditEvent({ event_type: 'material', action: 'upstream_mtls_material_invalid', result: 'failed', target: e.path, reason: e.code }));
    }
  }

  activate(body: Record<string, unknown>, identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    return this.activateOrReload(body, identity, 'activate', ctx);
  }

  reload(body: Record<string, unknown>, identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    return this.systemd.reloading(() => this.activateOrReload(body, identity, 'reload', ctx));
  }

  async rollback(body: Record<string, unknown>, identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    const expected = int(body['expected_active_generation']);
    const req: RollbackRequest = { target_generation: int(body['target_generation']) ?? 0, ...(expected === undefined ? {} : { expected_active_generation: expected }), ...this.attribution(body, identity) };
    const r = await this.manager.rollback(req, ctx);
    this.metrics.counter('svc_runtime_rollback_total').inc({ result: r.status === 202 ? 'success' : r.status >= 500 ? 'failure' : 'rejected', reason: r.reason ?? 'rolled_back' });
    return this.answer(r);
  }

  /** Re-reads listener certificates and client CAs for new handshakes; no new generation. */
  reloadCerts(identity: Identity, ctx: OperationContext = {}): Promise<ApiAnswer> {
    // Serialized with the generation operations: it must not interleave with an activation.
    return this.manager.exclusive(ctx, () => this.reloadCertsNow(identity, ctx));
  }

  private async reloadCertsNow(identity: Identity, ctx: OperationContext): Promise<ApiAnswer> {
    const active = this.manager.active();
    if (active === undefined) return { status: 503, reason: 'not_ready', body: { reason: 'not_ready', message: 'no active generation' } };
    const re = await resolveConfig(active.validated, { fingerprintKey: this.manager.fingerprintKey });
    if (!re.ok) {
      const reason = re.issues[0]?.code ?? 'unreadable';
      this.metrics.counter('svc_control_plane_cert_reload_total').inc({ result: 'failure', reason });
      this.metrics.counter('svc_secret_reload_total').inc({ scope: 'listeners', result: 'failure', reason });
      // Paths and codes only: an issue's message may quote what a file held.
      this.logger.error({ errors: re.issues.map((i) => ({ path: i.path, code: i.code })) }, 'certificate reload failed: nothing changed, the loaded certificates keep serving');
      return { status: 500, reason: 'cert_reload_failed', body: { reason: 'cert_reload_failed', message: 'certificate material could not be loaded; nothing changed', errors: re.issues } };
    }
    checkpoint(ctx.signal);
    await this.pool.reloadCerts(re.value.material.listeners);
    const id = re.value.material.control_api.identity;
    if (id !== undefined) this.api?.setCertificate(id.cert_pem, id.key_pem, re.value.material.control_api.client_ca?.pems);
    this.certGeneration++;
    this.certLoadedAt = re.value.material.loaded_at_unix_ms;
    this.metrics.counter('svc_control_plane_cert_reload_total').inc({ result: 'success', reason: 'reloaded' });
    this.metrics.counter('svc_secret_reload_total').inc({ scope: 'listeners', result: 'success', reason: 'reloaded' });
    this.metrics.gauge('svc_secret_last_success_unixtime').set({ scope: 'listeners' }, Math.floor(this.certLoadedAt / 1000));
    const listeners = Object.keys(re.value.material.listeners);
    this.sink(auditEvent({ event_type: 'material', action: 'cert_reload_applied', result: 'succeeded', target: listeners.join(','), generation: this.manager.activeGeneration, actor: { id: identity.actor, roles: [identity.role] }, authn: identity.authn }));
    return { status: 200, body: { reloaded_listeners: listeners, tls_generation: this.certGeneration, loaded_at_unix_ms: this.certLoadedAt } };
  }

  async restart(identity: Identity): Promise<ApiAnswer> {
    if (this.restartState.requested) return { status: 409, reason: 'restart_in_progress', body: { reason: 'restart_in_progress', message: 'a restart is already in progress', restart_id: this.restartState.id } };
    const id = await this.requestRestart(`requested by ${identity.actor}`, { id: identity.actor, role: identity.role, authn: identity.authn });
    return { status: 202, body: { restart_id: id, status: 'draining' } };
  }

  /** SIGHUP: reload the active config source, under the same deadline as an API operation. */
  async sighup(): Promise<void> {
    const op = operationSignal(this.resolvedOrUndefined()?.config.observability.control_api.operation_timeout_ms ?? 30_000);
    try {
      const r = await this.systemd.reloading(() => this.manager.activate({ requested_by: 'SIGHUP', reason: 'signal' }, 'reload', { signal: op.signal }));
      countActivation(this.metrics, r);
      logActivation(this.logger, 'reload', 'SIGHUP', r, this.manager.activeGeneration);
    } catch (e) {
      if ((e as { code?: string }).code !== 'EDGE_OPERATION_ABANDONED') throw e;
      const a = e as OperationAbandoned;
      // The reason an API caller would have been answered with (a signal has no caller to lose).
      const reason = abandonedAnswer(a).reason ?? 'operation_deadline_exceeded';
      this.metrics.counter('svc_runtime_rejections_total').inc({ reason });
      this.logger.warn({ reason: a.reason, phase: a.phase, generation: this.manager.activeGeneration }, 'SIGHUP reload abandoned: not carried out');
      this.sink(auditEvent({ event_type: 'operation_result', action: 'reload', result: 'failed', reason, failure_class: 'abandoned', target: 'SIGHUP', actor: { id: 'SIGHUP', roles: ['admin'] } }));
    } finally {
      op.dispose();
    }
  }

  /** SIGTERM: stop admitting, let in-flight work finish (shutdown_drain_ms), stop everything. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.systemd.stopping();
    this.pool?.beginShutdown();
    if (this.watchdogTimer !== undefined) clearInterval(this.watchdogTimer);
    const drainMs = this.resolvedOrUndefined()?.config.performance.timeouts.shutdown_drain_ms ?? 5000;
    const drainStart = performance.now();
    this.logger?.info({ drain_ms: drainMs }, 'shutdown: draining the workers');
    await this.pool?.drain(drainMs).catch(() => undefined);
    this.logger?.info({ duration_ms: Math.round(performance.now() - drainStart) }, 'shutdown: drain finished');
    this.jwks?.close();
    this.breakers?.close();
    this.tokens?.close();
    this.leases?.close();
    await Promise.all([this.pool?.stop(2000), this.api?.close(), this.metricsEndpoint?.close(), this.store?.flush()]);
    this.logger?.info({}, 'edge-proxy stopped');
    await this.systemd.close();
    await this.stateLock?.release();
  }

  /** What systemd is told: readiness, the active generation, workers serving it (systemd/notifier.ts). */
  private serviceView(): ServiceView {
    const generation = this.manager.activeGeneration;
    const workers = this.pool.describe();
    const workersReady = workers.filter((w) => w.state === 'serving' && w.generation === generation && w.listening).length;
    return { generation, workersReady, workersExpected: workers.length, ready: this.ready().status === 200, stallLimitMs: stallLimitMs(this.resolved.config.resilience.watchdog.drain_grace_ms) };
  }
}
