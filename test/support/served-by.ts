// Which backend answers, per protocol: the check every activation, rollback, reload and re-fork
// test makes after the control plane reports a generation. Each request goes on a fresh
// connection (a new TLS connection for HTTP/1.1, a new HTTP/2 session, a new QUIC connection for
// HTTP/3) so that the kernel spreads them over every worker's SO_REUSEPORT socket: a worker left
// on an older generation answers some of them. With two workers and 8 fresh connections per
// protocol, the chance that every one lands on the same worker is 2 × 2^-8 per protocol.
import https from 'node:https';
import http2 from 'node:http2';
import { Http3ClientSession } from '@edge-proxy/http3';

export type Protocol = 'h1' | 'h2' | 'h3';
export const PROTOCOLS: readonly Protocol[] = ['h1', 'h2', 'h3'];

export interface Target {
  readonly lport: number;
  readonly ca: Buffer;
  /** SNI and authority; `localhost` unless given. */
  readonly host?: string;
}

export interface ServedOptions {
  readonly path?: string;
  /** Requests per protocol, each on its own connection (default 8). */
  readonly perProtocol?: number;
  readonly protocols?: readonly Protocol[];
  /** Per request (default 10 s: generous, the machine may be loaded). */
  readonly timeoutMs?: number;
}

/** The answer as one string: the body on 200, else `status N: body` or `error: message`. */
function answer(status: number, body: string): string {
  return status === 200 ? body : `status ${status}: ${body.slice(0, 60)}`;
}

export function getH1(p: Target, path = '/', timeoutMs = 10_000): Promise<string> {
  const host = p.host ?? 'localhost';
  return new Promise((resolve) => {
    const req = https.get({ host: '127.0.0.1', port: p.lport, path, ca: p.ca, servername: host, headers: { host }, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve(answer(res.statusCode ?? 0, body)));
      res.on('error', (err) => resolve(`error: ${err.message}`));
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('timeout')));
    req.on('error', (err) => resolve(`error: ${err.message}`));
  });
}

export function getH2(p: Target, path = '/', timeoutMs = 10_000): Promise<string> {
  const host = p.host ?? 'localhost';
  return new Promise((resolve) => {
    let settled = false;
    const session = http2.connect(`https://${host}:${p.lport}`, { ca: p.ca, host: '127.0.0.1', servername: host } as http2.SecureClientSessionOptions);
    const done = (value: string): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.destroy();
      resolve(value);
    };
    const timer = setTimeout(() => done('error: timeout'), timeoutMs);
    session.on('error', (err) => done(`error: ${err.message}`));
    const req = session.request({ ':path': path, ':authority': host });
    let status = 0;
    let body = '';
    req.on('response', (h) => (status = Number(h[':status'])));
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => done(answer(status, body)));
    req.on('error', (err) => done(`error: ${err.message}`));
    req.end();
  });
}

export async function getH3(p: Target, path = '/', timeoutMs = 10_000): Promise<string> {
  const host = p.host ?? 'localhost';
  let session: Http3ClientSession | undefined;
  try {
    session = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: host, ca: p.ca, handshakeTimeoutMs: timeoutMs });
    const r = await session.fetch({ path, authority: host, timeoutMs });
    return answer(r.status, r.body.toString());
  } catch (err) {
    return `error: ${(err as Error).message}`;
  } finally {
    await session?.close(true).catch(() => undefined);
  }
}

const GET: Record<Protocol, (p: Target, path?: string, timeoutMs?: number) => Promise<string>> = { h1: getH1, h2: getH2, h3: getH3 };

/** Counts of each answer per protocol, e.g. `{ h1: { 'gen-b': 8 }, h2: { 'gen-b': 8 }, h3: { 'gen-b': 8 } }`. */
export async function servedBy(p: Target, o: ServedOptions = {}): Promise<Record<string, Record<string, number>>> {
  const n = o.perProtocol ?? 8;
  const out: Record<string, Record<string, number>> = {};
  for (const protocol of o.protocols ?? PROTOCOLS) {
    const tally: Record<string, number> = {};
    for (let i = 0; i < n; i++) {
      const a = await GET[protocol](p, o.path ?? '/', o.timeoutMs ?? 10_000);
      tally[a] = (tally[a] ?? 0) + 1;
    }
    out[protocol] = tally;
  }
  return out;
}

/** What `servedBy` returns when every request of every protocol was answered by `body`. */
export function allFrom(body: string, o: ServedOptions = {}): Record<string, Record<string, number>> {
  const n = o.perProtocol ?? 8;
  return Object.fromEntries((o.protocols ?? PROTOCOLS).map((protocol) => [protocol, { [body]: n }]));
}

/**
 * One request on a fresh QUIC connection, then how long the connection stays open while idle, in
 * ms (the client asks for 30 s, so the server's advertised `quic_idle_ms` decides: RFC 9000
 * §10.1). Rejects when it is still open after `limitMs`.
 */
export async function quicIdleClose(p: Target, limitMs = 8000): Promise<{ status: number; idleMs: number }> {
  const client = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: p.host ?? 'localhost', ca: p.ca.toString('utf8'), maxIdleTimeoutMs: 30_000 });
  let timer: NodeJS.Timeout | undefined;
  try {
    const { status } = await client.fetch({ path: '/' });
    const t0 = performance.now();
    const timeout = new Promise<never>((_r, reject) => {
      timer = setTimeout(() => reject(new Error(`still open after ${limitMs / 1000} s`)), limitMs);
    });
    await Promise.race([new Promise((resolve) => client.once('close', resolve)), timeout]);
    return { status, idleMs: performance.now() - t0 };
  } finally {
    clearTimeout(timer);
    await Promise.resolve(client.close(true)).catch(() => undefined);
  }
}
