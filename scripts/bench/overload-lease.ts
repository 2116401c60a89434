// The lease phase of `npm run bench:overload -- --lease-phase` (issue 39, "Must show"): how much
// IPC the node's in-flight leases cost at a load's peak, and how far the node's admitted in-flight
// count strays from `global_inflight_limit` while the load moves from one worker to another.
//
// A real `edge-proxy serve` with --workers (4) and `global_inflight_limit` --limit (64), queues at
// 0; a backend (test/support/controlled-backend.ts) answering after --service-ms (20). Phase A:
// one HTTP/2 connection runs 1.5 × limit requests in a closed loop (more than the limit, so the
// node is at its limit, contended) for --seconds (2); phase B: that connection stops and a second
// one, served by another worker (both found by a held probe: test/support/limits.ts), takes the
// same load, so the node's slots must move from one worker to the other. The backend's in-flight
// count is sampled every 2 ms while the load runs: its maximum (never above the limit), the time
// until it first reached the limit, and after that its lowest value, its mean and the share of
// samples at the limit (how far the admitted in-flight count strayed below the limit once the
// load moved; a closed loop on one connection runs in waves, so its lowest value is the gap
// between two waves, and the mean says more). Lease traffic: the snapshot's
// `admission.lease_messages` before and after each phase (messages per second each way, and per
// request answered 200).
import { controlledBackend } from '../../test/support/controlled-backend.ts';
import { serviceFiles } from '../../test/support/service-config.ts';
import { admission, startProxy } from '../../test/support/overload.ts';
import type { H2Connection, Proxy } from '../../test/support/overload.ts';
import { connectionsOnEveryWorker } from '../../test/support/limits.ts';

export interface LeasePhaseOptions {
  readonly workers: number;
  readonly limit: number;
  readonly serviceMs: number;
  readonly seconds: number;
}

interface PhaseResult {
  readonly phase: string;
  readonly requests: number;
  readonly ok: number;
  readonly refused: number;
  readonly maxInflight: number;
  /** ms from the phase's start until the backend saw `limit` in flight. */
  readonly reachMs: number;
  /** The lowest in-flight count after it was first reached, its mean, and the share of samples at the limit. */
  readonly minAfterReach: number;
  readonly meanAfterReach: number;
  readonly atLimitShare: number;
  readonly msgsInPerSec: number;
  readonly msgsOutPerSec: number;
  readonly seconds: number;
  /** Workers holding slots of `global` in the phase's middle. */
  readonly holders: string;
}

export async function leasePhase(o: LeasePhaseOptions, log: (line: string) => void): Promise<void> {
  const cleanups: (() => unknown)[] = [];
  const t = { teardown: (fn: () => unknown) => void cleanups.push(fn) };
  try {
    const files = serviceFiles(t, 'bench-lease-');
    const be = await controlledBackend(t, 'lb');
    be.set({ kind: 'slow', ms: o.serviceMs });
    const p = await startProxy(t, files, 'lease-bench', {
      workers: o.workers,
      performance: `global_inflight_limit: ${o.limit}, per_upstream_inflight_limit: ${o.limit}, per_backend_inflight_limit: ${o.limit}`,
      upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: lb, address: "127.0.0.1:${be.port}" }] } }`,
      resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, route_queue: { default_cap: 0, global_cap: 0 } }',
    });
    // Two connections on two different workers (a probe held on each shows which worker serves it).
    be.set({ kind: 'hold' }, '/probe');
    const [a, b] = (await connectionsOnEveryWorker(t, p, be, '/probe', o.workers)) as [H2Connection & { worker: number }, H2Connection & { worker: number }];
    const results = [await run(p, be, a, 'A (first connection)', o), await run(p, be, b, 'B (the load moved)', o)];
    log('');
    log(`### Lease phase: ${o.workers} workers, global_inflight_limit ${o.limit}, queues 0, backend ${o.serviceMs} ms, ${Math.round(1.5 * o.limit)} concurrent streams, ${o.seconds} s per phase`);
    log('');
    log(`Phase A on worker ${a.worker}'s connection, phase B on worker ${b.worker}'s.`);
    log('');
    log('| phase | requests | 200 | 503 | max in flight at the backend | reached the limit after | after that: lowest / mean in flight, samples at the limit | lease msgs/s from workers | to workers | msgs per 200 (both ways) | workers holding slots |');
    log('|---|---|---|---|---|---|---|---|---|---|---|');
    for (const r of results) log(`| ${r.phase} | ${r.requests} | ${r.ok} | ${r.refused} | ${r.maxInflight} | ${r.reachMs.toFixed(0)} ms | ${r.minAfterReach} / ${r.meanAfterReach.toFixed(1)}, ${(100 * r.atLimitShare).toFixed(0)} % | ${r.msgsInPerSec.toFixed(0)} | ${r.msgsOutPerSec.toFixed(0)} | ${((r.msgsInPerSec + r.msgsOutPerSec) / (r.ok / r.seconds)).toFixed(2)} | ${r.holders} |`);
    const over = Math.max(...results.map((r) => r.maxInflight)) - o.limit;
    log('');
    log(`Overshoot above the limit: ${Math.max(0, over)} (never above it: ${over <= 0 ? 'yes' : 'NO'}).`);
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
}

async function traffic(p: Proxy): Promise<{ in: number; out: number; holders: string }> {
  const x = await admission(p);
  const g = x.leases.find((l) => l.key === 'global');
  return { in: x.lease_messages.from_workers, out: x.lease_messages.to_workers, holders: (g?.workers ?? []).filter((w) => w.granted > 0).map((w) => `${w.worker}:${w.granted}`).join(' ') };
}

async function run(p: Proxy, be: Awaited<ReturnType<typeof controlledBackend>>, conn: H2Connection, phase: string, o: LeasePhaseOptions): Promise<PhaseResult> {
  const before = await traffic(p);
  be.maxInflight = 0;
  const t0 = performance.now();
  let reachMs = -1;
  let minAfter = Number.POSITIVE_INFINITY;
  let sum = 0;
  let samples = 0;
  let atLimit = 0;
  const end = t0 + o.seconds * 1000;
  const sampler = setInterval(() => {
    // The load's own span only: once it stops, the backend drains to 0.
    if (performance.now() >= end) return;
    const n = be.inflight;
    if (reachMs < 0 && n >= o.limit) reachMs = performance.now() - t0;
    else if (reachMs >= 0) {
      minAfter = Math.min(minAfter, n);
      sum += n;
      samples++;
      if (n >= o.limit) atLimit++;
    }
  }, 2);
  let requests = 0;
  let ok = 0;
  let refused = 0;
  let holders = '';
  const mid = setTimeout(() => void traffic(p).then((x) => (holders = x.holders)), (o.seconds * 1000) / 2);
  const loop = async (): Promise<void> => {
    while (performance.now() < end) {
      const r = await conn.request({ path: `/x/${requests}`, timeoutMs: 10_000 });
      requests++;
      if (r.status === 200) ok++;
      else refused++;
      // A refusal comes back at once: a short pause keeps the loop from spinning the CPU the proxy needs.
      if (r.status !== 200) await new Promise((res) => setTimeout(res, 5));
    }
  };
  await Promise.all(Array.from({ length: Math.round(1.5 * o.limit) }, loop));
  clearInterval(sampler);
  clearTimeout(mid);
  const seconds = (performance.now() - t0) / 1000;
  const after = await traffic(p);
  return { phase, requests, ok, refused, maxInflight: be.maxInflight, reachMs, minAfterReach: minAfter === Number.POSITIVE_INFINITY ? 0 : minAfter, meanAfterReach: samples === 0 ? 0 : sum / samples, atLimitShare: samples === 0 ? 0 : atLimit / samples, msgsInPerSec: (after.in - before.in) / seconds, msgsOutPerSec: (after.out - before.out) / seconds, seconds, holders };
}
