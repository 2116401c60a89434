// The retry budget is the node's (issue 39, Deliver 2): a real `edge-proxy serve` with 4 workers
// (on this 2-core machine); each route's window lives in the supervisor (controlplane
// limits/window-ledger.ts) and the workers take retries from leases of it (docs/retries.md "The
// retry budget"). A backend that answers every request 503 (retryable), `max_attempts: 2`, so
// every primary wants one retry:
// - `ratio_percent: 0`: only the floor applies, 30 retries per 10 s window for the node, whatever
//   the worker count: requests until the backend has seen 30 retries, then 20 more that get none:
//   exactly N primaries + 30 retries, not 4 × 30, over new HTTP/1.1 connections (the kernel
//   spreads them over the workers) and on one HTTP/2 connection;
// - `per_route_ratio_percent` applies per route and live: a route at 50 % retries past the floor
//   and never past 30 + 50 % of its primaries, its neighbour at 0 % exactly the floor; an
//   activation raising the neighbour to 100 % lets it retry again within the same window.
// The traffic of each case stays inside one 10 s window (asserted), so the figures are exact.
import t from 'tap';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { activate, connectH2, request, startProxy } from './support/overload.ts';
import { moved, retryCounters } from './support/retries.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Answer } from './support/overload.ts';

const files = serviceFiles(t, 'edge-node-retry-');
const WORKERS = 4;
/** The retry budget's floor per route and window (MIN_RETRIES_PER_WINDOW, RETRY_FLOOR). */
const FLOOR = 30;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const LIMITS = 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000';
/** The budget's window, ms: every case's traffic must fit in it with room to spare. */
const WINDOW_MS = 10_000;

/** Pools named after their path prefix (`/<name>`), all on `be`; YAML flow style. */
const pools = (be: ControlledBackend, names: readonly string[]): string => `{ ${names.map((n) => `${n}: { route: { path_prefix: /${n} }, backends: [{ id: ${be.name}, address: "127.0.0.1:${be.port}" }] }`).join(', ')} }`;

/** Sends `n` requests on `route` one after another, each on a new HTTP/1.1 connection or on `h2`; their answers. */
async function sequential(p: Parameters<typeof request>[0], route: string, from: number, n: number, h2?: { request: (o: { path: string }) => Promise<Answer> }): Promise<Answer[]> {
  const out: Answer[] = [];
  for (let i = from; i < from + n; i++) {
    const o = { path: `/${route}/${i}` };
    out.push(await (h2?.request(o) ?? request(p, 'h1', o)));
  }
  return out;
}

/**
 * Sends requests on `route` one after another (each on a new HTTP/1.1 connection, or on `h2`) until
 * the backend has seen `FLOOR` retries of them, or `deadline` (performance.now()) passes; then
 * `after` more. Requests that fail while units are held unspent by other workers are refused, so
 * the floor is reached past its 30th request; the ones after must add none. The number sent.
 */
async function pastTheFloor(p: Parameters<typeof request>[0], be: ControlledBackend, route: string, deadline: number, after: number, h2?: { request: (o: { path: string }) => Promise<Answer> }): Promise<{ sent: number; bad: string[]; reached: number }> {
  const bad: string[] = [];
  let sent = 0;
  const one = async (): Promise<void> => {
    const a = await (h2?.request({ path: `/${route}/${sent}` }) ?? request(p, 'h1', { path: `/${route}/${sent}` }));
    sent++;
    if (a.status !== 503) bad.push(`${a.status} ${a.error ?? ''}`);
  };
  while (be.arrivalsUnder(`/${route}/`).length - sent < FLOOR && performance.now() < deadline && sent < 400) await one();
  const reached = be.arrivalsUnder(`/${route}/`).length - sent;
  for (let i = 0; i < after; i++) await one();
  return { sent, bad, reached };
}

t.test('ratio_percent 0, 4 workers: exactly the floor of 30 retries per window for the node, spread over new connections and on one HTTP/2 connection', async (t) => {
  const be = await controlledBackend(t, 'rf');
  be.set({ kind: 'status', status: 503 });
  const shapes = ['spread', 'h2'] as const;
  const p = await startProxy(t, files, 'retry-floor', {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be, shapes),
    resilience: `{ ${QUIET}, retry_budget: { ratio_percent: 0, max_attempts: 2 } }`,
  });
  // Each shape has its own route, so its own window.
  const AFTER = 20;
  for (const shape of shapes) {
    const h2 = shape === 'h2' ? await connectH2(t, p) : undefined;
    const before = await retryCounters(p);
    const t0 = performance.now();
    const { sent, bad, reached } = await pastTheFloor(p, be, shape, t0 + 7000, AFTER, h2);
    t.comment(`${shape}: ${reached} retries after ${sent - AFTER} requests, ${be.arrivalsUnder(`/${shape}/`).length - sent} after ${sent}`);
    const elapsed = performance.now() - t0;
    t.ok(elapsed < WINDOW_MS - 1500, `${shape}: the ${sent} requests took ${elapsed.toFixed(0)} ms, inside one 10 s window`);
    t.same(bad, [], `${shape}: every answer is the backend's 503 (the retry's, or the primary's when refused)`);
    const d = moved(await retryCounters(p), before);
    t.equal(be.arrivalsUnder(`/${shape}/`).length, sent + FLOOR, `${shape}: the backend saw exactly ${sent} primaries + ${FLOOR} retries, the last ${AFTER} requests none (4 workers, not 4 × ${FLOOR})`);
    t.equal(d['svc_retries_total'], FLOOR, `${shape}: svc_retries_total +${FLOOR}, summed over the workers`);
    t.equal(d['svc_retry_denied_total{reason="budget_exhausted"}'], sent - FLOOR, `${shape}: the other ${sent - FLOOR} denied budget_exhausted`);
    t.equal(d['svc_retry_denied_total{reason="max_attempts"}'], FLOOR, `${shape}: each retry's 503 denied max_attempts (max_attempts 2)`);
  }
});

t.test('per_route_ratio_percent per route and live: a route at 50 % retries past the floor, never past 30 + 50 % of its primaries; its 0 % neighbour only the floor; an activation raises the neighbour', async (t) => {
  const be = await controlledBackend(t, 'rr');
  be.set({ kind: 'status', status: 503 });
  const p = await startProxy(
    t,
    files,
    'retry-per-route',
    { workers: WORKERS, performance: LIMITS, upstream: pools(be, ['zero', 'half']), resilience: `{ ${QUIET}, retry_budget: { ratio_percent: 0, max_attempts: 2, per_route_ratio_percent: { half: 50 } } }` },
    'operator',
  );
  // One HTTP/2 connection: one worker, and fast enough for the whole case to fit in one window.
  const h2 = await connectH2(t, p);
  const t0 = performance.now();
  const N = 120;
  // `half`: every primary wants a retry; the node allows 30 + 50 % of the primaries it has heard of
  // (an empty window is asked again within 100 ms, as deposits come in).
  const half = await sequential(p, 'half', 0, N, h2);
  t.same(half.filter((a) => a.status !== 503).length, 0, 'half: every answer 503');
  const retried = be.arrivalsUnder('/half/').length - N;
  t.ok(retried > FLOOR && retried <= FLOOR + N / 2, `half (50 %): ${retried} retries for ${N} primaries: past the floor of ${FLOOR}, within ${FLOOR} + 50 % = ${FLOOR + N / 2}`);
  // `zero`: only the floor.
  const zero = await pastTheFloor(p, be, 'zero', performance.now() + 3000, 20, h2);
  t.equal(be.arrivalsUnder('/zero/').length, zero.sent + FLOOR, `zero (ratio_percent 0): ${zero.sent} primaries + the floor of ${FLOOR}, the last 20 none`);

  // Live: `zero` raised to 100 %. Its window holds its 30 retries and its primaries: 30 + 100 % of
  // them allows each of the next 40 a retry (at 0 % none, and even a new window only 30).
  await activate(t, p, 'retry-per-route-2', p.configText.replace('per_route_ratio_percent: { half: 50 }', 'per_route_ratio_percent: { half: 50, zero: 100 }'), 2);
  const arrived = be.arrivalsUnder('/zero/').length;
  const before = await retryCounters(p);
  await sequential(p, 'zero', zero.sent, 40, h2);
  const after = be.arrivalsUnder('/zero/').length - arrived - 40;
  t.ok(after > 0 && after <= 40, `zero after the activation: ${after} of 40 requests retried (none at 0 % in this window)`);
  t.equal(moved(await retryCounters(p), before)['svc_retries_total'], after, 'svc_retries_total moved as much');
  const elapsed = performance.now() - t0;
  t.ok(elapsed < WINDOW_MS - 1500, `the case took ${elapsed.toFixed(0)} ms, inside one 10 s window`);
});
