// Breakers a client cannot trip for everyone (issue 38, finding 2) and time-driven breaker state
// (finding 6), against real `edge-proxy serve` processes and real backends, over HTTP/1.1, HTTP/2
// and HTTP/3:
// - 30 requests the application answers 500 (what any client that makes it throw gets) open no
//   breaker: every one reaches the backend, none is shed; 502s and connection resets still open it;
// - with the operator's opt-in (`failure_statuses` listing 500) three 500s open it; left idle, it
//   shows half-open in the gauge and the snapshot once open_ms elapsed, without any request;
// - three backends all failing: at most max_ejection_percent (50 %: one) ejected, the two others
//   held closed and still serving, each refused opening counted and the first of each logged;
// - a `failure_statuses` entry that is no 5xx or a `max_ejection_percent` above 100 is refused by
//   `edge-proxy -c` (exit 1, one coded line each).
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { assertShed, breaker, metric, pollUntil, request, startProxy, SHED_BODY } from './support/overload.ts';
import type { Answer } from './support/overload.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const files = serviceFiles(t, 'edge-breaker-bounds-');
const RETRY_AFTER = 5;
/** No retries: each request is one attempt, so every breaker figure below is exact. */
const QUIET = `adaptive_admission: { enabled: false }, brownout: { enabled: false }, retry_budget: { max_attempts: 1 }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} }`;
const PERF = 'global_inflight_limit: 50, per_upstream_inflight_limit: 50, per_backend_inflight_limit: 50';
const isShed = (a: Answer): boolean => a.status === 503 && a.body === SHED_BODY.circuit_open;

t.test('default failure_statuses: 30 requests answered 500 open no breaker; 502s and resets still do', async (t) => {
  const app = await controlledBackend(t, 'app');
  app.set({ kind: 'status', status: 500 });
  const gw = await controlledBackend(t, 'gw');
  gw.set({ kind: 'status', status: 502 });
  const rst = await controlledBackend(t, 'rst');
  rst.set({ kind: 'reset' });
  const p = await startProxy(t, files, 'five-hundreds', {
    performance: PERF,
    upstream: `{ app: { route: { path_prefix: /app }, backends: [{ id: app, address: "127.0.0.1:${app.port}" }] }, gw: { route: { path_prefix: /gw }, backends: [{ id: gw, address: "127.0.0.1:${gw.port}" }] }, rst: { route: { path_prefix: /rst }, backends: [{ id: rst, address: "127.0.0.1:${rst.port}" }] } }`,
    // The defaults otherwise: failure_threshold 3, open_ms 30 s, failure_statuses [502, 503, 504].
    resilience: `{ ${QUIET} }`,
  });
  const rejected0 = await metric(p, 'svc_circuit_breaker_rejected_total');
  const answers: Answer[] = [];
  for (let i = 0; i < 30; i++) answers.push(await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/app/throw-${i}` }));
  t.same(
    answers.filter((a) => a.status !== 500 || a.body !== 'app status 500').map((a) => [a.status, a.body.slice(0, 60)]),
    [],
    '30 of 30 answered the application\'s own 500 (10 per protocol), none shed 503 EDGE_SHED_CIRCUIT_OPEN',
  );
  t.equal(app.arrivals.length, 30, 'all 30 reached the backend');
  t.equal((await breaker(p, 'app', 'app'))?.state, 'closed', 'snapshot: app closed');
  t.equal(await metric(p, 'svc_circuit_breaker_state', { upstream: 'app', backend: 'app' }), 0, 'svc_circuit_breaker_state 0');
  t.equal((await metric(p, 'svc_circuit_breaker_rejected_total')) - rejected0, 0, 'svc_circuit_breaker_rejected_total unchanged');
  for (const protocol of PROTOCOLS) t.equal((await request(p, protocol, { path: '/app/next' })).status, 500, `${protocol}: the 31st-33rd still reach the backend`);

  // Gateway failures still open it: three 502s, then shed.
  for (let i = 0; i < 3; i++) t.same((await request(p, PROTOCOLS[i] ?? 'h1', { path: `/gw/${i}` })).status, 502, `gw: 502 number ${i + 1}`);
  const gwOpen = await pollUntil(() => breaker(p, 'gw', 'gw'), (b) => b?.state === 'open', 2000);
  t.equal(gwOpen?.state, 'open', 'three 502s: gw open');
  for (const protocol of PROTOCOLS) assertShed(t, await request(p, protocol, { path: '/gw/after' }), 'circuit_open', RETRY_AFTER, `gw open, ${protocol}`);
  t.equal(gw.arrivals.length, 3, 'gw saw the three failures only');

  // And connection resets (transport failures): three, then shed.
  for (let i = 0; i < 3; i++) t.same((await request(p, PROTOCOLS[i] ?? 'h1', { path: `/rst/${i}` })).status, 502, `rst: reset number ${i + 1} answered 502`);
  t.equal((await pollUntil(() => breaker(p, 'rst', 'rst'), (b) => b?.state === 'open', 2000))?.state, 'open', 'three resets: rst open');
  assertShed(t, await request(p, 'h2', { path: '/rst/after' }), 'circuit_open', RETRY_AFTER, 'rst open');
  t.equal(rst.arrivals.length, 3, 'rst saw the three failures only');
  t.equal((await metric(p, 'svc_circuit_breaker_rejected_total')) - rejected0, 4, 'svc_circuit_breaker_rejected_total: the four sheds of gw and rst');
  t.equal((await breaker(p, 'app', 'app'))?.state, 'closed', 'app still closed');
});

t.test('opt-in failure_statuses with 500: three 500s open it; left idle it turns half-open at open_ms in gauge and snapshot, no request needed', async (t) => {
  const OPEN_MS = 1500;
  const app = await controlledBackend(t, 'opt');
  app.set({ kind: 'status', status: 500 });
  const p = await startProxy(t, files, 'opt-in', {
    performance: PERF,
    upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: opt, address: "127.0.0.1:${app.port}" }] } }`,
    resilience: `{ ${QUIET}, circuit_breaker: { failure_statuses: [500, 502, 503, 504], open_ms: ${OPEN_MS} } }`,
  });
  let third = 0;
  for (const protocol of PROTOCOLS) {
    third = performance.now();
    t.equal((await request(p, protocol, { path: `/boom-${protocol}` })).status, 500, `${protocol}: 500`);
  }
  const opened = await request(p, 'h1', { path: '/after' });
  assertShed(t, opened, 'circuit_open', RETRY_AFTER, 'the operator listed 500: three 500s opened it');
  const gauge = (): Promise<number> => metric(p, 'svc_circuit_breaker_state', { upstream: 'app', backend: 'opt' });
  t.equal(await gauge(), 2, 'gauge 2 (open)');
  t.equal((await breaker(p, 'app', 'opt'))?.state, 'open', 'snapshot open');
  const arrivals = app.arrivals.length;

  // No request from here on: only the metrics endpoint and the control API are read.
  const halfGauge = await pollUntil(gauge, (v) => v === 1, OPEN_MS + 5000, 50);
  const gaugeAt = performance.now();
  t.equal(halfGauge, 1, 'svc_circuit_breaker_state 1 (half-open) without any request');
  t.ok(gaugeAt - third >= OPEN_MS, `the gauge turned half-open ${(gaugeAt - third).toFixed(0)} ms after the third failure was sent (open_ms ${OPEN_MS})`);
  // The state is the supervisor's node breaker, the workers' count their latest heartbeats (one a
  // second): the snapshot is read until both say half-open.
  const half = await pollUntil(() => breaker(p, 'app', 'opt'), (b) => b?.state === 'half_open' && b.workers?.half_open === 1, 3000, 50);
  t.match(half, { state: 'half_open', workers: { half_open: 1 }, open_until_unix_ms: null }, 'snapshot: half_open, by the one worker');
  const line = await p.served.waitFor((l) => l['msg'] === 'circuit breaker half-open: open_ms elapsed, the next request probes the backend' && l['backend'] === 'opt', 3000);
  t.match(line, { level: 'info', upstream: 'app', backend: 'opt', from: 'open', to: 'half_open' }, 'one log line for the transition time made');
  t.equal(app.arrivals.length, arrivals, 'no request reached the backend meanwhile');

  // The next request is the probe: the backend recovered, so it closes.
  app.set({ kind: 'ok' });
  const probe = await request(p, 'h3', { path: '/probe' });
  t.same([probe.status, probe.body], [200, 'opt /probe'], 'the probe reached the backend and succeeded');
  t.equal(await pollUntil(gauge, (v) => v === 0, 3000), 0, 'gauge 0 (closed)');
});

t.test('three backends all failing: max_ejection_percent 50 ejects one, the two others are held closed and keep serving', async (t) => {
  const names = ['t1', 't2', 't3'] as const;
  const be = await Promise.all(names.map((n) => controlledBackend(t, n)));
  for (const b of be) b.set({ kind: 'status', status: 502 });
  const p = await startProxy(t, files, 'trio', {
    performance: PERF,
    upstream: `{ trio: { route: { path_prefix: / }, load_balancing: { type: round-robin }, backends: [${names.map((n, i) => `{ id: ${n}, address: "127.0.0.1:${be[i]?.port}" }`).join(', ')}] } }`,
    // open_ms far beyond the test: the one ejected stays open throughout.
    resilience: `{ ${QUIET}, circuit_breaker: { open_ms: 600000 } }`,
  });
  const answers: Answer[] = [];
  for (let i = 0; i < 30; i++) answers.push(await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/all-fail/${i}` }));
  t.same(answers.filter(isShed).length, 0, 'no request shed circuit_open');
  t.same(
    answers.filter((a) => a.status !== 502 || !/^t[123] status 502$/.test(a.body)).map((a) => [a.status, a.body.slice(0, 60)]),
    [],
    'all 30 answered by a backend (its own 502): the pool kept serving',
  );
  const views = await pollUntil(
    async () => Promise.all(names.map((n) => breaker(p, 'trio', n))),
    (v) => v.filter((b) => b?.state === 'open').length === 1,
    2000,
  );
  const states = views.map((v) => v?.state);
  t.same([states.filter((s) => s === 'open').length, states.filter((s) => s === 'closed').length], [1, 2], `snapshot: one open, two closed (${states.join(', ')})`);
  const ejected = names[states.indexOf('open')] as string;
  const heldNames = names.filter((n) => n !== ejected);
  const arrivals = Object.fromEntries(names.map((n, i) => [n, be[i]?.arrivals.length ?? 0]));
  t.equal(arrivals[ejected], 3, `the ejected backend (${ejected}) saw its three failures only`);
  t.equal(heldNames.reduce((n, k) => n + (arrivals[k] ?? 0), 0), 27, 'the two held ones took the other 27');
  // Each failure of a held backend from its third on was an opening refused.
  const capped = await metric(p, 'svc_circuit_breaker_ejections_capped_total', { upstream: 'trio' });
  t.equal(capped, 27 - 2 * 2, 'svc_circuit_breaker_ejections_capped_total{upstream="trio"} 23: 27 failures of the held two, less the first two of each');
  const holdLines = p.served.lines.filter((l) => l['msg'] === 'circuit breaker held closed: max_ejection_percent of the pool is already ejected, the failing backend keeps serving');
  t.same(
    holdLines.map((l) => [l['level'], l['upstream'], l['backend'], l['ejected'], l['pool_size'], l['max_ejection_percent']]).sort(),
    heldNames.map((n) => ['warn', 'trio', n, 1, 3, 50]).sort(),
    'one warn line per held backend, when it was first held',
  );
  t.equal(await metric(p, 'svc_circuit_breaker_state', { upstream: 'trio', backend: ejected }), 2, 'gauge: the ejected one 2');
  for (const n of heldNames) t.equal(await metric(p, 'svc_circuit_breaker_state', { upstream: 'trio', backend: n }), 0, `gauge: ${n} 0`);

  // The backends recover: the held ones serve at once (they were never ejected).
  for (const b of be) b.set({ kind: 'ok' });
  const after: Answer[] = [];
  for (let i = 0; i < 6; i++) after.push(await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/ok/${i}` }));
  t.same(after.map((a) => a.status), Array(6).fill(200), 'recovered: six 200s');
  t.same(new Set(after.map((a) => a.body.split(' ')[0])), new Set(heldNames), 'from the two held backends');
});

t.test('edge-proxy -c refuses breaker bounds out of range, one coded line each', async (t) => {
  const { leaf } = files;
  const base = `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${leaf.cert}, key: ${leaf.key} } }\nupstream:\n  api: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:9" }] }\n`;
  /** Exit status, the error lines (`path: CODE: message`) and the summary line after them. */
  const run = (name: string, resilience: string): { status: number | null; lines: string[]; summary: string } => {
    const file = path.join(files.dir, `${name}.yaml`);
    writeFileSync(file, `${base}resilience:\n${resilience}`);
    const r = spawnSync(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), '-c', file], { encoding: 'utf8', timeout: 30_000 });
    const all = r.stderr.split('\n').filter((l) => l.length > 0);
    return { status: r.status, lines: all.filter((l) => !l.startsWith(file)), summary: all.filter((l) => l.startsWith(file)).join(' | ') };
  };
  const bounds = run('breaker-bounds', '  circuit_breaker: { failure_statuses: [404, 500], max_ejection_percent: 101 }\n');
  t.equal(bounds.status, 1, 'failure_statuses [404], max_ejection_percent 101: exit 1');
  t.same(bounds.lines.map((l) => l.split(': ').slice(0, 2).join(': ')).sort(), ['resilience.circuit_breaker.failure_statuses[0]: EDGE_CONFIG_RANGE', 'resilience.circuit_breaker.max_ejection_percent: EDGE_CONFIG_RANGE'], bounds.lines.join('\n'));
  t.equal(bounds.summary, `${path.join(files.dir, 'breaker-bounds.yaml')}: invalid (2 errors)`, 'the summary line');
  const ok = run('breaker-ok', '  circuit_breaker: { failure_statuses: [500, 502, 503, 504, 599], max_ejection_percent: 100 }\n');
  t.equal(ok.status, 0, `every 5xx and 100 %: valid (${ok.lines.join(' | ')})`);
  const none = run('breaker-none', '  circuit_breaker: { failure_statuses: [], max_ejection_percent: 0 }\n');
  t.equal(none.status, 0, `no status and 0 %: valid (${none.lines.join(' | ')})`);
});
