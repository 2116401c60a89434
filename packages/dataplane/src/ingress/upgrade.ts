// HTTP/1.1 Upgrade (WebSocket) pass-through on the bootstrap ingress (RFC 9110 §7.8, RFC 6455 §4).
// The request goes through the same policy, routing and selection as any request; then a raw
// connection to the backend carries the upgrade request, and the two sockets are spliced. The
// backend's answer (101, or an error response) reaches the client unchanged. The tunnel does not
// hold the generation: it uses no pool, so the runtime is released once the backend is connected.
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import { checkProtocolPolicy } from '../policy/protocol-policy.ts';
import { upstreamRequestHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { Runtime, UpstreamRuntime, BackendRuntime } from '../runtime/provision.ts';
import { unmapIpv4 } from '../proxy/handler.ts';

const TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed', 431: 'Request Header Fields Too Large', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/** Answers on the raw socket and closes it. */
function refuse(socket: Duplex, status: number, detail: string, extra: Record<string, string> = {}): void {
  const body = `${status} ${TEXT[status] ?? 'Error'}: ${detail}\n`;
  const head = Object.entries({ 'content-type': 'text/plain; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), connection: 'close', ...extra })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('');
  if (socket.writable) socket.end(`HTTP/1.1 ${status} ${TEXT[status] ?? 'Error'}\r\n${head}\r\n${body}`);
  else socket.destroy();
}

function serializeHeaders(headers: HeaderMap): string {
  let out = '';
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined) continue;
    for (const value of Array.isArray(v) ? v : [v]) {
      // Header values from a parsed request cannot hold CR/LF; guard anyway against request splitting.
      if (/[\r\n]/.test(value) || /[\r\n:]/.test(k)) continue;
      out += `${k}: ${value}\r\n`;
    }
  }
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

/** Proxies one upgrade request. Never throws; always ends or splices the client socket. */
export async function proxyUpgrade(rt: Runtime, req: IncomingMessage, client: Duplex, head: Buffer, release: () => void): Promise<void> {
  const m = rt.deps.metrics;
  client.on('error', () => client.destroy());
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
    const policy = checkProtocolPolicy(rt.protocol, {
      method: req.method ?? 'GET',
      path: req.url ?? '/',
      authority: headers['host'] as string | undefined,
      host: headers['host'] as string | undefined,
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
    const route = rt.router.resolve(headers['host'] as string | undefined, req.url ?? '/', req.method ?? 'GET');
    if (route.kind !== 'match') {
      refuse(client, route.kind === 'not_found' ? 404 : 405, 'no route', route.kind === 'method_not_allowed' ? { allow: route.allowed.join(', ') } : {});
      return;
    }
    const u = rt.upstreams.get(route.upstream) as UpstreamRuntime;
    const b = u.selector.pick({ eligible: (x) => rt.deps.health.eligible(x.key), affinityKey: `${req.socket.remoteAddress ?? ''}:${req.socket.remotePort ?? 0}` }) as BackendRuntime | undefined;
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
    const host = u.config.host_policy.mode === 'rewrite' ? u.config.host_policy.host : (headers['host'] as string | undefined);
    const out = upstreamRequestHeaders(headers, { remoteAddress: unmapIpv4(req.socket.remoteAddress ?? ''), authority: undefined, host: headers['host'] as string | undefined, protocol: '1.1' }, host, true);
    backend.write(`${req.method ?? 'GET'} ${req.url ?? '/'} HTTP/1.1\r\n${serializeHeaders(out)}\r\n`);
    if (head.length > 0) backend.write(head);
    m.counter('svc_backend_requests_total').inc({ upstream: u.name, backend: b.id, status_class: 'unknown', outcome: 'success' });
    m.counter('svc_upstream_requests_total').inc({ upstream: u.name, status_class: 'unknown', outcome: 'success' });
    // A tunnel ends as a whole: when either side ends, closes or fails, both are closed.
    const teardown = (): void => {
      client.destroy();
      backend.destroy();
    };
    for (const side of [client, backend]) {
      side.once('end', teardown);
      side.once('close', teardown);
      side.once('error', teardown);
    }
    backend.pipe(client);
    client.pipe(backend);
  } catch {
    refuse(client, 502, 'internal proxy error');
  } finally {
    done();
  }
}
