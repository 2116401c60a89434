// One GET of a JWKS document: a fresh connection (node:http / node:https, no agent: fetches are
// minutes apart), one deadline over the whole fetch, the body capped, redirects not followed.
// The outcome is a value, never a throw; the URL appears in neither the outcome nor an error.
import http from 'node:http';
import https from 'node:https';
import type { ClientRequest, IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { JwksFailureReason } from './types.ts';

/** Largest JWKS document read (bytes); a larger one is `too_large`. */
export const JWKS_MAX_BODY_BYTES = 1024 * 1024;

/** Why a fetch failed before a document was read. */
export type FetchFailure = Extract<JwksFailureReason, 'timeout' | 'connect_error' | 'tls_error' | 'http_status' | 'too_large'>;

export type FetchResult =
  | { readonly kind: 'body'; readonly body: Buffer }
  | { readonly kind: 'failure'; readonly reason: FetchFailure }
  /** `signal` aborted it (the source was removed): not an attempt that counts. */
  | { readonly kind: 'aborted' };

export interface FetchOptions {
  /** Deadline (ms) for the whole fetch: lookup, connect, TLS, headers and body. */
  readonly timeoutMs: number;
  /** Trust for https (PEM); absent or empty: the system's CAs. */
  readonly caPems?: readonly string[];
  readonly signal: AbortSignal;
  /** Body cap (bytes); default `JWKS_MAX_BODY_BYTES`. */
  readonly maxBytes?: number;
}

/**
 * GETs `url` with `accept: application/json`. Failure kinds are told apart by how far the
 * connection got, not by error codes: an error before the TCP connection is up is
 * `connect_error`; between TCP and the end of the TLS handshake (an untrusted or mismatched
 * certificate, a handshake failure) `tls_error`; after it (reset, not HTTP) `connect_error`.
 * The deadline wins over all of them. Any status outside 2xx, 3xx included, is `http_status`.
 */
export function fetchJwks(url: string, o: FetchOptions): Promise<FetchResult> {
  const maxBytes = o.maxBytes ?? JWKS_MAX_BODY_BYTES;
  return new Promise((resolve) => {
    if (o.signal.aborted) return resolve({ kind: 'aborted' });
    let target: URL;
    try {
      target = new URL(url);
    } catch {
      return resolve({ kind: 'failure', reason: 'connect_error' });
    }
    const secure = target.protocol === 'https:';
    if (!secure && target.protocol !== 'http:') return resolve({ kind: 'failure', reason: 'connect_error' });

    let tcpUp = false;
    let tlsUp = false;
    let settled = false;
    let req: ClientRequest | undefined;
    const finish = (r: FetchResult): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
      req?.destroy();
      resolve(r);
    };
    const fail = (reason: FetchFailure): void => finish({ kind: 'failure', reason });
    const onAbort = (): void => finish({ kind: 'aborted' });
    const timer = setTimeout(() => fail('timeout'), o.timeoutMs);
    timer.unref();
    o.signal.addEventListener('abort', onAbort, { once: true });

    const options: https.RequestOptions = { method: 'GET', agent: false, headers: { accept: 'application/json', 'user-agent': 'edge-proxy-jwks/1' } };
    if (secure && o.caPems !== undefined && o.caPems.length > 0) options.ca = [...o.caPems];
    try {
      req = (secure ? https : http).request(target, options);
    } catch {
      return fail('connect_error');
    }
    req.on('socket', (socket: Socket) => {
      socket.once('connect', () => (tcpUp = true));
      socket.once('secureConnect', () => (tlsUp = true));
    });
    req.on('error', () => fail(!tcpUp ? 'connect_error' : secure && !tlsUp ? 'tls_error' : 'connect_error'));
    req.on('response', (res: IncomingMessage) => {
      const status = res.statusCode ?? 0;
      if (status < 200 || status > 299) return fail('http_status');
      if (Number(res.headers['content-length'] ?? 0) > maxBytes) return fail('too_large');
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > maxBytes) return fail('too_large');
        chunks.push(chunk);
      });
      res.on('end', () => finish({ kind: 'body', body: Buffer.concat(chunks, size) }));
      res.on('error', () => fail('connect_error'));
      res.on('close', () => {
        if (!res.complete) fail('connect_error');
      });
    });
    req.end();
  });
}
