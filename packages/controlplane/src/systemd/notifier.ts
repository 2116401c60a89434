// Tells systemd what the service is doing (`Type=notify`): READY=1 once every worker serves the
// first generation, STATUS= lines, RELOADING=1 / READY=1 around a reload, STOPPING=1, and
// WATCHDOG=1 pings while the supervisor's own checks pass (systemd/watchdog-gate.ts). Without
// `$NOTIFY_SOCKET` every call is a no-op. A notification that cannot be sent is logged once
// (warn) and never stops the service.
//
// Node has no unix datagram socket; `node-unix-socket` (a napi-rs addon, prebuilt binaries) sends
// them. It is loaded only when `$NOTIFY_SOCKET` is set. docs/decisions.md "systemd notification"
// says why it and not `systemd-notify`, and what a message costs.
import { createRequire } from 'node:module';
import type { EventEmitter } from 'node:events';
import type { DgramSocket } from 'node-unix-socket';
import type * as UnixSocket from 'node-unix-socket';
import { describeService, formatNotify, readNotifyEnvironment, unsetNotifyEnvironment } from './notify-protocol.ts';
import type { NotifySettings, NotifyState, ServiceFacts } from './notify-protocol.ts';
import { initialGate, stepGate } from './watchdog-gate.ts';
import type { GateState } from './watchdog-gate.ts';

/** The supervisor's log (pino's call shape). */
export interface NotifyLog {
  info(fields: object, message: string): void;
  warn(fields: object, message: string): void;
  error(fields: object, message: string): void;
}

/** What the supervisor reports at each notification. */
export interface ServiceView extends ServiceFacts {
  /** The service's readiness (`/ready` answers 200): every worker serves the active generation. */
  readonly ready: boolean;
  /** How long a not-ready pool with nothing coming back is tolerated (watchdog-gate.ts). */
  readonly stallLimitMs: number;
}

/** How often readiness is re-checked while READY=1 waits for the pool, ms. */
const READY_POLL_MS = 50;
/** STATUS refresh interval when systemd does not watch us (with a watchdog: each ping tick), ms. */
const STATUS_REFRESH_MS = 5000;
/** Longest wait for notifications in flight when closing, ms. */
const CLOSE_WAIT_MS = 1000;

export class SystemdNotifier {
  private readonly settings: NotifySettings;
  private readonly log: () => NotifyLog | undefined;
  private readonly env: NodeJS.ProcessEnv;
  private sock: DgramSocket | undefined;
  private warned = false;
  private inFlight = 0;
  private view: (() => ServiceView) | undefined;
  private readySent = false;
  private stopped = false;
  private reloads = 0;
  private timer: NodeJS.Timeout | undefined;
  private gate: GateState | undefined;
  private progressAt: number | undefined;
  private lastStatus = '';

  /**
   * Reads `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID` from `env`; unsetEnvironment()
   * removes them before the workers are forked. `log` is read when there is something to log
   * (the supervisor's logger exists once it has started).
   */
  static fromEnvironment(log: () => NotifyLog | undefined, env: NodeJS.ProcessEnv = process.env, pid: number = process.pid): SystemdNotifier {
    return new SystemdNotifier(readNotifyEnvironment(env, pid), log, env);
  }

  constructor(settings: NotifySettings, log: () => NotifyLog | undefined, env: NodeJS.ProcessEnv = {}) {
    this.settings = settings;
    this.log = log;
    this.env = env;
  }

  /**
   * Removes the notify variables from the environment: call it before the first child process
   * (workers must not notify), and after any re-exec of this process (which needs them).
   */
  unsetEnvironment(): void {
    unsetNotifyEnvironment(this.env);
  }

  /** Started by systemd with a notify socket this sender can use. */
  get enabled(): boolean {
    return this.settings.socket !== undefined;
  }

  /**
   * The service has started: READY=1 as soon as `view().ready` (at once, normally: the first
   * generation is committed on every worker, which binds every listener before it acknowledges),
   * then STATUS refreshes and, when systemd watches us, WATCHDOG=1 pings. `pool` events
   * (`refork`, `restart-step`) count as a pool coming back (watchdog-gate.ts).
   */
  started(view: () => ServiceView, pool: EventEmitter): void {
    if (this.settings.unsupported !== undefined) this.failed('start', new Error(`NOTIFY_SOCKET=${this.settings.unsupported}: only a path or an abstract @name is supported`));
    if (!this.enabled || this.stopped) return;
    this.view = view;
    const progressed = (): void => {
      this.progressAt = performance.now();
    };
    pool.on('refork', progressed);
    pool.on('restart-step', progressed);
    this.awaitReady();
  }

  private awaitReady(): void {
    if (this.stopped || this.view === undefined) return;
    const v = this.view();
    if (!v.ready) {
      // Bounded by systemd's TimeoutStartSec=, which fails the start.
      this.timer = setTimeout(() => this.awaitReady(), READY_POLL_MS);
      return;
    }
    this.readySent = true;
    this.lastStatus = describeService(v);
    this.send({ kind: 'ready', status: this.lastStatus });
    this.gate = initialGate(performance.now());
    if (this.settings.watchdogPingMs !== undefined) this.send({ kind: 'watchdog' });
    this.timer = setInterval(() => this.tick(), this.settings.watchdogPingMs ?? STATUS_REFRESH_MS);
    this.timer.unref();
  }

  /** One ping tick: the gate decides; STATUS follows what changed. */
  private tick(): void {
    if (this.stopped || this.view === undefined || this.gate === undefined) return;
    const v = this.view();
    const step = stepGate(this.gate, { now: performance.now(), ready: v.ready, progressAt: this.progressAt, stallLimitMs: v.stallLimitMs });
    this.gate = step.state;
    const watched = this.settings.watchdogPingMs !== undefined;
    if (step.transition === 'withheld') this.log()?.error({ code: 'EDGE_SYSTEMD_WATCHDOG_WITHHELD', reason: step.state.withheld, watchdog: watched }, watched ? 'systemd watchdog pings withheld: systemd restarts the service once WatchdogSec= passes' : 'worker pool wedged (no systemd watchdog to restart the service)');
    if (step.transition === 'resumed') this.log()?.info({ watchdog: watched }, 'worker pool serving again: systemd watchdog pings resumed');
    if (step.ping && watched) this.send({ kind: 'watchdog' });
    const status = step.state.withheld !== undefined ? describeService(v, `WEDGED: ${step.state.withheld}`) : describeService(v, v.ready ? undefined : 'not ready');
    this.status(status);
  }

  /** STATUS= with the current facts (after an activation or rollback), unless unchanged. */
  statusNow(): void {
    if (this.view === undefined || this.stopped) return;
    const v = this.view();
    this.status(describeService(v, v.ready ? undefined : 'not ready'));
  }

  private status(text: string): void {
    if (text === this.lastStatus) return;
    this.lastStatus = text;
    this.send({ kind: 'status', status: text });
  }

  /**
   * Runs a reload (SIGHUP, API reload) between RELOADING=1 and READY=1, whatever its outcome:
   * `systemctl reload` learns of a rejected reload from ExecReload's exit status, not from here.
   * Overlapping reloads are one reloading period. Before the first READY=1 nothing is sent.
   */
  async reloading<T>(work: () => Promise<T>): Promise<T> {
    if (!this.readySent || this.stopped || this.view === undefined) return work();
    if (this.reloads++ === 0) {
      this.lastStatus = describeService(this.view(), 'reloading');
      this.send({ kind: 'reloading', monotonicUsec: process.hrtime.bigint() / 1000n, status: this.lastStatus });
    }
    try {
      return await work();
    } finally {
      if (--this.reloads === 0 && !this.stopped) {
        this.lastStatus = describeService(this.view());
        this.send({ kind: 'ready', status: this.lastStatus });
      }
    }
  }

  /** SIGTERM/SIGINT (or a start that failed): STOPPING=1; no pings from now on. */
  stopping(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    if (this.enabled) this.send({ kind: 'stopping', status: 'stopping: draining the workers' });
  }

  /** Closes the socket once what is in flight is sent (bounded). */
  async close(): Promise<void> {
    this.stopping();
    for (let waited = 0; this.inFlight > 0 && waited < CLOSE_WAIT_MS; waited += 10) await new Promise((r) => setTimeout(r, 10));
    this.sock?.close();
    this.sock = undefined;
  }

  private send(state: NotifyState): void {
    const target = this.settings.socket;
    if (target === undefined) return;
    const buf = Buffer.from(formatNotify(state));
    try {
      const sock = (this.sock ??= this.open());
      this.inFlight++;
      sock.sendTo(buf, 0, buf.length, target, (err) => {
        this.inFlight--;
        if (err !== undefined && err !== null) this.failed(state.kind, err);
      });
    } catch (err) {
      this.failed(state.kind, err);
    }
  }

  private open(): DgramSocket {
    const { DgramSocket: Socket } = createRequire(import.meta.url)('node-unix-socket') as typeof UnixSocket;
    const sock = new Socket();
    // The library closes the socket on an error; the next notification opens a new one.
    sock.on('error', (err: Error) => {
      if (this.sock === sock) this.sock = undefined;
      this.failed('socket', err);
    });
    return sock;
  }

  /** One warn line for the life of the process; later failures are not logged (pings would flood). */
  private failed(kind: string, err: unknown): void {
    if (this.warned) return;
    this.warned = true;
    const message = err instanceof Error ? err.message : String(err);
    this.log()?.warn({ code: 'EDGE_SYSTEMD_NOTIFY_FAILED', notification: kind, err: message }, 'systemd notification not delivered (further failures are not logged): readiness, reload state or watchdog pings may not reach systemd');
  }
}
