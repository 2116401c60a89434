// Forwarding one request attempt to one backend with undici's `stream` API: the response body is
// written straight into the downstream response (backpressure both ways, nothing buffered). A
// downstream that goes away aborts the upstream request; timeouts and transport failures are
// classified into a status, an `outcome` label and a passive-health reason.
import type { Readable, Writable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { downstreamResponseHeaders } from '../upstream/headers.ts';
import type { HeaderMap } from '../upstream/headers.ts';
import type { PassiveReason } from '../health/health-state.ts';

/** The downstream response, as node:http, node:http2 compat and our HTTP/3 responses all offer it. */
export interface DownstreamResponse extends Writable {
  readonly headersSent: boolean;
  writeHead(status: number, headers?: HeaderMap): unknown;
}

/** `outcome` label values (SPEC) used by forwarding. */
export type ForwardOutcome = 'success' | 'failure' | 'timeout' | 'backend_error';

export interface ForwardOptions {
  readonly dispatcher: Dispatcher;
  readonly method: string;
  /** Path with query. */
  readonly path: string;
  readonly headers: HeaderMap;
  readonly body: Readable | null;
  /** To the response headers (undici `headersTimeout`). */
  readonly headersTimeoutMs: number;
  /** Longest pause in the response body (undici `bodyTimeout`). */
  readonly bodyIdleMs: number;
  /** Whole response body. */
  readonly bodyTotalMs: number;
  /** Protocol spoken to the backend, for `via`. */
  readonly backendProtocol: '1.1' | '2';
  /**
   * TLS server name (SNI and certificate check) for an https backend. undici would otherwise take
   * it from the request's Host header, which names the client's view, not the backend.
   */
  readonly servername?: string;
}

export interface ForwardResult {
  /** Status sent downstream (the backend's, or ours on failure); undefined when nothing could be sent. */
  readonly status: number | undefined;
  readonly outcome: ForwardOutcome;
  /** Why it failed: `connect_timeout`, `headers_timeout`, `body_timeout`, `transport`, `tls`, `client_closed`. */
  readonly reason?: string;
  /** Passive health signal for the backend, if the failure was the backend's. */
  readonly health: 'ok' | PassiveReason | undefined;
  /** Whether response headers reached the downstream (a retry is no longer possible). */
  readonly responseStarted: boolean;
}

const TLS_CODES = /^(ERR_TLS|ERR_SSL|CERT_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN|HOSTNAME_MISMATCH)/;

/** Classifies an undici / socket error. */
export function classifyError(err: unknown): { outcome: ForwardOutcome; status: number; reason: string; health: PassiveReason | undefined } {
  const code = String((err as { code?: unknown })?.code ?? (err as { cause?: { code?: unknown } })?.cause?.code ?? '');
  switch (code) {
    case 'UND_ERR_CONNECT_TIMEOUT':
      return { outcome: 'timeout', status: 504, reason: 'connect_timeout', health: 'timeout' };
    case 'UND_ERR_HEADERS_TIMEOUT':
      return { outcome: 'timeout', status: 504, reason: 'headers_timeout', health: 'timeout' };
    case 'UND_ERR_BODY_TIMEOUT':
    case 'EDGE_BODY_TOTAL_TIMEOUT':
      return { outcome: 'timeout', status: 504, reason: 'body_timeout', health: 'timeout' };
    case 'EDGE_CLIENT_CLOSED':
      return { outcome: 'failure', status: 499, reason: 'client_closed', health: undefined };
    case 'EDGE_CLIENT_BODY_TIMEOUT':
      return { outcome: 'failure', status: 408, reason: 'client_body_timeout', health: undefined };
    case 'EDGE_REQUEST_TOO_LARGE':
      return { outcome: 'failure', status: 413, reason: 'request_too_large', health: undefined };
    default:
      if (TLS_CODES.test(code)) return { outcome: 'backend_error', status: 502, reason: 'tls', health: 'tls' };
      return { outcome: 'backend_error', status: 502, reason: 'transport', health: 'transport' };
  }
}

/** Causes that name themselves even if the downstream also closed. */
const UPSTREAM_TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'EDGE_BODY_TOTAL_TIMEOUT', 'EDGE_CLIENT_BODY_TIMEOUT', 'EDGE_REQUEST_TOO_LARGE']);

/** An Error with a stable `code`. */
export function codedError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** Forwards one attempt. Never throws: failures come back classified. */
export async function forward(res: DownstreamResponse, o: ForwardOptions): Promise<ForwardResult> {
  const controller = new AbortController();
  let done = false;
  let totalTimer: NodeJS.Timeout | undefined;
  // Abort upstream only when the downstream goes away before we finished (FIELD-NOTES: aborting on
  // every close costs ~25 µs per request, and `writableFinished` alone misses HTTP/2 aborts).
  // A completed HTTP/1.1 response emits 'close' on the next tick, before this function resumes
  // from `await`, so `done` is still false then: once undici has ended `res` (the upstream response
  // is complete and its abort signal already detached) there is nothing to abort, and the abort's
  // Error and event would be paid on every request.
  let clientClosed = false;
  const onClose = (): void => {
    if (done) return;
    clientClosed = true;
    if (res.writableEnded) return;
    controller.abort(codedError('EDGE_CLIENT_CLOSED', 'downstream closed'));
  };
  // 'close' comes once; `on` spares the wrapper `once` allocates, and `removeListener` below drops it.
  res.on('close', onClose);
  let backendStatus: number | undefined;
  try {
    const request: Dispatcher.RequestOptions & { servername?: string } = {
      path: o.path,
      method: o.method as Dispatcher.HttpMethod,
      headers: o.headers as Record<string, string | string[]>,
      body: o.body,
      signal: controller.signal,
      headersTimeout: o.headersTimeoutMs,
      bodyTimeout: o.bodyIdleMs,
    };
    if (o.servername !== undefined) request.servername = o.servername;
    await o.dispatcher.stream(
      request,
      ({ statusCode, headers }) => {
        backendStatus = statusCode;
        res.writeHead(statusCode, downstreamResponseHeaders(headers as HeaderMap, o.backendProtocol));
        totalTimer = setTimeout(() => controller.abort(codedError('EDGE_BODY_TOTAL_TIMEOUT', 'response body took too long')), o.bodyTotalMs);
        return res;
      },
    );
    done = true;
    const status = backendStatus ?? 502;
    return { status, outcome: 'success', health: status >= 500 ? '5xx' : 'ok', responseStarted: true };
  } catch (err) {
    done = true;
    // An upstream timeout names its cause even though undici then destroys `res` (which looks like
    // a client close); any other failure after the downstream went away is the client's doing.
    const code = String((err as { code?: unknown })?.code ?? '');
    const upstreamTimeout = UPSTREAM_TIMEOUT_CODES.has(code);
    const reason = upstreamTimeout ? err : clientClosed ? (controller.signal.reason ?? codedError('EDGE_CLIENT_CLOSED', 'downstream closed')) : err;
    const c = classifyError(reason);
    if (res.headersSent) {
      // Too late for an error response: cut the downstream so the client sees a truncated body, not a complete one.
      res.destroy(reason instanceof Error ? reason : undefined);
      return { status: backendStatus, outcome: c.outcome, reason: c.reason, health: c.health, responseStarted: true };
    }
    return { status: c.status === 499 ? undefined : c.status, outcome: c.outcome, reason: c.reason, health: c.health, responseStarted: false };
  } finally {
    if (totalTimer !== undefined) clearTimeout(totalTimer);
    res.removeListener('close', onClose);
  }
}
