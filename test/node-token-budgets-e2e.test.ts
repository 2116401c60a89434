// Node-wide token budgets end to end (issue 39, Deliver 2 and "Must show"): a real `edge-proxy
// serve` with 4 workers (on this 2-core machine), the budgets in the supervisor's token ledger and
// leased to the workers. A scoped rate limit of `burst: 5` admits exactly 5 whatever the load
// shape: 20 requests each on a new HTTP/1.1 connection (the kernel spreads them over the
// workers), 20 at once on one HTTP/2 connection, 20 at once on one HTTP/3 connection (one worker
// takes them all). `max_connections_per_source: 8` keeps exactly 8 idle connections from one
// source for the node (TLS and QUIC), and a closed one gives its slot back to the node. A frozen
// supervisor (SIGSTOP): a worker keeps spending the tokens its lease holds and sheds a key it
// holds none of with 503 `EDGE_SHED_LEASE_UNAVAILABLE` after the bounded wait, never admitting
// past its lease; full service after SIGCONT.
import t from 'tap';
import tls from 'node:tls';
import { Http3ClientSession } from '@edge-proxy/http3';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { connectH2, connectH3, metric, pollUntil, request, startProxy } from './support/overload.ts';
import { assertLimited, statuses } from './support/limits.ts';
import { pools } from './support/bursts.ts';
import type { Answer, Proxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-token-budgets-');
const WORKERS = 4;
const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';
const LIMITS = 'global_inflight_limit: 1000, per_upstream_inflight_limit: 1000, per_backend_inflight_limit: 1000';

/** Pools named after their path prefix (`/<name>`), all on `be`; YAML flow style. */

t.test('burst 5, 1 req/s, 4 workers: exactly 5 x 200 and 15 x 429 spread over 20 connections, on one HTTP/2 connection and on one HTTP/3 connection', async (t) => {
  const be = await controlledBackend(t, 'tb');
  // One route and one limit per shape: each shape starts from a full bucket of 5.
  const shapes = ['spread', 'h2', 'h3'] as const;
  const p = await startProxy(t, files, 'tb-burst', {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be, shapes),
    resilience: `{ ${QUIET}, rate_limits: [${shapes.map((s) => `{ name: five-${s}, routes: [${s}], key: client_ip, requests_per_second: 1, burst: 5 }`).join(', ')}] }`,
  });
  const limitedBefore = await metric(p, 'svc_request_rate_limited');
  for (const shape of shapes) {
    const h2 = shape === 'h2' ? await connectH2(t, p) : undefined;
    const h3 = shape === 'h3' ? await connectH3(t, p) : undefined;
    const t0 = performance.now();
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i): Promise<Answer> => {
        const o = { path: `/${shape}/${i}` };
        return h2?.request(o) ?? h3?.request(o) ?? request(p, 'h1', o);
      }),
    );
    const elapsed = performance.now() - t0;
    // One token a second: the 20 must be decided within the second after the first, or a sixth token exists.
    t.ok(elapsed < 1000, `${shape}: the 20 were answered within the second a token takes (${elapsed.toFixed(0)} ms)`);
    t.same(statuses(answers), { 200: 5, 429: 15 }, `${shape}: exactly 5 served, 15 limited`);
    t.equal(be.arrivalsUnder(`/${shape}/`).length, 5, `${shape}: exactly 5 reached the backend`);
    const limited = answers.filter((a) => a.status === 429);
    for (const a of limited.slice(0, 2)) assertLimited(t, a, 'EDGE_RATE_LIMITED', `${shape}: a refused one`, 1);
  }
  t.equal((await metric(p, 'svc_request_rate_limited')) - limitedBefore, 45, 'svc_request_rate_limited +45, summed over the workers');
});

/** Opens a TLS connection (ALPN h2) from 127.0.0.1 and keeps it idle: resolves with it once the handshake is done, or undefined if the proxy closed it. */
function idleTls(p: Proxy, t: { teardown(fn: () => unknown): void }): Promise<tls.TLSSocket | undefined> {
  return new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port: p.lport, servername: 'localhost', ca: p.ca, ALPNProtocols: ['h2'] });
    t.teardown(() => s.destroy());
    s.once('secureConnect', () => resolve(s));
    s.once('error', () => resolve(undefined));
    s.once('close', () => resolve(undefined));
  });
}

/** Whether `s` is closed by the proxy within `ms` (a refused connection is closed when the supervisor's answer comes). */
function closedWithin(s: tls.TLSSocket, ms: number): Promise<boolean> {
  if (s.destroyed) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    s.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

t.test('max_connections_per_source 8, 4 workers: 20 idle TLS connections from one source leave exactly 8 open node-wide; a closed one gives its slot back; over QUIC too', async (t) => {
  const be = await controlledBackend(t, 'cs');
  const p = await startProxy(t, files, 'tb-conns', { workers: WORKERS, performance: `${LIMITS}, max_connections_per_source: 8`, upstream: pools(be, ['app']), resilience: `{ ${QUIET} }` });
  const rejectsBefore = await metric(p, 'svc_connection_cap_rejects');
  const sockets = await Promise.all(Array.from({ length: 20 }, () => idleTls(p, t)));
  // A connection refused after its handshake is closed when the answer comes: wait for each one's fate (the lease wait is 1 s).
  const closed = await Promise.all(sockets.map((s) => (s === undefined ? Promise.resolve(true) : closedWithin(s, 3000))));
  const open = sockets.filter((s, i): s is tls.TLSSocket => s !== undefined && !closed[i]);
  t.equal(open.length, 8, `exactly 8 of 20 kept open (${closed.filter(Boolean).length} closed)`);
  t.equal((await metric(p, 'svc_connection_cap_rejects')) - rejectsBefore, 12, 'svc_connection_cap_rejects +12, summed over the workers');
  t.equal(await metric(p, 'svc_active_connections'), 8, 'svc_active_connections: 8 on the node');

  // One closes: its slot goes back to the node, whichever worker held it; the next new one is kept, the one after refused.
  (open[0] as tls.TLSSocket).destroy();
  // The gauge is a worker's count at a scrape: polled (bounded) until the close is seen.
  const waitActive = (n: number): Promise<number> => pollUntil(() => metric(p, 'svc_active_connections'), (v) => v === n, 5000);
  await waitActive(7);
  const again = await idleTls(p, t);
  t.ok(again !== undefined && !(await closedWithin(again, 1000)), 'a new connection is kept after one closed');
  const ninth = await idleTls(p, t);
  t.ok(ninth === undefined || (await closedWithin(ninth, 3000)), 'and the one after it is refused: 8 again');

  // QUIC: the same source is at its cap (8 TCP connections): a QUIC session is refused too (closed
  // by the proxy with H3_EXCESSIVE_LOAD, 0x107), and admitted once TCP ones close.
  const quic = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 5000 });
  t.teardown(() => quic.close(true).catch(() => undefined));
  const info = await new Promise<{ by: string; code: number | undefined } | undefined>((resolve) => {
    const timer = setTimeout(() => resolve(undefined), 5000);
    quic.once('close', (i: { by: string; code: number | undefined }) => {
      clearTimeout(timer);
      resolve(i);
    });
  });
  t.same(info && { by: info.by, code: info.code }, { by: 'peer', code: 0x107 }, 'a QUIC connection from the source at its cap is closed by the proxy: H3_EXCESSIVE_LOAD');
  for (const s of [...open.slice(1), again]) s?.destroy();
  await waitActive(0);
  const h3 = await connectH3(t, p);
  const a = await h3.request({ path: '/app/h3' });
  t.equal(a.status, 200, 'with the TCP connections closed, a QUIC connection is served');
});

t.test('a frozen supervisor: a worker spends the tokens its lease holds, sheds a key it holds none of with 503 EDGE_SHED_LEASE_UNAVAILABLE after the bounded wait; all served again after SIGCONT', async (t) => {
  const be = await controlledBackend(t, 'fz');
  // burst 400 on 4 workers: a block of 50, so a busy key's lease holds tokens ahead.
  const p = await startProxy(t, files, 'tb-frozen', {
    workers: WORKERS,
    performance: LIMITS,
    upstream: pools(be, ['app']),
    resilience: `{ ${QUIET}, rate_limits: [{ name: per-tenant, routes: [app], key: "header:x-tenant", key_fallback: none, requests_per_second: 100, burst: 400 }] }`,
  });
  const conn = await connectH2(t, p);
  const hot = { 'x-tenant': 'hot' };
  for (let i = 0; i < 3; i++) t.equal((await conn.request({ path: `/app/warm/${i}`, headers: hot })).status, 200, `warm-up ${i}`);
  const pid = p.served.proc.pid as number;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  t.teardown(() => {
    if (!resumed) process.kill(pid, 'SIGCONT');
  });
  const held = await Promise.all(Array.from({ length: 10 }, (_, i) => conn.request({ path: `/app/held/${i}`, headers: hot })));
  t.same(statuses(held), { 200: 10 }, "10 requests of the hot key served from the worker's lease while the supervisor is stopped");
  const t0 = performance.now();
  const cold = await conn.request({ path: '/app/cold', headers: { 'x-tenant': 'cold' } });
  const waited = performance.now() - t0;
  t.equal(cold.status, 503, `a key the lease holds nothing of: 503 (${cold.body.trim().slice(0, 80)})`);
  t.ok(cold.body.trimEnd().endsWith('(EDGE_SHED_LEASE_UNAVAILABLE)'), 'coded EDGE_SHED_LEASE_UNAVAILABLE');
  t.ok(waited >= 990 && waited < 3000, `after the bounded wait of 1 s (${waited.toFixed(0)} ms)`);
  t.equal(be.arrivalsUnder('/app/cold').length, 0, 'it never reached the backend');
  process.kill(pid, 'SIGCONT');
  resumed = true;
  // Until the supervisor's late answer arrives, the key's ask is still out: shed at once, never admitted.
  let again: Answer | undefined;
  let shedAfter = 0;
  for (let i = 0; i < 200; i++) {
    again = await conn.request({ path: `/app/cold/${i}`, headers: { 'x-tenant': 'cold' } });
    if (again.status === 200) break;
    if (again.status === 503 && again.body.trimEnd().endsWith('(EDGE_SHED_LEASE_UNAVAILABLE)')) shedAfter++;
  }
  t.equal(again?.status, 200, `served again once the supervisor answers (${shedAfter} more shed before its answer came)`);
  t.equal(await metric(p, 'svc_overload_shed_by_reason_total', { reason: 'lease_unavailable' }), 1 + shedAfter, 'every one counted as a lease_unavailable shed');
});
