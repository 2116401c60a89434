// The one HTTPS call of `edge-proxy ctl`: under a deadline that covers connect, TLS, request and the
// whole answer, with the answer's size bounded. Failures are values with a reason, never throws.
import https from 'node:https';
import tls from 'node:tls';
import type { PeerCertificate } from 'node:tls';
import type { CtlRequest } from './ctl-request.ts';

/** Largest answer read (bytes): a history with 256 entries and their diffs stays well below. */
export const MAX_RESPONSE_BYTES = 16 * 1024 * 1024;

/** Default deadline of a call (ms): above the service's default `operation_timeout_ms` (30 s). */
export const DEFAULT_TIMEOUT_MS = 60_000;

/** Where and how to connect (see ctl-target.ts). Holds the token: never printed. */
export interface Target {
  readonly url: URL;
  /** Trust anchors (PEM); undefined: the system store. */
  readonly ca?: readonly string[];
  /**
   * SHA-256 fingerprint (Node's `fingerprint256` form) of the certificate the service's
   * configuration names: a server presenting exactly it is accepted whatever its names.
   */
  readonly pin?: string;
  readonly insecure: boolean;
  readonly servername?: string;
  readonly cert?: string;
  readonly key?: string;
  readonly token?: string;
  readonly timeoutMs: number;
}

export type CallResult =
  | { readonly ok: true; readonly status: number; readonly text: string }
  | { readonly ok: false; readonly reason: 'unreachable' | 'tls_failed' | 'timeout' | 'response_too_large'; readonly message: string };

/** OpenSSL/Node codes of a failed certificate check or handshake. */
const TLS_CODE = /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO|SELF_SIGNED|HOSTNAME_MISMATCH|ERR_OSSL)/;

function failure(err: Error & { code?: string }): CallResult {
  const code = err.code ?? '';
  const message = code === '' || err.message.includes(code) ? err.message : `${code}: ${err.message}`;
  if (code === 'ABORT_ERR' || err.name === 'AbortError' || err.name === 'TimeoutError') return { ok: false, reason: 'timeout', message: 'no complete answer before the deadline' };
  return { ok: false, reason: TLS_CODE.test(code) || /SSL|TLS|certificate/i.test(err.message) ? 'tls_failed' : 'unreachable', message };
}

/** Sends `req` to `target`; resolves with the status and the answer text, or why there is none. */
export function call(target: Target, req: CtlRequest, maxBytes = MAX_RESPONSE_BYTES): Promise<CallResult> {
  const payload = req.body === undefined ? undefined : JSON.stringify(req.body);
  const headers: Record<string, string> = { accept: 'application/json' };
  if (target.token !== undefined) headers['authorization'] = `Bearer ${target.token}`;
  if (payload !== undefined) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(Buffer.byteLength(payload));
  }
  const pin = target.pin;
  const checkServerIdentity = pin === undefined ? undefined : (host: string, cert: PeerCertificate): Error | undefined => (cert.fingerprint256 === pin ? undefined : tls.checkServerIdentity(host, cert));
  const signal = AbortSignal.timeout(target.timeoutMs);
  return new Promise<CallResult>((resolve) => {
    const request = https.request(
      {
        protocol: 'https:',
        hostname: target.url.hostname.replace(/^\[|\]$/g, ''),
        port: target.url.port === '' ? 443 : Number(target.url.port),
        path: req.path,
        method: req.method,
        headers,
        agent: false,
        signal,
        rejectUnauthorized: !target.insecure,
        ...(target.ca === undefined ? {} : { ca: [...target.ca] }),
        // A pinned certificate is a trust anchor of its own, whoever issued it.
        ...(pin === undefined ? {} : { allowPartialTrustChain: true, checkServerIdentity }),
        ...(target.servername === undefined ? {} : { servername: target.servername }),
        ...(target.cert === undefined ? {} : { cert: target.cert, key: target.key }),
      },
      (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > maxBytes) {
            resolve({ ok: false, reason: 'response_too_large', message: `the answer exceeds ${maxBytes} bytes` });
            request.destroy();
            return;
          }
          chunks.push(chunk);
        });
        res.on('end', () => resolve({ ok: true, status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', (err) => resolve(failure(err)));
      },
    );
    request.on('error', (err) => resolve(failure(err)));
    request.end(payload);
  });
}
