// What bounds the fail-open of external authorization (issue 38, finding 6): a real `edge-proxy
// serve` (one worker), a real authorization service on loopback that holds every call (a service
// made slow by the flood) or answers 500 (test/support/authz-service.ts), a real backend, clients
// over HTTP/1.1, HTTP/2 and HTTP/3. `max_pending` caps the calls a worker keeps waiting: the
// requests beyond are decided by `failure_mode` at once, without a call (under `allow`: the
// attacker's flood is let through, which is why `deny` is the default and the recommendation);
// `fail_open_per_second` bounds what failures let through under `allow`. It is the node's (issue
// 39): on 4 workers, a failing service lets exactly `fail_open_per_second` through for the whole
// node however the requests spread over the workers, the pool's own and `default_auth`'s alike;
// a supervisor that does not answer the lease denies.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { admission, connectH2, request } from './support/overload.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import { authCounters, moved, pool, shown, startAuthProxy } from './support/idp.ts';
import { authzServer } from './support/authz-service.ts';
import type { Answer } from './support/overload.ts';
import type { AuthProxy } from './support/idp.ts';

const files = serviceFiles(t, 'edge-auth-bound-');
const be = await controlledBackend(t, 'ext');
const authz = await authzServer(t);
// `/<pool>/...`: the pools `hold*` never get an answer (until the proxy gives up), `err` and `frz` get 500; the others are held until the test releases them.
authz.decide = (call) => (/^\/(err|frz)\//.test(String(call.body['path'] ?? '')) ? { kind: 'status', status: 500 } : { kind: 'hold' });

/** A 503 EDGE_AUTH_UNAVAILABLE (the coded answer's body ends with its code). */
const unavailable = (a: Answer): boolean => a.status === 503 && a.body.trimEnd().endsWith('(EDGE_AUTH_UNAVAILABLE)');

const external = (failureMode: 'allow' | 'deny', more: string): string => `auth: { external: { url: "${authz.url}", timeout_ms: 3000, failure_mode: ${failureMode}${more} } }`;
const p = await startAuthProxy(t, files, 'auth-bound', {
  upstream: `{ ${[pool('holda', be.port, external('allow', ', max_pending: 8')), pool('holdd', be.port, external('deny', ', max_pending: 8')), pool('err', be.port, external('allow', ', fail_open_per_second: 5'))].join(', ')} }`,
});

/** `n` requests at once to `/<prefix>/<i>`, spread over h1, h2 and h3; each answer with the ms it took. */
async function flood(prefix: string, n: number): Promise<{ a: Answer; ms: number }[]> {
  const t0 = performance.now();
  return Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const a = await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/${prefix}/${i}` });
      return { a, ms: performance.now() - t0 };
    }),
  );
}

t.test('failure_mode allow, max_pending 8, a service that never answers: 30 requests at once make 8 calls; the 22 beyond are forwarded at once unchecked (overflow), the 8 after timeout_ms', async (t) => {
  const before = await authCounters(p);
  const out = await flood('holda', 30);
  const fast = out.filter((o) => o.ms < 2500);
  t.equal(authz.callsFor('/holda/').length, 8, 'the service received 8 calls, not 30: max_pending bounds its load');
  t.equal(fast.length, 22, '22 answered before timeout_ms (3000 ms): decided without a call');
  t.ok(out.every((o) => o.a.status === 200), `all 30 forwarded (allow): ${[...new Set(out.map((o) => o.a.status))].join(', ')}`);
  t.equal(be.arrivals.filter((x) => x.path.startsWith('/holda/')).length, 30, 'the backend served all 30: under allow the flood decides');
  t.same(moved(await authCounters(p), before), { 'external overflow': 22, 'external timeout': 8 }, 'svc_external_auth_overflow +22, svc_external_auth_timeout +8, nothing allowed by the service');
  const warned = await p.served.waitFor((l) => l['upstream'] === 'holda' && l['cause'] === 'overflow', 5000);
  t.match(warned, { level: 'warn', failure_mode: 'allow', msg: /has max_pending calls waiting: requests allowed/ }, 'the warn line says the overflow let requests through');
});

t.test('failure_mode deny, max_pending 8: the same flood is answered 503 EDGE_AUTH_UNAVAILABLE, 22 at once; 8 calls; the backend sees none', async (t) => {
  const before = await authCounters(p);
  const out = await flood('holdd', 30);
  t.equal(authz.callsFor('/holdd/').length, 8, 'the service received 8 calls');
  t.ok(out.every((o) => unavailable(o.a)), `all 30 answered 503 EDGE_AUTH_UNAVAILABLE: ${[...new Set(out.map((o) => shown(o.a)))].join(' | ')}`);
  t.equal(out.filter((o) => o.ms < 2500).length, 22, '22 of them at once');
  t.equal(be.arrivals.filter((x) => x.path.startsWith('/holdd/')).length, 0, 'the backend saw none');
  t.same(moved(await authCounters(p), before), { 'external overflow': 22, 'external timeout': 8 });
});

t.test('failure_mode allow, fail_open_per_second 5, a service answering 500: of 40 requests in a row, 5 + 5/s are let through, the rest 503; the backend sees exactly those', async (t) => {
  const before = await authCounters(p);
  const t0 = performance.now();
  const answers: Answer[] = [];
  for (let i = 0; i < 40; i++) answers.push(await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/err/${i}` }));
  const elapsed = (performance.now() - t0) / 1000;
  const allowed = answers.filter((a) => a.status === 200).length;
  const refused = answers.filter(unavailable).length;
  t.equal(allowed + refused, 40, `every answer 200 or 503 EDGE_AUTH_UNAVAILABLE: ${[...new Set(answers.map((a) => (unavailable(a) ? '503' : shown(a))))].join(' | ')}`);
  t.ok(allowed >= 5 && allowed <= 5 + Math.ceil(5 * elapsed), `${allowed} let through in ${elapsed.toFixed(2)} s: at most the burst 5 + 5/s (${5 + Math.ceil(5 * elapsed)})`);
  t.ok(refused >= 40 - 5 - Math.ceil(5 * elapsed), `${refused} refused`);
  t.equal(be.arrivals.filter((x) => x.path.startsWith('/err/')).length, allowed, 'the backend saw exactly the requests let through');
  t.same(moved(await authCounters(p), before), { 'external error': 40, 'external fail_open_refused': refused }, 'svc_external_auth_error +40, svc_external_auth_fail_open_refused + the refused');
  t.ok(p.served.lines.some((l) => l['upstream'] === 'err' && typeof l['msg'] === 'string' && l['msg'].startsWith('external authorization failed: requests')), 'a warn line for the failing service');
});

t.test('fail_open_per_second with failure_mode deny is refused by validation (EDGE_CONFIG_JWT): it would do nothing', async (t) => {
  const file = path.join(files.dir, 'fail-open-deny.yaml');
  writeFileSync(file, p.configText.replace('failure_mode: allow, fail_open_per_second: 5', 'failure_mode: deny, fail_open_per_second: 5'));
  const r = await runEdgeProxy(['-c', file]);
  t.equal(r.code, 1, 'exit 1');
  t.match(r.stdout + r.stderr, /upstream\.err\.auth\.external\.fail_open_per_second: EDGE_CONFIG_JWT: /, 'the key and the code named');
  writeFileSync(file, p.configText);
  t.equal((await runEdgeProxy(['-c', file])).code, 0, 'the file as served validates');
});

/**
 * `n` requests to `/<prefix>/<i>` at once, each on a new connection (HTTP/1.1, HTTP/2, HTTP/3 in
 * turn, so the kernel spreads them over the workers); once the service holds all `n` calls, it
 * answers them 500 together, so the workers decide the failures together: the node's bucket
 * grants its burst and nothing more as long as they are decided within the 1/rate a token takes
 * to refill (200 ms at 5/s; a machine loaded enough to spread them wider lets the contract's
 * refill through). The answers, and when the first and the last refusal came after the release.
 */
async function failTogether(q: AuthProxy, prefix: string, n: number): Promise<{ answers: Answer[]; refusedMs: string }> {
  let t0 = 0;
  const refusedAt: number[] = [];
  const pending = Array.from({ length: n }, async (_, i) => {
    const a = await request(q, PROTOCOLS[i % 3] ?? 'h1', { path: `/${prefix}/${i}`, timeoutMs: 30_000 });
    if (a.status === 503) refusedAt.push(performance.now() - t0);
    return a;
  });
  try {
    await authz.until(() => authz.callsFor(`/${prefix}/`).length === n, `holding the ${n} calls of /${prefix}/`, 30_000);
  } catch (err) {
    authz.release(`/${prefix}/`, 500);
    const early = (await Promise.all(pending)).map((a) => `${a.status} ${a.error ?? ''} ${a.body.slice(0, 60)}`);
    throw new Error(`${(err as Error).message}: ${authz.callsFor(`/${prefix}/`).length} held; answers: ${[...new Set(early)].join(' | ')}`, { cause: err });
  }
  t0 = performance.now();
  const released = authz.release(`/${prefix}/`, 500);
  const answers = await Promise.all(pending);
  if (released !== n) throw new Error(`released ${released} held calls of /${prefix}/, not ${n}`);
  return { answers, refusedMs: refusedAt.length === 0 ? 'none refused' : `refusals answered ${Math.min(...refusedAt).toFixed(0)} to ${Math.max(...refusedAt).toFixed(0)} ms after the release` };
}

t.test('fail_open_per_second is the node\'s: 4 workers, a service failing 40 requests spread over new connections at once: exactly 5 let through node-wide, 35 answered 503; default_auth\'s budget (3) too; a frozen supervisor denies', async (t) => {
  const files4 = serviceFiles(t, 'edge-auth-bound-node-');
  // Held calls wait for the release, well within timeout_ms.
  const allowWithin = (failOpen: number): string => `{ url: "${authz.url}", timeout_ms: 20000, failure_mode: allow, fail_open_per_second: ${failOpen} }`;
  const q = await startAuthProxy(t, files4, 'auth-bound-node', {
    workers: 4,
    upstream: `{ ${[pool('fo', be.port, `auth: { external: ${allowWithin(5)} }`), pool('frz', be.port, `auth: { external: ${allowWithin(5)} }`), pool('dflt', be.port)].join(', ')} }`,
    extra: `default_auth: { external: ${allowWithin(3)} }`,
  });
  const budgets = (await admission(q)).token_budgets.filter((b) => b.budget.startsWith('auth-fo:')).map((b) => ({ budget: b.budget, rate: b.rate, burst: b.burst }));
  t.same(
    budgets.sort((a, b) => a.budget.localeCompare(b.budget)),
    [
      { budget: 'auth-fo:dflt', rate: 3, burst: 3 },
      { budget: 'auth-fo:fo', rate: 5, burst: 5 },
      { budget: 'auth-fo:frz', rate: 5, burst: 5 },
    ],
    "the supervisor's token ledger holds one fail-open budget per pool: the pool's own fail_open_per_second, or default_auth's",
  );

  for (const [prefix, n, burst] of [['fo', 40, 5], ['dflt', 20, 3]] as const) {
    const before = await authCounters(q);
    const { answers, refusedMs } = await failTogether(q, prefix, n);
    const allowed = answers.filter((a) => a.status === 200).length;
    const refused = answers.filter(unavailable).length;
    t.equal(allowed + refused, n, `${prefix}: every answer 200 or 503 EDGE_AUTH_UNAVAILABLE: ${[...new Set(answers.map((a) => (unavailable(a) ? '503' : shown(a))))].join(' | ')}`);
    t.equal(allowed, burst, `${prefix}: exactly ${burst} let through by failure for the node (${refusedMs}), not ${burst} per worker`);
    t.equal(refused, n - burst, `${prefix}: ${n - burst} answered 503`);
    t.equal(be.arrivals.filter((x) => x.path.startsWith(`/${prefix}/`)).length, burst, `${prefix}: the backend saw exactly the ${burst}`);
    t.same(moved(await authCounters(q), before), { 'external error': n, 'external fail_open_refused': n - burst }, `${prefix}: svc_external_auth_error +${n}, svc_external_auth_fail_open_refused +${n - burst}, summed over the workers`);
  }

  // A supervisor that does not answer: the worker's lease of auth-fo:frz is empty, the failure waits
  // LEASE_WAIT_MS (1 s) for the lease and is denied, counted as refused. The HTTP/2 connection is
  // opened first: a new connection would need the connection budgets of the stopped supervisor.
  const conn = await connectH2(t, q);
  const before = await authCounters(q);
  const pid = q.served.proc.pid as number;
  process.kill(pid, 'SIGSTOP');
  let resumed = false;
  t.teardown(() => {
    if (!resumed) process.kill(pid, 'SIGCONT');
  });
  const t0 = performance.now();
  const frozen = await conn.request({ path: '/frz/frozen' });
  const waited = performance.now() - t0;
  process.kill(pid, 'SIGCONT');
  resumed = true;
  t.ok(unavailable(frozen), `the failure, with no answer from the supervisor: 503 EDGE_AUTH_UNAVAILABLE (${shown(frozen)})`);
  t.ok(waited >= 990 && waited < 5000, `after the bounded lease wait of 1 s (${waited.toFixed(0)} ms)`);
  t.equal(be.arrivals.filter((x) => x.path === '/frz/frozen').length, 0, 'it never reached the backend');
  // Until the supervisor's late answer reaches the worker, the key's ask is still out: denied at once.
  let again: Answer | undefined;
  let deniedAfter = 0;
  for (let i = 0; i < 200; i++) {
    again = await conn.request({ path: `/frz/after/${i}` });
    if (again.status === 200) break;
    if (unavailable(again)) deniedAfter++;
  }
  t.equal(again?.status, 200, `once the supervisor answers, a failure is allowed from the budget again (${deniedAfter} more denied before its answer came)`);
  t.same(moved(await authCounters(q), before), { 'external error': deniedAfter + 2, 'external fail_open_refused': deniedAfter + 1 }, 'every failure counted as an error; the ones the lease did not answer as fail_open_refused');
});
