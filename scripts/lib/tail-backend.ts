// A backend with a slow tail and optional failures, for `npm run bench:tail`: it answers `200 ok`
// at once, except a fixed share of its requests that it answers after `slowMs` (the tail hedging
// is meant to cut) and, when told to, a fixed share that it fails (a reset without an answer, or
// a 503; what retries are meant to hide).
//
// Which requests are slow or fail is drawn from a seeded PRNG, and the share is exact rather than
// a coin flip per request: `slowPercent` 5 makes exactly one request of every block of 20 slow, at
// a position drawn anew per block. The tail is then the same size in every run and every phase
// (a Bernoulli draw over 3,000 requests varies by ±0.4 points, which moves the p95 a hedging
// delay is taken from across the knee of the distribution), and runs with the same seed see the
// same sequence, so two runs compare the proxy rather than the dice.
//
// It counts every request it receives (the proxy's upstream load) and how each ended.
// `GET /__stats` answers the counters as JSON; `GET /__mode?fail=none|reset|503&reset=1` sets
// the failure mode and zeroes the counters. Neither is counted.
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo, Socket } from 'node:net';

/** mulberry32: a small seeded PRNG with a period of 2^32, uniform in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

/**
 * A picker that says yes to exactly `percent` % of its calls: the calls are cut into blocks of
 * 100 ÷ gcd(percent, 100) (20 for 5 %, 10 for 10 %), and in each block percent ÷ gcd of the
 * positions, drawn with `rand`, answer true. `percent` is an integer 0-100.
 */
export function exactShare(percent: number, rand: () => number): () => boolean {
  if (!Number.isInteger(percent) || percent < 0 || percent > 100) throw new Error(`share must be an integer percentage 0-100, got ${percent}`);
  if (percent === 0) return () => false;
  const g = gcd(percent, 100);
  const block = 100 / g;
  const hits = percent / g;
  let chosen = new Set<number>();
  let pos = block;
  return () => {
    if (pos === block) {
      pos = 0;
      // Partial Fisher-Yates: the first `hits` entries of a shuffled 0..block-1.
      const idx = Array.from({ length: block }, (_, i) => i);
      for (let i = 0; i < hits; i++) {
        const j = i + Math.floor(rand() * (block - i));
        [idx[i], idx[j]] = [idx[j] as number, idx[i] as number];
      }
      chosen = new Set(idx.slice(0, hits));
    }
    return chosen.has(pos++);
  };
}

/** How a failing request fails: `reset` closes the connection (RST) without a byte of answer; `503` answers 503. */
export type FailMode = 'none' | 'reset' | '503';

/** Settings of one backend. */
export interface TailBackendOptions {
  /** Share of requests answered after `slowMs`, integer %. */
  readonly slowPercent: number;
  readonly slowMs: number;
  /** Share of requests failed when the mode is not `none`, integer %. */
  readonly failPercent: number;
  /** Seed of the PRNG (one per backend, so backends do not share a pattern). */
  readonly seed: number;
  /** Port on 127.0.0.1; 0 for any. */
  readonly port?: number;
}

/** What `GET /__stats` answers. */
export interface TailBackendStats {
  /** Requests received (counted on arrival): the upstream load. */
  readonly received: number;
  /** Answered 200 at once. */
  readonly fast: number;
  /** Answered 200 after `slowMs`. */
  readonly slow: number;
  /** Slow requests whose connection was closed before their answer (a hedge won elsewhere). */
  readonly abandoned: number;
  /** Failed on purpose (reset or 503). */
  readonly failed: number;
  readonly failMode: FailMode;
}

/** The running backend. */
export interface TailBackend {
  readonly port: number;
  stats(): TailBackendStats;
  setFailMode(mode: FailMode): void;
  resetStats(): void;
  close(): Promise<void>;
}

/** Starts the backend on 127.0.0.1 and resolves once it listens. */
export async function startTailBackend(o: TailBackendOptions): Promise<TailBackend> {
  // Two streams from one seed: the slow pattern stays the same whether failures are on or not.
  const slowRand = mulberry32(o.seed);
  const failRand = mulberry32(o.seed ^ 0x9e3779b9);
  const isSlow = exactShare(o.slowPercent, slowRand);
  let isFail = exactShare(o.failPercent, failRand);
  let failMode: FailMode = 'none';
  let c = { received: 0, fast: 0, slow: 0, abandoned: 0, failed: 0 };
  const stats = (): TailBackendStats => ({ ...c, failMode });
  const setFailMode = (mode: FailMode): void => {
    failMode = mode;
    // A fresh picker per mode: each failure phase starts at the head of the same sequence.
    isFail = exactShare(o.failPercent, mulberry32(o.seed ^ 0x9e3779b9));
  };
  const resetStats = (): void => {
    c = { received: 0, fast: 0, slow: 0, abandoned: 0, failed: 0 };
  };

  const server = http.createServer((req, res) => {
    const url = req.url ?? '/';
    if (url.startsWith('/__stats')) {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(stats()));
      return;
    }
    if (url.startsWith('/__mode')) {
      const q = new URL(url, 'http://x').searchParams;
      const mode = q.get('fail');
      if (mode === 'none' || mode === 'reset' || mode === '503') setFailMode(mode);
      if (q.get('reset') === '1') resetStats();
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(stats()));
      return;
    }
    c.received++;
    // The requests of this benchmark have no body; draining keeps the connection reusable if one comes.
    req.resume();
    if (failMode !== 'none' && isFail()) {
      c.failed++;
      if (failMode === 'reset') req.socket.resetAndDestroy();
      else res.writeHead(503, { 'content-type': 'text/plain', 'content-length': '4' }).end('fail');
      return;
    }
    if (isSlow()) {
      const timer = setTimeout(() => {
        c.slow++;
        res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '2' }).end('ok');
      }, o.slowMs);
      // The proxy gave up on this attempt (the hedge answered first): no answer to write.
      res.once('close', () => {
        if (res.writableFinished) return;
        clearTimeout(timer);
        c.abandoned++;
      });
      return;
    }
    c.fast++;
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '2' }).end('ok');
  });
  // Keep-alive connections live as long as the proxy wants them (its pool decides).
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 61_000;
  server.requestTimeout = 0;
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(o.port ?? 0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    stats,
    setFailMode,
    resetStats,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
