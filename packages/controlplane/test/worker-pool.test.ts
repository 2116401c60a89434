// The worker pool with real cluster workers (packages/dataplane/src/worker/main.ts): two-phase
// activation, a candidate that fails to prepare, re-fork on SIGKILL, readiness, metrics pulls.
// Two backends answer `gen-a` and `gen-b`; each generation names one, so what the workers serve
// (servedBy: fresh HTTP/1.1, HTTP/2 and HTTP/3 connections, spread over both workers) shows which
// generation they really run, not only what the pool's bookkeeping says.
import t from 'tap';
import http from 'node:http';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { promisify } from 'node:util';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { WorkerPool } from '../src/supervisor/worker-pool.ts';
import { LeaseService } from '../src/limits/lease-service.ts';
import { TokenService } from '../src/limits/token-service.ts';
import type { ActivationOutcome } from '../src/supervisor/worker-pool.ts';
import type { FromWorker, GenerationBundle, LeaseAsk } from '@edge-proxy/ipc';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';
import { allFrom, servedBy } from '../../../test/support/served-by.ts';
import { forwardsTo } from '../../../test/support/upstream-peers.ts';
import { freePort } from '../../../scripts/lib/free-port.ts';

const run = promisify(execFile);
const root = path.resolve(import.meta.dirname, '../../..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-pool-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost'] });
// A client certificate whose key is too weak for TLS: it parses and matches, but no TLS context accepts it.
await run('openssl', ['req', '-x509', '-newkey', 'rsa:512', '-nodes', '-subj', '/CN=weak', '-keyout', path.join(dir, 'weak.key'), '-out', path.join(dir, 'weak.crt'), '-days', '3']);

async function backend(name: string): Promise<number> {
  const s = http.createServer((req, res) => res.end(req.url === '/' ? name : `${name} ${req.url}`));
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  t.teardown(() => new Promise<void>((r) => s.close(() => r())));
  return (s.address() as AddressInfo).port;
}
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];
const bport = pa;
const port = await freePort();
const target = { lport: port, ca: readFileSync(ca.cert) };

async function bundle(generation: number, extraUpstream = '', extraTop = '', appPort = pa): Promise<GenerationBundle> {
  const r = await loadConfigText(
    `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${cert.cert}, key: ${cert.key} } }
${extraTop}
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: a, address: "127.0.0.1:${appPort}" }]
${extraUpstream}`,
    dir,
  );
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return { generation, resolved: r.value };
}

const pool = new WorkerPool({ exec: path.join(root, 'packages/dataplane/src/worker/main.ts'), count: 2, keys: { cryptoKey: randomBytes(32), ticketKey: randomBytes(48) }, phaseTimeoutMs: 15_000, execArgv: [] });
t.teardown(() => pool.stop(2000));
// The node's limit services, wired as the supervisor wires them (supervisor.ts): workers admit
// requests from in-flight slots (leases) and connections from token budgets (tokens) the node
// leases them; a dead worker's part comes back; each committed generation's limits hold.
const leases = new LeaseService({ workers: 2, send: (i, grants) => pool.send(i, { type: 'lease', grants }) });
const tokens = new TokenService({ send: (i, n) => pool.send(i, n) });
pool.on('lease', (i: number, asks: readonly LeaseAsk[]) => leases.receive(i, asks));
pool.on('tokens', (i: number, m: Extract<FromWorker, { type: 'tokens' }>) => tokens.receive(i, m));
pool.on('exit', (i: number) => {
  tokens.workerGone(i);
  leases.workerGone(i);
});
t.teardown(() => {
  tokens.close();
  leases.close();
});
/** The pool's two-phase activation; once committed, its limits are the node's (the supervisor's onActivated). */
async function activate(b: GenerationBundle): Promise<ActivationOutcome> {
  const outcome = await pool.activate(b);
  if (outcome.ok) {
    tokens.configure(b.resolved, 2);
    leases.configure(b.resolved.config);
  }
  return outcome;
}

const curl = async (p: string): Promise<string> =>
  (await run('curl', ['-sS', '--max-time', '10', '--cacert', ca.cert, '--resolve', `localhost:${port}:127.0.0.1`, `https://localhost:${port}${p}`])).stdout;

t.test('workers start, activate generation 1 and serve on one shared port', async (t) => {
  await pool.start();
  let listening = 0;
  const both = new Promise<void>((resolve) => {
    pool.on('listening', () => {
      if (++listening === 2) resolve();
    });
  });
  t.same(await activate(await bundle(1)), { ok: true });
  await both;
  t.ok(pool.ready, 'ready once every worker committed generation 1');
  t.equal(await curl('/one'), 'gen-a /one');
  t.same(pool.describe().map((w) => w.generation), [1, 1]);
  t.same(await servedBy(target), allFrom('gen-a'), 'both workers serve generation 1 (gen-a) on every protocol');
});

t.test('a candidate a worker cannot provision is aborted everywhere; generation 1 keeps serving', async (t) => {
  const bad = await bundle(
    2,
    `  secure:
    route: { path_prefix: /secure }
    tls: { client_certificate_ref: { ref: "file://${path.join(dir, 'weak.crt')}" }, client_key_ref: { ref: "file://${path.join(dir, 'weak.key')}" } }
    backends: [{ id: s, address: "https://127.0.0.1:${bport}" }]`,
    '',
    pb,
  );
  const outcome = await activate(bad);
  t.match(outcome, { ok: false, phase: 'prepare', code: 'EDGE_PREPARE_FAILED', note: /TLS material cannot be used.*key too small/ });
  t.equal(pool.activeGeneration, 1);
  t.same(pool.describe().map((w) => w.generation), [1, 1]);
  t.equal(await curl('/still'), 'gen-a /still');
  t.same(await servedBy(target), allFrom('gen-a'), 'the aborted candidate (gen-b) serves nowhere; generation 1 does, on every protocol');
});

t.test('SIGKILL of a worker: re-forked on the active generation, serving continues', async (t) => {
  const victim = pool.describe()[0];
  const reforksBefore = pool.reforks;
  const refork = once(pool, 'refork') as Promise<[number, number]>;
  process.kill(victim?.pid ?? 0, 'SIGKILL');
  const [index, generation] = await refork;
  t.same([index, generation], [0, 1]);
  const fresh = pool.describe()[0]?.pid ?? 0;
  t.not(fresh, victim?.pid, 'a new process');
  t.same(await servedBy(target), allFrom('gen-a'), 'after the re-fork both workers serve generation 1 on every protocol');
  t.ok(await forwardsTo(fresh, pa, () => servedBy(target, { perProtocol: 4, protocols: ['h1'] })), `the re-forked worker (pid ${fresh}) forwards requests to gen-a`);
  t.equal(pool.reforks - reforksBefore, 1, 'one kill, one re-fork counted');
});

t.test('metrics are pulled from every worker', async (t) => {
  const { values, missing } = await pool.metrics(5000);
  t.equal(values.length, 2);
  t.equal(missing, 0);
  const names = (values[0] as { name: string }[]).map((m) => m.name);
  t.ok(names.includes('svc_requests_total'));
});

t.test('performance.worker_heartbeat_ms is live: a generation with 100 ms makes every worker beat about every 100 ms', async (t) => {
  /** The shortest gap between `n` consecutive heartbeats of worker `index`. */
  const shortestGap = (index: number, n: number): Promise<number> =>
    new Promise((resolve) => {
      const times: number[] = [];
      const on = (i: number): void => {
        if (i !== index) return;
        times.push(Date.now());
        if (times.length < n) return;
        pool.off('heartbeat', on);
        resolve(Math.min(...times.slice(1).map((x, k) => x - (times[k] as number))));
      };
      pool.on('heartbeat', on);
    });
  const before = await shortestGap(1, 3);
  t.ok(before >= 500, `default 1000 ms: shortest gap ${before} ms`);
  t.match(await activate(await bundle(3, '', 'performance: { worker_heartbeat_ms: 100 }', pb)), { ok: true });
  t.same(await servedBy(target), allFrom('gen-b'), 'generation 3 (gen-b) is what both workers serve, on every protocol');
  const after = await shortestGap(1, 6);
  t.ok(after < 300, `100 ms: shortest gap ${after} ms`);
});
