// The quota phase in isolation: `QuotaControl.check` at a fixed rate against a real redis-server
// on loopback, to show what the phase adds to a request and how many round trips it costs
// (issue 15: p99 added < 0.5 ms, exactly one round trip). The end-to-end figure through
// `edge-proxy serve` belongs to the proxy's own quota benchmark; this one has no proxy around it.
//
//   node scripts/bench/quota-check.ts [--rate 2000 --seconds 5 --warmup 1 --rounds 3 --policies 2]
//
// - redis-server: started on a free loopback port (packages/dataplane/test/support/redis.ts).
// - One QuotaControl (one worker), `--policies` policies matching the route, each with a burst and a
//   sustained contract over `header:x-tenant` (1,000 tenants in turn, limits high enough that
//   nothing is denied: the cost of counting, not of refusing).
// - Open loop: checks are issued on a 1 ms timer at `--rate` per second whether or not earlier ones
//   answered; latency is issue → `done`. Each run starts with `--warmup` s not counted (JIT, the
//   connection's first commands). The same schedule against backend `local` is the floor
//   (key hashing, the local window, the timer), so "added by Redis" is the difference.
// - Round trips: `cmdstat_evalsha` calls (and `eval`, which must stay 0) over checks, from INFO.
// - Output: a markdown table per round and the medians.
import { performance } from 'node:perf_hooks';
import { Metrics } from '@edge-proxy/telemetry';
import { QuotaControl } from '../../packages/dataplane/src/resilience/quota/index.ts';
import type { QuotaConfig, QuotaRequestFacts, QuotaSettings } from '../../packages/dataplane/src/resilience/quota/index.ts';
import { RedisServer } from '../../packages/dataplane/test/support/redis.ts';
import { percentile } from '../lib/bench-load.ts';
import { scriptArgs } from '../lib/bench-args.ts';

const { values } = scriptArgs({
  options: {
    rate: { type: 'string', default: '2000' },
    seconds: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    rounds: { type: 'string', default: '3' },
    policies: { type: 'string', default: '2' },
  },
});
const RATE = Number(values.rate);
const SECONDS = Number(values.seconds);
const WARMUP = Number(values.warmup);
const ROUNDS = Number(values.rounds);
const POLICIES = Number(values.policies);

function settings(backend: 'local' | 'redis', address: string): QuotaSettings {
  const quota: QuotaConfig = {
    enabled: true,
    backend,
    redis: { address, key_prefix: 'edge-proxy:quota:', timeout_ms: 50 },
    failure_mode: 'local_fallback',
    policies: Array.from({ length: POLICIES }, (_, i) => ({
      name: `p${i}`,
      routes: [],
      dimensions: ['header:x-tenant'],
      key_fallback: 'client_ip' as const,
      // The 1,000 tenants all come from one client address: budgets above them, so every check asks Redis.
      max_keys_per_window: 1_000_000,
      max_new_keys_per_source: 1_000_000,
      burst: { limit: 1_000_000, window_ms: 1000 },
      sustained: { limit: 1_000_000_000, window_ms: 3_600_000 },
    })),
  };
  return { resilience: { quota } };
}

function facts(i: number): QuotaRequestFacts {
  const tenant = `tenant-${i % 1000}`;
  return { clientIp: '192.0.2.1', host: 'api.example', route: 'api', path: '/v1/items', header: (n) => (n === 'x-tenant' ? tenant : undefined) };
}

interface Round {
  readonly checks: number;
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
  readonly modes: Record<string, number>;
}

async function run(q: QuotaControl, seconds = SECONDS): Promise<Round> {
  const pols = q.policiesFor('api');
  const total = Math.max(1, Math.round(RATE * seconds));
  const lat: number[] = [];
  const modes: Record<string, number> = {};
  let issued = 0;
  let answered = 0;
  const t0 = performance.now();
  await new Promise<void>((resolve) => {
    const tick = (): void => {
      const due = Math.min(total, Math.floor(((performance.now() - t0) * RATE) / 1000));
      for (; issued < due; issued++) {
        const start = performance.now();
        q.check(pols, facts(issued), (v) => {
          lat.push(performance.now() - start);
          modes[v.mode] = (modes[v.mode] ?? 0) + 1;
          if (++answered === total) resolve();
        });
      }
      if (issued < total) setTimeout(tick, 1);
    };
    tick();
  });
  lat.sort((a, b) => a - b);
  return { checks: total, p50: percentile(lat, 0.5), p99: percentile(lat, 0.99), max: lat[lat.length - 1] ?? NaN, modes };
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const f = (ms: number): string => ms.toFixed(3);

const redis = await RedisServer.start();
try {
  const rows: { round: number; local: Round; redis: Round; evalsha: number; evals: number }[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    const local = new QuotaControl(new Metrics('worker'), 1);
    local.configure(settings('local', redis.address), undefined);
    await run(local, WARMUP);
    const localRound = await run(local);
    await local.close();
    const shared = new QuotaControl(new Metrics('worker'), 1);
    shared.configure(settings('redis', redis.address), undefined);
    while (shared.health().availability !== 'available') await new Promise((r) => setTimeout(r, 5));
    await run(shared, WARMUP);
    const evalsha0 = await redis.commandCalls('evalsha');
    const eval0 = await redis.commandCalls('eval');
    const redisRound = await run(shared);
    const evalsha = (await redis.commandCalls('evalsha')) - evalsha0;
    const evals = (await redis.commandCalls('eval')) - eval0;
    await shared.close();
    rows.push({ round, local: localRound, redis: redisRound, evalsha, evals });
  }
  console.log(`quota check at ${RATE}/s for ${SECONDS} s (after ${WARMUP} s of warm-up), ${POLICIES} policies × 2 contracts, redis-server ${redis.address} (loopback)\n`);
  console.log('| round | local p50 / p99 ms | redis p50 / p99 / max ms | added p50 / p99 ms | EVALSHA per check | EVAL | modes |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(`| ${r.round} | ${f(r.local.p50)} / ${f(r.local.p99)} | ${f(r.redis.p50)} / ${f(r.redis.p99)} / ${f(r.redis.max)} | ${f(r.redis.p50 - r.local.p50)} / ${f(r.redis.p99 - r.local.p99)} | ${(r.evalsha / r.redis.checks).toFixed(3)} | ${r.evals} | ${JSON.stringify(r.redis.modes)} |`);
  }
  const addedP99 = median(rows.map((r) => r.redis.p99 - r.local.p99));
  const addedP50 = median(rows.map((r) => r.redis.p50 - r.local.p50));
  const trips = rows.every((r) => r.evalsha === r.redis.checks && r.evals === 0);
  console.log(`\nmedian added: p50 ${f(addedP50)} ms, p99 ${f(addedP99)} ms (target < 0.5 ms: ${addedP99 < 0.5 ? 'met' : 'NOT met'}); one round trip per check: ${trips ? 'yes' : 'NO'}`);
} finally {
  await redis.stop();
}
