// A wall clock that steps (NTP correcting a node at boot, a VM resumed after a pause, an operator's
// `date -s`) must not change what durations mean. The supervisor and its workers run here with
// Date.now() stepped by an hour every 200 ms, forward in one proxy and backward in the other (a
// preload module given with NODE_OPTIONS, which the workers inherit); every duration the proxy
// acts on runs on the monotonic clock, so:
// - forward: no worker is killed as "silent for an hour", and an open circuit breaker stays open
//   for its open_ms instead of letting a probe through at the next step;
// - backward: the new-connection token bucket refuses nothing (an hour of negative refill would
//   refuse every new connection for an hour), and an open breaker half-opens after open_ms
//   instead of staying open for the size of the step.
import t from 'tap';
import type { Test } from 'tap';
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { controlledBackend } from './support/controlled-backend.ts';
import { PROTOCOLS } from './support/served-by.ts';
import { serviceFiles } from './support/service-config.ts';
import { assertShed, breaker, pollUntil, request, snapshot, startProxy, SHED_BODY } from './support/overload.ts';
import { workersBlock } from './support/workers.ts';
import type { WorkersBlock } from './support/workers.ts';
import type { Answer, Proxy, StartedProxy } from './support/overload.ts';
import type { ControlledBackend } from './support/controlled-backend.ts';

const files = serviceFiles(t, 'edge-clock-');
const STEP_EVERY_MS = 200;
const HOUR = 3_600_000;
const RETRY_AFTER = 5;

/** A preload that steps Date.now() by `stepMs` every STEP_EVERY_MS and leaves `<marks>/<pid>` behind. */
function clockStepper(name: string, stepMs: number): { env: Record<string, string>; loadedIn: (pid: number) => boolean } {
  const marks = path.join(files.dir, `${name}-marks`);
  const file = path.join(files.dir, `${name}-clock.mjs`);
  writeFileSync(
    file,
    [
      "import { mkdirSync, writeFileSync } from 'node:fs';",
      'const real = Date.now;',
      'const t0 = performance.now();',
      `Date.now = () => real() + Math.floor((performance.now() - t0) / ${STEP_EVERY_MS}) * ${stepMs};`,
      `mkdirSync(${JSON.stringify(marks)}, { recursive: true });`,
      `writeFileSync(${JSON.stringify(marks)} + '/' + process.pid, '');`,
      '',
    ].join('\n'),
  );
  return {
    env: { NODE_OPTIONS: `${process.env['NODE_OPTIONS'] ?? ''} --import=${pathToFileURL(file).href}`.trim() },
    loadedIn: (pid) => existsSync(path.join(marks, String(pid))),
  };
}

const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function openBreaker(t: Test, p: Proxy): Promise<number> {
  let lastFailureSent = 0;
  for (const protocol of PROTOCOLS) {
    lastFailureSent = performance.now();
    const a = await request(p, protocol, { path: `/one/fail-${protocol}` });
    t.equal(a.status, 500, `${protocol}: the backend's 500 passes through`);
  }
  t.equal((await pollUntil(() => breaker(p, 'one', 'b'), (b) => b?.state === 'open', 2000))?.state, 'open', 'the breaker opened');
  return lastFailureSent;
}

/** A proxy (one worker) on a clock stepped by `stepMs`, its one upstream `one` on backend `b` with a breaker of `openMs`. */
async function steppedProxy(t: Test, name: string, stepMs: number, openMs: number, performance: string): Promise<{ p: StartedProxy; b: ControlledBackend; clock: ReturnType<typeof clockStepper>; pid: number; start: WorkersBlock }> {
  const clock = clockStepper(name, stepMs);
  const b = await controlledBackend(t, 'b');
  const p = await startProxy(t, files, name, {
    performance,
    upstream: `{ one: { route: { path_prefix: /one }, backends: [{ id: b, address: "127.0.0.1:${b.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { failure_threshold: 3, open_ms: ${openMs}, half_open_max_probes: 1, failure_statuses: [500, 502, 503, 504] }, route_queue: { shed_retry_after_seconds: ${RETRY_AFTER} } }`,
    env: clock.env,
  });
  const start = await workersBlock(p);
  const pid = start.list[0]?.pid ?? 0;
  t.ok(clock.loadedIn(p.served.proc.pid ?? 0), 'the supervisor runs on the stepping clock');
  t.ok(clock.loadedIn(pid), `worker ${pid} runs on the stepping clock`);
  return { p, b, clock, pid, start };
}

/**
 * 24 requests over about 1.2 s (6 steps), rotating the protocols; each is a new connection (HTTP/1.1
 * without an agent, a new HTTP/2 session, a new QUIC connection). Their statuses.
 */
async function trafficAcrossSteps(p: Proxy): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < 24; i++) {
    statuses.push((await request(p, PROTOCOLS[i % 3] ?? 'h1', { path: `/one/ok-${i}` })).status);
    await pause(50); // bounded traffic over a span of steps: what is observed is an absence
  }
  return statuses;
}

t.test('the wall clock steps forward an hour every 200 ms: no worker is killed as silent, an open breaker stays open for open_ms', async (t) => {
  const OPEN_MS = 3000;
  const { p, b, pid, start } = await steppedProxy(t, 'forward', HOUR, OPEN_MS, 'global_inflight_limit: 50');
  // Six steps, six hours of wall clock: the supervisor hears every heartbeat after a step as an
  // hour of silence, if it measures silence on the wall clock.
  const statuses = await trafficAcrossSteps(p);
  t.same(statuses.filter((s) => s !== 200), [], 'every request answered 200 across the steps');
  const after = await workersBlock(p);
  t.same(after.list.map((w) => [w.pid, w.incarnation]), [[pid, 0]], 'the same worker, never re-forked');
  t.same([after.exits, after.reforks], [start.exits, start.reforks], 'no worker exit, no re-fork');
  t.ok(after.list.every((w) => w.last_heard_ms_ago >= 0 && w.last_heard_ms_ago < 2000), `last heard ${after.list.map((w) => w.last_heard_ms_ago).join(', ')} ms ago: real time, not hours`);
  t.same(p.served.lines.filter((l) => /unresponsive/.test(String(l['msg']))), [], 'no "worker unresponsive" line');
  t.equal((await snapshot(p))['readiness'], 'ready', 'the node stays ready');

  // Open, then 1.5 s of requests (7 steps): each is shed; none reaches the backend as a probe.
  b.set({ kind: 'status', status: 500 });
  const lastFailureSent = await openBreaker(t, p);
  const arrivals = b.arrivals.length;
  const answers: Answer[] = [];
  while (performance.now() - lastFailureSent < OPEN_MS / 2) {
    answers.push(await request(p, 'h1', { path: '/one/x' }));
    await pause(50); // the breaker's own clock decides: poll with requests, bounded
  }
  t.ok(answers.length >= 5, `${answers.length} requests within open_ms / 2`);
  t.same(answers.filter((a) => a.status !== 503 || a.body !== SHED_BODY.circuit_open).map((a) => a.status), [], 'every one shed circuit_open');
  t.equal(b.arrivals.length, arrivals, 'no probe reached the backend before open_ms');
  const until = (await breaker(p, 'one', 'b'))?.open_until_unix_ms ?? 0;
  t.ok(until > Date.now() + HOUR, `the snapshot's open_until_unix_ms reads the worker's stepped wall clock (${((until - Date.now()) / HOUR).toFixed(1)} h ahead of ours); the probe waits for open_ms all the same`);
  assertShed(t, await request(p, 'h3', { path: '/one/y' }), 'circuit_open', RETRY_AFTER, 'still open (h3)');
});

t.test('the wall clock steps back an hour every 200 ms: new connections are admitted, an open breaker half-opens after open_ms', async (t) => {
  const OPEN_MS = 1000;
  const { p, b } = await steppedProxy(t, 'backward', -HOUR, OPEN_MS, 'global_inflight_limit: 50, new_connections_per_sec: 200, new_connections_burst: 40');
  // 24 new connections, well inside 200 per second, across six steps back.
  const statuses = await trafficAcrossSteps(p);
  t.same(statuses.filter((s) => s !== 200), [], 'every new connection admitted and answered 200');

  b.set({ kind: 'status', status: 500 });
  const lastFailureSent = await openBreaker(t, p);
  const arrivals = b.arrivals.length;
  let probe: Answer | undefined;
  let sentAt = 0;
  let shed = 0;
  while (performance.now() - lastFailureSent < OPEN_MS + 4000) {
    sentAt = performance.now();
    const a = await request(p, 'h1', { path: '/one/poll' });
    if (a.status !== 503 || a.body !== SHED_BODY.circuit_open) {
      probe = a;
      break;
    }
    shed++;
    await pause(50); // the breaker's own clock decides: poll with requests, bounded
  }
  t.same([probe?.status, probe?.body], [500, 'b status 500'], `after ${shed} sheds, a half-open probe reached the backend`);
  t.ok(sentAt - lastFailureSent >= OPEN_MS && sentAt - lastFailureSent < OPEN_MS + 2000, `${(sentAt - lastFailureSent).toFixed(0)} ms after the third failure was sent: open_ms (${OPEN_MS}), not the steps back`);
  t.equal(b.arrivals.length, arrivals + 1, 'exactly one probe');
});
