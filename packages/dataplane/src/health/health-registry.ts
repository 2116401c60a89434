// Health state per backend identity, shared by every generation of a worker: active probes run on
// timers owned here (reconciled when a generation is activated) and decide eligibility, read at pick
// time; nothing mutates selector weights. Passive outcomes from forwarding are only counted: the
// circuit breaker owns consecutive-failure ejection (docs/decisions.md).
import type { Dispatcher } from 'undici';
import type { UpstreamDispatcher } from '../upstream/pools.ts';
import { INITIAL_HEALTH, isEligible, observeProbe } from './health-state.ts';
import type { HealthState, HealthThresholds, PassiveReason } from './health-state.ts';

/** An active check of one backend. */
export interface ProbeSpec {
  /** Backend identity (selector key). */
  readonly key: string;
  readonly dispatcher: UpstreamDispatcher;
  readonly path: string;
  /** Host header of the probe. */
  readonly host: string;
  readonly intervalMs: number;
  readonly timeoutMs: number;
  /** `2xx`, `204` or `200-399`. */
  readonly expectedStatus: string;
  readonly thresholds: HealthThresholds;
}

/** Health counters reported to metrics. */
export interface HealthEvents {
  probe(ok: boolean): void;
  passiveFailure(reason: PassiveReason): void;
  transition(key: string, eligible: boolean): void;
}

/** Whether `status` satisfies an `expected_status` spec. */
export function statusMatches(spec: string, status: number): boolean {
  const cls = /^([1-5])xx$/.exec(spec);
  if (cls !== null) return Math.floor(status / 100) === Number(cls[1]);
  const range = /^(\d{3})-(\d{3})$/.exec(spec);
  if (range !== null) return status >= Number(range[1]) && status <= Number(range[2]);
  return status === Number(spec);
}

interface Check {
  readonly spec: ProbeSpec;
  readonly fingerprint: string;
  timer: NodeJS.Timeout | undefined;
  inFlight: AbortController | undefined;
}

export class HealthRegistry {
  private readonly states = new Map<string, HealthState>();
  private readonly checks = new Map<string, Check>();
  private readonly events: HealthEvents | undefined;
  private closed = false;

  constructor(events?: HealthEvents) {
    this.events = events;
  }

  /** Whether the backend may be picked now. Unknown backends are eligible (no evidence against them). */
  eligible(key: string): boolean {
    const s = this.states.get(key);
    return s === undefined || isEligible(s);
  }

  /**
   * Records the outcome of a real request (passive health): a failure is counted by reason
   * (`svc_health_failures_total{reason}`) and ejects nothing; the circuit breaker decides that.
   * `key` names the backend, for the caller's reading; no state is kept per passive outcome.
   */
  passive(_key: string, outcome: 'ok' | PassiveReason): void {
    if (outcome !== 'ok') this.events?.passiveFailure(outcome);
  }

  /** Replaces the set of active checks (a generation was activated). Unchanged checks keep running. */
  reconcile(specs: readonly ProbeSpec[]): void {
    const wanted = new Map(specs.map((s) => [s.key, s]));
    for (const [key, check] of this.checks) {
      const next = wanted.get(key);
      if (next === undefined || fingerprintOf(next) !== check.fingerprint || next.dispatcher !== check.spec.dispatcher) this.stop(key);
    }
    for (const [key, spec] of wanted) {
      if (this.checks.has(key) || this.closed) continue;
      const check: Check = { spec, fingerprint: fingerprintOf(spec), timer: undefined, inFlight: undefined };
      this.checks.set(key, check);
      this.schedule(check, 0);
    }
  }

  /** Forgets state of backends no generation references any more. */
  retain(keys: ReadonlySet<string>): void {
    for (const key of this.states.keys()) if (!keys.has(key)) this.states.delete(key);
  }

  /** Number of running checks (tests assert that nothing is left behind). */
  get activeChecks(): number {
    return this.checks.size;
  }

  close(): void {
    this.closed = true;
    for (const key of [...this.checks.keys()]) this.stop(key);
  }

  private stop(key: string): void {
    const check = this.checks.get(key);
    if (check === undefined) return;
    if (check.timer !== undefined) clearTimeout(check.timer);
    check.inFlight?.abort();
    this.checks.delete(key);
  }

  private schedule(check: Check, delayMs: number): void {
    check.timer = setTimeout(() => void this.probe(check), delayMs);
    check.timer.unref();
  }

  private async probe(check: Check): Promise<void> {
    const { spec } = check;
    const controller = new AbortController();
    check.inFlight = controller;
    const timer = setTimeout(() => controller.abort(), spec.timeoutMs);
    let ok = false;
    try {
      const status = await probeStatus(spec, controller.signal);
      ok = statusMatches(spec.expectedStatus, status);
    } catch {
      ok = false;
    } finally {
      clearTimeout(timer);
      check.inFlight = undefined;
    }
    if (this.checks.get(spec.key) !== check) return; // stopped or replaced while probing
    this.events?.probe(ok);
    this.update(spec.key, (s) => observeProbe(s, ok, spec.thresholds));
    this.schedule(check, spec.intervalMs);
  }

  private update(key: string, f: (s: HealthState) => HealthState): void {
    const before = this.states.get(key) ?? INITIAL_HEALTH;
    const after = f(before);
    this.states.set(key, after);
    const was = isEligible(before);
    const is = isEligible(after);
    if (was !== is) this.events?.transition(key, is);
  }
}

/**
 * One probe request through the pool's `dispatch`: the status, once the body (discarded) has
 * ended; rejects when the request fails or `signal` aborts it.
 */
function probeStatus(spec: ProbeSpec, signal: AbortSignal): Promise<number> {
  return new Promise((resolve, reject) => {
    let status = 0;
    const handler: Dispatcher.DispatchHandler = {
      onRequestStart(controller) {
        if (signal.aborted) controller.abort(new Error('probe aborted'));
        else signal.addEventListener('abort', () => controller.abort(new Error('probe aborted')), { once: true });
      },
      onResponseStart(_controller, statusCode) {
        status = statusCode;
      },
      onResponseData() {},
      onResponseEnd() {
        resolve(status);
      },
      onResponseError(_controller, err) {
        reject(err);
      },
    };
    spec.dispatcher.dispatch({ path: spec.path, method: 'GET', headers: { host: spec.host, 'user-agent': 'edge-proxy-health/1' }, headersTimeout: spec.timeoutMs, bodyTimeout: spec.timeoutMs }, handler);
  });
}

function fingerprintOf(s: ProbeSpec): string {
  return JSON.stringify([s.path, s.host, s.intervalMs, s.timeoutMs, s.expectedStatus, s.thresholds]);
}
