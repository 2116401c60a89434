// Upstream connection pools, one per backend identity: `http://` backends over HTTP/1.1 keep-alive
// through our own client (upstream/h1-client.ts), `https://` backends through undici over HTTP/2
// (ALPN, falling back to HTTP/1.1). A pool outlives generation swaps while its identity (address
// and TLS material fingerprint) is unchanged; a changed client identity is a new key, hence a new
// pool.
import { maxHeaderSize } from 'node:http';
import { UndiciPool as Pool } from '@edge-proxy/auth';
import type { Dispatcher } from 'undici';
import { H1Pool } from './h1-client.ts';

/**
 * What forwarding and health checks need of a pool: undici's `dispatch` (one handler object per
 * request), `close` (after the requests in flight) and `destroy` (at once). undici's Pool and our
 * H1Pool both offer it.
 */
export interface UpstreamDispatcher {
  dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean;
  close(): Promise<void>;
  destroy(): Promise<void>;
}

/** TLS parameters toward one backend. */
export interface UpstreamTlsParams {
  readonly verify: boolean;
  /** SNI and verification name; undefined: no SNI (IP backends or `strict_sni: false`). */
  readonly serverName: string | undefined;
  /** Trusted CAs (PEM); undefined: the system store. */
  readonly ca: readonly string[] | undefined;
  readonly cert: string | undefined;
  readonly key: string | undefined;
  /** Fingerprint of the material, part of the pool identity. */
  readonly fingerprint: string;
}

/** What a pool is built from. */
export interface PoolSpec {
  readonly scheme: 'http' | 'https';
  readonly host: string;
  readonly port: number;
  readonly connectTimeoutMs: number;
  /** Concurrent connections to this backend (HTTP/1.1) or sessions (HTTP/2). */
  readonly connections: number;
  readonly tls: UpstreamTlsParams | undefined;
}

/** The origin string undici expects. */
export function originOf(spec: Pick<PoolSpec, 'scheme' | 'host' | 'port'>): string {
  const host = spec.host.includes(':') ? `[${spec.host}]` : spec.host;
  return `${spec.scheme}://${host}:${spec.port}`;
}

/** Identity of a pool: everything that, when changed, needs new connections. */
export function poolKey(spec: PoolSpec): string {
  return `${originOf(spec)}|${spec.tls?.fingerprint ?? 'plain'}|${spec.connectTimeoutMs}|${spec.connections}`;
}

/**
 * How long an idle upstream connection is kept when the backend names no `Keep-Alive: timeout`,
 * and the most a backend's hint is trusted for (the same for both clients).
 */
const KEEP_ALIVE_MS = 4_000;
const KEEP_ALIVE_MAX_MS = 60_000;

/** Keys of specs already seen: a spec object is built once per generation, used per request. */
const keys = new WeakMap<PoolSpec, string>();

function keyOf(spec: PoolSpec): string {
  let key = keys.get(spec);
  if (key === undefined) {
    key = poolKey(spec);
    keys.set(spec, key);
  }
  return key;
}

/** Pools by identity, shared by every generation of one worker. */
export class UpstreamPools {
  private readonly pools = new Map<string, UpstreamDispatcher>();

  get(spec: PoolSpec): UpstreamDispatcher {
    const key = keyOf(spec);
    let pool = this.pools.get(key);
    if (pool === undefined) {
      pool = spec.scheme === 'http' ? new H1Pool(spec.host, spec.port, { connections: spec.connections, connectTimeout: spec.connectTimeoutMs, keepAliveTimeout: KEEP_ALIVE_MS, keepAliveMaxTimeout: KEEP_ALIVE_MAX_MS, maxHeaderSize }) : new Pool(originOf(spec), {
        connections: spec.connections,
        pipelining: 1,
        connectTimeout: spec.connectTimeoutMs,
        keepAliveTimeout: KEEP_ALIVE_MS,
        keepAliveMaxTimeout: KEEP_ALIVE_MAX_MS,
        allowH2: spec.scheme === 'https',
        ...(spec.tls === undefined
          ? {}
          : {
              connect: {
                rejectUnauthorized: spec.tls.verify,
                ...(spec.tls.serverName === undefined ? {} : { servername: spec.tls.serverName }),
                ...(spec.tls.ca === undefined ? {} : { ca: [...spec.tls.ca] }),
                ...(spec.tls.cert === undefined ? {} : { cert: spec.tls.cert }),
                ...(spec.tls.key === undefined ? {} : { key: spec.tls.key }),
              },
            }),
      });
      this.pools.set(key, pool);
    }
    return pool;
  }

  /** Closes pools whose key is not in `keep`, after their in-flight requests finish. */
  async retain(keep: ReadonlySet<string>): Promise<void> {
    const closing: Promise<void>[] = [];
    for (const [key, pool] of this.pools) {
      if (keep.has(key)) continue;
      this.pools.delete(key);
      closing.push(pool.close());
    }
    await Promise.all(closing);
  }

  /**
   * Replaces the pool of `spec` with a fresh one (its backend's DNS answer changed): new requests
   * open connections to the new addresses; the old pool finishes its requests and closes.
   */
  rotate(spec: PoolSpec): boolean {
    const key = keyOf(spec);
    const old = this.pools.get(key);
    if (old === undefined) return false;
    this.pools.delete(key);
    void old.close();
    return true;
  }

  get size(): number {
    return this.pools.size;
  }

  /** Closes every pool at once (shutdown); in-flight requests are aborted. */
  async destroy(): Promise<void> {
    const all = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(all.map((p) => p.destroy()));
  }
}
