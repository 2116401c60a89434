// Forwarding one request attempt to one backend with undici's `dispatch` API: the response body is
// written straight into the downstream response (backpressure both ways). When the request could
// still be retried, the owner may have the response held first (the prebuffer, up to
// `prebufferBytes`, its end, or `PREBUFFER_HOLD_MS`), so that a failure inside it is retryable; or
// discard it (a 502/503 to retry, a hedge that lost). A downstream that goes away aborts the
// upstream request; timeouts and transport failures are classified into a status, an `outcome`
// label and a passive-health reason.
import type { Readable, Writable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { downstreamResponseHeaders } from '../upstream/headers.ts';
import { H1_ERR } from '../upstream/h1-client.ts';
import type { UpstreamDispatcher } from '../upstream/pools.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { PassiveReason } from '../health/health-state.ts';
import { DeadlineSweep } from './deadline-sweep.ts';
import { ERR } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import type { Expirable } from './deadline-sweep.ts';

/** The downstream response, as node:http, node:http2 compat and our HTTP/3 responses all offer it. */
export interface DownstreamResponse extends Writable {
  readonly headersSent: boolean;
  writeHead(status: number, headers?: HeaderMap): unknown;
  /**
   * Sends `100 Continue` (RFC 9110 §15.2.1) to a client that asked for it with
   * `expect: 100-continue`; the request path calls it only once it is about to read the body.
   */
  writeContinue?(): void;
}

/** `outcome` label values (SPEC) used by forwarding. */
export type ForwardOutcome = 'success' | 'failure' | 'timeout' | 'backend_error';

export interface ForwardOptions {
  /** The pool to send through (not named `dispatcher`: undici refuses that field in dispatch options). */
  readonly pool: UpstreamDispatcher;
  readonly method: string;
  /** Path with query. */
  readonly path: string;
  readonly headers: HeaderMap;
  readonly body: Readable | null;
  /** Milliseconds to the response headers (undici's option, under its name). */
  readonly headersTimeout: number;
  /** Longest pause in the response body, in ms (undici's option, under its name). */
  readonly bodyTimeout: number;
  /** Whole response body. */
  readonly bodyTotalMs: number;
  /**
   * Longest time the downstream may leave the response blocked (not reading, or a closed flow
   * control window) before the exchange is cut (`client_send_idle_ms`); none: only `bodyTotalMs`.
   */
  readonly sendIdleMs?: number;
  /** Protocol spoken to the backend, for `via`. */
  readonly backendProtocol: '1.1' | '2';
  /**
   * TLS server name (SNI and certificate check) for an https backend. undici would otherwise take
   * it from the request's Host header, which names the client's view, not the backend.
   */
  readonly servername: string | undefined;
  /** Response bytes the owner may have held before the response is committed (`HOLD`); none by default. */
  readonly prebufferBytes?: number;
}

export interface ForwardResult {
  /** Status sent downstream (the backend's, or ours on failure); undefined when nothing could be sent. */
  readonly status: number | undefined;
  readonly outcome: ForwardOutcome;
  /** Why it failed: `connect_timeout`, `headers_timeout`, `body_timeout`, `transport`, `tls`, `client_closed`. */
  readonly reason?: string;
  /** The coded error of a failed attempt (errors.ts); undefined when the exchange completed. */
  readonly error?: RequestError;
  /** When the response headers arrived (`performance.now()`), 0 if they did not. */
  readonly headersAt: number;
  /** Passive health signal for the backend, if the failure was the backend's. */
  readonly health: 'ok' | PassiveReason | undefined;
  /** Whether response headers reached the downstream (a retry is no longer possible). */
  readonly responseStarted: boolean;
  /** Response body bytes written downstream by this attempt (none when absent). */
  readonly bytesOut?: number;
  /**
   * What went wrong, in the upstream client's words (`ECONNREFUSED: connect ECONNREFUSED
   * 127.0.0.1:8080`, `H1_PROTOCOL: a response with both content-length and transfer-encoding`):
   * only for a failure charged to the backend, for the failure log. Bounded to 200 characters.
   */
  readonly cause?: string;
}

/** `err` as a failure-log cause: its code and message, bounded. */
function causeOf(err: Error): string {
  const code = (err as { code?: unknown }).code;
  const text = typeof code === 'string' && code.length > 0 ? `${code}: ${err.message}` : err.message;
  return text.length > 200 ? `${text.slice(0, 199)}…` : text;
}

/** What the owner does with a response head (`AttemptOwner.attemptHeaders`). */
export const COMMIT = 0;
/** Hold the response (up to `prebufferBytes`, its end, or `PREBUFFER_HOLD_MS`) before committing it. */
export const HOLD = 1;
/** Abort the attempt: its response is not wanted (a 502/503 that is retried, a hedge that lost). */
export const DISCARD = 2;
export type HeadVerdict = typeof COMMIT | typeof HOLD | typeof DISCARD;

/**
 * Longest a response is held in the prebuffer after its head arrived, ms (up to one sweep more):
 * a slow or streaming response is committed then rather than delayed until `prebufferBytes`.
 */
export const PREBUFFER_HOLD_MS = 200;

const TLS_CODES = /^(ERR_TLS|ERR_SSL|CERT_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN|HOSTNAME_MISMATCH)/;

/**
 * Classifies an undici / socket error. Only a failure that came from the backend (its socket, its
 * TLS, its timeouts) carries a passive-health signal; an error raised by our own request building
 * or undici's request validation, or one without a code (a defect of ours), carries none.
 */
export interface Classified {
  readonly outcome: ForwardOutcome;
  readonly status: number;
  readonly reason: string;
  readonly health: PassiveReason | undefined;
  readonly error: RequestError;
}

/** The attempt outcome of an error (an attempt is never shed or rate limited: those never reach forwarding). */
export function attemptOutcome(error: RequestError): ForwardOutcome {
  const o = error.outcome;
  return o === 'overload_shed' || o === 'rate_limited' ? 'failure' : o;
}

const C = (error: RequestError, reason: string, health: PassiveReason | undefined, status = error.status as number): Classified => Object.freeze({ outcome: attemptOutcome(error), status, reason, health, error });

const CLASSIFIED = {
  connectTimeout: C(ERR.EDGE_UPSTREAM_CONNECT_TIMEOUT, 'connect_timeout', 'timeout'),
  headersTimeout: C(ERR.EDGE_UPSTREAM_HEADERS_TIMEOUT, 'headers_timeout', 'timeout'),
  bodyTimeout: C(ERR.EDGE_UPSTREAM_BODY_TIMEOUT, 'body_timeout', 'timeout'),
  clientClosed: C(ERR.EDGE_CLIENT_CLOSED, 'client_closed', undefined, 499),
  clientSend: C(ERR.EDGE_CLIENT_SEND_TIMEOUT, 'client_send_timeout', undefined),
  clientBody: C(ERR.EDGE_CLIENT_BODY_TIMEOUT, 'client_body_timeout', undefined),
  tooLarge: C(ERR.EDGE_REQUEST_BODY_TOO_LARGE, 'request_too_large', undefined),
  lengthMismatch: C(ERR.EDGE_REQUEST_BODY_LENGTH_MISMATCH, 'body_length_mismatch', undefined),
  invalid: C(ERR.EDGE_REQUEST_INVALID, 'invalid_request', undefined),
  internal: C(ERR.EDGE_INTERNAL, 'internal', undefined),
  tls: C(ERR.EDGE_UPSTREAM_TLS, 'tls', 'tls'),
  transport: C(ERR.EDGE_UPSTREAM_TRANSPORT, 'transport', 'transport'),
  cancelled: C(ERR.EDGE_ATTEMPT_CANCELLED, 'cancelled', undefined),
};

export function classifyError(err: unknown): Classified {
  const code = String((err as { code?: unknown })?.code ?? (err as { cause?: { code?: unknown } })?.cause?.code ?? '');
  switch (code) {
    case 'UND_ERR_CONNECT_TIMEOUT':
    case H1_ERR.CONNECT_TIMEOUT:
      return CLASSIFIED.connectTimeout;
    case 'UND_ERR_HEADERS_TIMEOUT':
    case H1_ERR.HEADERS_TIMEOUT:
      return CLASSIFIED.headersTimeout;
    case 'UND_ERR_BODY_TIMEOUT':
    case H1_ERR.BODY_TIMEOUT:
    case 'EDGE_UPSTREAM_BODY_TIMEOUT':
      return CLASSIFIED.bodyTimeout;
    case 'EDGE_CLIENT_CLOSED':
      return CLASSIFIED.clientClosed;
    case 'EDGE_CLIENT_SEND_TIMEOUT':
      return CLASSIFIED.clientSend;
    case 'EDGE_CLIENT_BODY_TIMEOUT':
      return CLASSIFIED.clientBody;
    case 'EDGE_REQUEST_BODY_TOO_LARGE':
      return CLASSIFIED.tooLarge;
    case 'EDGE_REQUEST_BODY_LENGTH_MISMATCH':
      return CLASSIFIED.lengthMismatch;
    case 'EDGE_ATTEMPT_CANCELLED':
      return CLASSIFIED.cancelled;
    // Raised by the client (undici's or ours) while it builds or writes the request, before or
    // without any byte from the backend: the request's fault (a field value or target the client
    // refuses, a body shorter or longer than its content-length), never the backend's
    // (docs/decisions.md, "Whose failure").
    case 'UND_ERR_INVALID_ARG':
    case 'UND_ERR_NOT_SUPPORTED':
    case 'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH':
    case H1_ERR.INVALID_REQUEST:
    case H1_ERR.CONTENT_LENGTH_MISMATCH:
      return CLASSIFIED.invalid;
    // The pool was closed or destroyed under the request (a generation swap), or we aborted it.
    case 'UND_ERR_DESTROYED':
    case 'UND_ERR_CLOSED':
    case 'UND_ERR_ABORTED':
    case H1_ERR.POOL_CLOSED:
    case '':
      return CLASSIFIED.internal;
    default:
      if (TLS_CODES.test(code)) return CLASSIFIED.tls;
      return CLASSIFIED.transport;
  }
}

/** Causes that name themselves even if the downstream also closed. */
const UPSTREAM_TIMEOUT_CODES = new Set<string>(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', H1_ERR.CONNECT_TIMEOUT, H1_ERR.HEADERS_TIMEOUT, H1_ERR.BODY_TIMEOUT, 'EDGE_UPSTREAM_BODY_TIMEOUT', 'EDGE_CLIENT_BODY_TIMEOUT', 'EDGE_CLIENT_SEND_TIMEOUT', 'EDGE_REQUEST_BODY_TOO_LARGE', 'EDGE_REQUEST_BODY_LENGTH_MISMATCH', 'EDGE_ATTEMPT_CANCELLED']);

/** An Error with a stable `code`. */
export function codedError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** Who decides what becomes of an attempt's response, and is told how the attempt ended (once). */
export interface AttemptOwner {
  /** The final response head arrived (`status` ≥ 200): commit it, hold it, or discard the attempt. */
  attemptHeaders(status: number, headers: Readonly<Record<string, string | string[] | undefined>>): HeadVerdict;
  /** A held response outgrew `prebufferBytes` and is committed (`svc_response_prebuffer_limit_rejects`). */
  prebufferOverflow(): void;
  attemptDone(result: ForwardResult): void;
}

/** An owner that commits every response at once (no retry): `forward` and single-attempt callers. */
export const commitAll = (done: (r: ForwardResult) => void): AttemptOwner => ({ attemptHeaders: () => COMMIT, prebufferOverflow: () => undefined, attemptDone: done });

/**
 * Starts one attempt; `owner.attemptDone` hears how it ended, exactly once, possibly before this
 * returns (a closed pool fails at once). Failures come back classified, never thrown.
 *
 * Built on undici's `dispatch` with one handler object per attempt rather than on `stream()`,
 * which adds an AbortController and its listener, an AsyncResource scope and `finished()`
 * tracking of the downstream response to every request (measured: ~10 µs per request); and it
 * reports to an owner object rather than through a promise, which would add a promise, its
 * resolver closures and a microtask turn per request.
 */
export function startAttempt(res: DownstreamResponse, o: ForwardOptions, owner: AttemptOwner): ForwardAttempt {
  const a = new ForwardAttempt(res, o, owner);
  a.start();
  return a;
}

/** `startAttempt` as a promise (never rejects). */
export function forward(res: DownstreamResponse, o: ForwardOptions): Promise<ForwardResult> {
  return new Promise((resolve) => {
    startAttempt(res, o, commitAll(resolve));
  });
}

/** Body-total and send-stall deadlines of every attempt in this process; they fire up to 25 ms late. */
const BODY_DEADLINES = new DeadlineSweep(25);

/** One attempt: undici's handler for the upstream exchange, writing into the downstream response. */
export class ForwardAttempt implements Dispatcher.DispatchHandler, Expirable {
  private readonly res: DownstreamResponse;
  private readonly o: ForwardOptions;
  private readonly owner: AttemptOwner;
  private controller: Dispatcher.DispatchController | undefined;
  /** Abort asked before undici started the request (it is still queued in the pool). */
  private pendingAbort: Error | undefined;
  private backendStatus: number | undefined;
  /** When the response headers arrived (`performance.now()`); 0 before. */
  private headersAt = 0;
  /** When the whole response body must have arrived (`performance.now()`); set with the response head. */
  private totalDeadline = Infinity;
  /** What the sweep watches: `totalDeadline`, or sooner while the downstream blocks the response. */
  deadline = Infinity;
  sweepSlot = -1;
  private settled = false;
  private clientClosed = false;
  /** Whether this attempt wrote the response head downstream (another attempt may have: a hedge). */
  private committed = false;
  /** The response held before it is committed (`HOLD`): head and body chunks so far, and their size. */
  private heldHeaders: Record<string, string | string[] | undefined> | undefined;
  /** Whether the response is held; its first chunk, and the others (most responses are one chunk: no array). */
  private holding = false;
  private heldFirst: Buffer | undefined;
  private held: Buffer[] | undefined;
  private heldBytes = 0;
  /** Response body bytes written downstream. */
  private written = 0;

  constructor(res: DownstreamResponse, o: ForwardOptions, owner: AttemptOwner) {
    this.res = res;
    this.o = o;
    this.owner = owner;
  }

  start(): void {
    // 'close' comes once; `on` spares the wrapper `once` allocates, and `settle` drops it.
    this.res.on('close', this.onClose);
    // The options carry undici's fields under undici's names, so they are the dispatch options
    // themselves (undici reads the fields it knows and ignores the others). A dispatcher that is closed
    // or destroyed reports through onResponseError.
    this.o.pool.dispatch(this.o as unknown as Dispatcher.DispatchOptions, this);
  }

  // Abort upstream only when the downstream goes away before we finished (FIELD-NOTES: aborting on
  // every close costs ~25 µs per request). Once the response has been ended downstream there is
  // nothing left to abort.
  private readonly onClose = (): void => {
    if (this.settled) return;
    this.clientClosed = true;
    if (this.res.writableEnded) return;
    this.abort(codedError('EDGE_CLIENT_CLOSED', 'downstream closed'));
  };

  /** Resumes the upstream once the downstream drained; made on the first backpressure only. */
  private onDrain: (() => void) | undefined;

  /** Aborts the attempt upstream because its response is no longer wanted (a hedge that lost). */
  cancel(): void {
    if (!this.settled) this.abort(codedError('EDGE_ATTEMPT_CANCELLED', 'attempt cancelled'));
  }

  private abort(reason: Error): void {
    if (this.controller !== undefined) this.controller.abort(reason);
    else this.pendingAbort ??= reason;
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.pendingAbort !== undefined) controller.abort(this.pendingAbort);
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    // Interim responses (1xx) are not relayed: `100 Continue` is the ingress's business.
    if (statusCode < 200) return;
    this.backendStatus = statusCode;
    const now = performance.now();
    this.headersAt = now;
    this.totalDeadline = now + this.o.bodyTotalMs;
    this.deadline = this.totalDeadline;
    const verdict = this.owner.attemptHeaders(statusCode, headers);
    if (verdict === DISCARD) {
      this.abort(codedError('EDGE_ATTEMPT_CANCELLED', 'response discarded'));
      return;
    }
    if (verdict === HOLD) {
      this.heldHeaders = headers;
      this.holding = true;
      this.deadline = Math.min(this.totalDeadline, now + PREBUFFER_HOLD_MS);
    } else {
      this.commit(headers);
    }
    BODY_DEADLINES.add(this);
  }

  /** Writes the response head downstream: from here on the response is the client's. */
  private commit(headers: Record<string, string | string[] | undefined>): void {
    this.committed = true;
    this.res.writeHead(this.backendStatus as number, downstreamResponseHeaders(headers, this.o.backendProtocol));
  }

  /** Commits a held response: its head, then the chunks held (backpressure as for any chunk). */
  private flush(): void {
    const first = this.heldFirst;
    const rest = this.held;
    this.holding = false;
    this.heldFirst = undefined;
    this.held = undefined;
    this.commit(this.heldHeaders as Record<string, string | string[] | undefined>);
    this.heldHeaders = undefined;
    this.heldBytes = 0;
    if (first !== undefined) this.write(first);
    if (rest !== undefined) for (const chunk of rest) this.write(chunk);
  }

  /**
   * The response body took longer than `bodyTotalMs`, or the downstream blocked it longer than
   * `sendIdleMs` (called by the deadline sweep). A client that stops reading (or keeps its HTTP/2
   * window at zero) would otherwise hold the backend request and its in-flight slot until the
   * body-total deadline.
   */
  expire(): void {
    if (this.holding) {
      // Held long enough: commit it and stream the rest.
      this.deadline = this.totalDeadline;
      this.flush();
      BODY_DEADLINES.add(this);
      return;
    }
    if (this.deadline < this.totalDeadline) this.abort(codedError('EDGE_CLIENT_SEND_TIMEOUT', 'the client did not read the response'));
    else this.abort(codedError('EDGE_UPSTREAM_BODY_TIMEOUT', 'response body took too long'));
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.holding) {
      if (this.heldFirst === undefined) this.heldFirst = chunk;
      else (this.held ??= []).push(chunk);
      this.heldBytes += chunk.length;
      if (this.heldBytes <= (this.o.prebufferBytes ?? 0)) return;
      this.owner.prebufferOverflow();
      this.deadline = this.totalDeadline;
      this.flush();
      return;
    }
    this.write(chunk);
  }

  /** Writes one response chunk downstream; on backpressure undici stops reading the backend. */
  private write(chunk: Buffer): void {
    const res = this.res;
    if (res.destroyed) return;
    this.written += chunk.length;
    if (!res.write(chunk)) {
      const controller = this.controller as Dispatcher.DispatchController;
      // Backpressure: undici stops reading the upstream socket until the client catches up.
      controller.pause();
      const sendIdleMs = this.o.sendIdleMs;
      if (sendIdleMs !== undefined) this.deadline = Math.min(this.totalDeadline, performance.now() + sendIdleMs);
      if (this.onDrain === undefined) {
        this.onDrain = () => {
          this.deadline = this.totalDeadline;
          this.controller?.resume();
        };
        res.on('drain', this.onDrain);
      }
    }
  }

  onResponseEnd(): void {
    if (this.holding) this.flush();
    if (!this.res.destroyed) this.res.end();
    const status = this.backendStatus ?? 502;
    this.settle({ status, outcome: 'success', health: status >= 500 ? '5xx' : 'ok', responseStarted: true, headersAt: this.headersAt, bytesOut: this.written });
  }

  onResponseError(_controller: Dispatcher.DispatchController | null, err: Error): void {
    // An upstream timeout names its cause even though the downstream may also have closed; any
    // other failure after the downstream went away is the client's doing.
    const code = String((err as { code?: unknown })?.code ?? '');
    const reason = UPSTREAM_TIMEOUT_CODES.has(code) || !this.clientClosed ? err : (this.pendingAbort ?? codedError('EDGE_CLIENT_CLOSED', 'downstream closed'));
    const c = classifyError(reason);
    // The client's own words for a backend's failure (the failure log's `cause`), nothing otherwise.
    const cause = c.health === undefined ? {} : { cause: causeOf(reason) };
    const res = this.res;
    if (this.committed) {
      // Too late for an error response: cut the downstream so the client sees a truncated body, not a complete one.
      res.destroy(reason);
      this.settle({ status: this.backendStatus, outcome: c.outcome, reason: c.reason, error: c.error, health: c.health, responseStarted: true, headersAt: this.headersAt, bytesOut: this.written, ...cause });
      return;
    }
    this.settle({ status: c.status === 499 ? undefined : c.status, outcome: c.outcome, reason: c.reason, error: c.error, health: c.health, responseStarted: false, headersAt: this.headersAt, ...cause });
  }

  private settle(result: ForwardResult): void {
    if (this.settled) return;
    this.settled = true;
    if (this.sweepSlot !== -1) BODY_DEADLINES.delete(this);
    this.holding = false;
    this.heldFirst = undefined;
    this.held = undefined;
    this.res.removeListener('close', this.onClose);
    if (this.onDrain !== undefined) this.res.removeListener('drain', this.onDrain);
    this.owner.attemptDone(result);
  }
}
