// A JWKS endpoint over HTTPS with a private CA, whose next answers the test sets: a key set, a
// status, a hang, garbage, an oversized body, a redirect. It counts the requests it receives and
// emits 'request' for each (await it rather than sleep).
import https from 'node:https';
import { EventEmitter, once } from 'node:events';
import { readFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { makeCa, makeLeaf } from '../../../../scripts/lib/certs.ts';

export type Answer =
  | { readonly kind: 'json'; readonly body: unknown }
  | { readonly kind: 'status'; readonly status: number; readonly headers?: Record<string, string> }
  | { readonly kind: 'raw'; readonly body: string | Buffer }
  /** A body sent chunked: no content-length to refuse it by. */
  | { readonly kind: 'chunked'; readonly body: Buffer }
  | { readonly kind: 'hang' };

export interface SeenRequest {
  readonly url: string;
  readonly headers: IncomingMessage['headers'];
  /** Resolves when the client closes the connection of this request. */
  readonly closed: Promise<void>;
}

export class JwksServer extends EventEmitter {
  readonly #server: https.Server;
  readonly caPem: string;
  answer: Answer = { kind: 'status', status: 404 };
  readonly seen: SeenRequest[] = [];

  private constructor(server: https.Server, caPem: string) {
    super();
    this.#server = server;
    this.caPem = caPem;
    server.on('request', (req: IncomingMessage, res: ServerResponse) => this.#answer(req, res));
  }

  /** Starts a server on 127.0.0.1:0 with a CA and a leaf made in `dir` (named after `name`). */
  static async start(dir: string, name = 'jwks'): Promise<JwksServer> {
    const ca = makeCa(dir, `${name}-ca`);
    const leaf = makeLeaf(dir, name, ca, { sans: ['127.0.0.1', 'localhost'] });
    const server = https.createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return new JwksServer(server, readFileSync(ca.cert, 'utf8'));
  }

  get fetches(): number {
    return this.seen.length;
  }

  /** `https://<userinfo>127.0.0.1:<port><pathAndQuery>`. */
  url(pathAndQuery = '/jwks', userinfo = ''): string {
    return `https://${userinfo}127.0.0.1:${(this.#server.address() as AddressInfo).port}${pathAndQuery}`;
  }

  #answer(req: IncomingMessage, res: ServerResponse): void {
    const closed = new Promise<void>((resolve) => res.once('close', () => resolve()));
    this.seen.push({ url: req.url ?? '', headers: req.headers, closed });
    const a = this.answer;
    if (a.kind === 'json') res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(a.body));
    else if (a.kind === 'status') res.writeHead(a.status, a.headers ?? {}).end();
    else if (a.kind === 'raw') res.writeHead(200, { 'content-type': 'application/json' }).end(a.body);
    else if (a.kind === 'chunked') res.writeHead(200, { 'content-type': 'application/json' }).write(a.body, () => res.end());
    // 'hang': headers never sent; the client's deadline (or close()) ends it.
    this.emit('request');
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
