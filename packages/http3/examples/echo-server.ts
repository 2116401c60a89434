// An HTTP/3 echo server for interop tests and benchmarks.
//
//   node packages/http3/examples/echo-server.ts --port P --cert F --key F [--host H]
//     [--ticket-key HEX48] [--no-retry] [--max-streams N]
//
// - any request: 200 with a JSON body describing it (method, path, authority, scheme, headers,
//   body length and SHA-256, trailers, connection facts);
// - POST /echo: the request body streamed back as the response body (trailers echoed too);
// - /bytes/N: N bytes of 'x' (N <= 1 GiB);
// - /status/N: an empty response with status N; /early-hints: a 103 before the 200.
// Prints one JSON line {"event":"listening","host":...,"port":...} on stdout once bound, so a
// test can pass --port 0. SIGTERM/SIGINT: graceful close (GOAWAY, drain 2 s).

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { Http3Server } from '@edge-proxy/http3';
import type { Http3ServerRequest, Http3ServerResponse } from '@edge-proxy/http3';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    host: { type: 'string', default: '::' },
    cert: { type: 'string' },
    key: { type: 'string' },
    'ticket-key': { type: 'string' },
    'no-retry': { type: 'boolean', default: false },
    'max-streams': { type: 'string', default: '100' },
  },
  strict: true,
});
if (values.cert === undefined || values.key === undefined) {
  console.error('usage: echo-server.ts --port P --cert FILE --key FILE [--host H] [--ticket-key HEX] [--no-retry] [--max-streams N]');
  process.exit(2);
}

const MAX_BYTES = 1 << 30;
const chunk = Buffer.alloc(65536, 'x');

const server = new Http3Server({
  key: readFileSync(values.key, 'utf8'),
  cert: readFileSync(values.cert, 'utf8'),
  ...(values['ticket-key'] !== undefined ? { ticketKey: Buffer.from(values['ticket-key'], 'hex') } : {}),
  retry: !values['no-retry'],
  maxConcurrentStreams: Number(values['max-streams']),
});

server.on('request', (req: Http3ServerRequest, res: Http3ServerResponse) => {
  const path = req.url.split('?')[0] ?? '';
  if (req.method === 'POST' && path === '/echo') return echo(req, res);
  const bytes = /^\/bytes\/(\d+)$/.exec(path);
  if (bytes !== null) return sendBytes(req, res, Math.min(Number(bytes[1]), MAX_BYTES));
  const status = /^\/status\/(\d{3})$/.exec(path);
  if (status !== null) {
    req.resume();
    res.writeHead(Number(status[1]));
    res.end();
    return;
  }
  if (path === '/early-hints') res.writeEarlyHints({ link: '</style.css>; rel=preload; as=style' });
  describe(req, res);
});

function describe(req: Http3ServerRequest, res: Http3ServerResponse): void {
  const hash = createHash('sha256');
  let length = 0;
  req.on('data', (c: Buffer) => {
    length += c.length;
    hash.update(c);
  });
  req.on('end', () => {
    const body = JSON.stringify({
      method: req.method,
      path: req.url,
      authority: req.authority,
      scheme: req.scheme,
      headers: req.headers,
      bodyLength: length,
      bodySha256: hash.digest('hex'),
      trailers: req.trailers,
      connection: { serverName: req.socket.serverName, resumed: req.socket.resumed, earlyData: req.socket.earlyData, connectionId: req.socket.connectionId, remoteAddress: req.socket.remoteAddress },
    });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
}

function echo(req: Http3ServerRequest, res: Http3ServerResponse): void {
  const type = req.headers['content-type'];
  res.writeHead(200, { 'content-type': typeof type === 'string' ? type : 'application/octet-stream' });
  req.pipe(res, { end: false });
  req.on('end', () => {
    if (Object.keys(req.trailers).length > 0) res.addTrailers(req.trailers as Record<string, string>);
    res.end();
  });
}

function sendBytes(req: Http3ServerRequest, res: Http3ServerResponse, n: number): void {
  req.resume();
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': n });
  let left = n;
  const pump = (): void => {
    while (left > 0) {
      const piece = left >= chunk.length ? chunk : chunk.subarray(0, left);
      left -= piece.length;
      if (!res.write(piece)) {
        res.once('drain', pump);
        return;
      }
    }
    res.end();
  };
  pump();
}

const address = await server.listen({ host: values.host, port: Number(values.port) });
console.log(JSON.stringify({ event: 'listening', host: address.host, port: address.port }));

let stopping = false;
const stop = (): void => {
  if (stopping) return;
  stopping = true;
  void server.close(2000).then(() => process.exit(0));
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
