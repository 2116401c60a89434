// The throughput cost of JWT validation on bench:proxy's HTTP/1.1 phase (issue 16, "Must show"),
// run by `npm run bench:jwt` after the micro-benchmark (--proxy-rounds 0 skips it).
//
// The same setup as bench:proxy's HTTP/1.1 phase: an nginx `return 200` backend and the wrk client
// on core 0, one edge-proxy worker (standalone) on core 1, `wrk -t1 -c50`. Four proxies, started
// once and loaded in turn inside each round (the order rotates): no auth (sent the same token
// header, so that only validation is measured, not a 0.7 kB longer request); RS256 with the
// verification cache (every request after the first per connection is a hit: wrk sends one token);
// RS256 and ES256 with `verification_cache_entries: 0` (a signature check per request). Keys come
// from an HTTPS JWKS endpoint served by this process (one fetch per proxy at start). Per round,
// each auth variant's req/s is divided by the no-auth proxy's of the same round; the figures are
// the medians of those ratios (the machine is noisy; ratios in one round share its state).
import { readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { SignJWT, exportJWK, generateKeyPair } from 'jose';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { Processes, ensureBenchTools, nginxBackendConfig, waitForListeningLine, waitForTcp } from '../lib/bench-peers.ts';
import { median, wrk } from '../lib/bench-load.ts';
import { fmt, fmtPct } from '../lib/bench-format.ts';

const PROXY_CORE = 1;
const CLIENT_CORE = 0;
const CONNECTIONS = 50;
const ISSUER = 'https://idp.bench.example/';
const AUDIENCE = 'edge-proxy-bench';

interface Variant {
  readonly key: string;
  readonly name: string;
  /** The pool's `auth` flow mapping; empty: none. */
  readonly auth: string;
  /** The token wrk sends (none: no header). */
  readonly token?: string;
}

export interface ProxyPhaseResult {
  readonly rounds: number;
  readonly seconds: number;
  readonly req_per_s: Record<string, number>;
  readonly ratio_to_no_auth: Record<string, number>;
  readonly errors: Record<string, number>;
}

/** Runs the phase; undefined (with a line saying why) when wrk, nginx or taskset is missing. */
export async function proxyPhase(dir: string, rounds: number, seconds: number, log: (line: string) => void): Promise<ProxyPhaseResult | undefined> {
  const tools = ensureBenchTools(log);
  for (const tool of ['wrk', 'nginx', 'taskset']) {
    if (!tools.has(tool)) {
      log(`proxy phase skipped: ${tool} missing (bench:proxy's Debian packages)`);
      return undefined;
    }
  }
  const procs = new Processes();
  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'bench', ca, { sans: ['localhost', '127.0.0.1'] });
  const rsa = await generateKeyPair('RS256', { extractable: true });
  const ec = await generateKeyPair('ES256', { extractable: true });
  const keys = [
    { ...(await exportJWK(rsa.publicKey)), kid: 'rsa-1', alg: 'RS256', use: 'sig' },
    { ...(await exportJWK(ec.publicKey)), kid: 'ec-1', alg: 'ES256', use: 'sig' },
  ];
  const idp = https.createServer({ cert: readFileSync(leaf.cert), key: readFileSync(leaf.key) }, (_req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ keys }));
  });
  idp.listen(0, '127.0.0.1');
  await once(idp, 'listening');
  const jwksUrl = `https://127.0.0.1:${(idp.address() as AddressInfo).port}/jwks.json`;
  const sign = (alg: 'RS256' | 'ES256'): Promise<string> =>
    new SignJWT({ sub: 'bench-user', scope: 'read write' })
      .setProtectedHeader({ alg, kid: alg === 'RS256' ? 'rsa-1' : 'ec-1', typ: 'JWT' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setIssuedAt()
      .setExpirationTime('1h')
      .sign(alg === 'RS256' ? rsa.privateKey : ec.privateKey);
  const jwt = (alg: string, cache: number): string => `, tls: { ca_file: ${ca.cert} }, auth: { jwt: { issuer: "${ISSUER}", audiences: [${AUDIENCE}], algorithms: [${alg}], verification_cache_entries: ${cache}, jwks: { url: "${jwksUrl}" } } }`;
  const rs256 = await sign('RS256');
  // The no-auth proxy gets the same header: the figures are validation's cost, not a longer request's.
  const variants: Variant[] = [
    { key: 'none', name: 'no auth (the same RS256 token header sent)', auth: '', token: rs256 },
    { key: 'rs256_cached', name: 'RS256, verification cache (hits)', auth: jwt('RS256', 10_000), token: rs256 },
    { key: 'rs256_uncached', name: 'RS256, no cache (a signature check per request)', auth: jwt('RS256', 0), token: rs256 },
    { key: 'es256_uncached', name: 'ES256, no cache (a signature check per request)', auth: jwt('ES256', 0), token: await sign('ES256') },
  ];
  try {
    const backendPort = await freePort();
    const backend = procs.spawnPinned(CLIENT_CORE, tools.get('nginx') as string, ['-p', dir, '-e', path.join(dir, 'backend-stderr.log'), '-c', nginxBackendConfig(dir, backendPort, await freePort(), leaf.cert, leaf.key)]);
    await waitForTcp(backendPort, backend);
    const urls = new Map<string, string>();
    for (const v of variants) {
      const port = await freePort();
      const file = path.join(dir, `edge-proxy-${v.key}.yaml`);
      writeFileSync(
        file,
        `listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${leaf.cert}, key: ${leaf.key} } }
log: { level: warn, format: json }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:${backendPort}" }]${v.auth} } }
observability: { metrics: { enabled: false }, control_api: { enabled: false } }
`,
      );
      const p = procs.spawnPinned(PROXY_CORE, process.execPath, [path.join(import.meta.dirname, '../../packages/dataplane/src/worker/standalone.ts'), '-c', file, '--port', String(port)], { stdout: 'pipe' });
      await waitForListeningLine(p);
      urls.set(v.key, `https://127.0.0.1:${port}/`);
    }
    const headers = (v: Variant): string[] => (v.token === undefined ? [] : [`authorization: Bearer ${v.token}`]);
    // Warm-up: each proxy once (JIT, connections, the first fetch of its keys, the cache).
    for (const v of variants) await wrk(CLIENT_CORE, urls.get(v.key) as string, CONNECTIONS, 2, headers(v));
    const perRound = new Map<string, number[]>(variants.map((v) => [v.key, []]));
    const ratios = new Map<string, number[]>(variants.map((v) => [v.key, []]));
    const errors: Record<string, number> = Object.fromEntries(variants.map((v) => [v.key, 0]));
    for (let r = 0; r < rounds; r++) {
      const order = variants.map((_, i) => variants[(i + r) % variants.length] as Variant);
      const got: Record<string, number> = {};
      for (const v of order) {
        const res = await wrk(CLIENT_CORE, urls.get(v.key) as string, CONNECTIONS, seconds, headers(v));
        got[v.key] = res.reqPerSec;
        errors[v.key] = (errors[v.key] ?? 0) + res.errors;
        perRound.get(v.key)?.push(res.reqPerSec);
      }
      for (const v of variants) ratios.get(v.key)?.push((got[v.key] ?? NaN) / (got['none'] ?? NaN));
      log(`  round ${r + 1}: ${variants.map((v) => `${v.key} ${fmt(got[v.key])} req/s`).join('; ')}`);
    }
    const result: ProxyPhaseResult = {
      rounds,
      seconds,
      req_per_s: Object.fromEntries(variants.map((v) => [v.key, median(perRound.get(v.key) ?? [])])),
      ratio_to_no_auth: Object.fromEntries(variants.map((v) => [v.key, median(ratios.get(v.key) ?? [])])),
      errors,
    };
    log(`\n## Throughput cost on bench:proxy's HTTP/1.1 phase (wrk -t1 -c${CONNECTIONS}, one worker on one core; medians of ${rounds} rounds of ${seconds} s)`);
    log('| proxy | req/s | ÷ no auth | cost | errors |');
    log('|---|---|---|---|---|');
    for (const v of variants) {
      const ratio = result.ratio_to_no_auth[v.key] ?? NaN;
      log(`| ${v.name} | ${fmt(result.req_per_s[v.key])} | ${fmt(ratio, 3)} | ${v.key === 'none' ? '—' : fmtPct((1 - ratio) * 100)} | ${errors[v.key]} |`);
    }
    return result;
  } finally {
    await procs.stopAll();
    idp.close();
  }
}
