// A backend with a fixed capacity, for overload benchmarks: at most `concurrency` requests are
// served at once, each taking `serviceMs`; the rest wait in the backend's own FIFO, so latency
// grows with the backlog as in a real saturated service (a thread pool in front of a database).
// Capacity is concurrency ÷ service time (8 ÷ 50 ms = 160 req/s).
//
// A request whose client went away while it waited (the proxy gave up: its deadline, or its own
// client aborted) is dropped when it reaches the head of the FIFO instead of being served: a real
// server would still do the work, but then one overloaded step would leave minutes of backlog to
// the next step and the benchmark would measure the leftover, not the step.
//
// `GET /__stats` answers at once (outside the FIFO) with the counters as JSON, so the benchmark
// can wait until the backlog is gone between steps.
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';

/** Settings of the backend. */
export interface SlowBackendOptions {
  /** Requests served at once (K). */
  readonly concurrency: number;
  /** Service time of one request, ms (S). */
  readonly serviceMs: number;
  /** Port on 127.0.0.1; 0 for any. */
  readonly port?: number;
}

/** What `GET /__stats` answers. */
export interface SlowBackendStats {
  /** Requests answered 200. */
  readonly served: number;
  /** Requests dropped at the head of the FIFO because their client had gone. */
  readonly dropped: number;
  /** Requests being served now (≤ concurrency). */
  readonly active: number;
  /** Requests waiting in the FIFO now. */
  readonly queued: number;
  /** Longest FIFO seen since the last `GET /__stats?reset=1`. */
  readonly maxQueued: number;
}

/** The running backend. */
export interface SlowBackend {
  readonly port: number;
  stats(): SlowBackendStats;
  close(): Promise<void>;
}

/** Starts the backend on 127.0.0.1 and resolves once it listens. */
export async function startSlowBackend(o: SlowBackendOptions): Promise<SlowBackend> {
  const fifo: Array<{ req: http.IncomingMessage; res: http.ServerResponse }> = [];
  let active = 0;
  let served = 0;
  let dropped = 0;
  let maxQueued = 0;
  const stats = (): SlowBackendStats => ({ served, dropped, active, queued: fifo.length, maxQueued });

  const serveOne = (res: http.ServerResponse): void => {
    active++;
    setTimeout(() => {
      active--;
      if (!res.destroyed) {
        served++;
        res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '2' }).end('ok');
      }
      next();
    }, o.serviceMs);
  };
  const next = (): void => {
    while (active < o.concurrency && fifo.length > 0) {
      const { res } = fifo.shift() as { res: http.ServerResponse };
      if (res.destroyed) {
        dropped++;
        continue;
      }
      serveOne(res);
    }
  };

  const server = http.createServer((req, res) => {
    if (req.url?.startsWith('/__stats') === true) {
      const body = JSON.stringify(stats());
      if (req.url.includes('reset=1')) maxQueued = fifo.length;
      res.writeHead(200, { 'content-type': 'application/json' }).end(body);
      return;
    }
    // The request has no body in this benchmark; draining keeps the socket reusable if one comes.
    req.resume();
    fifo.push({ req, res });
    maxQueued = Math.max(maxQueued, fifo.length);
    next();
  });
  // Keep-alive connections live as long as the proxy wants them (its pool decides).
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 61_000;
  server.requestTimeout = 0;
  server.listen(o.port ?? 0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    stats,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
