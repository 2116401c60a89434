// The external authorization client (issue 16, item 3): one POST per request to the pool's
// authorization service, over a keep-alive undici pool, decided by the answer's status alone.
// Bounded (issue 38, finding 6): at most `maxPending` calls wait for the service per worker (the
// rest are decided by the failure mode at once, `overflow`, and cost the service nothing), and
// under `allow` the pool's fail-open budget, a `FailOpenGate` its caller hands each check, bounds
// how many requests failures may let through (one gate per pool: pools with the same settings share
// an authorizer, not a budget).
import type { FailOpenGate } from './fail-open-budget.ts';
import { Pool } from './undici-pool.ts';

/** A pool's external authorization (from `upstream.<pool>.auth.external`). */
export interface ExternalAuthPolicy {
  /** The service's endpoint (POST), `http://` or `https://`; never logged (it may carry a query). */
  readonly url: string;
  /** Bound on the whole call up to the answer's headers, ms (`timeout_ms`, default 200). */
  readonly timeoutMs: number;
  /** Sent as the user of HTTP Basic credentials when set. */
  readonly clientId?: string;
  /** The Basic password (`client_secret_ref`); '' when absent. Never logged. */
  readonly clientSecret?: string;
  /** What a timeout, an error or an overflow decides (`failure_mode`, default `deny`). */
  readonly failureMode: 'deny' | 'allow';
  /** Calls waiting for the service at most (`max_pending`, default 256); a request beyond is an `overflow`, decided by the failure mode without a call. */
  readonly maxPending: number;
  /** Lower-case names of the request headers sent to the service (`allowed_headers`); no other header leaves the proxy. */
  readonly allowedHeaders: readonly string[];
  /** Trust of an `https://` endpoint (the pool's upstream CA, PEM); absent: the system's CAs. */
  readonly caPems?: readonly string[];
}

/** What the authorizer reads of a request. */
export interface AuthRequestView {
  readonly method: string;
  readonly path: string;
  readonly host: string;
  readonly clientAddress: string;
  /** The request header `name` (lower-case), undefined when absent. */
  header(name: string): string | undefined;
}

/** The service's decision, or what the failure mode made of a failure. */
export type ExternalDecision = {
  readonly allow: boolean;
  /** `svc_external_auth_{allowed,denied,timeout,error,overflow}`. */
  readonly cause: 'allowed' | 'denied' | 'timeout' | 'error' | 'overflow';
  /** A failure under `allow` that the fail-open budget turned into a denial (`svc_external_auth_fail_open_refused`). */
  readonly failOpenRefused?: boolean;
  /** The service's status, when it answered. */
  readonly status?: number;
};

/** Connections kept to the service per worker (HTTP/1.1 keep-alive, one request at a time each). */
export const EXTERNAL_AUTH_CONNECTIONS = 64;
/** Most of an answer's body read (and discarded) to keep its connection; beyond it the connection is dropped. */
export const EXTERNAL_AUTH_MAX_BODY = 64 * 1024;

/** Asks the authorization service about each request of one pool (one per pool and generation, in each worker). */
export class ExternalAuthorizer {
  private readonly pool: Pool;
  private readonly path: string;
  private readonly timeoutMs: number;
  private readonly allowOnFailure: boolean;
  private readonly allowedHeaders: readonly string[];
  private readonly fixedHeaders: Readonly<Record<string, string>>;
  private readonly maxPending: number;
  /** Calls started and not settled (in flight on a connection, or queued for one). */
  private pending = 0;

  constructor(policy: ExternalAuthPolicy) {
    const url = new URL(policy.url);
    this.path = `${url.pathname}${url.search}`;
    this.timeoutMs = policy.timeoutMs;
    this.allowOnFailure = policy.failureMode === 'allow';
    this.maxPending = policy.maxPending;
    this.allowedHeaders = [...new Set(policy.allowedHeaders.map((h) => h.toLowerCase()))];
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (policy.clientId !== undefined) headers['authorization'] = `Basic ${Buffer.from(`${policy.clientId}:${policy.clientSecret ?? ''}`, 'utf8').toString('base64')}`;
    this.fixedHeaders = Object.freeze(headers);
    this.pool = new Pool(url.origin, {
      connections: EXTERNAL_AUTH_CONNECTIONS,
      pipelining: 1,
      keepAliveTimeout: 4_000,
      keepAliveMaxTimeout: 60_000,
      // Every call is bounded by its own timer (the signal in `check`); undici's own timers only back it up.
      connectTimeout: policy.timeoutMs + 1000,
      headersTimeout: policy.timeoutMs + 1000,
      bodyTimeout: policy.timeoutMs + 1000,
      ...(url.protocol === 'https:' && policy.caPems !== undefined ? { connect: { ca: [...policy.caPems] } } : {}),
    });
  }

  /** Calls waiting for the service now. */
  get inflight(): number {
    return this.pending;
  }

  /**
   * The decision for `req`. Never throws: a failure is `timeout`, `error` or `overflow`, allowed or
   * denied by the failure mode and, under `allow`, by `failOpen` (the pool's fail-open budget; absent:
   * every failure allows). A gate that throws or rejects denies.
   */
  async check(req: AuthRequestView, failOpen?: FailOpenGate): Promise<ExternalDecision> {
    if (this.pending >= this.maxPending) return this.failed(failOpen, 'overflow');
    this.pending++;
    let failure: { cause: 'timeout' | 'error'; status?: number };
    try {
      const d = await this.call(req);
      if ('allow' in d) return d;
      failure = d;
    } finally {
      this.pending--;
    }
    return this.failed(failOpen, failure.cause, failure.status);
  }

  /** What the failure mode (and the fail-open budget) make of a failure. */
  private async failed(failOpen: FailOpenGate | undefined, cause: 'timeout' | 'error' | 'overflow', status?: number): Promise<ExternalDecision> {
    let allow = this.allowOnFailure;
    if (allow && failOpen !== undefined) {
      try {
        allow = await failOpen.take();
      } catch {
        allow = false;
      }
    }
    return { allow, cause, ...(status === undefined ? {} : { status }), ...(this.allowOnFailure && !allow ? { failOpenRefused: true } : {}) };
  }

  /** One call: the service's decision, or the failure (decided by `failed`, after the call no longer counts as pending). */
  private async call(req: AuthRequestView): Promise<ExternalDecision | { cause: 'timeout' | 'error'; status?: number }> {
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, this.timeoutMs);
    try {
      const headers: Record<string, string> = {};
      for (const name of this.allowedHeaders) {
        const v = req.header(name);
        if (v !== undefined) headers[name] = v;
      }
      const body = JSON.stringify({ method: req.method, path: req.path, host: req.host, client_address: req.clientAddress, headers });
      const res = await this.pool.request({ path: this.path, method: 'POST', headers: this.fixedHeaders, body, signal: controller.signal });
      clearTimeout(timer);
      // Read and discard (bounded, within the same time again) so the connection is kept; a larger body drops it.
      res.body.dump({ limit: EXTERNAL_AUTH_MAX_BODY, signal: AbortSignal.timeout(Math.max(1, this.timeoutMs)) }).catch(() => undefined);
      const status = res.statusCode;
      if (status >= 200 && status < 300) return { allow: true, cause: 'allowed', status };
      if (status === 401 || status === 403) return { allow: false, cause: 'denied', status };
      return { cause: 'error', status };
    } catch (e) {
      clearTimeout(timer);
      const code = (e as { code?: unknown } | null)?.code;
      const timeout = timedOut || code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'UND_ERR_HEADERS_TIMEOUT';
      return { cause: timeout ? 'timeout' : 'error' };
    }
  }

  /** Closes the connections (checks still running finish first, each bounded by its timeout). */
  async close(): Promise<void> {
    try {
      await this.pool.close();
    } catch {
      // Already closed.
    }
  }
}
