// HTTP/1.1 Upgrade (WebSocket) pass-through on the bootstrap ingress (RFC 9110 §7.8, RFC 6455 §4).
// The request goes through the same validation, policy, routing and selection as any request;
// then a raw connection to the backend carries the upgrade request and node's HTTP client parses
// the backend's answer (head bounded by `UPGRADE_RESPONSE_HEAD_MAX`, within the pool's
// `backend_request_ms`). Only a `101` whose `Upgrade` names a protocol the client asked for splices
// the two sockets. Any other answer is relayed as one response with `Connection: close`, and the
// client connection ends there: a byte the client sends after the upgrade request never reaches
// the backend unless the backend switched protocols (else a second request on the same connection
// would reach it raw, past policy, routing and the forwarding headers). The tunnel does not hold
// the generation: it uses no pool, so the runtime is released once the backend is connected.
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import { checkProtocolPolicy } from '../policy/protocol-policy.ts';
import { validateRequest } from '../policy/request-validation.ts';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { Runtime, UpstreamRuntime, BackendRuntime } from '../runtime/provision.ts';
import { hostFieldCount, requestHashKey, statusClass, unmapIpv4, upstreamHost } from '../proxy/handler.ts';

/** Largest backend response head accepted on an upgrade exchange, bytes (node's default). */
export const UPGRADE_RESPONSE_HEAD_MAX = 16 * 1024;

const TEXT: Record<number, string> = { 200: 'OK', 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 431: 'Request Header Fields Too Large', 501: 'Not Implemented', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

function ignore(): void {}

/**
 * Answers on the raw socket and closes it. What the client sends meanwhile is read and dropped
 * (never forwarded; read so that the close does not reset the connection before the answer).
 */
function refuse(socket: Duplex, status: number, detail: string, extra: Record<string, string> = {}): void {
  socket.on('data', ignore);
  const body = `${status} ${TEXT[status] ?? 'Error'}: ${detail}\n`;
  const head = Object.entries({ 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), connection: 'close', ...extra })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('');
  if (socket.writable) socket.end(`HTTP/1.1 ${status} ${TEXT[status] ?? 'Error'}\r\n${head}\r\n${body}`);
  else socket.destroy();
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
 * RFC 9110 §7.8: a 101 names, in `Upgrade`, the protocol(s) switched to, which must be among those
 * the client asked for.
 */
export function upgradeMatches(requested: string | string[] | undefined, answered: string | string[] | undefined): boolean {
  const asked = upgradeTokens(requested);
  const got = upgradeTokens(answered);
  return got.length > 0 && got.every((g) => asked.includes(g));
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

/** Proxies one upgrade request. Never throws; always ends or splices the client socket. */
export async function proxyUpgrade(rt: Runtime, req: IncomingMessage, client: Duplex, head: Buffer, release: () => void): Promise<void> {
  const m = rt.deps.metrics;
  client.on('error', () => client.destroy());
  // Hold what the client sends next until the backend has answered (see `exchange`).
  client.pause();
  m.counter('svc_requests_total').inc();
  let released = false;
  const done = (): void => {
    if (!released) {
      released = true;
      release();
    }
  };
  try {
    const headers = req.headers as HeaderMap;
    const raw = req.rawHeaders;
    let path = req.url ?? '/';
    let host = headers['host'] as string | undefined;
    const method = req.method ?? 'GET';
    const valid = validateRequest({ method, path, authority: host, host, headers, protocol: '1.1', duplicateHost: hostFieldCount(raw) > 1 }, rt.protocol.allowed_methods);
    if (valid.kind === 'reject') {
      m.counter('svc_request_validation_rejects').inc();
      refuse(client, valid.status, valid.reason.replace(/_/g, ' '));
      return;
    }
    if (valid.kind === 'options') {
      refuse(client, 400, 'OPTIONS * cannot be upgraded');
      return;
    }
    if (valid.kind === 'rewrite') {
      path = valid.path;
      host = valid.host;
    }
    const policy = checkProtocolPolicy(rt.protocol, {
      method,
      path,
      authority: host,
      host,
      headerCount: raw.length / 2,
      headerBytes: raw.reduce((s, x) => s + x.length, 0),
      upgrade: true,
      ingress: 'bootstrap-h1',
      earlyData: false,
    });
    if (!policy.ok) {
      m.counter('svc_policy_denied').inc();
      refuse(client, policy.status, policy.reason.replace(/_/g, ' '));
      return;
    }
    const route = rt.router.resolve(host, path, method);
    if (route.kind !== 'match') {
      refuse(client, route.kind === 'not_found' ? 404 : 405, 'no route', route.kind === 'method_not_allowed' ? { allow: route.allowed.join(', ') } : {});
      return;
    }
    const u = rt.upstreams.get(route.upstream) as UpstreamRuntime;
    // The pool's hash key as the normal path computes it: without it, a consistent-hash pool sent
    // every upgrade to the backend of the empty key.
    const hashKey = requestHashKey(u, unmapIpv4(req.socket.remoteAddress ?? ''), host ?? '', path, headers);
    const b = u.selector.pick({ eligible: (x) => rt.deps.health.eligible(x.key), ...(hashKey === undefined ? {} : { hashKey }), affinityKey: `${req.socket.remoteAddress ?? ''}:${req.socket.remotePort ?? 0}` }) as BackendRuntime | undefined;
    if (b === undefined) {
      refuse(client, 503, `no healthy backend for route ${u.name}`);
      return;
    }
    let backend: Duplex;
    try {
      backend = await connectBackend(b, u.timeouts.connectMs);
    } catch (err) {
      const timeout = (err as { code?: string }).code === 'UND_ERR_CONNECT_TIMEOUT';
      rt.deps.health.passive(b.key, timeout ? 'timeout' : 'transport');
      m.counter('svc_backend_requests_total').inc({ upstream: u.name, backend: b.id, status_class: '5xx', outcome: timeout ? 'timeout' : 'backend_error' });
      refuse(client, timeout ? 504 : 502, 'backend unreachable');
      return;
    }
    done();
    const out = upstreamRequestHeaders(headers, { remoteAddress: unmapIpv4(req.socket.remoteAddress ?? ''), authority: undefined, host, protocol: '1.1' }, upstreamHost(u, b, host), true);
    exchange(rt, u, b, client, backend, head, method, path, out, headers['upgrade']);
  } catch {
    refuse(client, 502, 'internal proxy error');
  } finally {
    done();
  }
}

/**
 * Sends the upgrade request on `backend` and acts on the answer: splice on a matching 101, relay
 * and close on anything else, 502/504 when there is no usable answer in time.
 */
function exchange(rt: Runtime, u: UpstreamRuntime, b: BackendRuntime, client: Duplex, backend: Duplex, head: Buffer, method: string, path: string, headers: HeaderMap, requested: string | string[] | undefined): void {
  const m = rt.deps.metrics;
  const record = (status: number | undefined, outcome: 'success' | 'timeout' | 'backend_error' | 'failure'): void => {
    m.counter('svc_backend_requests_total').inc({ upstream: u.name, backend: b.id, status_class: statusClass(status), outcome });
    m.counter('svc_upstream_requests_total').inc({ upstream: u.name, status_class: statusClass(status), outcome });
  };
  // Until the backend has switched protocols, nothing the client sends is forwarded: it waits in
  // the paused socket, and is read and dropped once the answer is not a 101 (dropped rather than
  // left unread, so that closing the connection does not reset it before the client reads the
  // answer).
  let upstreamReq: http.ClientRequest;
  try {
    // No `agent`: with `createConnection` and no agent, node sends on the socket given (an agent,
    // even `agent: false`, would open its own connection).
    upstreamReq = http.request({ method, path, headers: definedHeaders(headers), setHost: false, maxHeaderSize: UPGRADE_RESPONSE_HEAD_MAX, createConnection: () => backend as net.Socket });
  } catch {
    // node refused to build the request (a field value it will not send): the request's fault.
    backend.destroy();
    record(400, 'failure');
    refuse(client, 400, 'invalid request');
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
    const timeout = err.code === 'UND_ERR_HEADERS_TIMEOUT';
    // A response node could not parse (over UPGRADE_RESPONSE_HEAD_MAX, malformed) or a socket
    // failure: the backend's.
    rt.deps.health.passive(b.key, timeout ? 'timeout' : 'transport');
    record(timeout ? 504 : 502, timeout ? 'timeout' : 'backend_error');
    refuse(client, timeout ? 504 : 502, timeout ? 'backend did not answer the upgrade in time' : 'invalid answer from backend');
  });
  upstreamReq.on('upgrade', (res: IncomingMessage, socket: Duplex, upgradeHead: Buffer) => {
    clearTimeout(timer);
    answered = true;
    if (res.statusCode !== 101 || !upgradeMatches(requested, res.headers['upgrade'])) {
      socket.destroy();
      rt.deps.health.passive(b.key, 'transport');
      record(502, 'backend_error');
      refuse(client, 502, 'backend switched to a protocol the client did not ask for');
      return;
    }
    rt.deps.health.passive(b.key, 'ok');
    record(101, 'success');
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
    rt.deps.health.passive(b.key, status >= 500 ? '5xx' : 'ok');
    record(status, 'success');
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
