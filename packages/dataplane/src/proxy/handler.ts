// The request path, one ordered list of phases (docs/request-path.md):
//   admit → protocol policy → route → select → forward (failover once) → respond → record.
// Both ingresses call `handleRequest` with the runtime they read at admission; the request finishes
// on that runtime even if a new generation is activated meanwhile.
import type { Readable } from 'node:stream';
import { checkProtocolPolicy } from '../policy/protocol-policy.ts';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import { forward } from './forward.ts';
import type { DownstreamResponse, ForwardResult } from './forward.ts';
import { BodyGuard } from './body-guard.ts';
import { requestMetrics } from './request-metrics.ts';
import type { BackendRuntime, Runtime, UpstreamRuntime } from '../runtime/provision.ts';
import type { RouteResult } from '../routing/router.ts';
import type { BackendRef } from '../balancing/selector.ts';
import type { Logger } from '@edge-proxy/telemetry';

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

/** Field count and name + value bytes of a header section given as flat `rawHeaders` (name, value, ...). */
export function headerStats(raw: readonly string[]): { count: number; bytes: number } {
  let bytes = 0;
  for (const s of raw) bytes += s.length;
  return { count: raw.length / 2, bytes };
}

/** The IPv4 address of an IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`); any other address as it is. */
export function unmapIpv4(address: string): string {
  return address.startsWith('::ffff:') ? address.slice(7) : address;
}

/**
 * Admits `req` on the runtime active now, handles it there and releases the runtime when the
 * response is done (phase 1, "admit", for every ingress). A defect answers 502 rather than leave
 * the client hanging. Never rejects: an ingress may drop the promise.
 */
export function serveRequest(runtimes: RuntimeSource, req: DownstreamRequest, res: DownstreamResponse): Promise<void> {
  let rt: Runtime;
  try {
    rt = runtimes.acquire();
  } catch {
    answerDefect(res, req.method);
    return DONE;
  }
  return handleRequest(rt, req, res, runtimes);
}

const DONE = Promise.resolve();

/** 502 for a defect of ours; if even that cannot be sent, the connection is cut. */
function answerDefect(res: DownstreamResponse, method: string): void {
  try {
    sendError(res, method, 502, 'internal proxy error');
  } catch {
    res.destroy();
  }
}

/** HTTP status class label (SPEC label values). */
export function statusClass(status: number | undefined): string {
  if (status === undefined) return 'unknown';
  if (status >= 100 && status < 600) return STATUS_CLASSES[Math.floor(status / 100) - 1] as string;
  return 'other';
}

/** Label values by hundreds (constant strings: no string built per request). */
const STATUS_CLASSES = ['1xx', '2xx', '3xx', '4xx', '5xx'];

const REASON_TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 408: 'Request Timeout', 413: 'Content Too Large', 421: 'Misdirected Request', 425: 'Too Early', 431: 'Request Header Fields Too Large', 501: 'Not Implemented', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/** Answers with a short plain-text error; never includes request data. */
export function sendError(res: DownstreamResponse, method: string, status: number, detail: string, headers: HeaderMap = {}): void {
  if (res.headersSent || res.destroyed) return;
  const body = `${status} ${REASON_TEXT[status] ?? 'Error'}: ${detail}\n`;
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), 'cache-control': 'no-store', ...headers });
  res.end(method === 'HEAD' ? undefined : body);
}

/** `upstreamRequestHeaders` options, one object each rather than one per request. */
const KEEP_UPGRADE = { upgrade: true } as const;
const KEEP_NONE = {} as const;

/** Failures after which another backend may be tried: nothing reached the backend's application. */
const FAILOVER_REASONS = new Set(['transport', 'tls', 'connect_timeout']);

/**
 * The pick context of one runtime, reused by every pick on it (a pick is synchronous): the
 * eligibility check is built once per runtime, and the per-request fields are overwritten.
 */
interface PickScratch {
  readonly eligible: (b: BackendRef) => boolean;
  exclude: ReadonlySet<string> | undefined;
  hashKey: string | undefined;
  affinityKey: string | undefined;
}

const PICK_SCRATCH = new WeakMap<Runtime, PickScratch>();

function pickScratch(rt: Runtime): PickScratch {
  let s = PICK_SCRATCH.get(rt);
  if (s === undefined) {
    const limit = rt.config.performance.per_backend_inflight_limit;
    const { health, stats } = rt.deps;
    s = { eligible: (b) => health.eligible(b.key) && stats.inflight(b.key) < limit, exclude: undefined, hashKey: undefined, affinityKey: undefined };
    PICK_SCRATCH.set(rt, s);
  }
  return s;
}

function pickBackend(rt: Runtime, u: UpstreamRuntime, req: DownstreamRequest, exclude: ReadonlySet<string> | undefined): BackendRuntime | undefined {
  const ctx = pickScratch(rt);
  ctx.exclude = exclude;
  ctx.hashKey = u.hashKey?.({ clientIp: req.remoteAddress, host: req.authority ?? req.host ?? '', path: req.path, route: u.name, header: (n) => firstValue(req.headers[n]) });
  ctx.affinityKey = req.affinityKey;
  return u.selector.pick(ctx) as BackendRuntime | undefined;
}

function firstValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

function upstreamHost(u: UpstreamRuntime, req: DownstreamRequest, b: BackendRuntime): string | undefined {
  const hp = u.config.host_policy;
  if (hp.mode === 'rewrite') return hp.host;
  if (hp.mode === 'backend') return b.port === (b.scheme === 'https' ? 443 : 80) ? b.host : `${b.host}:${b.port}`;
  return req.authority ?? req.host;
}

/**
 * One route-decision log line (`observability.routing`): what was asked (method, host, path
 * without the query string, which may carry credentials) and what was decided.
 */
function logRouteDecision(log: Logger, req: DownstreamRequest, route: RouteResult, includeReason: boolean, generation: number): void {
  const q = req.path.indexOf('?');
  log.info(
    {
      generation,
      method: req.method,
      host: req.authority ?? req.host ?? null,
      path: q === -1 ? req.path : req.path.slice(0, q),
      protocol: req.protocol,
      decision: route.kind,
      route: route.kind === 'match' ? route.upstream : null,
      ...(includeReason && route.kind === 'match' ? { reason: route.reason } : {}),
    },
    'route decision',
  );
}

/**
 * Handles one request on runtime `rt`, then gives `rt` back to `runtimes` if given. Never rejects
 * (so the ingresses need no `.catch` of their own).
 */
export async function handleRequest(rt: Runtime, req: DownstreamRequest, res: DownstreamResponse, runtimes?: RuntimeSource): Promise<void> {
  const m = rt.deps.metrics;
  const rm = requestMetrics(m);
  const started = performance.now();
  rm.requests.inc();
  let failed = true;
  try {
    const verdict = checkProtocolPolicy(rt.protocol, req);
    if (!verdict.ok) {
      m.counter(verdict.reason.startsWith('header') || verdict.reason === 'authority_host_mismatch' || verdict.reason === 'connect_target' || verdict.reason === 'upgrade_not_supported' ? 'svc_request_validation_rejects' : 'svc_policy_denied').inc();
      if (verdict.status === 425) m.counter('svc_early_data_rejected').inc();
      sendError(res, req.method, verdict.status, verdict.reason.replace(/_/g, ' '), verdict.allow === undefined ? {} : { allow: verdict.allow.join(', ') });
      return;
    }
    if (req.earlyData) m.counter('svc_early_data_accepted').inc();
    const route = rt.router.resolve(req.authority ?? req.host, req.path, req.method);
    const routing = rt.config.observability.routing;
    if (routing.enabled && rt.deps.log !== undefined) logRouteDecision(rt.deps.log, req, route, routing.include_reason, rt.generation);
    if (route.kind !== 'match') {
      if (route.kind === 'method_not_allowed') sendError(res, req.method, 405, 'no route accepts this method', { allow: route.allowed.join(', ') });
      else sendError(res, req.method, 404, 'no route matches this host and path');
      return;
    }
    const u = rt.upstreams.get(route.upstream) as UpstreamRuntime;
    const maxBody = rt.config.performance.body.max_request_body_bytes;
    const declared = Number(firstValue(req.headers['content-length']) ?? NaN);
    if (maxBody > 0 && declared > maxBody) {
      m.counter('svc_request_buffer_limit_rejects').inc();
      sendError(res, req.method, 413, 'request body larger than the limit', { connection: 'close' });
      return;
    }
    const body = req.hasBody ? req.body.pipe(new BodyGuard(maxBody, rt.config.performance.timeouts.client_body_idle_ms)) : null;
    // Backends tried by this request; built only if there is a second attempt.
    let tried: Set<string> | undefined;
    const attempts = req.hasBody ? 1 : Math.min(2, u.backends.length);
    let result: ForwardResult | undefined;
    // When the last attempt ended (also the end of the request: what follows is bookkeeping).
    let finished = started;
    let wallNow: number | undefined;
    for (let attempt = 0; attempt < attempts; attempt++) {
      const b = pickBackend(rt, u, req, tried);
      if (b === undefined) break;
      if (attempt + 1 < attempts) (tried ??= new Set()).add(b.key);
      if (attempt > 0) {
        m.counter('svc_retries_total').inc();
        m.counter('svc_retry_attempts_total').inc({ reason: result?.reason ?? 'unknown' });
      }
      const token = rt.deps.stats.begin(b.key);
      const t0 = performance.now();
      result = await forward(res, {
        pool: rt.deps.pools.get(b.pool),
        method: req.method,
        path: req.path,
        headers: upstreamRequestHeaders(req.headers, { ip: req.remoteAddress, host: req.authority ?? req.host, protocol: req.protocol }, upstreamHost(u, req, b), req.upgrade ? KEEP_UPGRADE : KEEP_NONE),
        body,
        headersTimeout: u.timeouts.requestMs,
        bodyTimeout: u.timeouts.bodyIdleMs,
        bodyTotalMs: u.timeouts.bodyTotalMs,
        backendProtocol: b.scheme === 'https' ? '2' : '1.1',
        servername: b.scheme === 'https' ? (b.pool.tls?.serverName ?? b.host) : undefined,
      });
      rt.deps.stats.end(token);
      finished = performance.now();
      if (result.health !== undefined) rt.deps.health.passive(b.key, result.health);
      if (result.outcome === 'success') rt.deps.stats.observe(b.key, finished - t0, (wallNow ??= Date.now()));
      if (result.outcome === 'timeout') m.counter('svc_backend_timeouts').inc();
      if (result.outcome === 'backend_error') m.counter('svc_backend_errors').inc();
      rm.backend(u, b, statusClass(result.status), result.outcome).inc();
      if (result.responseStarted || !FAILOVER_REASONS.has(result.reason ?? '')) break;
    }
    if (result === undefined) {
      sendError(res, req.method, 503, `no healthy backend for route ${u.name}`, { 'retry-after': '1' });
      rm.upstream(u, '5xx', 'backend_error').inc();
      return;
    }
    if (!result.responseStarted && result.status !== undefined) sendError(res, req.method, result.status, (result.reason ?? 'upstream failure').replace(/_/g, ' '));
    if (result.reason === 'request_too_large') m.counter('svc_request_buffer_limit_rejects').inc();
    const outcome = result.outcome;
    rm.upstream(u, statusClass(result.status), outcome).inc();
    const elapsed = finished - started;
    rm.latency(u, outcome).observe(elapsed);
    if (outcome === 'success') rt.deps.routeLatency.observe(u.name, elapsed, (wallNow ??= Date.now()));
    failed = outcome !== 'success' || (result.status ?? 500) >= 500;
  } catch (err) {
    // A defect in our code: answer 502 rather than leave the client hanging, and report it (the
    // supervisor counts these as svc_runtime_panics).
    rt.deps.onPanic?.(err);
    answerDefect(res, req.method);
  } finally {
    (failed ? rm.failure : rm.success).inc();
    runtimes?.release(rt);
  }
}
