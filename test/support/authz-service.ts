// An external authorization service for the request-authentication end-to-end tests (issue 16):
// HTTP or HTTPS under a private CA on 127.0.0.1, recording every call (method, path, headers, the
// JSON body the proxy sent) and deciding each one as the test says (a status, or no answer until
// the caller gives up, or until the test releases the held calls together).
import http from 'node:http';
import https from 'node:https';
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { makeCa, makeLeaf } from '../../scripts/lib/certs.ts';
import type { CertFiles } from '../../scripts/lib/certs.ts';
import { listenTracked } from './backends.ts';
import { until } from './until.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** How the service answers one call. */
export type AuthzDecision = { readonly kind: 'status'; readonly status: number } | { readonly kind: 'hold' };

/** One call the service received. */
export interface AuthzCall {
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
  /** The body parsed as JSON (`{ raw }` when it is not JSON). */
  readonly body: Record<string, unknown>;
  readonly at: number;
}

/** An HTTP authorization service on 127.0.0.1; `decide` picks the answer from the call. */
export class AuthzServer {
  port = 0;
  readonly calls: AuthzCall[] = [];
  /** Answers 200 unless the test says otherwise. */
  decide: (call: AuthzCall) => AuthzDecision = () => ({ kind: 'status', status: 200 });
  /** Calls held unanswered (`hold`), with their answer. */
  private readonly held = new Map<http.ServerResponse, AuthzCall>();
  private server: http.Server | undefined;
  private readonly changed = new EventEmitter();

  constructor() {
    this.changed.setMaxListeners(0);
  }

  /** Its certificate's CA when it serves HTTPS (`authzServer(t, tls)`), else undefined. */
  tlsCa: CertFiles | undefined;

  /** `http://127.0.0.1:<port>/authz` (`https://` when it serves TLS). */
  get url(): string {
    return `${this.tlsCa === undefined ? 'http' : 'https'}://127.0.0.1:${this.port}/authz`;
  }

  /** The calls whose body `path` starts with `prefix`. */
  callsFor(prefix: string): AuthzCall[] {
    return this.calls.filter((c) => typeof c.body['path'] === 'string' && c.body['path'].startsWith(prefix));
  }

  /** Resolves once `pred()` holds (checked on every call); rejects after `timeoutMs`. */
  until(pred: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    return until(this.changed, 'call', pred, () => `authz service: not ${what} within ${timeoutMs} ms (${this.calls.length} calls)`, timeoutMs);
  }

  /**
   * Answers `status` to every call held now whose body `path` starts with `prefix`, all in one go
   * (the failures reach the proxy together); returns how many it answered.
   */
  release(prefix: string, status: number): number {
    let n = 0;
    for (const [res, call] of this.held) {
      if (typeof call.body['path'] !== 'string' || !call.body['path'].startsWith(prefix)) continue;
      this.held.delete(res);
      res.writeHead(status, { 'content-type': 'text/plain' }).end(`authz ${status}`);
      n++;
    }
    return n;
  }

  /** Stops listening: from now on a call is refused. */
  stop(): Promise<void> {
    for (const r of this.held.keys()) r.destroy();
    return new Promise((resolve) => (this.server === undefined ? resolve() : this.server.close(() => resolve())));
  }

  /** Starts on 127.0.0.1 port 0, over HTTPS with `tls` (a certificate signed by `tls.ca`) when given; closed at teardown. */
  async start(t: Teardown, tls?: { readonly ca: CertFiles; readonly leaf: CertFiles }): Promise<this> {
    const handler = (req: http.IncomingMessage, res: http.ServerResponse): void => this.handle(req, res);
    const server = tls === undefined ? http.createServer(handler) : https.createServer({ cert: readFileSync(tls.leaf.cert), key: readFileSync(tls.leaf.key) }, handler);
    this.tlsCa = tls?.ca;
    server.requestTimeout = 0;
    server.headersTimeout = 0;
    t.teardown(() => {
      for (const r of this.held.keys()) r.destroy();
    });
    this.server = server;
    this.port = await listenTracked(t, server);
    return this;
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      let body: Record<string, unknown>;
      try {
        body = JSON.parse(text) as Record<string, unknown>;
      } catch {
        body = { raw: text };
      }
      const call: AuthzCall = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body, at: Date.now() };
      this.calls.push(call);
      const d = this.decide(call);
      if (d.kind === 'status') res.writeHead(d.status, { 'content-type': 'text/plain' }).end(`authz ${d.status}`);
      else {
        this.held.set(res, call);
        res.on('close', () => this.held.delete(res));
      }
      this.changed.emit('call');
    });
  }
}

/**
 * A started authorization service (answers 200 until `decide` is set): plain HTTP, or HTTPS with
 * a certificate for 127.0.0.1 signed by a new CA made in `<tls.dir>/<tls.name>/` (`tlsCa`).
 */
export function authzServer(t: Teardown, tls?: { readonly dir: string; readonly name: string }): Promise<AuthzServer> {
  if (tls === undefined) return new AuthzServer().start(t);
  const own = path.join(tls.dir, tls.name);
  const ca = makeCa(own, `${tls.name}-ca`, `/CN=${tls.name} test authz CA`);
  return new AuthzServer().start(t, { ca, leaf: makeLeaf(own, `${tls.name}-server`, ca, { sans: ['127.0.0.1', 'localhost'] }) });
}
