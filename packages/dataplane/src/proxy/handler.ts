// Requests of every ingress (HTTP/1.1, HTTP/2, HTTP/3): `serveRequest` admits a request on the
// runtime active then (phase `admit`) and runs the phases of proxy/pipeline.ts on an `Exchange`,
// which forwards through undici (proxy/forward.ts) and answers through the ingress's response.
// The request finishes on that runtime even if a new generation is activated meanwhile.
import type { Readable } from 'node:stream';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import { COMMIT, DISCARD, HOLD, startAttempt } from './forward.ts';
import type { AttemptOwner, DownstreamResponse, ForwardAttempt, ForwardOptions, ForwardResult, HeadVerdict } from './forward.ts';
import { ReplayBody } from './replay-body.ts';
import { canonicalContentLength } from '../policy/content-length.ts';
import { BodyGuard } from './body-guard.ts';
import { statusClass } from './request-metrics.ts';
import { NEXT, RequestContext, STOP, upstreamHost } from './pipeline.ts';
import type { PhaseResult, RoutePhases, Selection } from './pipeline.ts';
import { ERR, REASON_PHRASES } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import type { BackendRuntime, Runtime, UpstreamRuntime } from '../runtime/provision.ts';
import type { InflightToken } from '../balancing/backend-stats.ts';
import type { AttemptSpan } from '@edge-proxy/telemetry';

export { upstreamHost } from './pipeline.ts';

/** A downstream request as every ingress presents it. Header names are lower case. */
export interface DownstreamRequest {
  readonly method: string;
  /** Path with query (origin form), or the authority for CONNECT. */
  readonly path: string;
  readonly authority: string | undefined;
  readonly host: string | undefined;
  readonly headers: HeaderMap;
  readonly headerCount: number;
  readonly headerBytes: number;
  readonly remoteAddress: string;
  readonly protocol: '1.1' | '2' | '3';
  readonly ingress: 'quic' | 'bootstrap-h1' | 'bootstrap-h2';
  /** The listener's name (`listeners[].name`). */
  readonly listener: string;
  readonly earlyData: boolean;
  /** QUIC connection id, or `address:port` of the TCP connection (sticky-cid). */
  readonly affinityKey: string;
  readonly upgrade: boolean;
  /** `:scheme` (HTTP/2, HTTP/3); absent on HTTP/1.1. */
  readonly scheme?: string | undefined;
  /** More than one Host field line arrived (see `hostFieldCount`); the request is refused. */
  readonly duplicateHost?: boolean;
  /** The request body; read only when `hasBody`. */
  readonly body: Readable;
  readonly hasBody: boolean;
}

/** What an ingress needs from the worker: the runtime to admit a request on. */
export interface RuntimeSource {
  /** The active runtime, held until `release` is called (requests finish on their generation). */
  acquire(): Runtime;
  release(rt: Runtime): void;
}

/** Name + value bytes of a header section given as flat `rawHeaders` (name, value, ...); its field count is half the length. */
export function headerBytes(raw: readonly string[]): number {
  let bytes = 0;
  for (const s of raw) bytes += s.length;
  return bytes;
}

/**
 * How many `Host` field lines a flat `rawHeaders` list holds. Node's header objects keep the first
 * of two Host lines silently; two are refused (RFC 9112 §3.2: 400).
 */
export function hostFieldCount(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string;
    // Compared by char code with the ASCII case bit set: no lower-cased copy of every name.
    if (name.length === 4 && (name.charCodeAt(0) | 0x20) === 0x68 && (name.charCodeAt(1) | 0x20) === 0x6f && (name.charCodeAt(2) | 0x20) === 0x73 && (name.charCodeAt(3) | 0x20) === 0x74) n++;
  }
  return n;
}

/** The IPv4 address of an IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`); any other address as it is. */
export function unmapIpv4(address: string): string {
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}

/**
 * Admits `req` on the runtime active now, handles it there and releases the runtime when the
 * response is done (phase 1, "admit", for every ingress). A defect answers 502 rather than leave
 * the client hanging. Never throws.
 */
export function serveRequest(runtimes: RuntimeSource, req: DownstreamRequest, res: DownstreamResponse): void {
  let rt: Runtime;
  try {
    rt = runtimes.acquire();
  } catch {
    answerDefect(res, req.method, undefined);
    return;
  }
  new Exchange(rt, req, res, runtimes, undefined).start();
}

/** 502 for a defect of ours; if even that cannot be sent, the connection is cut. Returns the body bytes sent. */
function answerDefect(res: DownstreamResponse, method: string, requestId: string | undefined): number {
  try {
    return sendError(res, method, 502, 'internal proxy error', {}, ERR.EDGE_INTERNAL.code, requestId);
  } catch {
    res.destroy();
    return 0;
  }
}

/**
 * Answers with a short plain-text error naming its code (`503 Service Unavailable: route queue
 * full (EDGE_SHED_QUEUE_FULL)`) and the request's id in `x-request-id`; never includes request
 * data. Returns the body bytes sent (0 for HEAD, or when a response had already begun).
 */
export function sendError(res: DownstreamResponse, method: string, status: number, detail: string, headers: HeaderMap = {}, code?: string, requestId?: string): number {
  if (res.headersSent || res.destroyed) return 0;
  const body = `${status} ${REASON_PHRASES[status] ?? 'Error'}: ${detail}${code === undefined ? '' : ` (${code})`}\n`;
  const length = Buffer.byteLength(body);
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': String(length), 'cache-control': 'no-store', ...(requestId === undefined ? {} : { 'x-request-id': requestId }), ...headers });
  res.end(method === 'HEAD' ? undefined : body);
  return method === 'HEAD' ? 0 : length;
}

/**
 * Handles one request on runtime `rt`, then gives `rt` back to `runtimes` if given. The promise
 * settles when the request is over; it never rejects.
 */
export function handleRequest(rt: Runtime, req: DownstreamRequest, res: DownstreamResponse, runtimes?: RuntimeSource): Promise<void> {
  return new Promise((resolve) => {
    new Exchange(rt, req, res, runtimes, resolve).start();
  });
}

/**
 * One attempt of an exchange: the backend it went to (with its in-flight token and breaker probe),
 * whether it is a hedge, and what became of its response. It is the attempt's owner and passes
 * what it hears to its exchange.
 */
class Try implements AttemptOwner, Selection {
  private readonly x: Exchange;
  readonly backend: BackendRuntime;
  token: InflightToken | undefined;
  readonly probe: boolean;
  readonly hedge: boolean;
  readonly t0 = performance.now();
  attempt: ForwardAttempt | undefined;
  /** The attempt's client span (tracing on). */
  span: AttemptSpan | undefined;
  /**
   * Why its response was not used: `lost` (another attempt answered first), `status_502` /
   * `status_503` (a 502/503 discarded to try again); '' when it was (or may still be) used.
   */
  discarded = '';
  /** A retry was granted when its 502/503 was discarded. */
  granted = false;

  constructor(x: Exchange, sel: Selection, hedge: boolean) {
    this.x = x;
    this.backend = sel.backend as BackendRuntime;
    this.token = sel.token;
    this.probe = sel.probe;
    this.hedge = hedge;
  }

  attemptHeaders(status: number, headers: Readonly<Record<string, string | string[] | undefined>>): HeadVerdict {
    return this.x.tryHeaders(this, status, headers);
  }

  prebufferOverflow(): void {
    this.x.rt.deps.metrics.counter('svc_response_prebuffer_limit_rejects').inc();
  }

  attemptDone(result: ForwardResult): void {
    this.x.tryDone(this, result);
  }
}

/** What an attempt whose 502/503 was discarded counts as: a backend failure of that status. */
function discardedStatus(status: number, reason: string, headersAt: number): ForwardResult {
  return { status, outcome: 'backend_error', reason, error: ERR.EDGE_UPSTREAM_ERROR_STATUS, health: '5xx', responseStarted: false, headersAt };
}

/** Whether an `expect` field asks for `100 Continue` (RFC 9110 §10.1.1: the token is case-insensitive). */
function expectsContinue(v: string | string[] | undefined): boolean {
  if (v === undefined) return false;
  const value = Array.isArray(v) ? v.join(',') : v;
  return value.length === 12 ? value.toLowerCase() === '100-continue' : /(?:^|,)\s*100-continue\s*(?:,|$)/i.test(value);
}

/** The declared length of a body or response (`content-length`), NaN when not declared (or invalid). */
function declaredLength(v: string | string[] | undefined): number {
  return Number(canonicalContentLength(v) ?? NaN);
}

/**
 * One request on one runtime, forwarded through undici: the phases of proxy/pipeline.ts plus this
 * path's `forward` and `respond`. An object with methods rather than an async function: an
 * attempt reports back through its `Try`, so a request costs no promise, no suspended frame and
 * no microtask turn. Every entry point catches defects, and `finish` runs exactly once.
 *
 * Retries and hedges (docs/retries.md): an idempotent request may be tried again after a failure
 * before its response is committed downstream, within `max_attempts` and the route's retry budget,
 * with its body replayed from memory; after `delay_ms` without response headers a hedge may be
 * sent to another backend, and the first response head wins (the other attempt is cancelled).
 */
export class Exchange extends RequestContext {
  private readonly res: DownstreamResponse;
  private readonly runtimes: RuntimeSource | undefined;
  private readonly onDone: (() => void) | undefined;
  /** The request body: as guarded from the client (one attempt), or kept for replay. */
  private body: Readable | null = null;
  /** The body's guard, which counts the bytes received. */
  private guard: BodyGuard | undefined;
  private replay: ReplayBody | undefined;
  private result: ForwardResult | undefined;
  /** When the last attempt ended (the end of the exchange: what follows is bookkeeping). */
  private ended = 0;
  /** Attempts in flight: the latest primary or retry, and the hedge. */
  private current: Try | undefined;
  private hedging: Try | undefined;
  /** The attempt whose response head was taken (committed or held). */
  private winner: Try | undefined;
  private hedgeTimer: NodeJS.Timeout | undefined;
  /** When the hedge was sent (`performance.now()`), 0 if none; and whether its outcome is counted. */
  private hedgeAt = 0;
  private hedgeCounted = false;
  /** The failure a granted retry follows (`svc_retry_attempts_total{reason}` when it is sent). */
  private retryReason = '';

  constructor(rt: Runtime, req: DownstreamRequest, res: DownstreamResponse, runtimes: RuntimeSource | undefined, onDone: (() => void) | undefined) {
    super(rt, req);
    this.res = res;
    this.runtimes = runtimes;
    this.onDone = onDone;
  }

  start(): void {
    this.rm.requests.inc();
    this.run();
  }

  protected routePhases(u: UpstreamRuntime): RoutePhases {
    return u.phases;
  }

  protected options(allow: string): PhaseResult {
    // RFC 9110 §9.3.7: `OPTIONS *` asks about the server, not a resource: the proxy answers.
    this.res.writeHead(200, { allow, 'content-length': '0' });
    this.res.end();
    this.status = 200;
    this.failed = false;
    this.finish();
    return STOP;
  }

  protected answer(err: RequestError, detail: string | undefined, headers: HeaderMap | undefined): void {
    if (err.status === undefined) return;
    this.status = err.status;
    this.bytesOut = sendError(this.res, this.req.method, err.status, detail ?? err.detail, headers, err.code, this.requestId);
    if (this.u !== undefined) this.rm.latency(this.u, err.outcome).observe(performance.now() - this.started);
    this.noteAnswered(err, err.status);
  }

  private readonly onAbandon = (): void => {
    this.abandonWait();
  };

  protected watchAbandon(on: boolean): void {
    if (on) this.res.on('close', this.onAbandon);
    else this.res.removeListener('close', this.onAbandon);
  }

  /** Phase `forward` of this path. */
  static forwardPhase(x: RequestContext): PhaseResult {
    return (x as Exchange).forward();
  }

  /** Phase `respond` of this path. */
  static respondPhase(x: RequestContext): PhaseResult {
    return (x as Exchange).respond();
  }

  /** Starts an attempt on the backend `select` picked (the first, or a retry); its `Try` hears its end. */
  forward(): PhaseResult {
    const { rt, req } = this;
    const u = this.u as UpstreamRuntime;
    if (this.attempt === 0) {
      if (req.hasBody) this.openBody(u);
      const t = this.launch(false);
      if (this.attempts > 1) {
        rt.deps.retries.primary(u.name, t.t0);
        const delay = u.retry.hedgeDelayMs;
        if (delay > 0 && !this.finished && u.retry.hedgeMethods.has(req.method)) this.hedgeTimer = setTimeout(this.onHedge, delay);
      }
      return STOP;
    }
    this.launch(false);
    return STOP;
  }

  /** Guards the request body (size, pace) and, when the request may be retried, keeps it for replay. */
  private openBody(u: UpstreamRuntime): void {
    const { rt, req } = this;
    // RFC 9110 §10.1.1: a client that sent `expect: 100-continue` holds its body until told to
    // send it. Told only now, when the body is read: every refusal that needs no body (validation,
    // protocol policy, routing, authentication, limits, shedding, selection) came first, so a
    // refused request is answered without the client having sent (or the proxy having read) it.
    if (expectsContinue(req.headers['expect'])) this.res.writeContinue?.();
    const t = rt.config.performance.timeouts;
    // The guard also holds a content-length body's final chunk until the client's end of stream
    // (body-guard.ts): a longer or shorter body never reaches the backend whole.
    const declared = declaredLength(req.headers['content-length']);
    const guarded = (this.guard = req.body.pipe(new BodyGuard(rt.config.performance.body.max_request_body_bytes, { idleMs: t.client_body_idle_ms, totalMs: t.client_body_total_ms, minBytesPerSec: rt.config.performance.body.client_body_min_bytes_per_s }, declared, req.body)));
    if (this.attempts > 1 && u.retry.bufferBytes > 0) this.replay = new ReplayBody(guarded, rt.deps.retries, u.retry.bufferBytes, declared);
    else this.body = guarded;
  }

  /** Sends an attempt to the backend selected (moved into its `Try`). */
  private launch(hedge: boolean): Try {
    const { rt, req, res } = this;
    const u = this.u as UpstreamRuntime;
    const b = this.backend as BackendRuntime;
    const t = new Try(this, this, hedge);
    this.token = undefined;
    if (hedge) this.hedging = t;
    else this.current = t;
    if (!hedge && this.attempt > 0) rt.deps.retries.retried(this.retryReason);
    this.attempt++;
    const body = this.replay !== undefined ? this.replay.open() : this.body;
    this.body = null;
    const headers = upstreamRequestHeaders(req.headers, req, upstreamHost(u, b, req.authority ?? req.host), req.upgrade, this.requestId, u.auth?.guarded);
    if (this.span !== undefined) t.span = this.span.startAttempt({ attempt: this.attempt, hedge, upstream: u.name, backend: b.id, host: b.host, port: b.port }, headers);
    const options: ForwardOptions = {
      pool: rt.deps.pools.get(b.pool),
      method: req.method,
      path: req.path,
      headers,
      body,
      headersTimeout: u.timeouts.requestMs,
      bodyTimeout: u.timeouts.bodyIdleMs,
      bodyTotalMs: u.timeouts.bodyTotalMs,
      sendIdleMs: rt.config.performance.timeouts.client_send_idle_ms,
      backendProtocol: b.scheme === 'https' ? '2' : '1.1',
      servername: b.scheme === 'https' ? (b.pool.tls?.serverName ?? b.host) : undefined,
      prebufferBytes: u.retry.prebufferBytes,
    };
    // From here on `tryDone` is called exactly once for `t`, and it ends the backend's slot (or
    // `finish` does, for an attempt still in flight then).
    t.attempt = startAttempt(res, options, t);
    return t;
  }

  /** Attempts in flight. */
  private get live(): number {
    return (this.current === undefined ? 0 : 1) + (this.hedging === undefined ? 0 : 1);
  }

  /**
   * Whether another attempt follows the failure of `failed` for `reason` (`transport`,
   * `status_503`, ...): an attempt left, a body that can be replayed, the route's budget, and a
   * backend, which is picked here (the retry resumes after `select`). A refusal is counted; a
   * grant takes from the budget.
   */
  private prepareRetry(failed: Try, reason: string): boolean {
    if (this.attempts <= 1) return false;
    const retries = this.rt.deps.retries;
    if (this.attempt >= this.attempts) {
      retries.denied('max_attempts');
      return false;
    }
    if (this.req.hasBody && this.replay?.replayable !== true) {
      retries.denied('body_not_buffered');
      return false;
    }
    const u = this.u as UpstreamRuntime;
    const now = performance.now();
    if (!retries.allows(u.name, now, u.retry.ratioPercent)) {
      retries.denied('budget_exhausted');
      return false;
    }
    if (!this.pickBackend(failed.backend)) {
      retries.denied('no_backend');
      return false;
    }
    retries.withdraw(u.name, now, u.retry.ratioPercent);
    this.retryReason = reason;
    return true;
  }

  /**
   * After a transport error (nothing answered yet), when a retry may follow but the worker's lease
   * of the route's retry budget (the node's) is empty: waits for the supervisor's answer, at most
   * the lease wait, instead of failing the request for want of a unit the node may have; then
   * retries, or answers the failure (`budget_exhausted`). True when it waits. Only here: a retry
   * after a 502/503 head is decided as the head arrives, from what the lease holds.
   */
  private waitForRetryUnit(failed: Try, reason: string): boolean {
    if (this.attempts <= 1 || this.attempt >= this.attempts) return false;
    if (this.req.hasBody && this.replay?.replayable !== true) return false;
    const u = this.u as UpstreamRuntime;
    const retries = this.rt.deps.retries;
    const now = performance.now();
    if (retries.allows(u.name, now, u.retry.ratioPercent)) return false;
    return retries.waitForUnit(u.name, now, (taken) => {
      try {
        if (this.finished) return;
        if (this.res.destroyed) return void this.complete();
        if (!taken) {
          retries.denied('budget_exhausted');
          return void this.complete();
        }
        if (!this.pickBackend(failed.backend)) {
          retries.denied('no_backend');
          return void this.complete();
        }
        this.retryReason = reason;
        this.resumeAt(u.phases.afterSelect);
      } catch (err) {
        this.defect(err);
        this.finish();
      }
    });
  }

  /** After `delay_ms` without a response head: a hedge to another backend, if one may be sent. */
  private readonly onHedge = (): void => {
    this.hedgeTimer = undefined;
    try {
      if (this.finished || this.winner !== undefined || this.current === undefined || this.hedging !== undefined) return;
      if (this.attempt >= this.attempts || (this.req.hasBody && this.replay?.complete !== true)) return;
      const u = this.u as UpstreamRuntime;
      const retries = this.rt.deps.retries;
      const now = performance.now();
      if (!retries.allows(u.name, now, u.retry.ratioPercent)) {
        retries.denied('budget_exhausted');
        return;
      }
      // Another backend, not tried yet, eligible now; none: no hedge (nothing counted).
      if (!this.pickBackend()) return;
      retries.withdraw(u.name, now, u.retry.ratioPercent);
      this.rt.deps.metrics.counter('svc_hedge_triggered_total').inc();
      this.hedgeAt = performance.now();
      this.launch(true);
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  };

  /** The hedge's outcome, counted once: whether it (or the primary, and how late) answered, or neither. */
  private countHedge(winner: Try | undefined): void {
    if (this.hedgeAt === 0 || this.hedgeCounted) return;
    this.hedgeCounted = true;
    const m = this.rt.deps.metrics;
    if (winner?.hedge === true) {
      m.counter('svc_hedge_won_total').inc();
      return;
    }
    m.counter('svc_hedge_wasted_total').inc();
    if (winner === undefined) return;
    m.counter('svc_hedge_primary_won_after_trigger_total').inc();
    m.counter('svc_hedge_primary_late_ms_total').inc(Math.round(performance.now() - this.hedgeAt));
    m.counter('svc_hedge_primary_late_samples_total').inc();
  }

  /**
   * An attempt's response head arrived: the first one wins (the other attempt is cancelled); a
   * 502/503 is discarded when a retry may follow; a winner that may still be retried is held in
   * the prebuffer.
   */
  tryHeaders(t: Try, status: number, headers: Readonly<Record<string, string | string[] | undefined>>): HeadVerdict {
    if (this.winner !== undefined || this.finished) {
      t.discarded = 'lost';
      return DISCARD;
    }
    if ((status === 502 || status === 503) && this.attempts > 1) {
      const reason = status === 502 ? 'status_502' : 'status_503';
      // With another attempt in flight, that one may still answer; else a retry must be granted now.
      if (this.live > 1 || (t.granted = this.prepareRetry(t, reason))) {
        t.discarded = reason;
        return DISCARD;
      }
    }
    this.winner = t;
    this.stopHedge();
    this.countHedge(t);
    const other = t === this.current ? this.hedging : this.current;
    if (other !== undefined) {
      other.discarded = 'lost';
      other.attempt?.cancel();
    }
    // Held only while a failure could still be retried: attempts left, a body that can be replayed.
    const prebuffer = (this.u as UpstreamRuntime).retry.prebufferBytes;
    if (prebuffer === 0 || this.attempt >= this.attempts || (this.req.hasBody && this.replay?.replayable !== true)) return COMMIT;
    const type = headers['content-type'];
    if (typeof type === 'string' && type.startsWith('text/event-stream')) return COMMIT;
    if (declaredLength(headers['content-length']) > prebuffer) {
      t.prebufferOverflow();
      return COMMIT;
    }
    return HOLD;
  }

  /** An attempt ended (called by its `Try`, possibly inside undici's callbacks). */
  tryDone(t: Try, result: ForwardResult): void {
    try {
      const now = performance.now();
      const discarded = t.discarded;
      const recorded = discarded === '' || discarded === 'lost' ? result : discardedStatus(result.status ?? (discarded === 'status_502' ? 502 : 503), discarded, result.headersAt);
      // Still in flight for `finish` (which ends its slot) if recording it fails.
      this.attemptRecorded(recorded, t.t0, now, t);
      t.span?.end({ status: result.status, outcome: recorded.outcome, reason: discarded === '' ? recorded.reason : discarded });
      if (this.current === t) this.current = undefined;
      else if (this.hedging === t) this.hedging = undefined;
      if (recorded.outcome === 'success') this.rt.deps.stats.observe(t.backend.key, now - t.t0, now);
      // A cancelled loser: nothing more to do (the request may even be over).
      if (discarded === 'lost' || this.finished) return;
      this.ended = now;
      this.result = recorded;
      if (t === this.winner) {
        if (recorded.responseStarted || recorded.error === undefined) {
          this.complete();
          return;
        }
        // Failed while held in the prebuffer: as if no head had come.
        this.winner = undefined;
      }
      // Another attempt in flight may still answer.
      if (this.live > 0) return;
      // A transport error with the worker's retry lease empty: the supervisor's answer decides.
      if (!t.granted && !recorded.responseStarted && recorded.error?.retryable === true && this.waitForRetryUnit(t, recorded.reason ?? 'unknown')) return;
      const retry = t.granted || (!recorded.responseStarted && recorded.error?.retryable === true && this.prepareRetry(t, recorded.reason ?? 'unknown'));
      if (retry) {
        // The next attempt (its backend picked) starts on a later turn, outside the failed
        // attempt's undici callbacks.
        const u = this.u as UpstreamRuntime;
        queueMicrotask(() => {
          // The client may have gone meanwhile: nobody to retry for (`finish` ends the pick).
          if (this.res.destroyed) this.complete();
          else this.resumeAt(u.phases.afterSelect);
        });
        return;
      }
      this.complete();
    } catch (err) {
      this.defect(err);
      this.finish();
    }
  }

  /** The exchange is over: answer what is left unanswered, record it, finish. */
  private complete(): void {
    this.countHedge(this.winner);
    this.respond();
    this.finish();
  }

  private stopHedge(): void {
    if (this.hedgeTimer === undefined) return;
    clearTimeout(this.hedgeTimer);
    this.hedgeTimer = undefined;
  }

  /** Answers what the attempts left unanswered, and records the upstream outcome. */
  respond(): PhaseResult {
    const { req, res, result } = this;
    const u = this.u as UpstreamRuntime;
    if (result === undefined) return NEXT;
    // An HTTP/1.1 client cut for a slow body may still be sending it: close the connection rather
    // than read the rest (RFC 9110 §15.5.9).
    const malformed = this.malformedBody(result.error);
    const err = malformed ?? result.error;
    this.status = result.status ?? 0;
    this.bytesOut = result.bytesOut ?? 0;
    this.error = err;
    this.reason = malformed === undefined ? result.reason : 'body_length_mismatch';
    if (!result.responseStarted && result.status !== undefined && err !== undefined) {
      this.bytesOut = sendError(res, req.method, result.status, (result.reason ?? err.detail).replace(/_/g, ' '), result.status === 408 && req.protocol === '1.1' ? { connection: 'close' } : {}, err.code, this.requestId);
      if (err.source === 'upstream' || err.source === 'internal') this.logFailure(result.status, err.code, this.ended, result.cause);
    }
    if (err !== undefined) this.count(err);
    const outcome = result.outcome;
    this.outcome = outcome;
    this.rm.upstream(u, statusClass(result.status), outcome).inc();
    const elapsed = this.ended - this.started;
    this.rm.latency(u, outcome).observe(elapsed);
    if (outcome === 'success') this.rt.deps.routeLatency.observe(u.name, elapsed, this.ended);
    this.failed = outcome !== 'success' || (result.status ?? 500) >= 500;
    return NEXT;
  }

  /**
   * The client's stream reset under the attempt (`EDGE_CLIENT_CLOSED`) because its body disagreed
   * with its content-length: recorded as that, not as a client that went away.
   */
  private malformedBody(err: RequestError | undefined): RequestError | undefined {
    return err === ERR.EDGE_CLIENT_CLOSED && this.guard?.lengthMismatch === true ? ERR.EDGE_REQUEST_BODY_LENGTH_MISMATCH : undefined;
  }

  protected override clientGone(): void {
    super.clientGone();
    if (this.malformedBody(this.error) === undefined) return;
    this.error = ERR.EDGE_REQUEST_BODY_LENGTH_MISMATCH;
    this.outcome = ERR.EDGE_REQUEST_BODY_LENGTH_MISMATCH.outcome;
    this.reason = 'body_length_mismatch';
  }

  protected answerDefect(): void {
    this.status = this.res.headersSent ? this.status : 502;
    this.bytesOut += answerDefect(this.res, this.req.method, this.requestId);
  }

  protected override bytesIn(): number {
    return this.guard?.bytes ?? 0;
  }

  protected override lastBackend(): BackendRuntime | undefined {
    return this.winner?.backend ?? this.backend;
  }

  protected override gone(): boolean {
    return this.res.destroyed;
  }

  protected done(): void {
    if (this.current !== undefined) this.endBackend(this.current);
    if (this.hedging !== undefined) this.endBackend(this.hedging);
    this.stopHedge();
    this.replay?.release();
    this.runtimes?.release(this.rt);
    this.onDone?.();
  }
}
