// One warning line for a 502 or 504 the proxy answered itself (the backend refused or reset the
// connection, failed TLS, or timed out) or a 503 for want of a healthy backend (every backend
// failing its active checks), at most one per (upstream, backend, code) and interval. A
// dead backend under load fails thousands of requests a second: a line each would bury the log
// (and cost the worker more than the requests), so the first failure of a kind is written at once
// and the rest of the interval is summed into the next line's `suppressed` count. The metrics
// (`svc_backend_requests_total{outcome}`, `svc_backend_errors`, `svc_backend_timeouts`) count
// every one. Only failures reach this: a successful request costs nothing here.
import type { Logger } from '@edge-proxy/telemetry';

/** One answered failure. */
export interface UpstreamFailure {
  readonly upstream: string;
  /** The backend id of the last attempt; none for `no_healthy_backend`. */
  readonly backend: string | undefined;
  /** 502, 503 or 504. */
  readonly status: number;
  /** Why: the error's code (errors.ts), e.g. `EDGE_UPSTREAM_TRANSPORT`, `EDGE_NO_HEALTHY_BACKEND`. */
  readonly code: string;
  /** From the request's admission to the failure, ms. */
  readonly durationMs: number;
  readonly generation: number;
  /** The request's id (a line names the latest failure it stands for). */
  readonly requestId: string;
  /**
   * For a backend's failure, what the upstream client said (the socket error, the malformed
   * response, the timeout), so the line says why and not only which class; bounded by forward.ts.
   */
  readonly cause?: string;
}

interface Entry {
  /** When the last line of this kind was written (`now()`). */
  at: number;
  /** Failures of this kind since that line. */
  count: number;
  last: UpstreamFailure;
}

export class UpstreamFailureLog {
  private readonly log: Logger;
  private readonly intervalMs: number;
  private readonly now: () => number;
  private readonly entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout | undefined;

  /** `intervalMs`: the shortest time between two lines of one kind (default 1 s). */
  constructor(log: Logger, intervalMs = 1000, now: () => number = () => performance.now()) {
    this.log = log;
    this.intervalMs = intervalMs;
    this.now = now;
  }

  /** Records one failure: logged now if it is the first of its kind for an interval, else counted. */
  note(f: UpstreamFailure): void {
    const key = `${f.upstream}\n${f.backend ?? ''}\n${f.code}`;
    const e = this.entries.get(key);
    if (e !== undefined) {
      e.count++;
      e.last = f;
      return;
    }
    this.entries.set(key, { at: this.now(), count: 0, last: f });
    this.write(f, 0);
    if (this.timer === undefined) {
      this.timer = setInterval(() => this.tick(), this.intervalMs);
      this.timer.unref();
    }
  }

  /**
   * Writes what each kind counted over its interval; forgets kinds that stayed quiet for one.
   * Run by the interval timer (tests call it with their own clock).
   */
  tick(): void {
    const now = this.now();
    for (const [key, e] of this.entries) {
      if (now - e.at < this.intervalMs) continue;
      if (e.count === 0) {
        this.entries.delete(key);
        continue;
      }
      this.write(e.last, e.count - 1);
      e.at = now;
      e.count = 0;
    }
    if (this.entries.size === 0 && this.timer !== undefined) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  /** The line describes `f`; `suppressed` failures of its kind since the previous line had none. */
  private write(f: UpstreamFailure, suppressed: number): void {
    this.log.warn(
      { upstream: f.upstream, backend: f.backend ?? null, status: f.status, code: f.code, cause: f.cause ?? null, duration_ms: Math.round(f.durationMs), generation: f.generation, request_id: f.requestId, suppressed },
      `upstream failure answered with ${f.status}`,
    );
  }

  /** Writes the counts not written yet and stops the timer (worker shutdown). */
  close(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    for (const e of this.entries.values()) if (e.count > 0) this.write(e.last, e.count - 1);
    this.entries.clear();
  }
}
