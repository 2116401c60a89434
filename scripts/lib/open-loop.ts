// Open-loop HTTP load for overload benchmarks: each stream sends its requests on a fixed schedule
// (request k at start + k ÷ rate) whatever the answers. A closed loop (wrk, a fixed set of clients
// each waiting for its answer) slows down with the server and so hides overload; an open loop keeps
// offering the load a crowd of independent users would.
//
// Requests go over undici Pools (HTTP/1.1, one request per connection at a time), one Pool per
// stream so one stream's backlog never delays another's sends. Every request has a deadline
// (AbortSignal.timeout): a request the server never answers counts as a failure and a run always
// ends. The generator reports its own health (schedule lag, requests waiting for a connection,
// CPU) so a reader can tell whether it, rather than the server, was the bottleneck.
import diagnostics from 'node:diagnostics_channel';
import { performance } from 'node:perf_hooks';
// The undici our data plane runs (one copy, at the repository root).
import { Pool } from 'undici';
import { percentile } from './bench-load.ts';

/** One stream of requests: a path asked at a fixed rate. */
export interface Stream {
  readonly name: string;
  readonly path: string;
  /** Requests per second; 0 sends none. */
  readonly rate: number;
  readonly pool: Pool;
}

/** How one request ended. */
export interface Outcome {
  /** `ok` 2xx; `shed` 503 with Retry-After; `status` any other answer; `error` no answer (timeout, reset). */
  readonly kind: 'ok' | 'shed' | 'status' | 'error';
  readonly status: number;
  /** Shed: the reason named by the body's code (`EDGE_SHED_QUEUE_FULL` → `queue_full`), else `uncoded: <body text>`. Error: its code or name. */
  readonly detail: string;
  /** From the request's write on a connection to the end of the response body, ms (from the send if it was never written). */
  readonly latencyMs: number;
  /** From the scheduled time to the send, ms: this process's own delay (its event loop). */
  readonly lagMs: number;
  /** From the send to the request's write on a connection, ms: the wait for a free (or new) connection. */
  readonly connWaitMs: number;
  /** The answer said `connection: close`: the client's next request needs a new connection (TLS handshake). */
  readonly closed: boolean;
  /** When the request was due (performance.now(), ms): places it in time within the run. */
  readonly scheduledAt: number;
}

/** What one open-loop run measured (the warm-up left out). */
export interface RunResult {
  /** Outcomes per stream name, of requests scheduled after the warm-up. */
  readonly outcomes: ReadonlyMap<string, readonly Outcome[]>;
  /** 2xx answers received inside the measured window per stream name (whenever their request was sent): goodput × seconds. */
  readonly okInWindow: ReadonlyMap<string, number>;
  /** Length of the measured window, s. */
  readonly seconds: number;
  /** Requests sent per stream name, warm-up included (to compare with what a server received over the whole run). */
  readonly sent: ReadonlyMap<string, number>;
  /** The generator's health over the measured window. */
  readonly generator: GeneratorHealth;
}

/** Whether the load generator kept its schedule. */
export interface GeneratorHealth {
  /** p99 and max of the lag (scheduled time → send), ms. */
  readonly lagP99Ms: number;
  readonly lagMaxMs: number;
  /** p99 of the wait for a connection (send → write), ms. */
  readonly connWaitP99Ms: number;
  /** Most requests waiting for a free connection in any one Pool at once (sampled every 50 ms). */
  readonly maxWaitingForConnection: number;
  /** Most connections open at once, all Pools together (each new one is a TLS handshake for the server). */
  readonly maxConnections: number;
  /** Connections opened during the measured window, per second (undici's `undici:client:connected`). */
  readonly newConnectionsPerSec: number;
  /** CPU of this process over the window, % of one core. */
  readonly cpuPercent: number;
}

/** Options of a run. */
export interface RunOptions {
  readonly warmupSeconds: number;
  readonly seconds: number;
  /** Per-request deadline, ms. */
  readonly deadlineMs: number;
  /** Called every ~500 ms while requests are sent (e.g. to sample a process's memory). */
  readonly onSample?: () => void;
}

/** A Pool of up to `connections` HTTP/1.1 connections to `origin`, trusting `ca` for `servername`. */
export function loadPool(origin: string, connections: number, ca: Buffer, servername: string, deadlineMs: number): Pool {
  // undici 8 offers h2 in ALPN by default (allowH2): the proxy would take it and multiplex
  // everything over a handful of connections, which is not the HTTP/1.1 load asked for.
  return new Pool(origin, { allowH2: false, connections, pipelining: 1, connect: { ca, servername }, headersTimeout: deadlineMs, bodyTimeout: deadlineMs, keepAliveTimeout: 30_000, keepAliveMaxTimeout: 30_000 });
}

const SHED_CODE = /\((EDGE_SHED_[A-Z_]+)\)/;
/** Body bytes kept to read a shed code (the shed bodies are about 80 bytes). */
const BODY_KEPT = 256;

/**
 * One GET over `pool.dispatch` (no response stream: cheaper per request than `request()`, which
 * matters at 1,600 req/s). Latency runs from the moment undici writes the request on a connection
 * (`onRequestStart`) to the end of the answer, so time spent waiting for a free connection in the
 * generator is not charged to the server; that wait is counted apart (`maxWaitingForConnection`).
 * The deadline runs from the send, queue included: it also ends a request that never got a connection.
 */
export function send(pool: Pool, path: string, deadlineMs: number, scheduled: number): Promise<Outcome> {
  const queued = performance.now();
  const lagMs = queued - scheduled;
  return new Promise((resolve) => {
    let started = NaN;
    let status = 0;
    let retryAfter = false;
    let body = '';
    let done = false;
    let controller: { abort(reason: Error): void } | undefined;
    let closed = false;
    const finish = (o: Omit<Outcome, 'lagMs' | 'connWaitMs' | 'latencyMs' | 'closed' | 'scheduledAt'>): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const now = performance.now();
      const written = Number.isNaN(started) ? now : started;
      resolve({ ...o, latencyMs: now - (Number.isNaN(started) ? queued : started), lagMs, connWaitMs: written - queued, closed, scheduledAt: scheduled });
    };
    const timer = setTimeout(() => {
      finish({ kind: 'error', status: 0, detail: 'deadline' });
      controller?.abort(new Error('deadline'));
    }, deadlineMs);
    pool.dispatch({ path, method: 'GET', headers: { host: 'localhost' } }, {
      onRequestStart(c) {
        // Past its deadline while it waited for a connection: already counted, not sent.
        if (done) c.abort(new Error('deadline'));
        controller = c;
        started = performance.now();
      },
      onResponseStart(_c, statusCode, headers) {
        status = statusCode;
        retryAfter = headers['retry-after'] !== undefined;
        closed = headers['connection'] === 'close';
      },
      onResponseData(_c, chunk) {
        if (body.length < BODY_KEPT) body += chunk.toString('latin1');
      },
      onResponseEnd() {
        if (status >= 200 && status < 300) return finish({ kind: 'ok', status, detail: '' });
        if (status === 503 && retryAfter) {
          const code = SHED_CODE.exec(body)?.[1];
          // A 503 + Retry-After without a shed code (today's "no healthy backend" when every
          // backend is at its in-flight limit) is named by the start of its body text.
          const detail = code === undefined ? `uncoded: ${body.replace(/^503 Service Unavailable: /, '').trim().slice(0, 40)}` : code.slice('EDGE_SHED_'.length).toLowerCase();
          return finish({ kind: 'shed', status, detail });
        }
        finish({ kind: 'status', status, detail: String(status) });
      },
      onResponseError(_c, err) {
        const e = err as { code?: string; name?: string };
        finish({ kind: 'error', status: 0, detail: e.code ?? e.name ?? 'error' });
      },
    });
  });
}

/**
 * Opens up to `n` connections on `pool` before a run, by sending `n` requests for `path` at once
 * (a path the server answers itself, e.g. an unrouted one, so nothing behind it is disturbed).
 * Without this the pool opens connections while the load runs, and each new one is a TLS
 * handshake on both sides: a burst of them stalls this process, the stall turns into a burst of
 * sends, which opens more connections, and the run measures handshakes instead of the server.
 * Resolves with the number of connections open afterwards.
 */
export async function warmConnections(pool: Pool, n: number, path: string, deadlineMs: number): Promise<number> {
  await Promise.all(Array.from({ length: n }, () => pool.request({ path, method: 'GET', signal: AbortSignal.timeout(deadlineMs) }).then((r) => r.body.dump(), () => undefined)));
  return pool.stats.connected;
}

/**
 * Sends every stream at its rate for `warmupSeconds + seconds`, then waits for the last answers
 * (each bounded by the deadline). A 1 ms timer sends whatever has come due since the last tick,
 * each request stamped with its scheduled time, so a late tick delays sends (counted as lag) but
 * never drops them.
 */
export async function runOpenLoop(streams: readonly Stream[], o: RunOptions): Promise<RunResult> {
  const start = performance.now();
  const measureFrom = start + o.warmupSeconds * 1000;
  const end = measureFrom + o.seconds * 1000;
  const pending: Array<Promise<void>> = [];
  const outcomes = new Map<string, Outcome[]>(streams.map((s) => [s.name, []]));
  const okInWindow = new Map<string, number>(streams.map((s) => [s.name, 0]));
  const sentCount = streams.map(() => 0);
  const lags: number[] = [];
  const waits: number[] = [];
  let maxWaiting = 0;
  let maxConnected = 0;
  let lastSample = start;
  let lastPoolSample = start;
  let cpuAtMeasure: NodeJS.CpuUsage | undefined;
  let connects = 0;
  let measuring = false;
  // Published by this process's undici for every connection it opens (the proxy's is another process).
  const onConnected = (): void => {
    if (measuring) connects++;
  };
  diagnostics.subscribe('undici:client:connected', onConnected);

  await new Promise<void>((resolve) => {
    const tick = (): void => {
      const now = performance.now();
      if (cpuAtMeasure === undefined && now >= measureFrom) {
        cpuAtMeasure = process.cpuUsage();
        measuring = true;
      }
      streams.forEach((s, i) => {
        if (s.rate <= 0) return;
        for (;;) {
          const scheduled = start + ((sentCount[i] as number) * 1000) / s.rate;
          if (scheduled > now || scheduled >= end) break;
          sentCount[i] = (sentCount[i] as number) + 1;
          const measured = scheduled >= measureFrom;
          pending.push(send(s.pool, s.path, o.deadlineMs, scheduled).then((r) => {
            const at = performance.now();
            if (r.kind === 'ok' && at >= measureFrom && at < end) okInWindow.set(s.name, (okInWindow.get(s.name) ?? 0) + 1);
            if (!measured) return;
            (outcomes.get(s.name) as Outcome[]).push(r);
            lags.push(r.lagMs);
            waits.push(r.connWaitMs);
          }));
        }
      });
      if (now >= measureFrom && now - lastPoolSample >= 50) {
        lastPoolSample = now;
        for (const s of streams) maxWaiting = Math.max(maxWaiting, s.pool.stats.pending);
        maxConnected = Math.max(maxConnected, streams.reduce((sum, s) => sum + s.pool.stats.connected, 0));
      }
      if (o.onSample !== undefined && now - lastSample >= 500) {
        lastSample = now;
        o.onSample();
      }
      if (now >= end) resolve();
      else setTimeout(tick, 1);
    };
    tick();
  });
  const cpu = process.cpuUsage(cpuAtMeasure);
  const wall = performance.now() - measureFrom;
  measuring = false;
  diagnostics.unsubscribe('undici:client:connected', onConnected);
  await Promise.all(pending);
  lags.sort((a, b) => a - b);
  waits.sort((a, b) => a - b);
  return {
    outcomes,
    okInWindow,
    seconds: o.seconds,
    sent: new Map(streams.map((s, i) => [s.name, sentCount[i] as number])),
    generator: {
      lagP99Ms: percentile(lags, 0.99),
      lagMaxMs: lags.at(-1) ?? NaN,
      connWaitP99Ms: percentile(waits, 0.99),
      maxWaitingForConnection: maxWaiting,
      maxConnections: maxConnected,
      newConnectionsPerSec: connects / (wall / 1000),
      cpuPercent: ((cpu.user + cpu.system) / 1000 / wall) * 100,
    },
  };
}
