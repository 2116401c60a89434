// The floor of our stack for `npm run bench:proxy` (target `bare`): the server our worker builds on
// in front of an undici Pool, with no proxy logic. A file of its own, importing nothing else, so
// that its RSS is the stack's.
//
//   node scripts/bench/bare-proxy.ts --cert FILE --key FILE --upstream http://HOST:PORT
//
// Prints {"event":"listening","port":N} once bound; SIGTERM ends it.
import { readFileSync } from 'node:fs';
import http2 from 'node:http2';
import { once } from 'node:events';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { scriptArgs } from '../lib/bench-args.ts';

/** The part of undici 8's Pool the bare proxy uses. */
interface BarePool {
  dispatch(options: { path: string; method: string; headers: Record<string, string> }, handler: object): boolean;
}

/**
 * The floor of our stack, for reference: the server our worker builds on (node:http2's secure
 * server with HTTP/1.1 allowed, TCP_NODELAY on) in front of an undici Pool, with no routing, header
 * rules, metrics or timeouts; status, content type and length copied, the body streamed. HTTP/1.1
 * through node's request API, HTTP/2 through the core stream API, as our worker serves each.
 */
async function serveBare(cert: string, key: string, upstream: string): Promise<void> {
  // The undici our data plane runs, its Pool module alone as our worker loads it.
  const Pool = createRequire(import.meta.url)('undici/lib/dispatcher/pool.js') as new (origin: string, o: object) => BarePool;
  const pool = new Pool(upstream, { connections: 128 });
  const forward = (urlPath: string, host: string, start: (status: number, headers: Record<string, string | undefined>) => void, body: { write(c: Buffer): unknown; end(): unknown; destroy(): unknown }): void => {
    pool.dispatch(
      { path: urlPath, method: 'GET', headers: { host } },
      {
        onRequestStart() {},
        onResponseStart(_c: unknown, status: number, headers: Record<string, string | undefined>) {
          start(status, headers);
        },
        onResponseData(_c: unknown, chunk: Buffer) {
          body.write(chunk);
        },
        onResponseEnd() {
          body.end();
        },
        onResponseError() {
          body.destroy();
        },
      },
    );
  };
  const server = http2.createSecureServer({ cert: readFileSync(cert), key: readFileSync(key), allowHTTP1: true, noDelay: true, ALPNProtocols: ['h2', 'http/1.1'] }, (req, res) => {
    forward(req.url, req.headers.host ?? 'localhost', (status, headers) => res.writeHead(status, { 'content-type': headers['content-type'] ?? '', 'content-length': headers['content-length'] ?? '0' }), res);
  });
  // The request listener made node put its HTTP/2 compatibility layer on 'stream': serve the
  // streams themselves, as our worker does.
  server.removeAllListeners('stream');
  server.on('stream', (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => {
    forward(String(headers[':path'] ?? '/'), String(headers[':authority'] ?? 'localhost'), (status, h) => stream.respond({ ':status': status, 'content-type': h['content-type'] ?? '', 'content-length': h['content-length'] ?? '0' }), stream);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  console.log(JSON.stringify({ event: 'listening', port: (server.address() as AddressInfo).port }));
  process.on('SIGTERM', () => process.exit(0));
}

const { values } = scriptArgs({ options: { cert: { type: 'string' }, key: { type: 'string' }, upstream: { type: 'string' } }, strict: true });
if (values.cert === undefined || values.key === undefined || values.upstream === undefined) throw new Error('usage: bare-proxy.ts --cert FILE --key FILE --upstream URL');
await serveBare(values.cert, values.key, values.upstream);
