// JWT verification micro-benchmark (issue 16, "Must show" and item 5): what one verification of a
// request's token costs a worker, RS256 and ES256, with and without the cache of verified tokens.
//
//   npm run bench:jwt [-- --rounds 5 --iterations 3000 --warmup 500 --concurrency 1 --json FILE]
//                     [--proxy-rounds 3 --proxy-seconds 4]
//
// Then the throughput cost on bench:proxy's HTTP/1.1 phase (scripts/bench/jwt-proxy.ts): one worker
// without auth, with RS256 (cache hits), RS256 and ES256 (no cache), ratios per round
// (--proxy-rounds 0 skips it; it needs wrk, nginx and taskset, as bench:proxy does).
//
// - Keys and tokens: generated here with jose, RSA 2048-bit (RS256) and P-256 (ES256); one token
//   per algorithm with the claims of a typical access token (iss, aud, sub, iat, exp, scope, jti),
//   and a `kid`. The public keys are fed to a KeyStore as the supervisor's push would be (state
//   `fresh`), and the verifiers run the production path (`JwtVerifier.verify` on the header value).
// - Modes: `no cache` (`cacheEntries: 0`: every verification is jose's `jwtVerify`: header and
//   claims parsing, key selection and the signature check; jose keeps the imported CryptoKey per
//   JWK, as in production) and `cache hit` (`cacheEntries: 10000`, the token verified once before:
//   the cost of a request whose token was seen before).
// - Measure: per round and case, --warmup verifications unmeasured, then --iterations measured with
//   --concurrency in flight (1: one after another). Per case: wall µs per verification; CPU µs per
//   verification (process.cpuUsage: every thread, libuv's pool included, where WebCrypto runs the
//   signature check); event-loop µs per verification (performance.eventLoopUtilization: the time
//   the worker's main thread was busy, the cost other requests on that worker wait behind). The
//   order of the cases rotates each round so that a drift of the machine weighs on all alike.
//   Figures are the medians of the rounds, with the min and max.
// - Output: a markdown table, the cache speed-ups, and one JSON line (`{"benchmark":"jwt",...}`);
//   --json FILE also writes it to a file. Exits 1 if any verification did not answer as expected.
// - Bounded: the defaults take a few seconds; the run stops (exit 1) after --max-seconds (60).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { SignJWT, exportJWK, generateKeyPair } from 'jose';
import { JwtVerifier, KeyStore } from '@edge-proxy/auth';
import type { JwtOutcome } from '@edge-proxy/auth';
import { benchArgs, commandLine, numberArg } from '../lib/bench-args.ts';
import { fmt } from '../lib/bench-format.ts';
import { median } from '../lib/bench-load.ts';
import { proxyPhase } from './jwt-proxy.ts';
import type { ProxyPhaseResult } from './jwt-proxy.ts';

const log = (line: string): void => console.log(line);
const SOURCE = 'jwks-bench0000000';
const ISSUER = 'https://idp.bench.example/';
const AUDIENCE = 'edge-proxy-bench';

/** What the command line asks for. */
export interface JwtBenchArgs {
  readonly rounds: number;
  readonly iterations: number;
  readonly warmup: number;
  readonly concurrency: number;
  readonly maxSeconds: number;
  readonly json: string | undefined;
  readonly proxyRounds: number;
  readonly proxySeconds: number;
}

/** Parses and checks the command line; throws on a bad value. */
export function parseJwtArgs(argv: readonly string[]): JwtBenchArgs {
  const { values } = benchArgs({
    args: [...argv],
    options: {
      rounds: { type: 'string', default: '5' },
      iterations: { type: 'string', default: '3000' },
      warmup: { type: 'string', default: '500' },
      concurrency: { type: 'string', default: '1' },
      'max-seconds': { type: 'string', default: '60' },
      json: { type: 'string' },
      'proxy-rounds': { type: 'string', default: '3' },
      'proxy-seconds': { type: 'string', default: '4' },
    },
    strict: true,
    allowPositionals: false,
  });
  const int = (n: number): boolean => Number.isInteger(n) && n > 0;
  return {
    rounds: numberArg('rounds', values.rounds, int),
    iterations: numberArg('iterations', values.iterations, int),
    warmup: numberArg('warmup', values.warmup, (n) => Number.isInteger(n) && n >= 0),
    concurrency: numberArg('concurrency', values.concurrency, (n) => int(n) && n <= 1024),
    maxSeconds: numberArg('max-seconds', values['max-seconds'], (n) => n > 0),
    json: values.json,
    proxyRounds: numberArg('proxy-rounds', values['proxy-rounds'], (n) => Number.isInteger(n) && n >= 0 && n <= 20),
    proxySeconds: numberArg('proxy-seconds', values['proxy-seconds'], (n) => int(n) && n <= 60),
  };
}

type Alg = 'RS256' | 'ES256';
type Mode = 'no cache' | 'cache hit';

/** One algorithm and mode, ready to run. */
interface Case {
  readonly alg: Alg;
  readonly mode: Mode;
  readonly verifier: JwtVerifier;
  readonly header: string;
  readonly expect: JwtOutcome;
}

/** One measured run of a case. */
interface Sample {
  readonly wallUs: number;
  readonly cpuUs: number;
  readonly loopUs: number;
  readonly wrong: number;
}

async function buildCases(): Promise<{ cases: Case[]; tokenBytes: Record<Alg, number> }> {
  const store = new KeyStore({ askRefresh: () => undefined });
  const keys = [];
  const tokens = {} as Record<Alg, string>;
  const now = Math.floor(Date.now() / 1000);
  for (const alg of ['RS256', 'ES256'] as const) {
    const pair = await generateKeyPair(alg, alg === 'RS256' ? { modulusLength: 2048, extractable: true } : { extractable: true });
    const kid = `bench-${alg.toLowerCase()}`;
    keys.push({ ...(await exportJWK(pair.publicKey)), kid, alg, use: 'sig' });
    tokens[alg] = await new SignJWT({ scope: 'orders:read orders:write profile', tenant: 'acme-corp' })
      .setProtectedHeader({ alg, kid, typ: 'JWT' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setSubject('user-4711-0b9c2f7e')
      .setJti('b1946ac9-2e5f-4c8a-9f3d-7a1e5c0d2b64')
      .setIssuedAt(now)
      .setExpirationTime(now + 3600)
      .sign(pair.privateKey);
  }
  store.update({ sourceId: SOURCE, state: 'fresh', keys, fetchedAtMs: Date.now(), version: 1 });
  const policy = { issuer: ISSUER, audiences: [AUDIENCE], algorithms: ['RS256', 'ES256'], sourceId: SOURCE, jwksTimeoutMs: 2000, clockSkewMs: 30_000, header: 'authorization' };
  const cases: Case[] = [];
  for (const alg of ['RS256', 'ES256'] as const) {
    cases.push({ alg, mode: 'no cache', verifier: new JwtVerifier({ ...policy, cacheEntries: 0 }, store), header: `Bearer ${tokens[alg]}`, expect: { ok: true, cached: false } });
    cases.push({ alg, mode: 'cache hit', verifier: new JwtVerifier({ ...policy, cacheEntries: 10_000 }, store), header: `Bearer ${tokens[alg]}`, expect: { ok: true, cached: true } });
  }
  // Every case answers as expected before anything is measured (the cache cases fill their entry here).
  for (const c of cases) {
    const first = await c.verifier.verify(c.header);
    if (!first.ok) throw new Error(`${c.alg} ${c.mode}: the token does not verify (${first.reason})`);
    const o = await c.verifier.verify(c.header);
    if (!same(o, c.expect)) throw new Error(`${c.alg} ${c.mode}: expected ${JSON.stringify(c.expect)}, got ${JSON.stringify(o)}`);
  }
  return { cases, tokenBytes: { RS256: tokens.RS256.length, ES256: tokens.ES256.length } };
}

function same(a: JwtOutcome, b: JwtOutcome): boolean {
  return a.ok === b.ok && (a.ok ? a.cached === (b as { cached: boolean }).cached : a.reason === (b as { reason: string }).reason);
}

/** `n` verifications of `c`, `concurrency` in flight; the count of answers other than expected. */
async function run(c: Case, n: number, concurrency: number): Promise<number> {
  let wrong = 0;
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < n) {
      next++;
      if (!same(await c.verifier.verify(c.header), c.expect)) wrong++;
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, n) }, lane));
  return wrong;
}

async function measure(c: Case, args: JwtBenchArgs): Promise<Sample> {
  await run(c, args.warmup, args.concurrency);
  const elu0 = performance.eventLoopUtilization();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const wrong = await run(c, args.iterations, args.concurrency);
  const wallMs = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const elu = performance.eventLoopUtilization(elu0);
  const n = args.iterations;
  return { wallUs: (wallMs * 1000) / n, cpuUs: (cpu.user + cpu.system) / n, loopUs: (elu.active * 1000) / n, wrong };
}

async function main(args: JwtBenchArgs): Promise<void> {
  const tooLong = (): never => {
    console.error(`bench:jwt: still running after ${args.maxSeconds} s; stopping (lower --iterations or --rounds)`);
    process.exit(1);
  };
  // The timer catches a slow signature check; a run of cache hits never yields to timers, so each case is checked too.
  const deadline = performance.now() + args.maxSeconds * 1000;
  const stop = setTimeout(tooLong, args.maxSeconds * 1000);
  const load = loadavg();
  const { cases, tokenBytes } = await buildCases();
  log(`keys: RSA 2048-bit (RS256), P-256 (ES256), generated by jose; tokens of ${tokenBytes.RS256} (RS256) and ${tokenBytes.ES256} (ES256) characters with iss, aud, sub, iat, exp, scope, jti, kid`);
  log(`path: JwtVerifier.verify('Bearer <jwt>') against a KeyStore holding both public keys (state fresh); no cache = cacheEntries 0, cache hit = the token verified once before`);
  log(`run: ${args.rounds} rounds × ${cases.length} cases × (${args.warmup} warm-up + ${args.iterations} measured), ${args.concurrency} in flight; node ${process.version}, ${cpus().length} CPUs (${cpus()[0]?.model ?? 'unknown'}), load average at start ${load.map((l) => l.toFixed(2)).join(' ')}`);
  const samples = new Map<Case, Sample[]>(cases.map((c) => [c, []]));
  for (let r = 0; r < args.rounds; r++) {
    // Rotate the order each round: a drift of the machine weighs on every case alike.
    const order = cases.map((_, i) => cases[(i + r) % cases.length] as Case);
    for (const c of order) {
      samples.get(c)?.push(await measure(c, args));
      if (performance.now() > deadline) tooLong();
    }
    log(`  round ${r + 1}: ${cases.map((c) => `${c.alg} ${c.mode} ${fmt(samples.get(c)?.[r]?.wallUs, 2)} µs`).join('; ')}`);
  }
  clearTimeout(stop);

  const rows = cases.map((c) => {
    const s = samples.get(c) ?? [];
    const wall = s.map((x) => x.wallUs);
    return {
      alg: c.alg,
      mode: c.mode,
      us_per_verification: median(wall),
      us_min: Math.min(...wall),
      us_max: Math.max(...wall),
      cpu_us_per_verification: median(s.map((x) => x.cpuUs)),
      event_loop_us_per_verification: median(s.map((x) => x.loopUs)),
      verifications_per_s: 1e6 / median(wall),
      wrong_answers: s.reduce((a, x) => a + x.wrong, 0),
    };
  });
  log(`\n## JWT verification, µs per verification (median of ${args.rounds} rounds of ${args.iterations}, ${args.concurrency} in flight)`);
  log('| algorithm | mode | wall µs | min–max µs | CPU µs (all threads) | event loop µs | verifications/s |');
  log('|---|---|---|---|---|---|---|');
  for (const r of rows) log(`| ${r.alg} | ${r.mode} | **${fmt(r.us_per_verification, 2)}** | ${fmt(r.us_min, 2)}–${fmt(r.us_max, 2)} | ${fmt(r.cpu_us_per_verification, 2)} | ${fmt(r.event_loop_us_per_verification, 2)} | ${fmt(r.verifications_per_s)} |`);
  const speedup: Record<string, number> = {};
  for (const alg of ['RS256', 'ES256'] as const) {
    const off = rows.find((r) => r.alg === alg && r.mode === 'no cache');
    const on = rows.find((r) => r.alg === alg && r.mode === 'cache hit');
    if (off !== undefined && on !== undefined) speedup[alg] = off.us_per_verification / on.us_per_verification;
  }
  log(`\ncache hit vs no cache (wall): RS256 ${fmt(speedup['RS256'], 1)}× faster, ES256 ${fmt(speedup['ES256'], 1)}× faster`);
  const wrong = rows.reduce((a, r) => a + r.wrong_answers, 0);
  if (wrong > 0) log(`\nFAIL: ${wrong} verifications answered other than expected`);
  let proxy: ProxyPhaseResult | undefined;
  if (args.proxyRounds > 0) {
    const dir = mkdtempSync(path.join(tmpdir(), 'bench-jwt-'));
    try {
      proxy = await proxyPhase(dir, args.proxyRounds, args.proxySeconds, log);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  const proxyErrors = proxy === undefined ? 0 : Object.values(proxy.errors).reduce((a, n) => a + n, 0);
  if (proxyErrors > 0) log(`\nFAIL: ${proxyErrors} requests through the proxies were not answered 2xx`);
  const result = {
    benchmark: 'jwt',
    measured_at: new Date().toISOString(),
    node: process.version,
    cpus: cpus().length,
    load_average_at_start: load,
    rounds: args.rounds,
    iterations: args.iterations,
    warmup: args.warmup,
    concurrency: args.concurrency,
    token_chars: tokenBytes,
    results: rows,
    cache_speedup: speedup,
    ...(proxy === undefined ? {} : { proxy_h1: proxy }),
  };
  log(JSON.stringify(result));
  if (args.json !== undefined) writeFileSync(args.json, `${JSON.stringify(result, null, 2)}\n`);
  if (wrong > 0 || proxyErrors > 0) process.exitCode = 1;
}

if (import.meta.main) await main(commandLine(() => parseJwtArgs(process.argv.slice(2))));
