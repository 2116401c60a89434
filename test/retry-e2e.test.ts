// Retries, request-body replay and response prebuffering end to end (issue 14, "Must show"): a
// real `edge-proxy serve` (one worker: the retry budget is per route per worker), real HTTP/1.1
// backends whose behaviour the test sets per path (test/support/controlled-backend.ts), clients
// over HTTP/1.1, HTTP/2 and HTTP/3. Pools balance by consistent hashing on `x-key`
// (test/support/retries.ts), so each request's first attempt goes to the backend the test chose
// and every figure is exact. The circuit breaker is disabled unless a test is about it: a backend
// that fails every request stays eligible, so each request meets it. This file: a 100 kB PUT
// replayed byte-exact after a reset (after the body, and in the middle of the upload); a body over
// request_buffer_bytes not retried; POST and PATCH never retried, the idempotent methods are; a
// backend 503 discarded and retried, or forwarded with max_attempts 1; a headers timeout and a
// refused connection retried; no backend left (breakers open); a dead pool bounded by the budget,
// and per_route_ratio_percent; the response prebuffer (a failure inside it retried, past its size
// or 200 ms committed and not retried, text/event-stream never held). Hedging: hedge-e2e.test.ts;
// memory with 1,000 bodies held: replay-memory.test.ts.
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { controlledBackend, sha256 } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { connectH2, request, send, startProxy } from './support/overload.ts';
import { HASH_HEADER, hashedPool, keyOwnedBy, moved, retryCounters } from './support/retries.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';
import type { Answer, StartedProxy } from './support/overload.ts';
import type { Test } from 'tap';

const files = serviceFiles(t, 'edge-retry-');

/** request_buffer_bytes of these tests: a 100 kB body is replayable, a 300 kB one is not. */
const BUFFER = 262_144;
/** response_prebuffer_bytes of these tests. */
const PREBUFFER = 16_384;

const QUIET = 'adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }';

/** A proxy with one pool `app` (path /) over `a` then `b`, hashed on x-key; `retryBudget` and `timeouts` are YAML flow maps. */
function proxyOver(t: Test, name: string, a: ControlledBackend, b: ControlledBackend, retryBudget = '{}', timeouts = '{}'): Promise<StartedProxy> {
  return startProxy(t, files, name, {
    performance: `global_inflight_limit: 100, per_upstream_inflight_limit: 100, per_backend_inflight_limit: 100, timeouts: ${timeouts}, body: { request_buffer_bytes: ${BUFFER}, response_prebuffer_bytes: ${PREBUFFER} }`,
    upstream: `{ ${hashedPool('app', '/', [a, b])} }`,
    resilience: `{ ${QUIET}, retry_budget: ${retryBudget} }`,
  });
}

const shown = (a: Answer): string => `${a.status}${a.error === undefined ? '' : ` (${a.error})`} ${a.body.slice(0, 80)}`;

t.test('a 100 kB PUT whose first backend resets after reading it is replayed byte-exact on the other, over h1, h2 and h3', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'reset-after-body' }, '/put/');
  rb.set({ kind: 'echo-sha256' }, '/put/');
  const p = await proxyOver(t, 'put-replay', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  const sent: Record<string, string> = {};
  for (const protocol of PROTOCOLS) {
    const body = randomBytes(100_000);
    sent[protocol] = sha256(body);
    const a = await request(p, protocol, { method: 'PUT', path: `/put/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol }, body });
    t.equal(a.status, 200, `${protocol}: 200 (${shown(a)})`);
    t.equal(a.headers['x-backend'], 'rb', `${protocol}: answered by rb, the backend not tried yet`);
    t.equal(a.body, sent[protocol], `${protocol}: rb read exactly the bytes sent (its answer is their SHA-256)`);
  }
  t.same(
    ra.arrivalsUnder('/put/').map((x) => x.seq),
    ['h1', 'h2', 'h3'],
    'ra (the key owner) got each PUT once, first',
  );
  t.same(
    ra.bodies.filter((x) => x.path.startsWith('/put/')).map((x) => [x.seq, x.bytes, x.sha256]),
    PROTOCOLS.map((pr) => [pr, 100_000, sent[pr]]),
    'ra read each whole body before it reset the connection',
  );
  t.same(
    rb.bodies.filter((x) => x.path.startsWith('/put/')).map((x) => [x.seq, x.bytes, x.sha256]),
    PROTOCOLS.map((pr) => [pr, 100_000, sent[pr]]),
    'rb got each PUT once, the retry, with the same 100,000 bytes',
  );
  for (const pr of PROTOCOLS) {
    const first = ra.arrivalsUnder(`/put/${pr}`)[0];
    const retry = rb.arrivalsUnder(`/put/${pr}`)[0];
    t.ok(first !== undefined && retry !== undefined && first.at < retry.at, `${pr}: the retry reached rb after the first attempt reached ra`);
  }
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 3, 'svc_retry_attempts_total{reason="transport"}': 3 }, 'three retries, reason transport; nothing denied or rejected');
});

t.test('a PUT whose first backend resets in the middle of the upload is retried: the part kept is replayed, the rest follows from the client', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'reset-after-bytes', bytes: 50_000 }, '/mid/');
  rb.set({ kind: 'echo-sha256' }, '/mid/');
  const p = await proxyOver(t, 'put-mid-upload', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const full = randomBytes(100_000);
    // 60,000 bytes, then nothing until the retry has reached rb: the retry starts with the
    // client's upload unfinished, and the last 40,000 bytes reach the proxy only then.
    async function* chunks(): AsyncGenerator<Buffer> {
      yield full.subarray(0, 60_000);
      await rb.until(() => rb.arrivalsUnder(`/mid/${protocol}`).length === 1, `${protocol}: the retry on rb`);
      yield full.subarray(60_000);
    }
    const a = await request(p, protocol, { method: 'PUT', path: `/mid/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol }, body: { length: full.length, chunks: chunks() } });
    t.same([a.status, a.headers['x-backend'], a.body], [200, 'rb', sha256(full)], `${protocol}: rb read the whole 100,000 bytes, byte-exact (${shown(a)})`);
  }
  t.same(
    ra.arrivalsUnder('/mid/').map((x) => x.seq),
    ['h1', 'h2', 'h3'],
    'ra got each PUT once, first',
  );
  t.same(ra.bodies.filter((x) => x.path.startsWith('/mid/')), [], 'ra never read a body to its end');
  t.same(
    rb.bodies.filter((x) => x.path.startsWith('/mid/')).map((x) => [x.seq, x.bytes]),
    PROTOCOLS.map((pr) => [pr, 100_000]),
    'rb read each once, whole',
  );
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 3, 'svc_retry_attempts_total{reason="transport"}': 3 }, 'three retries, reason transport');
});

t.test('a PUT body over request_buffer_bytes streams and is not retried: 502, body_not_buffered', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  for (const be of [ra, rb]) be.set({ kind: 'reset-after-body' }, '/big/');
  const p = await proxyOver(t, 'put-big', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const body = randomBytes(300_000);
    const a = await request(p, protocol, { method: 'PUT', path: `/big/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol }, body });
    t.equal(a.status, 502, `${protocol}: the client gets the 502 (${shown(a)})`);
    t.equal(ra.bodies.find((x) => x.seq === protocol)?.sha256, sha256(body), `${protocol}: ra read the whole streamed body (${BUFFER} bytes would have been buffered) before it reset`);
  }
  t.same(
    ra.arrivalsUnder('/big/').map((x) => x.seq),
    ['h1', 'h2', 'h3'],
    'ra got each PUT once',
  );
  t.same(rb.arrivalsUnder('/big/'), [], 'rb never saw them: not retried');
  t.same(
    moved(await retryCounters(p), before),
    { 'svc_retry_denied_total': 3, 'svc_retry_denied_total{reason="body_not_buffered"}': 3, svc_request_buffer_limit_rejects: 3 },
    'three retries wanted and denied for body_not_buffered, three buffer limit rejects, no retry',
  );
});

t.test('request_buffer_bytes is inclusive: a body of exactly that size is replayed, one byte more is not', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'reset-after-body' }, '/edge/');
  rb.set({ kind: 'echo-sha256' }, '/edge/');
  const p = await proxyOver(t, 'put-edge', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  const exact = randomBytes(BUFFER);
  const a = await request(p, 'h2', { method: 'PUT', path: '/edge/exact', headers: { [HASH_HEADER]: key, 'x-seq': 'exact' }, body: exact });
  t.same([a.status, a.body], [200, sha256(exact)], `${BUFFER} bytes: replayed on rb, byte-exact (${shown(a)})`);
  const over = await request(p, 'h2', { method: 'PUT', path: '/edge/over', headers: { [HASH_HEADER]: key, 'x-seq': 'over' }, body: randomBytes(BUFFER + 1) });
  t.equal(over.status, 502, `${BUFFER + 1} bytes: not replayed, 502 (${shown(over)})`);
  t.same(
    rb.arrivalsUnder('/edge/').map((x) => x.seq),
    ['exact'],
    'rb saw the exact one only',
  );
  t.same(
    moved(await retryCounters(p), before),
    { svc_retries_total: 1, 'svc_retry_attempts_total{reason="transport"}': 1, svc_retry_denied_total: 1, 'svc_retry_denied_total{reason="body_not_buffered"}': 1, svc_request_buffer_limit_rejects: 1 },
    'one retry, one denial body_not_buffered',
  );
});

t.test('POST, with and without a body, is never retried: 502, the other backend never sees it', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'reset-after-body' }, '/post/');
  rb.set({ kind: 'echo-sha256' }, '/post/');
  const p = await proxyOver(t, 'post', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  const seqs: string[] = [];
  for (const protocol of PROTOCOLS) {
    for (const body of [randomBytes(10_000), undefined]) {
      const seq = `${protocol}-${body === undefined ? 'empty' : 'body'}`;
      seqs.push(seq);
      const a = await request(p, protocol, { method: 'POST', path: `/post/${seq}`, headers: { [HASH_HEADER]: key, 'x-seq': seq }, ...(body === undefined ? {} : { body }) });
      t.equal(a.status, 502, `${seq}: 502 (${shown(a)})`);
    }
  }
  t.same(
    ra.arrivalsUnder('/post/').map((x) => x.seq),
    seqs,
    'ra saw exactly one arrival per POST',
  );
  t.same(rb.arrivalsUnder('/post/'), [], 'rb never saw any');
  t.same(moved(await retryCounters(p), before), {}, 'no retry, and none denied: a POST never wants one');
});

t.test('GET, HEAD, OPTIONS, PUT and DELETE are retried after a reset; POST and PATCH never', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'reset-after-body' }, '/m/');
  const p = await proxyOver(t, 'methods', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  const statuses: Record<string, number> = {};
  for (const method of ['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE', 'POST', 'PATCH']) {
    const a = await request(p, 'h2', { method, path: `/m/${method}`, headers: { [HASH_HEADER]: key, 'x-seq': method }, ...(['PUT', 'POST', 'PATCH'].includes(method) ? { body: randomBytes(1000) } : {}) });
    statuses[method] = a.status;
    if (a.status === 200) t.equal(a.headers['x-backend'], 'rb', `${method}: answered by rb`);
  }
  t.same(statuses, { GET: 200, HEAD: 200, OPTIONS: 200, PUT: 200, DELETE: 200, POST: 502, PATCH: 502 }, 'idempotent methods retried to a 200, POST and PATCH 502');
  t.same(
    ra.arrivalsUnder('/m/').map((x) => x.seq),
    ['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE', 'POST', 'PATCH'],
    'each reached ra once',
  );
  t.same(
    rb.arrivalsUnder('/m/').map((x) => x.seq),
    ['GET', 'HEAD', 'OPTIONS', 'PUT', 'DELETE'],
    'only the idempotent ones reached rb',
  );
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 5, 'svc_retry_attempts_total{reason="transport"}': 5 }, 'five retries, reason transport');
});

t.test('a headers timeout and a refused connection are retried on the other backend', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'hold' }, '/slow/');
  const p = await proxyOver(t, 'timeout-refused', ra, rb, '{}', '{ connect_ms: 500, backend_request_ms: 500 }');
  const key = await keyOwnedBy(p, ra, '/probe');
  let before = await retryCounters(p);
  const a = await request(p, 'h1', { path: '/slow/1', headers: { [HASH_HEADER]: key, 'x-seq': 'slow' } });
  t.same([a.status, a.headers['x-backend'], a.body], [200, 'rb', 'rb /slow/1'], `no answer head from ra within backend_request_ms: rb's answer (${shown(a)})`);
  t.equal(ra.abandoned, 1, "ra saw the attempt's connection closed before it answered");
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 1, 'svc_retry_attempts_total{reason="headers_timeout"}': 1 }, 'one retry, reason headers_timeout');

  await ra.stop();
  before = await retryCounters(p);
  const r = await request(p, 'h1', { path: '/gone/1', headers: { [HASH_HEADER]: key, 'x-seq': 'gone' } });
  t.same([r.status, r.headers['x-backend'], r.body], [200, 'rb', 'rb /gone/1'], `ra refuses connections: rb's answer (${shown(r)})`);
  const d = moved(await retryCounters(p), before);
  t.comment(`refused: moved ${JSON.stringify(d)}`);
  t.equal(d['svc_retries_total'], 1, 'one retry');
  t.equal(Object.entries(d).filter(([k]) => k.startsWith('svc_retry_attempts_total{')).reduce((n, [, v]) => n + v, 0), 1, 'counted under one reason');
});

t.test('a backend 503 on a GET is retried on the other backend and never reaches the client', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'status', status: 503 }, '/s/');
  const p = await proxyOver(t, 'status-503', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/s/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.same([a.status, a.headers['x-backend'], a.body], [200, 'rb', `rb /s/${protocol}`], `${protocol}: rb's 200, nothing of ra's 503 (${shown(a)})`);
  }
  t.same(
    [ra.arrivalsUnder('/s/').map((x) => x.seq), rb.arrivalsUnder('/s/').map((x) => x.seq)],
    [
      ['h1', 'h2', 'h3'],
      ['h1', 'h2', 'h3'],
    ],
    'each GET reached ra, then rb',
  );
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 3, 'svc_retry_attempts_total{reason="status_503"}': 3 }, 'three retries, reason status_503');
});

t.test('with max_attempts 1 a backend 503 is forwarded as it came', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  ra.set({ kind: 'status', status: 503 }, '/s/');
  const p = await proxyOver(t, 'status-503-once', ra, rb, '{ max_attempts: 1 }');
  const key = await keyOwnedBy(p, ra, '/probe');
  const before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/s/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.same([a.status, a.headers['x-backend'], a.headers['content-type'], a.body], [503, 'ra', 'text/plain', 'ra status 503'], `${protocol}: ra's 503, status, headers and body (${shown(a)})`);
  }
  t.same(rb.arrivalsUnder('/s/'), [], 'rb never saw them');
  // docs/retries.md: `max_attempts: 1` turns retries off, so no retry is wanted and none is
  // counted denied (HELPERS.md's contract would count max_attempts here: reported to the lead).
  t.same(moved(await retryCounters(p), before), {}, 'no retry, none counted denied (retries are off)');
});

t.test('no backend left to retry on (every breaker open): the last answer stands, denied no_backend', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  for (const be of [ra, rb]) {
    be.set({ kind: 'reset' }, '/nbr/x');
    be.set({ kind: 'status', status: 503 }, '/nbs/x');
  }
  // Two pools over the same backends, each with its own breakers (one failure opens one); three
  // attempts allowed: after two failures on two backends, the third finds none eligible.
  const p = await startProxy(t, files, 'no-backend', {
    performance: `global_inflight_limit: 100, per_upstream_inflight_limit: 100, per_backend_inflight_limit: 100`,
    upstream: `{ ${hashedPool('nbr', '/nbr', [ra, rb])}, ${hashedPool('nbs', '/nbs', [ra, rb])} }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { failure_threshold: 1, open_ms: 60000 }, retry_budget: { max_attempts: 3 } }`,
  });
  const keyR = await keyOwnedBy(p, ra, '/nbr/probe');
  const keyS = await keyOwnedBy(p, ra, '/nbs/probe');
  let before = await retryCounters(p);
  const reset = await request(p, 'h1', { path: '/nbr/x', headers: { [HASH_HEADER]: keyR, 'x-seq': 'nbr' } });
  t.equal(reset.status, 502, `both reset: 502 (${shown(reset)})`);
  t.same([ra.arrivalsUnder('/nbr/x').length, rb.arrivalsUnder('/nbr/x').length], [1, 1], 'one attempt on each backend, no third');
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 1, 'svc_retry_attempts_total{reason="transport"}': 1, svc_retry_denied_total: 1, 'svc_retry_denied_total{reason="no_backend"}': 1 }, 'one retry, then denied no_backend');

  before = await retryCounters(p);
  const status = await request(p, 'h1', { path: '/nbs/x', headers: { [HASH_HEADER]: keyS, 'x-seq': 'nbs' } });
  t.same([status.status, status.headers['x-backend'], status.body], [503, 'rb', 'rb status 503'], `both 503: the last 503 forwarded as it came (${shown(status)})`);
  t.same([ra.arrivalsUnder('/nbs/x').length, rb.arrivalsUnder('/nbs/x').length], [1, 1], 'one attempt on each backend, no third');
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 1, 'svc_retry_attempts_total{reason="status_503"}': 1, svc_retry_denied_total: 1, 'svc_retry_denied_total{reason="no_backend"}': 1 }, 'one retry, then denied no_backend');
});

t.test('a dead pool: upstream attempts stay within the budget (N + floor 30 + ratio_percent of N)', async (t) => {
  const N = 200;
  const RATIO = 10;
  const da = await controlledBackend(t, 'da');
  const db = await controlledBackend(t, 'db');
  for (const be of [da, db]) be.set({ kind: 'reset' });
  const p = await proxyOver(t, 'dead-pool', da, db, `{ ratio_percent: ${RATIO} }`);
  const before = await retryCounters(p);
  // 10 streams at a time on one HTTP/2 connection: 200 requests well inside the budget's 10 s
  // window (a longer run would let the window slide, and the bound grow with it).
  const h2 = await connectH2(t, p);
  const statuses: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 10 }, async () => {
      for (let i = next++; i < N; i = next++) statuses.push((await h2.request({ path: `/dead/${i}`, headers: { [HASH_HEADER]: `d${i}` } })).status);
    }),
  );
  const elapsed = performance.now() - t0;
  t.ok(elapsed < 10_000, `the ${N} requests took ${elapsed.toFixed(0)} ms, inside one 10 s window`);
  t.same(
    statuses.filter((s) => s !== 502),
    [],
    `all ${N} answered 502`,
  );
  const d = moved(await retryCounters(p), before);
  const retries = d['svc_retries_total'] ?? 0;
  const attempts = da.arrivals.length + db.arrivals.length;
  const bound = N + 30 + Math.ceil((N * RATIO) / 100);
  t.ok(attempts <= bound, `${attempts} upstream attempts for ${N} requests, at most ${bound}`);
  t.equal(attempts, N + retries, `every attempt is a primary or a counted retry (${retries} retries)`);
  t.ok(retries >= 30, `the floor of 30 retries was available (${retries})`);
  t.equal(d['svc_retry_attempts_total{reason="transport"}'], retries, 'every retry for a transport failure');
  t.ok((d['svc_retry_denied_total{reason="budget_exhausted"}'] ?? 0) > 0, `retries denied budget_exhausted once the floor was used (${d['svc_retry_denied_total{reason="budget_exhausted"}'] ?? 0})`);
  t.equal((d['svc_retry_denied_total{reason="budget_exhausted"}'] ?? 0) + retries, N, 'each primary failure either retried or denied budget_exhausted');
  t.equal(d['svc_retry_denied_total{reason="max_attempts"}'] ?? 0, retries, 'each failed retry denied max_attempts (max_attempts 2)');
  t.comment(`dead pool: ${N} requests, ${attempts} attempts, moved ${JSON.stringify(d)}`);
});

t.test('per_route_ratio_percent overrides ratio_percent for its route: two dead pools, 10 % and 50 %', async (t) => {
  const N = 100;
  const da = await controlledBackend(t, 'da');
  const db = await controlledBackend(t, 'db');
  for (const be of [da, db]) be.set({ kind: 'reset' });
  const p = await startProxy(t, files, 'per-route-ratio', {
    performance: 'global_inflight_limit: 100, per_upstream_inflight_limit: 100, per_backend_inflight_limit: 100',
    upstream: `{ ${hashedPool('ten', '/ten', [da, db])}, ${hashedPool('fifty', '/fifty', [da, db])} }`,
    resilience: `{ ${QUIET}, retry_budget: { ratio_percent: 10, per_route_ratio_percent: { fifty: 50 } } }`,
  });
  const h2 = await connectH2(t, p);
  const run = async (route: string): Promise<number> => {
    const before = await retryCounters(p);
    let next = 0;
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        for (let i = next++; i < N; i = next++) await h2.request({ path: `/${route}/${i}`, headers: { [HASH_HEADER]: `d${i}` } });
      }),
    );
    const d = moved(await retryCounters(p), before);
    const attempts = [...da.arrivalsUnder(`/${route}/`), ...db.arrivalsUnder(`/${route}/`)].length;
    t.equal(attempts, N + (d['svc_retries_total'] ?? 0), `${route}: ${attempts} attempts, each a primary or a counted retry`);
    return d['svc_retries_total'] ?? 0;
  };
  const ten = await run('ten');
  const fifty = await run('fifty');
  t.ok(ten <= 30 + N / 10, `ratio 10 %: ${ten} retries for ${N} requests, at most ${30 + N / 10}`);
  t.ok(fifty <= 30 + N / 2, `per-route 50 %: ${fifty} retries, at most ${30 + N / 2}`);
  t.ok(fifty > 30 + N / 10, `and more than the 10 % route could make (${30 + N / 10}): the override is in force`);
});

t.test('response prebuffer: a failure inside the held part is retried; past response_prebuffer_bytes the response streams and fails', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  // 4,000 of 10,000 bytes, then a reset: the whole response fits in the prebuffer (16,384).
  ra.set({ kind: 'partial-then-reset', contentLength: 10_000, send: 4000 }, '/pre/');
  // 40,000 of 100,000: declared larger than the prebuffer, committed at its head.
  for (const be of [ra, rb]) be.set({ kind: 'partial-then-reset', contentLength: 100_000, send: 40_000 }, '/big/');
  // Chunked (no length declared): 4,000 bytes fit in the prebuffer; 40,000 outgrow it.
  ra.set({ kind: 'partial-then-reset', contentLength: undefined, send: 4000 }, '/chunked-small/');
  for (const be of [ra, rb]) be.set({ kind: 'partial-then-reset', contentLength: undefined, send: 40_000 }, '/chunked-big/');
  const p = await proxyOver(t, 'prebuffer', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  let before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/pre/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.same([a.status, a.headers['x-backend'], a.body], [200, 'rb', `rb /pre/${protocol}`], `${protocol}: rb's complete body, none of ra's partial one (${shown(a)})`);
  }
  t.same(
    [ra.arrivalsUnder('/pre/').map((x) => x.seq), rb.arrivalsUnder('/pre/').map((x) => x.seq)],
    [
      ['h1', 'h2', 'h3'],
      ['h1', 'h2', 'h3'],
    ],
    'each GET reached ra, then rb',
  );
  t.same(moved(await retryCounters(p), before), { svc_retries_total: 3, 'svc_retry_attempts_total{reason="transport"}': 3 }, 'three retries, reason transport');

  before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/big/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.ok(a.error !== undefined && a.body.length < 100_000, `${protocol}: the client sees a failed response (${a.error ?? 'no error'}, ${a.body.length} of 100,000 bytes)`);
    t.ok(/^r*$/.test(a.body), `${protocol}: what it got is ra's bytes only`);
  }
  t.same(
    ra.arrivalsUnder('/big/').map((x) => x.seq),
    ['h1', 'h2', 'h3'],
    'ra got each GET once',
  );
  t.same(rb.arrivalsUnder('/big/'), [], 'not retried: rb never saw them');
  t.same(moved(await retryCounters(p), before), { svc_response_prebuffer_limit_rejects: 3 }, 'three prebuffer limit rejects, no retry, nothing denied (nothing could be retried once committed)');

  before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const small = await request(p, protocol, { path: `/chunked-small/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.same([small.status, small.body], [200, `rb /chunked-small/${protocol}`], `${protocol}: chunked, failing inside the prebuffer: retried (${shown(small)})`);
    const big = await request(p, protocol, { path: `/chunked-big/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.ok(big.error !== undefined && /^r*$/.test(big.body), `${protocol}: chunked, past the prebuffer then reset: the client sees it fail (${big.error ?? 'no error'}, ${big.body.length} bytes of ra)`);
  }
  t.same(
    [rb.arrivalsUnder('/chunked-small/').length, rb.arrivalsUnder('/chunked-big/').length],
    [3, 0],
    'rb got the three small ones retried, none of the big ones',
  );
  t.same(
    moved(await retryCounters(p), before),
    { svc_retries_total: 3, 'svc_retry_attempts_total{reason="transport"}': 3, svc_response_prebuffer_limit_rejects: 3 },
    'three retries (the small ones), three prebuffer limit rejects (the big ones)',
  );
});

t.test('response prebuffer: committed 200 ms after the head at the latest, then not retried; text/event-stream never held', async (t) => {
  const ra = await controlledBackend(t, 'ra');
  const rb = await controlledBackend(t, 'rb');
  // 100 of 10,000 bytes, then nothing: the prebuffer neither fills nor sees the end.
  ra.set({ kind: 'partial-then-hold', contentLength: 10_000, send: 100 }, '/wait/');
  // An event stream whose first 100 bytes come before a reset: a held one would be retried.
  ra.set({ kind: 'partial-then-reset', contentLength: 10_000, send: 100, contentType: 'text/event-stream' }, '/sse/');
  const p = await proxyOver(t, 'prebuffer-time', ra, rb);
  const key = await keyOwnedBy(p, ra, '/probe');
  let before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const s = send(p, protocol, { path: `/wait/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    await ra.until(() => ra.held === 1, `${protocol}: the response started and held`);
    const sentAt = ra.arrivalsUnder(`/wait/${protocol}`)[0]?.at ?? 0;
    t.equal(await s.head, 200, `${protocol}: the client got the head while ra still held the rest`);
    const gap = performance.now() - sentAt;
    t.ok(gap >= 180, `${protocol}: the head reached the client ${gap.toFixed(0)} ms after ra sent it (held up to 200 ms)`);
    t.equal(ra.held, 1, `${protocol}: ra still holds the rest of the body`);
    ra.resetHeld();
    const a = await s.answer;
    t.ok(a.error !== undefined, `${protocol}: the client sees the response fail (${a.error ?? 'no error'}), committed`);
  }
  t.same(rb.arrivalsUnder('/wait/'), [], 'never retried once committed: rb saw none');
  let d = moved(await retryCounters(p), before);
  t.comment(`committed after 200 ms, then reset: moved ${JSON.stringify(d)}`);
  t.equal(d['svc_retries_total'] ?? 0, 0, 'no retry');

  before = await retryCounters(p);
  for (const protocol of PROTOCOLS) {
    const a = await request(p, protocol, { path: `/sse/${protocol}`, headers: { [HASH_HEADER]: key, 'x-seq': protocol } });
    t.ok(a.error !== undefined && /^r*$/.test(a.body), `${protocol}: the event stream went to the client at once, then failed (${a.error ?? 'no error'}, ${a.body.length} bytes of ra)`);
  }
  t.same(rb.arrivalsUnder('/sse/'), [], 'not retried: rb saw none');
  d = moved(await retryCounters(p), before);
  t.comment(`event stream reset: moved ${JSON.stringify(d)}`);
  t.equal(d['svc_retries_total'] ?? 0, 0, 'no retry');
});
