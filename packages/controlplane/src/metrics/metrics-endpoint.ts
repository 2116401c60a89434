// The metrics endpoint (SPEC "Metrics endpoint"): plain HTTP on its own bind, GET on the configured
// path only (404 elsewhere). A scrape merges every worker's registry (summed, or max/min per the
// catalogue) with the supervisor's own. A worker that does not answer in time is left out of that
// scrape; the scrape itself never fails for it.
//
// The endpoint has no authentication, so its connections go through the same guard as the control
// API's (no allowlist): a per-source cap, a global cap where a newcomer displaces the oldest
// connection instead of being refused (a flood cannot lock the scraper out), an idle deadline
// that also covers a connection that never sends a request, and a lifetime.
import http from 'node:http';
import { AggregatorRegistry, Registry } from 'prom-client';
import { ConnectionGuard } from '../net/connection-guard.ts';
import type { GuardEvent, GuardSettings } from '../net/connection-guard.ts';

export interface MetricsEndpointOptions {
  readonly address: string;
  readonly port: number;
  readonly path: string;
  readonly maxConnections: number;
  readonly maxConnectionsPerSource: number;
  readonly idleTimeoutMs: number;
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

function guardSettings(o: MetricsEndpointOptions): GuardSettings {
  // Plain HTTP has no handshake: the wait for the first request is an idle wait.
  return { maxConnections: o.maxConnections, maxPerSource: o.maxConnectionsPerSource, handshakeTimeoutMs: o.idleTimeoutMs, idleTimeoutMs: o.idleTimeoutMs, lifetimeMs: o.connectionTimeoutMs };
}

export class MetricsEndpoint {
  private readonly server: http.Server;
  private readonly guard: ConnectionGuard;
  private opts: MetricsEndpointOptions;
  /** Scrapes that left out at least one worker (shown in the runtime snapshot). */
  partialScrapes = 0;

  /** `onEvent` hears every connection the guard dropped, displaced or timed out. */
  constructor(opts: MetricsEndpointOptions, sources: MetricsSources, onEvent: (e: GuardEvent) => void = () => {}) {
    this.opts = opts;
    this.server = http.createServer((req, res) => {
      this.guard.requestStarted(req.socket);
      res.once('close', () => this.guard.requestEnded(req.socket));
      const path = (req.url ?? '/').split('?')[0];
      if (path !== this.opts.path) {
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
    // The guard owns connection lifetimes; node's own keep-alive timer would race it.
    this.server.keepAliveTimeout = 0;
    this.guard = new ConnectionGuard(guardSettings(opts), () => true, (socket) => this.server.emit('connection', socket), onEvent);
  }

  /** Live settings of an activation: path, limits and timeouts (the bind is restart-required). */
  update(opts: MetricsEndpointOptions): void {
    this.opts = opts;
    this.guard.setSettings(guardSettings(opts));
  }

  /** Open connections. */
  get connections(): number {
    return this.guard.size;
  }

  async listen(port = this.opts.port): Promise<number> {
    return this.guard.listen(this.opts.address, port);
  }

  async close(): Promise<void> {
    await this.guard.close();
    this.server.closeAllConnections();
  }
}
