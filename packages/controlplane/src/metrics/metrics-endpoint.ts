// The metrics endpoint (SPEC "Metrics endpoint"): plain HTTP on its own bind, GET on the configured
// path only (404 elsewhere), bounded connections and connection lifetime. A scrape merges every
// worker's registry (summed, or max/min per the catalogue) with the supervisor's own. A worker that
// does not answer in time is left out of that scrape; the scrape itself never fails for it.
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo, Socket } from 'node:net';
import { AggregatorRegistry, Registry } from 'prom-client';
import { trackConnections } from '../net/connection-lifetime.ts';

export interface MetricsEndpointOptions {
  readonly address: string;
  readonly port: number;
  readonly path: string;
  readonly maxConnections: number;
  readonly connectionTimeoutMs: number;
}

/** Where the metrics come from. */
export interface MetricsSources {
  /** prom-client JSON of each worker that answered, and how many did not. */
  workers(timeoutMs: number): Promise<{ values: unknown[]; missing: number }>;
  /** The supervisor's own registry (control plane, secrets, watchdog). */
  readonly supervisor: Registry;
}

/** Per-worker answer deadline within one scrape. */
export const WORKER_SCRAPE_TIMEOUT_MS = 2000;

/** Renders the merged exposition text. */
export async function renderMetrics(sources: MetricsSources, timeoutMs = WORKER_SCRAPE_TIMEOUT_MS): Promise<{ text: string; missing: number }> {
  const { values, missing } = await sources.workers(timeoutMs);
  const merged: Registry = values.length > 0 ? AggregatorRegistry.aggregate(values as object[]) : new Registry();
  const text = await Registry.merge([merged, sources.supervisor]).metrics();
  return { text, missing };
}

export class MetricsEndpoint {
  private readonly server: http.Server;
  private readonly opts: MetricsEndpointOptions;
  private readonly sockets: Set<Socket>;
  /** Scrapes that left out at least one worker (shown in the runtime snapshot). */
  partialScrapes = 0;

  constructor(opts: MetricsEndpointOptions, sources: MetricsSources) {
    this.opts = opts;
    this.server = http.createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      if (path !== opts.path) {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
        return;
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
        return;
      }
      renderMetrics(sources).then(
        ({ text, missing }) => {
          if (missing > 0) this.partialScrapes++;
          res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', 'cache-control': 'no-store' });
          res.end(req.method === 'HEAD' ? undefined : text);
        },
        () => {
          // A failure to merge must not affect serving; the scrape gets a clear error.
          res.writeHead(500, { 'content-type': 'text/plain' }).end('metrics unavailable\n');
        },
      );
    });
    this.server.maxConnections = opts.maxConnections;
    this.sockets = trackConnections(this.server, opts.connectionTimeoutMs);
  }

  async listen(port = this.opts.port): Promise<number> {
    this.server.listen({ host: this.opts.address, port });
    await once(this.server, 'listening');
    return (this.server.address() as AddressInfo).port;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
