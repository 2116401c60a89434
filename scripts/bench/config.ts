// `npm run bench:config`: validating and resolving a configuration with 1,000 upstream pools ×
// 10 backends and 1,000 routes (target: under 1 s on a 2-core machine). Reports the median and
// worst of several runs of the whole load (YAML parse, schema, rules, normalization, resolution).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { dump } from 'js-yaml';
import { loadConfigFile, parseConfigText, validateConfig } from '@edge-proxy/config';
import { makeCa, makeLeaf } from '../lib/certs.ts';

const POOLS = 1000;
const BACKENDS = 10;
const RUNS = 7;

const dir = mkdtempSync(path.join(tmpdir(), 'edge-bench-config-'));
try {
  const ca = makeCa(dir);
  const server = makeLeaf(dir, 'server', ca);
  const upstream: Record<string, unknown> = {};
  for (let i = 0; i < POOLS; i++) {
    upstream[`pool-${i}`] = {
      route: { host: `svc${i % 50}.example.com`, path_prefix: `/svc/${i}`, methods: i % 3 === 0 ? ['GET', 'HEAD'] : [] },
      load_balancing: { type: i % 2 === 0 ? 'round-robin' : 'consistent-hash', ...(i % 2 === 0 ? {} : { key: 'header:x-user' }) },
      health_check: { path: '/healthz', interval: 5000 },
      tls: i % 10 === 0 ? { ca_file: ca.cert } : undefined,
      backends: Array.from({ length: BACKENDS }, (_, j) => ({ id: `b${j}`, address: `${i % 10 === 0 ? 'https' : 'http'}://10.${(i >> 8) & 255}.${i & 255}.${j + 1}:8080`, weight: 1 + (j % 3) })),
    };
  }
  const config = { listen: { address: '127.0.0.1', port: 9889, tls: { cert: server.cert, key: server.key } }, upstream: JSON.parse(JSON.stringify(upstream)) };
  const file = path.join(dir, 'config.yaml');
  const text = dump(config);
  writeFileSync(file, text);

  const parseMs: number[] = [];
  const validateMs: number[] = [];
  const totalMs: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const t0 = performance.now();
    const parsed = parseConfigText(text);
    const t1 = performance.now();
    if (!parsed.ok) throw new Error('parse failed');
    const v = validateConfig(parsed.value, dir);
    const t2 = performance.now();
    if (!v.ok) throw new Error(`invalid: ${JSON.stringify(v.issues.slice(0, 3))}`);
    parseMs.push(t1 - t0);
    validateMs.push(t2 - t1);
    const s = performance.now();
    const loaded = await loadConfigFile(file);
    totalMs.push(performance.now() - s);
    if (!loaded.ok) throw new Error(`load failed: ${JSON.stringify(loaded.issues.slice(0, 3))}`);
  }
  const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
  const fmt = (x: number): string => `${x.toFixed(0)} ms`;
  console.log(`config: ${POOLS} pools × ${BACKENDS} backends, ${POOLS} routes, ${(text.length / 1024).toFixed(0)} KiB YAML; ${RUNS} runs`);
  console.log(`  YAML parse             median ${fmt(median(parseMs))}`);
  console.log(`  validate + normalize   median ${fmt(median(validateMs))}`);
  console.log(`  full load (read, parse, validate, resolve)  median ${fmt(median(totalMs))}, worst ${fmt(Math.max(...totalMs))}  (target < 1000 ms)`);
  console.log(`  heap used after runs   ${(process.memoryUsage().heapUsed / 1048576).toFixed(0)} MiB`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
