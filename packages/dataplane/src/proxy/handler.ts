// Requests of every ingress (HTTP/1.1, HTTP/2, HTTP/3): `serveRequest` admits a request on the
// runtime active then (phase `admit`) and runs the phases of proxy/pipeline.ts on an `Exchange`,
// which forwards through undici (proxy/forward.ts) and answers through the ingress's response.
// The request finishes on that runtime even if a new generation is activated meanwhile.
import type { Readable } from 'node:stream';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import { startAttempt } from './forward.ts';
import type { AttemptOwner, DownstreamResponse, ForwardOptions, ForwardResult } from './forward.ts';
import { BodyGuard } from './body-guard.ts';
import { statusClass } from './request-metrics.ts';
import { NEXT, RequestContext, STOP, upstreamHost } from './pipeline.ts';
import type { PhaseResult, RoutePhases } from './pipeline.ts';
import { ERR } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import type { BackendRuntime, Runtime, UpstreamRuntime } from '../runtime/provision.ts';

export { requestHashKey, upstreamHost } from './pipeline.ts';

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
    answerDefect(res, req.method);
    return;
  }
  new Exchange(rt, req, res, runtimes, undefined).start();
}

/** 502 for a defect of ours; if even that cannot be sent, the connection is cut. */
function answerDefect(res: DownstreamResponse, method: string): void {
  try {
    sendError(res, method, 502, 'internal proxy error', {}, ERR.EDGE_INTERNAL.code);
  } catch {
    res.destroy();
  }
}

const REASON_TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 408: 'Request Timeout', 413: 'Content Too Large', 421: 'Misdirected Request', 425: 'Too Early', 431: 'Request Header Fields Too Large', 501: 'Not Implemented', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/**
 * Answers with a short plain-text error naming its code (`503 Service Unavailable: route queue
 * full (EDGE_SHED_QUEUE_FULL)`); never includes request data.
 */
export function sendError(res: DownstreamResponse, method: string, status: number, detail: string, headers: HeaderMap = {}, code?: string): void {
  if (res.headersSent || res.destroyed) return;
  const body = `${status} ${REASON_TEXT[status] ?? 'Error'}: ${detail}${code === undefined ? '' : ` (${code})`}\n`;
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), 'cache-control': 'no-store', ...headers });
  res.end(method === 'HEAD' ? undefined : body);
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
 * One request on one runtime, forwarded through undici: the phases of proxy/pipeline.ts plus this
 * path's `forward` and `respond`. An object with methods rather than an async function: the
 * attempt reports back by calling `attemptDone`, so a request costs no promise, no suspended frame
 * and no microtask turn. Every entry point catches defects, and `finish` runs exactly once.
 */
export class Exchange extends RequestContext implements AttemptOwner {
  private readonly res: DownstreamResponse;
  private readonly runtimes: RuntimeSource | undefined;
  private readonly onDone: (() => void) | undefined;
  private body: Readable | null = null;
  private t0 = 0;
  private result: ForwardResult | undefined;
  /** When the last attempt ended (the end of the exchange: what follows is bookkeeping). */
  private ended = 0;

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
    this.failed = false;
    this.finish();
    return STOP;
  }

  protected answer(err: RequestError, detail: string | undefined, headers: HeaderMap | undefined): void {
    if (err.status === undefined) return;
    sendError(this.res, this.req.method, err.status, detail ?? err.detail, headers, err.code);
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

  /** Starts an attempt on the backend `select` picked; `attemptDone` hears its end. */
  forward(): PhaseResult {
    const { rt, req, res } = this;
    const u = this.u as UpstreamRuntime;
    const b = this.backend as BackendRuntime;
    if (this.attempt === 0 && req.hasBody) {
      const t = rt.config.performance.timeouts;
      this.body = req.body.pipe(new BodyGuard(rt.config.performance.body.max_request_body_bytes, { idleMs: t.client_body_idle_ms, totalMs: t.client_body_total_ms, minBytesPerSec: rt.config.performance.body.client_body_min_bytes_per_s }));
    }
    if (this.attempt > 0) {
      const m = rt.deps.metrics;
      m.counter('svc_retries_total').inc();
      m.counter('svc_retry_attempts_total').inc({ reason: this.result?.reason ?? 'unknown' });
    }
    const options: ForwardOptions = {
      pool: rt.deps.pools.get(b.pool),
      method: req.method,
      path: req.path,
      headers: upstreamRequestHeaders(req.headers, req, upstreamHost(u, b, req.authority ?? req.host), req.upgrade),
      body: this.body,
      headersTimeout: u.timeouts.requestMs,
      bodyTimeout: u.timeouts.bodyIdleMs,
      bodyTotalMs: u.timeouts.bodyTotalMs,
      sendIdleMs: rt.config.performance.timeouts.client_send_idle_ms,
      backendProtocol: b.scheme === 'https' ? '2' : '1.1',
      servername: b.scheme === 'https' ? (b.pool.tls?.serverName ?? b.host) : undefined,
    };
    // From here on `attemptDone` is called exactly once, and it ends the backend's slot.
    this.t0 = performance.now();
    startAttempt(res, options, this);
    return STOP;
  }

  /** The attempt in flight ended (called by the attempt, possibly inside undici's callbacks). */
  attemptDone(result: ForwardResult): void {
    try {
      const u = this.u as UpstreamRuntime;
      const b = this.backend as BackendRuntime;
      this.ended = performance.now();
      this.result = result;
      this.attempt++;
      this.attemptRecorded(result, this.t0, this.ended);
      if (result.outcome === 'success') this.rt.deps.stats.observe(b.key, this.ended - this.t0, this.ended);
      if (!result.responseStarted && result.error?.retryable === true && this.attempt < this.attempts) {
        // The next attempt starts on a later turn, outside the failed attempt's undici callbacks.
        queueMicrotask(() => this.resumeAt(u.phases.afterSelect - 1));
        return;
      }
      this.respond();
    } catch (err) {
      this.defect(err);
    }
    this.finish();
  }

  /** Answers what the attempts left unanswered, and records the upstream outcome. */
  respond(): PhaseResult {
    const { req, res, result } = this;
    const u = this.u as UpstreamRuntime;
    if (result === undefined) return NEXT;
    // An HTTP/1.1 client cut for a slow body may still be sending it: close the connection rather
    // than read the rest (RFC 9110 §15.5.9).
    const err = result.error;
    if (!result.responseStarted && result.status !== undefined && err !== undefined) {
      sendError(res, req.method, result.status, (result.reason ?? err.detail).replace(/_/g, ' '), result.status === 408 && req.protocol === '1.1' ? { connection: 'close' } : {}, err.code);
      if (err.source === 'upstream' || err.source === 'internal') this.logFailure(result.status, err.code, this.ended);
    }
    if (err !== undefined) this.count(err);
    const outcome = result.outcome;
    this.rm.upstream(u, statusClass(result.status), outcome).inc();
    const elapsed = this.ended - this.started;
    this.rm.latency(u, outcome).observe(elapsed);
    if (outcome === 'success') this.rt.deps.routeLatency.observe(u.name, elapsed, this.ended);
    this.failed = outcome !== 'success' || (result.status ?? 500) >= 500;
    return NEXT;
  }

  protected answerDefect(): void {
    answerDefect(this.res, this.req.method);
  }

  protected done(): void {
    this.runtimes?.release(this.rt);
    this.onDone?.();
  }
}
