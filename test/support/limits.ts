// What the rate-limit and quota end-to-end tests (issue 15) share: HTTP/2 connections whose worker
// is known, so a test with two workers can say how many requests each worker saw and admitted
// (the kernel's SO_REUSEPORT picks a worker per connection, and an HTTP/2 connection stays on the
// worker that accepted it); and the limit answers of the contract (429, Retry-After, the coded
// body).
import { admission, connectH2, pollUntil } from './overload.ts';
import type { ControlledBackend } from './controlled-backend.ts';
import type { Answer, H2Connection, Proxy } from './overload.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** An HTTP/2 connection to the proxy and the worker (slot) that serves it. */
export interface PinnedConnection extends H2Connection {
  readonly worker: number;
}

/**
 * The worker serving `conn`: a request held by `be` under `holdPath` shows up as in flight in that
 * worker's entry of the snapshot's admission block (fed by 100 ms heartbeats); then it is
 * released. Nothing else may be in flight meanwhile, and `holdPath` must be on a route no limit
 * or quota applies to.
 */
export async function workerOf(p: Proxy, be: ControlledBackend, conn: H2Connection, holdPath: string): Promise<number> {
  const before = be.arrivals.length;
  const answer = conn.request({ path: holdPath });
  await be.until(() => be.held === 1 && be.arrivals.length === before + 1, 'the probe held');
  const seen = await pollUntil(
    () => admission(p),
    (a) => a.inflight === 1 && a.workers.filter((w) => w.inflight === 1).length === 1,
    10_000,
  );
  const worker = seen.workers.find((w) => w.inflight === 1)?.worker;
  be.release();
  const a = await answer;
  if (a.status !== 200) throw new Error(`the probe on ${holdPath} answered ${a.status} ${a.error ?? a.body}`);
  if (worker === undefined) throw new Error(`no worker reported the probe in flight: ${JSON.stringify(seen)}`);
  // Wait for the heartbeat that shows it done, so the next probe is not confused with this one.
  await pollUntil(() => admission(p), (x) => x.inflight === 0, 10_000);
  return worker;
}

/**
 * Opens HTTP/2 connections until each of the `workers` workers serves `perWorker` of them (extra
 * ones landing on a worker already served are closed at teardown and not returned); at most 64
 * connections are tried. Returned in turn order: worker 0's first, worker 1's first, ...
 */
export async function connectionsOnEveryWorker(t: Teardown, p: Proxy, be: ControlledBackend, holdPath: string, workers: number, perWorker = 1): Promise<PinnedConnection[]> {
  const byWorker = new Map<number, PinnedConnection[]>();
  for (let tries = 0; tries < 64; tries++) {
    const full = [...byWorker.values()].filter((l) => l.length >= perWorker).length;
    if (byWorker.size === workers && full === workers) break;
    const conn = await connectH2(t, p);
    const worker = await workerOf(p, be, conn, `${holdPath}/${tries}`);
    const list = byWorker.get(worker) ?? [];
    if (list.length < perWorker) list.push({ worker, request: conn.request });
    byWorker.set(worker, list);
  }
  const lists = [...byWorker.entries()].sort(([a], [b]) => a - b).map(([, l]) => l);
  if (lists.length !== workers || lists.some((l) => l.length < perWorker)) throw new Error(`64 connections did not reach ${perWorker} on each of ${workers} workers: ${lists.map((l) => l.length).join(', ')}`);
  const out: PinnedConnection[] = [];
  for (let i = 0; i < perWorker; i++) for (const l of lists) out.push(l[i] as PinnedConnection);
  return out;
}

/** The body code of each limit answer: a scoped rate limit, a quota policy. */
export type LimitCode = 'EDGE_RATE_LIMITED' | 'EDGE_QUOTA_EXCEEDED';

interface Assertions {
  equal(found: unknown, wanted: unknown, message: string): unknown;
  ok(v: unknown, message: string): unknown;
}

/** Asserts that `a` is a 429 of `code` with a Retry-After of at least 1 s (and at most `maxRetryAfter` when given). */
export function assertLimited(t: Assertions, a: Answer, code: LimitCode, what: string, maxRetryAfter?: number): void {
  t.equal(a.status, 429, `${what}: 429${a.error === undefined ? '' : ` (error: ${a.error})`} (${a.body.trim().slice(0, 100)})`);
  const ra = Number(a.headers['retry-after']);
  t.ok(Number.isInteger(ra) && ra >= 1 && (maxRetryAfter === undefined || ra <= maxRetryAfter), `${what}: Retry-After ${a.headers['retry-after']} (an integer ≥ 1${maxRetryAfter === undefined ? '' : ` and ≤ ${maxRetryAfter}`})`);
  t.ok(a.body.trimEnd().endsWith(`(${code})`), `${what}: the body ends with (${code})`);
}

/** A status tally, e.g. `{ 200: 10, 429: 20 }`, with errors under `error`. */
export function statuses(answers: readonly Answer[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of answers) {
    const k = a.status === 0 ? 'error' : String(a.status);
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}
