// Running `resilience.watchdog.restart_command` and judging whether it restarted the service.
//
// The command is meant to restart the whole service (e.g. `systemctl restart edge-proxy.service`),
// which ends this process with SIGTERM. So the command "worked" only if this process is stopping
// by the deadline (`restart_command_timeout_ms` after the start). Everything else is a failure the
// supervisor recovers from, since the workers are drained and the node would stay dark: the
// executable cannot be started (missing, not executable), it exits non-zero or on a signal, it is
// still running at the deadline (its process group is killed), or it exited 0 and the service is
// still alive at the deadline.
import { spawn } from 'node:child_process';
import { printable } from '@edge-proxy/config';
import { auditEvent } from '@edge-proxy/telemetry';
import type { AuditSink, Logger, Metrics } from '@edge-proxy/telemetry';
import type { WorkerPool } from './worker-pool.ts';

/** How a restart command failed; `reason` is the log's `code` and the audit event's `reason` (errors.ts). */
export type RestartCommandFailure =
  | { readonly reason: 'EDGE_RESTART_COMMAND_NOT_STARTED'; readonly errno: string }
  | { readonly reason: 'EDGE_RESTART_COMMAND_FAILED'; readonly exit_code: number | null; readonly signal: string | null; readonly stderr: string }
  | { readonly reason: 'EDGE_RESTART_COMMAND_TIMEOUT'; readonly timeout_ms: number; readonly stderr: string }
  | { readonly reason: 'EDGE_RESTART_COMMAND_NO_RESTART'; readonly timeout_ms: number };

/** `stopping`: the service is being stopped (the command worked); otherwise why it failed. */
export type RestartCommandOutcome = { readonly ok: true } | ({ readonly ok: false } & RestartCommandFailure);

/** The last line of the command's stderr that is kept for the log (printable, bounded). */
const STDERR_TAIL_CHARS = 300;

/** One-line description of a failure for the log message, the snapshot's note and the audit event. */
export function describeFailure(f: RestartCommandFailure): string {
  switch (f.reason) {
    case 'EDGE_RESTART_COMMAND_NOT_STARTED':
      return `the restart command could not be started (${f.errno})`;
    case 'EDGE_RESTART_COMMAND_FAILED':
      return f.signal !== null ? `the restart command was ended by ${f.signal}` : `the restart command exited with status ${String(f.exit_code)}`;
    case 'EDGE_RESTART_COMMAND_TIMEOUT':
      return `the restart command was still running after ${f.timeout_ms} ms: killed`;
    case 'EDGE_RESTART_COMMAND_NO_RESTART':
      return `the restart command exited 0 but the service was not restarted within ${f.timeout_ms} ms`;
  }
}

/**
 * Runs `argv` (no shell, its own process group, no stdin/stdout) and resolves with its outcome.
 * `stopping()` says whether this process has begun stopping (SIGTERM received): then the command
 * did its job, whatever its own exit says (it may be killed with the service it restarted).
 */
export function runRestartCommand(argv: readonly string[], timeoutMs: number, stopping: () => boolean): Promise<RestartCommandOutcome> {
  const [cmd, ...args] = argv as [string, ...string[]];
  return new Promise((resolve) => {
    let settled = false;
    let stderr = '';
    const finish = (failure: RestartCommandFailure): void => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      resolve(stopping() ? { ok: true } : { ok: false, ...failure });
    };
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true, shell: false });
    child.stderr?.setEncoding('utf8');
    // Only a bounded tail is kept (a tool's last line says why: e.g. polkit's refusal).
    child.stderr?.on('data', (d: string) => (stderr = (stderr + d).slice(-4 * STDERR_TAIL_CHARS)));
    const tail = (): string => printable(stderr.trim().split('\n').pop() ?? '', STDERR_TAIL_CHARS);
    const deadline = setTimeout(() => {
      if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
        // The whole group: a script's own children (a hung `sleep`, a blocked client) go too.
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          child.kill('SIGKILL');
        }
        finish({ reason: 'EDGE_RESTART_COMMAND_TIMEOUT', timeout_ms: timeoutMs, stderr: tail() });
      } else finish({ reason: 'EDGE_RESTART_COMMAND_NO_RESTART', timeout_ms: timeoutMs });
    }, timeoutMs);
    child.on('error', (err: NodeJS.ErrnoException) => finish({ reason: 'EDGE_RESTART_COMMAND_NOT_STARTED', errno: err.code ?? 'unknown' }));
    child.on('exit', (code, signal) => {
      if (settled) return;
      // Exit 0: the command says the restart is under way; the deadline judges whether it came.
      if (code === 0) return;
      // A deadline kill is reported by the deadline; anything else ends the wait now.
      finish({ reason: 'EDGE_RESTART_COMMAND_FAILED', exit_code: code, signal, stderr: tail() });
    });
  });
}

/** What a command restart needs of the supervisor. */
export interface CommandRestartContext {
  readonly pool: Pick<WorkerPool, 'drain' | 'replaceAll'>;
  readonly logger: Logger;
  readonly metrics: Metrics;
  readonly audit: AuditSink;
  /** The service has begun stopping (SIGTERM): the command did its job. */
  readonly stopping: () => boolean;
  readonly generation: () => number;
  /** SIGTERM → SIGKILL grace of a worker replaced after a failed command. */
  readonly stopGraceMs: number;
}

export interface CommandRestartSettings {
  readonly restart_command: readonly string[];
  readonly restart_command_timeout_ms: number;
  readonly drain_grace_ms: number;
}

/**
 * A restart through `restart_command`: every worker drains (each drain has a deadline), then the
 * command runs. If it did not restart the service, the failure is logged at error with its exit
 * status, signal or errno, counted (`svc_runtime_panics`; `svc_watchdog_restart_hooks` counts every
 * command run) and audited (`operation_result` / `restart` / `failed`), and every worker is
 * replaced on the active generation so the node serves again and a further restart is accepted.
 * `onDrained` runs once the workers drained, just before the command starts.
 */
export async function restartWithCommand(ctx: CommandRestartContext, cfg: CommandRestartSettings, restartId: string, who: { id: string; role: string; authn: string }, onDrained: () => void): Promise<{ ok: true } | { ok: false; note: string }> {
  await ctx.pool.drain(cfg.drain_grace_ms);
  onDrained();
  ctx.metrics.gauge('svc_watchdog_restart_hooks').inc();
  ctx.logger.info({ restart_id: restartId, command: cfg.restart_command[0], timeout_ms: cfg.restart_command_timeout_ms }, 'restart command started: the workers are drained');
  const outcome = await runRestartCommand(cfg.restart_command, cfg.restart_command_timeout_ms, ctx.stopping);
  if (outcome.ok) return outcome;
  const { ok: _ok, ...failure } = outcome;
  const note = describeFailure(failure);
  const { reason, ...details } = failure;
  ctx.logger.error({ restart_id: restartId, code: reason, command: cfg.restart_command[0], ...details }, `${note}: re-forking the workers on the active generation`);
  ctx.metrics.gauge('svc_runtime_panics').inc();
  ctx.audit(auditEvent({ event_type: 'operation_result', action: 'restart', result: 'failed', reason, failure_class: 'restart_command', target: 'restart_command', generation: ctx.generation(), actor: { id: who.id, roles: [who.role] }, authn: who.authn }));
  const missing = await ctx.pool.replaceAll(ctx.stopGraceMs);
  if (missing.length === 0) ctx.logger.warn({ restart_id: restartId, generation: ctx.generation() }, 'workers re-forked after the failed restart command: serving again');
  else ctx.logger.error({ restart_id: restartId, workers: missing }, 'after the failed restart command some workers do not serve yet: they are re-forked with backoff');
  return { ok: false, note };
}
