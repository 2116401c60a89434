// The access log (`observability.access_log`): one structured line per request, written when the
// request is recorded (phase `record`), to the service log's destination through the worker's
// asynchronous pino logger (no synchronous write on the request path), at `info` whatever
// `log.level` says: turning the access log on is its own decision. Sampled per request
// (`sample_ratio`); failures (5xx, or nothing answered) are kept whatever the draw when
// `log_failures` is on, so a sampled log still shows every 502.
//
// What a line holds is bounded and safe to write: the path is logged without its query string
// (which may carry credentials), field values taken from the request are cut to
// `FIELD_MAX` characters, and a request refused before validation passed (its target may hold
// control characters) has them escaped. No header value other than the request id is logged.
import type { Logger, RequestFacts } from '@edge-proxy/telemetry';

/** Longest path or authority written, in characters. */
export const FIELD_MAX = 1024;

/** What the access log needs of a request besides its facts. */
export interface AccessEntry {
  readonly requestId: string;
  readonly traceId: string | undefined;
  readonly listener: string;
  readonly protocol: string;
  readonly method: string;
  readonly authority: string | undefined;
  /** Path with or without its query string (the query is cut here). */
  readonly path: string;
  readonly generation: number;
  /** Whether the request passed validation (its target is clean); false: escape what is written. */
  readonly validated: boolean;
}

/** Control characters, DEL and the C1 range. */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f]/g;

/** `s` cut to FIELD_MAX characters, with control characters escaped when `escape`. */
function bounded(s: string, escape: boolean): string {
  const cut = s.length > FIELD_MAX ? `${s.slice(0, FIELD_MAX)}…` : s;
  return escape ? cut.replace(UNSAFE, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`) : cut;
}

/** The path without its query string. */
function pathOnly(path: string): string {
  const q = path.indexOf('?');
  return q === -1 ? path : path.slice(0, q);
}

/** Whether a request's facts make it a failure that `log_failures` keeps. */
export function isFailure(facts: RequestFacts): boolean {
  return facts.status === 0 || facts.status >= 500;
}

export class AccessLog {
  private readonly log: Logger;

  constructor(log: Logger) {
    // A child with its own level: `log.level` (live) changes the parent's, not this one's.
    this.log = log.child({ log_type: 'access' }, { level: 'info' });
  }

  /** Whether a request with these facts is written under this configuration (`random`: a draw in [0, 1)). */
  static keeps(facts: RequestFacts, sampleRatio: number, logFailures: boolean, random: number): boolean {
    if (logFailures && isFailure(facts)) return true;
    return sampleRatio >= 1 || random < sampleRatio;
  }

  /** Writes the line of one request. Never throws. */
  write(e: AccessEntry, f: RequestFacts): void {
    try {
      this.log.info(
        {
          request_id: e.requestId,
          trace_id: e.traceId ?? null,
          generation: e.generation,
          listener: e.listener,
          protocol: e.protocol,
          method: bounded(e.method, !e.validated),
          authority: e.authority === undefined ? null : bounded(e.authority, !e.validated),
          path: bounded(pathOnly(e.path), !e.validated),
          status: f.status,
          bytes_in: f.bytesIn,
          bytes_out: f.bytesOut,
          duration_ms: Math.round(f.durationMs * 1000) / 1000,
          upstream: f.upstream ?? null,
          backend: f.backend ?? null,
          attempts: f.attempts,
          outcome: f.outcome,
          code: f.code ?? null,
          reason: f.reason ?? null,
          failure_class: f.failureClass ?? null,
        },
        'access',
      );
    } catch {
      // The log destination failed (logger.ts says so once); serving goes on.
    }
  }
}
