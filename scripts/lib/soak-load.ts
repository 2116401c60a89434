// Open-loop load for `npm run bench:soak`, one per protocol, each counting what it sent, what came
// back 2xx and what failed (by reason) in a Tally the soak reads and resets once a minute:
// - HTTP/1.1 over TLS: open-loop.ts's `send` on an undici Pool (ALPN http/1.1 only).
// - HTTP/2: node:http2 client sessions, requests spread over them round-robin; a session that
//   closed (GOAWAY, reset) is replaced at the next request.
// - HTTP/3: `gtlsclient -n N` runs (one QUIC connection of N request streams each), started on a
//   schedule so the runs add up to the rate; a failure is a stream without a complete 2xx answer.
// Request k of a load is due at start + k ÷ rate whatever the answers (an open loop), and every
// request has a deadline, so a load always ends.
import http2 from 'node:http2';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import type { Pool } from 'undici';
import { okStreams } from './gtlsclient-log.ts';
import { send } from './open-loop.ts';

/** What a load counted since the last `take()`. */
export interface TallyCounts {
  readonly sent: number;
  readonly ok: number;
  readonly failed: number;
  /** Failures by reason (status code, error code, `deadline`). */
  readonly failures: Readonly<Record<string, number>>;
}

/** The sum of two tallies' counts, failures merged by reason. */
export function addCounts(a: TallyCounts, b: TallyCounts): TallyCounts {
  const failures: Record<string, number> = { ...a.failures };
  for (const [k, v] of Object.entries(b.failures)) failures[k] = (failures[k] ?? 0) + v;
  return { sent: a.sent + b.sent, ok: a.ok + b.ok, failed: a.failed + b.failed, failures };
}

/** Counts of one load; a request counts as sent when due and as ok or failed when it ends. */
export class Tally {
  private sent = 0;
  private ok = 0;
  private failed = 0;
  private failures: Record<string, number> = {};

  addSent(n = 1): void {
    this.sent += n;
  }

  /** `n` requests ended: 2xx when `failure` is undefined, else failed for that reason. */
  addEnded(failure: string | undefined, n = 1): void {
    if (n <= 0) return;
    if (failure === undefined) {
      this.ok += n;
      return;
    }
    this.failed += n;
    this.failures[failure] = (this.failures[failure] ?? 0) + n;
  }

  /** The counts since the last call, and a fresh start. */
  take(): TallyCounts {
    const out = { sent: this.sent, ok: this.ok, failed: this.failed, failures: this.failures };
    this.sent = 0;
    this.ok = 0;
    this.failed = 0;
    this.failures = {};
    return out;
  }
}

/** A running load. */
export interface Load {
  readonly tally: Tally;
  /** Stops sending and resolves once every request sent has ended (each within its deadline). */
  stop(): Promise<void>;
}

/** Scheduler tick, ms: at a few hundred req/s a tick sends one or two requests. */
const TICK_MS = 5;

/**
 * Calls `fire` at `rate` per second (in batches of `batch`: each call stands for that many
 * requests) until stopped; `fire` resolves when its requests ended.
 */
function openLoop(rate: number, batch: number, fire: () => Promise<void>): { stop(): Promise<void> } {
  const start = performance.now();
  const pending = new Set<Promise<void>>();
  let k = 0;
  let timer: NodeJS.Timeout | undefined;
  const tick = (): void => {
    const now = performance.now();
    while (start + (k * batch * 1000) / rate <= now) {
      k++;
      const p = fire().finally(() => pending.delete(p));
      pending.add(p);
    }
    timer = setTimeout(tick, TICK_MS);
  };
  if (rate > 0) tick();
  return {
    async stop() {
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
      await Promise.all([...pending]);
    },
  };
}

/** HTTP/1.1 over TLS: GET `path` on `pool` at `rate` req/s. */
export function h1Load(pool: Pool, path: string, rate: number, deadlineMs: number): Load {
  const tally = new Tally();
  const loop = openLoop(rate, 1, async () => {
    tally.addSent();
    const o = await send(pool, path, deadlineMs, performance.now());
    tally.addEnded(o.kind === 'ok' ? undefined : o.detail || o.kind);
  });
  return { tally, stop: () => loop.stop() };
}

/** One HTTP/2 GET; resolves undefined on a complete 2xx answer, else the failure's reason. */
function h2Get(session: http2.ClientHttp2Session, path: string, deadlineMs: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    let status = 0;
    let done = false;
    let req: http2.ClientHttp2Stream;
    const finish = (failure: string | undefined): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(failure);
    };
    const timer = setTimeout(() => {
      finish('deadline');
      req?.close(http2.constants.NGHTTP2_CANCEL);
    }, deadlineMs);
    try {
      req = session.request({ ':path': path, ':authority': 'localhost' });
    } catch (err) {
      finish((err as { code?: string }).code ?? 'request refused');
      return;
    }
    req.on('response', (h) => (status = Number(h[':status'])));
    req.on('data', () => undefined);
    req.on('end', () => finish(status >= 200 && status < 300 ? undefined : String(status)));
    req.on('error', (err: { code?: string }) => finish(err.code ?? 'error'));
    req.on('close', () => finish(`stream closed, rst ${req.rstCode}`));
  });
}

/** HTTP/2 load: `sessions` connections to `origin`, GET `path` at `rate` req/s over them. */
export function h2Load(origin: string, ca: Buffer, sessions: number, path: string, rate: number, deadlineMs: number): Load & { readonly reconnects: () => number } {
  const tally = new Tally();
  const open: (http2.ClientHttp2Session | undefined)[] = Array.from({ length: sessions }, () => undefined);
  let reconnects = -sessions; // the first connection of each slot is not a reconnect
  const session = (i: number): http2.ClientHttp2Session => {
    const s = open[i];
    if (s !== undefined && !s.closed && !s.destroyed) return s;
    reconnects++;
    const fresh = http2.connect(origin, { ca, servername: 'localhost' });
    fresh.on('error', () => undefined); // its requests fail with the error; the slot reconnects
    open[i] = fresh;
    return fresh;
  };
  let next = 0;
  const loop = openLoop(rate, 1, async () => {
    tally.addSent();
    const i = next++ % sessions;
    tally.addEnded(await h2Get(session(i), path, deadlineMs));
  });
  return {
    tally,
    reconnects: () => Math.max(0, reconnects),
    async stop() {
      await loop.stop();
      await Promise.all(open.map((s) => (s === undefined || s.closed ? undefined : new Promise<void>((r) => s.close(() => r())))));
    },
  };
}

/**
 * HTTP/3 load: a `gtlsclient -n streams` run (one QUIC connection) every streams ÷ rate s, each
 * killed at `deadlineMs`. Runs overlap when one takes longer than the spacing (an open loop).
 */
export function h3Load(host: string, port: number, path: string, rate: number, streams: number, deadlineMs: number): Load & { readonly children: ReadonlySet<ChildProcess> } {
  const tally = new Tally();
  const children = new Set<ChildProcess>();
  const run = (): Promise<void> =>
    new Promise((resolve) => {
      tally.addSent(streams);
      const args = ['--no-quic-dump', '--no-http-dump', '--exit-on-all-streams-close', `--timeout=${Math.ceil(deadlineMs / 1000)}s`, '-n', String(streams), host, String(port), `https://localhost:${port}${path}`];
      const p = spawn('gtlsclient', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      children.add(p);
      let log = '';
      p.stdout.on('data', (d: Buffer) => (log += d.toString()));
      p.stderr.on('data', (d: Buffer) => (log += d.toString()));
      let killed = false;
      const timer = setTimeout(() => {
        killed = true;
        p.kill('SIGKILL');
      }, deadlineMs);
      p.on('error', () => undefined); // 'close' follows (spawn failure: no stream ok)
      p.on('close', (code) => {
        clearTimeout(timer);
        children.delete(p);
        const ok = okStreams(log);
        tally.addEnded(undefined, ok);
        tally.addEnded(killed ? 'deadline' : code === 0 ? 'no 2xx answer' : `gtlsclient exit ${code ?? 'signal'}`, streams - ok);
        resolve();
      });
    });
  const loop = openLoop(rate, streams, run);
  return { tally, children, stop: () => loop.stop() };
}
