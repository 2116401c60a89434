// What bounds the fail-open of external authorization (issue 38, finding 6): a real `edge-proxy
// serve` (one worker), a real authorization service on loopback that holds every call (a service
// made slow by the flood) or answers 500 (test/support/authz-service.ts), a real backend, clients
// over HTTP/1.1, HTTP/2 and HTTP/3. `max_pending` caps the calls a worker keeps waiting: the
// requests beyond are decided by `failure_mode` at once, without a call (under `allow`: the
// attacker's flood is let through, which is why `deny` is the default and the recommendation);
// `fail_open_per_second` bounds what failures let through under `allow`.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { request } from './support/overload.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import { authCounters, moved, pool, shown, startAuthProxy } from './support/idp.ts';
import { authzServer } from './support/authz-service.ts';
import type { Answer } from './support/overload.ts';

const files = serviceFiles(t, 'edge-auth-bound-');
const be = await controlledBackend(t, 'ext');
const authz = await authzServer(t);
// `/<pool>/...`: the pools `hold*` never get an answer (until the proxy gives up), `err` gets 500.
authz.decide = (call) => (String(call.body['path'] ?? '').startsWith('/err') ? { kind: 'status', status: 500 } : { kind: 'hold' });

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
