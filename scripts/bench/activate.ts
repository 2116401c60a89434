// `npm run bench:activate`: time from `POST /admin/runtime/activate` to its 202 for a configuration
// with 1,000 routes (1,000 pools × 2 backends), with 2 and with 4 workers (target: under 250 ms),
// and the memory of the supervisor and of each worker at rest. Runs the real `edge-proxy serve`.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { makeCa, makeLeaf } from '../lib/certs.ts';
import { freePort } from '../lib/free-port.ts';
import { rssMiB } from '../lib/proc-stats.ts';
import { api, serve } from '../../test/support/serve.ts';

const ROUTES = 1000;
const RUNS = 12;
const TOKEN = 'bench-token-0123456789abcdef';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-bench-activate-'));
try {
  const ca = makeCa(dir);
  const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost'] });
  const caPem = readFileSync(ca.cert);
  const config = (workers: number, ports: { l: number; c: number; m: number }, weight: number): string => {
    const pools: string[] = [];
    for (let i = 0; i < ROUTES; i++) {
      pools.push(`  pool-${i}:\n    route: { host: svc${i % 50}.example.com, path_prefix: /svc/${i} }\n    backends:\n      - { id: a, address: "10.${(i >> 8) & 255}.${i & 255}.1:8080", weight: ${weight} }\n      - { id: b, address: "10.${(i >> 8) & 255}.${i & 255}.2:8080" }`);
    }
    return `listen: { address: 127.0.0.1, port: ${ports.l}, tls: { cert: ${cert.cert}, key: ${cert.key} } }
log: { format: json, level: info }
performance: { worker_threads: ${workers} }
observability:
  metrics: { address: 127.0.0.1, port: ${ports.m} }
  control_api: { address: 127.0.0.1, port: ${ports.c}, auth: { bearer_tokens: [{ token: ${TOKEN}, role: operator, actor_id: bench }] } }
upstream:
${pools.join('\n')}
`;
  };
  console.log(`activate: ${ROUTES} routes (${ROUTES * 2} backends), ${RUNS} activations per worker count, alternating two weight variants`);
  for (const workers of [2, 4]) {
    const ports = { l: await freePort(), c: await freePort(), m: await freePort() };
    const a = path.join(dir, `a-${workers}.yaml`);
    const b = path.join(dir, `b-${workers}.yaml`);
    writeFileSync(b, config(workers, ports, 2));
    const served = await serve(a, config(workers, ports, 1), 120_000);
    try {
      const snap = await api(ports.c, caPem, 'GET', '/admin/runtime', { token: TOKEN });
      const pids = (snap.body['workers'] as { list: { pid: number }[] }).list.map((w) => w.pid);
      const supervisorRss = rssMiB(served.proc.pid ?? 0);
      const workerRss = pids.map(rssMiB);
      const times: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        const t0 = performance.now();
        const r = await api(ports.c, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: i % 2 === 0 ? b : a });
        const ms = performance.now() - t0;
        if (r.status !== 202) throw new Error(`activation ${i} answered ${r.status}: ${JSON.stringify(r.body).slice(0, 300)}`);
        times.push(ms);
      }
      times.sort((x, y) => x - y);
      const q = (p: number): string => (times[Math.min(times.length - 1, Math.floor(p * times.length))] as number).toFixed(0);
      console.log(`  ${workers} workers: POST activate → 202  median ${q(0.5)} ms, p90 ${q(0.9)} ms, max ${times.at(-1)?.toFixed(0)} ms  (target < 250 ms)`);
      console.log(`             memory at rest: supervisor ${supervisorRss.toFixed(0)} MiB, workers ${workerRss.map((m) => m.toFixed(0)).join(' / ')} MiB`);
    } finally {
      await served.stop();
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
