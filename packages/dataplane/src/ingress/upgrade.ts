// HTTP/1.1 Upgrade (WebSocket) pass-through on the bootstrap ingress (RFC 9110 §7.8, RFC 6455 §4).
// The request runs the same phases as any request (proxy/pipeline.ts: protocol policy, route,
// brownout, admission with its route queue, selection with health, per-backend in-flight limit,
// breaker and the pool's hash key) on an `UpgradeExchange`, which differs in `forward`: a raw connection to the backend carries the upgrade request and node's HTTP client parses
// the backend's answer (head bounded by `UPGRADE_RESPONSE_HEAD_MAX`, within the pool's
// `backend_request_ms`). Only WebSocket may be switched to (`UPGRADE_PROTOCOLS`): the backend is
// offered the client's WebSocket token alone, and only a `101` whose `Upgrade` names it splices
// the two sockets. (An Upgrade offering nothing allowed, `h2c` above all, never comes here: the
// bootstrap ingress serves it as a plain request without its Upgrade, see `acceptsUpgrade`.) Any other answer is relayed as one response with `Connection: close`, and the
// client connection ends there: a byte the client sends after the upgrade request never reaches
// the backend unless the backend switched protocols (else a second request on the same connection
// would reach it raw, past policy, routing and the forwarding headers). The request holds its
// in-flight slots and its runtime until the backend has answered the upgrade; an established
// tunnel holds neither (it uses no pool, and a WebSocket may live for hours: counting it would let
// long-lived tunnels starve requests of in-flight slots).
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { Runtime, UpstreamRuntime, BackendRuntime } from '../runtime/provision.ts';
import type { DownstreamRequest } from '../proxy/handler.ts';
import { NEXT, RequestContext, STOP, upstreamHost } from '../proxy/pipeline.ts';
import type { PhaseResult, RoutePhases } from '../proxy/pipeline.ts';
import { statusClass } from '../proxy/request-metrics.ts';
import { ERR, REASON_PHRASES } from '../errors.ts';
import type { RequestError } from '../errors.ts';
import { attemptOutcome } from '../proxy/forward.ts';
import type { ForwardResult } from '../proxy/forward.ts';
import type { AttemptSpan } from '@edge-proxy/telemetry';

/** Largest backend response head accepted on an upgrade exchange, bytes (node's default). */
export const UPGRADE_RESPONSE_HEAD_MAX = 16 * 1024;

function ignore(): void {}

/**
 * Answers on the raw socket and closes it. What the client sends meanwhile is read and dropped
 * (never forwarded; read so that the close does not reset the connection before the answer).
 */
function refuse(socket: Duplex, status: number, detail: string, extra: HeaderMap, code: string | undefined, requestId: string): number {
  socket.on('data', ignore);
  const body = `${status} ${REASON_PHRASES[status] ?? 'Error'}: ${detail}${code === undefined ? '' : ` (${code})`}\n`;
  const length = Buffer.byteLength(body);
  const head = Object.entries({ 'content-type': 'text/plain; charset=utf-8', 'content-length': String(length), 'cache-control': 'no-store', connection: 'close', 'x-request-id': requestId, ...extra })
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(', ') : (v as string)}\r\n`)
    .join('');
  if (socket.writable) {
    socket.end(`HTTP/1.1 ${status} ${REASON_PHRASES[status] ?? 'Error'}\r\n${head}\r\n${body}`);
    return length;
  }
  socket.destroy();
  return 0;
}

/** The header object for node's client: no undefined values (undici skips them, node throws). */
function definedHeaders(headers: HeaderMap): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined) out[k] = v;
  return out;
}

function connectBackend(b: BackendRuntime, timeoutMs: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    const t = b.pool.tls;
    const socket =
      b.scheme === 'https' && t !== undefined
        ? tls.connect({ host: b.host, port: b.port, ALPNProtocols: ['http/1.1'], rejectUnauthorized: t.verify, ...(t.serverName === undefined ? {} : { servername: t.serverName }), ...(t.ca === undefined ? {} : { ca: [...t.ca] }), ...(t.cert === undefined ? {} : { cert: t.cert, key: t.key }) })
        : net.connect({ host: b.host, port: b.port });
    const timer = setTimeout(() => socket.destroy(Object.assign(new Error('connect timeout'), { code: 'UND_ERR_CONNECT_TIMEOUT' })), timeoutMs);
    socket.once(b.scheme === 'https' ? 'secureConnect' : 'connect', () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/** Protocol tokens of an `Upgrade` value (RFC 9110 §7.8), lower case. */
function upgradeTokens(v: string | string[] | undefined): string[] {
  if (v === undefined) return [];
  return (Array.isArray(v) ? v.join(',') : v)
    .split(',')
    .map((x) => x.trim().toLowerCase())
    .filter((x) => x.length > 0);
}

/**
 * The protocols (RFC 9110 §7.8 `protocol-name`, lower case) an HTTP/1.1 Upgrade may switch to
 * through the proxy, on every route: WebSocket (RFC 6455). Not `h2c` above all (RFC 9113 §3.1
 * defines it for cleartext only, and once spliced the client speaks HTTP/2 straight to the
 * backend: every later request on the connection past policy, routing, the forwarding headers and
 * the access log), nor any other: a tunnel is opaque to everything the proxy enforces, so only a
 * protocol meant to be one is let through (docs/request-path.md, "Upgrade").
 */
export const UPGRADE_PROTOCOLS: ReadonlySet<string> = new Set(['websocket']);

/** Whether an `Upgrade` token (`name` or `name/version`, lower case) names a protocol of `UPGRADE_PROTOCOLS`. */
function allowedToken(token: string): boolean {
  const slash = token.indexOf('/');
  return UPGRADE_PROTOCOLS.has(slash === -1 ? token : token.slice(0, slash).trimEnd());
}

/** The tokens of an `Upgrade` value that may be switched to (lower case, in the client's order). */
export function allowedUpgradeTokens(v: string | string[] | undefined): string[] {
  return upgradeTokens(v).filter(allowedToken);
}

/**
 * Whether an HTTP/1.1 request node parsed as an upgrade is proxied as one: its `Upgrade` offers a
 * protocol of `UPGRADE_PROTOCOLS`. Any other is served as a plain request, its `Upgrade` and
 * `Connection` dropped as hop-by-hop fields (RFC 9110 §7.8: a server may ignore Upgrade).
 */
export function acceptsUpgrade(headers: Readonly<Record<string, string | string[] | undefined>>): boolean {
  return allowedUpgradeTokens(headers['upgrade']).length > 0;
}

/** `Connection` naming the `upgrade` option (RFC 9110 §7.6.1, §7.8), any case. */
const CONNECTION_UPGRADE = /(?:^|,)\s*upgrade\s*(?:,|$)/i;

/**
 * Whether an HTTP/1.1 request asked to upgrade (`Upgrade` with `Connection: upgrade`) and
 * `acceptsUpgrade` declined: it is served as a plain request and its connection closed after the
 * response. The client may already be speaking the protocol it asked for (an h2c client sends the
 * HTTP/2 preface), and node does not parse what followed a declined upgrade's head in the same
 * read: kept open, the connection would sit silent until its idle timeout.
 */
export function declinedUpgrade(headers: Readonly<Record<string, string | string[] | undefined>>): boolean {
  const connection = headers['connection'];
  if (headers['upgrade'] === undefined || connection === undefined) return false;
  return CONNECTION_UPGRADE.test(Array.isArray(connection) ? connection.join(',') : connection) && !acceptsUpgrade(headers);
}

/**
 * RFC 9110 §7.8: a 101 names, in `Upgrade`, the protocol(s) switched to, which must be among those
 * the client asked for; and here among `UPGRADE_PROTOCOLS` too (a lenient backend that switches
 * to whatever it is offered is not spliced into h2c).
 */
export function upgradeMatches(requested: string | string[] | undefined, answered: string | string[] | undefined): boolean {
  const asked = upgradeTokens(requested);
  const got = upgradeTokens(answered);
  return got.length > 0 && got.every((g) => asked.includes(g) && allowedToken(g));
}

/** Fields of a relayed non-101 answer that describe the backend connection, not the response. */
const RELAY_DROP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'proxy-connection', 'te', 'trailer']);

/** The head of `res` for the client, as the backend sent it (raw names), plus `extra` lines. */
function responseHead(res: IncomingMessage, keep: (name: string) => boolean, extra: string): string {
  let out = `HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ''}\r\n`;
  const raw = res.rawHeaders;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string;
    if (keep(name.toLowerCase())) out += `${name}: ${raw[i + 1] as string}\r\n`;
  }
  return `${out}${extra}\r\n`;
}

/** Proxies one upgrade request on `rt`; `release` gives the runtime back. Never throws; always ends or splices the client socket. */
export function proxyUpgrade(rt: Runtime, request: DownstreamRequest, client: Duplex, head: Buffer, release: () => void): void {
  new UpgradeExchange(rt, request, client, head, release).start();
}

/** One upgrade request: the shared phases, then a raw connection to the backend as `forward`. */
export class UpgradeExchange extends RequestContext {
  private readonly client: Duplex;
  private readonly head: Buffer;
  private readonly release: () => void;
  private t0 = 0;
  /** The attempt's client span (tracing on). */
  private attemptSpan: AttemptSpan | undefined;
  /** The client's `Upgrade` tokens that may be switched to: all the backend is offered. */
  private readonly offered: string;

  constructor(rt: Runtime, req: DownstreamRequest, client: Duplex, head: Buffer, release: () => void) {
    super(rt, req);
    this.client = client;
    this.head = head;
    this.release = release;
    this.offered = allowedUpgradeTokens(req.headers['upgrade']).join(', ');
  }

  start(): void {
    this.client.on('error', () => this.client.destroy());
    // Hold what the client sends next until the backend has answered (see `exchange`).
    this.client.pause();
    this.rm.requests.inc();
    // The ingress brings only upgrades `acceptsUpgrade` takes, and CONNECT, which the protocol
    // phase refuses; an upgrade offering nothing allowed is refused here, before any phase, should
    // one come all the same: never offered to a backend.
    if (this.offered === '' && this.req.method !== 'CONNECT') {
      this.reason = 'upgrade_protocol';
      this.fail(ERR.EDGE_REQUEST_UPGRADE_UNSUPPORTED, 'upgrade protocol not allowed');
      return;
    }
    this.run();
  }

  protected routePhases(u: UpstreamRuntime): RoutePhases {
    return u.upgradePhases;
  }

  protected options(): PhaseResult {
    return this.fail(ERR.EDGE_REQUEST_INVALID_TARGET, 'OPTIONS * cannot be upgraded');
  }

  protected answer(err: RequestError, detail: string | undefined, headers: HeaderMap | undefined): void {
    if (err.status === undefined) {
      this.client.destroy();
      return;
    }
    this.status = err.status;
    this.bytesOut = refuse(this.client, err.status, detail ?? err.detail, headers ?? {}, err.code, this.requestId);
    this.noteAnswered(err, err.status);
  }

  private readonly onAbandon = (): void => {
    this.abandonWait();
  };

  protected watchAbandon(on: boolean): void {
    if (on) this.client.on('close', this.onAbandon);
    else this.client.removeListener('close', this.onAbandon);
  }

  protected answerDefect(): void {
    this.status = 502;
    this.bytesOut = refuse(this.client, 502, 'internal proxy error', {}, ERR.EDGE_INTERNAL.code, this.requestId);
  }

  protected done(): void {
    this.release();
  }

  /** Phase `forward` of the upgrade path. */
  static forwardPhase(x: RequestContext): PhaseResult {
    return (x as UpgradeExchange).forward();
  }

  /** Phase `respond` of the upgrade path: the answer was relayed by `forward`'s exchange. */
  static respondPhase(): PhaseResult {
    return NEXT;
  }

  respond(): PhaseResult {
    return NEXT;
  }

  /** Connects to the backend `select` picked and sends the upgrade request on that connection. */
  forward(): PhaseResult {
    const b = this.backend as BackendRuntime;
    const u = this.u as UpstreamRuntime;
    this.t0 = performance.now();
    this.attempt = 1;
    connectBackend(b, u.timeouts.connectMs).then(
      (backend) => {
        try {
          if (this.client.destroyed) {
            backend.destroy();
            this.settled(undefined, ERR.EDGE_CLIENT_CLOSED);
            return;
          }
          const out = upstreamRequestHeaders(this.req.headers, this.req, upstreamHost(u, b, this.req.host), true, this.requestId, u.auth?.guarded);
          // RFC 9110 §7.6.1, §7.8: our own hop's Connection, and only the protocols that may be
          // switched to (`Upgrade: websocket, h2c` offers the backend `websocket`).
          out['upgrade'] = this.offered;
          out['connection'] = 'upgrade';
          this.attemptSpan = this.span?.startAttempt({ attempt: this.attempt, hedge: false, upstream: u.name, backend: b.id, host: b.host, port: b.port }, out);
          this.exchange(u, backend, out);
        } catch (err) {
          backend.destroy();
          this.defect(err);
          this.finish();
        }
      },
      (err: unknown) => {
        const timeout = (err as { code?: string }).code === 'UND_ERR_CONNECT_TIMEOUT';
        const e = timeout ? ERR.EDGE_UPSTREAM_CONNECT_TIMEOUT : ERR.EDGE_UPSTREAM_TRANSPORT;
        this.settled(e.status, e, 'backend unreachable');
      },
    );
    return STOP;
  }

  /**
   * The backend answered the upgrade (or failed to): health, breaker, adaptive sample and
   * metrics are recorded, an error is answered, and the request's slots and runtime are given
   * back (an established tunnel holds none).
   */
  private settled(status: number | undefined, error: RequestError | undefined, detail?: string): void {
    if (this.finished) return;
    try {
      const u = this.u as UpstreamRuntime;
      const now = performance.now();
      const health = error === undefined ? (status !== undefined && status >= 500 ? '5xx' : 'ok') : error.class === 'timeout' ? 'timeout' : error.class === 'transport' ? 'transport' : error.class === 'tls' ? 'tls' : undefined;
      const result: ForwardResult = { status, outcome: error === undefined ? 'success' : attemptOutcome(error), health, responseStarted: error === undefined, headersAt: error === undefined ? now : 0, ...(error === undefined ? {} : { error, reason: error.detail }) };
      this.attemptRecorded(result, this.t0, now);
      this.attemptSpan?.end({ status, outcome: result.outcome, reason: error === undefined ? undefined : error.code });
      if (error !== undefined) {
        this.fail(error, detail);
        return;
      }
      this.rm.upstream(u, statusClass(status), 'success').inc();
      this.status = status ?? 0;
      this.failed = (status ?? 500) >= 500;
    } catch (err) {
      this.defect(err);
    }
    this.finish();
  }

  /**
   * Sends the upgrade request on `backend` and acts on the answer: splice on a matching 101, relay
   * and close on anything else, 502/504 when there is no usable answer in time.
   */
  private exchange(u: UpstreamRuntime, backend: Duplex, headers: HeaderMap): void {
    const { client, head } = this;
    const requested = this.offered;
    // Until the backend has switched protocols, nothing the client sends is forwarded: it waits in
    // the paused socket, and is read and dropped once the answer is not a 101 (dropped rather than
    // left unread, so that closing the connection does not reset it before the client reads the
    // answer).
    let upstreamReq: http.ClientRequest;
    try {
      // No `agent`: with `createConnection` and no agent, node sends on the socket given (an agent,
      // even `agent: false`, would open its own connection).
      upstreamReq = http.request({ method: this.req.method, path: this.req.path, headers: definedHeaders(headers), setHost: false, maxHeaderSize: UPGRADE_RESPONSE_HEAD_MAX, createConnection: () => backend as net.Socket });
    } catch {
      // node refused to build the request (a field value it will not send): the request's fault.
      backend.destroy();
      this.settled(400, ERR.EDGE_REQUEST_INVALID);
      return;
    }
    let answered = false;
    const timer = setTimeout(() => upstreamReq.destroy(Object.assign(new Error('no answer to the upgrade request in time'), { code: 'UND_ERR_HEADERS_TIMEOUT' })), u.timeouts.requestMs);
    upstreamReq.on('error', (err: Error & { code?: string }) => {
      clearTimeout(timer);
      backend.destroy();
      if (answered) {
        client.destroy();
        return;
      }
      answered = true;
      if (client.destroyed) {
        this.settled(undefined, ERR.EDGE_CLIENT_CLOSED);
        return;
      }
      // A response node could not parse (over UPGRADE_RESPONSE_HEAD_MAX, malformed) or a socket
      // failure: the backend's.
      const timeout = err.code === 'UND_ERR_HEADERS_TIMEOUT';
      this.settled(timeout ? 504 : 502, timeout ? ERR.EDGE_UPSTREAM_HEADERS_TIMEOUT : ERR.EDGE_UPSTREAM_TRANSPORT, timeout ? 'backend did not answer the upgrade in time' : 'invalid answer from backend');
    });
    upstreamReq.on('upgrade', (res: IncomingMessage, socket: Duplex, upgradeHead: Buffer) => {
      clearTimeout(timer);
      answered = true;
      if (res.statusCode !== 101 || !upgradeMatches(requested, res.headers['upgrade'])) {
        socket.destroy();
        this.settled(502, ERR.EDGE_UPSTREAM_PROTOCOL);
        return;
      }
      this.settled(101, undefined);
      client.write(responseHead(res, () => true, ''));
      if (upgradeHead.length > 0) client.write(upgradeHead);
      if (head.length > 0) socket.write(head);
      // A tunnel ends as a whole: when either side ends, closes or fails, both are closed.
      const teardown = (): void => {
        client.destroy();
        socket.destroy();
      };
      for (const side of [client, socket]) {
        side.once('end', teardown);
        side.once('close', teardown);
        side.once('error', teardown);
      }
      socket.pipe(client);
      client.pipe(socket);
    });
    upstreamReq.on('response', (res: IncomingMessage) => {
      clearTimeout(timer);
      answered = true;
      const status = res.statusCode ?? 502;
      client.on('data', ignore);
      this.settled(status, undefined);
      // One response, then the connection is closed: with its length if the backend gave one,
      // else delimited by the close (RFC 9112 §6.3).
      client.write(responseHead(res, (n) => !RELAY_DROP.has(n), 'connection: close\r\n'));
      res.setTimeout(u.timeouts.bodyIdleMs, () => {
        res.destroy();
        client.destroy();
      });
      res.on('data', (chunk: Buffer) => {
        if (!client.write(chunk)) {
          res.pause();
          client.once('drain', () => res.resume());
        }
      });
      res.on('end', () => {
        backend.destroy();
        client.end();
      });
      res.on('error', () => {
        backend.destroy();
        client.destroy();
      });
    });
    client.once('close', () => {
      if (!answered) upstreamReq.destroy();
      else backend.destroy();
    });
    upstreamReq.end();
  }
}
