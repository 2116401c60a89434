// Generations under load, end to end: `edge-proxy serve` with two workers, continuous HTTP/1.1,
// HTTP/2 and HTTP/3 traffic, 25 activations and 25 rollbacks in a row; then a worker killed with
// SIGKILL. The two configurations point at two backends answering `gen-a` and `gen-b`, so every
// answer names the generation that served it: after each 202 the traffic must come from the
// generation the control plane reported, not merely be answered.
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import http2 from 'node:http2';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import { allFrom, getH1, servedBy } from './support/served-by.ts';
import { forwardsTo } from './support/upstream-peers.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-cp-load-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'operator-token-0123456789abcdef';

const backend = (answer: string): Promise<number> => namedBackend(t, answer);
const [pa, pb] = [await backend('gen-a'), await backend('gen-b')];
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];

function configText(backendPort: number): string {
  return `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 2 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${backendPort}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api:
    address: 127.0.0.1
    port: ${cport}
    auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: load-test }] }
`;
}
const aFile = path.join(dir, 'a.yaml');
const bFile = path.join(dir, 'b.yaml');
writeFileSync(bFile, configText(pb));
const served = await serve(aFile, configText(pa));
t.teardown(() => served.stop());
const call = (method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKEN }, body);

const target = { lport, ca: caPem };
/** Which backend a generation's configuration names: the control plane reports the config source. */
const backendOf = (configSource: unknown): string => (configSource === aFile ? 'gen-a' : configSource === bFile ? 'gen-b' : `unknown source ${String(configSource)}`);

type Kind = 'h1-keepalive' | 'h1-fresh' | 'h2' | 'h3';
interface Sample {
  readonly kind: Kind;
  readonly start: number;
  readonly end: number;
  readonly answer: string;
}
/** How many answered requests of each kind a window waits for (0: that kind is not running). */
type Need = Partial<Record<Kind, number>>;

/**
 * Continuous load, every request recorded with its start and end (performance.now()) and answer:
 * HTTP/1.1 on one keep-alive connection per loop and on a fresh connection per request (the kernel
 * spreads those over both workers), one HTTP/2 session with two request loops, and HTTP/3 loops
 * that open a new QUIC connection every few requests. A loop pinned to one connection sees one
 * worker only: the fresh connections are what reach a worker left behind.
 */
function startLoad(o: { keepAlive: number; fresh: number; h2: number; h3: number }) {
  let running = true;
  const samples: Sample[] = [];
  const waiters: { since: number; need: Need; resolve: () => void }[] = [];
  const enough = (since: number, need: Need): boolean =>
    Object.entries(need).every(([kind, n]) => samples.filter((s) => s.kind === kind && s.start > since).length >= (n ?? 0));
  const record = (kind: Kind, start: number, answer: string): void => {
    samples.push({ kind, start, end: performance.now(), answer });
    for (const w of [...waiters]) {
      if (!enough(w.since, w.need)) continue;
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve();
    }
  };
  const agent = new https.Agent({ keepAlive: true, maxSockets: Math.max(1, o.keepAlive) });
  const keepAliveGet = (): Promise<string> =>
    new Promise((resolve) => {
      const req = https.get({ host: '127.0.0.1', port: lport, path: '/', ca: caPem, servername: 'localhost', agent }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve(res.statusCode === 200 ? body : `status ${res.statusCode}: ${body.slice(0, 60)}`));
      });
      req.on('error', (err) => resolve(`error: ${err.message}`));
    });
  const loop = async (kind: Kind, get: () => Promise<string>): Promise<void> => {
    while (running) {
      const start = performance.now();
      record(kind, start, await get());
    }
  };
  const h2loops = async (): Promise<void> => {
    const session = http2.connect(`https://localhost:${lport}`, { ca: caPem, host: '127.0.0.1', servername: 'localhost' } as http2.SecureClientSessionOptions);
    session.on('error', () => undefined); // each stream reports its own failure
    const get = (): Promise<string> =>
      new Promise((resolve) => {
        const req = session.request({ ':path': '/', ':authority': 'localhost' });
        let status = 0;
        let body = '';
        req.on('response', (h) => (status = Number(h[':status'])));
        req.on('data', (c: Buffer) => (body += c.toString()));
        req.on('end', () => resolve(status === 200 ? body : `status ${status}: ${body.slice(0, 60)}`));
        req.on('error', (err) => resolve(`error: ${err.message}`));
        req.end();
      });
    try {
      await Promise.all(Array.from({ length: o.h2 }, () => loop('h2', get)));
    } finally {
      session.destroy();
    }
  };
  const h3loop = async (): Promise<void> => {
    while (running) {
      const session = await Http3ClientSession.connect({ host: '127.0.0.1', port: lport, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 10_000 });
      try {
        for (let i = 0; i < 5 && running; i++) {
          const start = performance.now();
          const r = await session.fetch({ path: '/', authority: 'localhost', timeoutMs: 10_000 }).catch((err: Error) => ({ status: -1, body: Buffer.from(`error: ${err.message}`) }));
          const body = r.body.toString();
          record('h3', start, r.status === 200 ? body : `status ${r.status}: ${body.slice(0, 60)}`);
        }
      } finally {
        await session.close(true).catch(() => undefined);
      }
    }
  };
  const loops = [
    ...Array.from({ length: o.keepAlive }, () => loop('h1-keepalive', keepAliveGet)),
    ...Array.from({ length: o.fresh }, () => loop('h1-fresh', () => getH1(target))),
    ...(o.h2 > 0 ? [h2loops()] : []),
    ...Array.from({ length: o.h3 }, h3loop),
  ];
  return {
    samples,
    /** Resolves once `need` requests of each kind that started after `since` have been answered. */
    answeredSince(since: number, need: Need, timeoutMs = 30_000): Promise<void> {
      if (enough(since, need)) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`fewer than ${JSON.stringify(need)} requests answered within ${timeoutMs} ms`)), timeoutMs);
        waiters.push({ since, need, resolve: () => (clearTimeout(timer), resolve()) });
      });
    },
    async stop(): Promise<Sample[]> {
      running = false;
      await Promise.all(loops);
      agent.destroy();
      return samples;
    },
  };
}

/** The generation the control plane reports, and every worker's, with the backend its config names. */
async function reported(): Promise<{ generation: number; workers: number[]; backend: string }> {
  const body = (await call('GET', '/admin/runtime')).body;
  const list = (body['workers'] as { list: { generation: number }[] }).list;
  return { generation: body['generation'] as number, workers: list.map((w) => w.generation), backend: backendOf(body['config_source']) };
}

const tally = (samples: readonly Sample[]): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const s of samples) out[`${s.kind} ${s.answer}`] = (out[`${s.kind} ${s.answer}`] ?? 0) + 1;
  return out;
};

t.test('25 activations and 25 rollbacks under HTTP/1.1, HTTP/2 and HTTP/3 load: no request lost, every one after a 202 served by the generation reported', async (t) => {
  const need: Need = { 'h1-keepalive': 1, 'h1-fresh': 2, h2: 1, h3: 1 };
  const load = startLoad({ keepAlive: 1, fresh: 2, h2: 2, h3: 1 });
  /** [202 received, next operation sent, backend the reported generation's config names, label]. */
  const windows: { from: number; to: number; backend: string; label: string }[] = [];
  let active = 1;
  /** Sends one operation; on its 202, waits until requests started after it were answered, then opens its window. */
  const operate = async (label: string, p: string, body: Record<string, unknown>): Promise<Record<string, unknown>> => {
    const sent = performance.now();
    const last = windows.at(-1);
    if (last !== undefined && last.to === Infinity) last.to = sent;
    const r = await call('POST', p, body);
    t.equal(r.status, 202, label);
    const from = performance.now();
    const entry = r.body['history_entry'] as { config_source?: string } | undefined;
    windows.push({ from, to: Infinity, backend: backendOf(entry?.config_source), label });
    await load.answeredSince(from, need);
    return r.body;
  };
  const check = async (label: string, expected: string, perProtocol: number): Promise<void> => {
    t.same(await servedBy(target, { perProtocol }), allFrom(expected, { perProtocol }), `${label}: fresh connections on every protocol answered by ${expected}`);
    const r = await reported();
    t.same(r, { generation: active, workers: [active, active], backend: expected }, `${label}: /admin/runtime and both workers report generation ${active}`);
  };
  for (let i = 0; i < 25; i++) {
    const file = i % 2 === 0 ? bFile : aFile;
    const act = await operate(`activation ${i}`, '/admin/runtime/activate', { config_path: file, expected_generation: active, reason: `load ${i}` });
    const previous = active;
    active = act['generation'] as number;
    const rb = await operate(`rollback ${i}`, '/admin/runtime/rollback', { target_generation: previous, expected_active_generation: active, reason: `undo ${i}` });
    t.equal(rb['generation'], previous, `rollback ${i} restores generation ${previous}`);
    active = previous;
    // Make the next activation go to the other config: activate this one for real before continuing.
    const fwd = await operate(`activation ${i} again`, '/admin/runtime/activate', { config_path: file, expected_generation: active });
    active = fwd['generation'] as number;
    // Every fifth round, alternately on gen-b and gen-a (rounds 4, 9, 14, 19); the end checks round 24.
    if (i % 5 === 4 && i < 24) await check(`after round ${i}`, backendOf(file), 4);
  }
  const samples = await load.stop();
  const lost = samples.filter((s) => s.answer !== 'gen-a' && s.answer !== 'gen-b');
  t.same(lost.map((s) => `${s.kind} ${s.answer}`), [], 'no failed request and every answer from exactly one backend');
  let checked = 0;
  for (const w of windows) {
    const inside = samples.filter((s) => s.start > w.from && s.end < w.to);
    checked += inside.length;
    const wrong = inside.filter((s) => s.answer !== w.backend);
    if (wrong.length > 0) t.fail(`after the 202 of ${w.label}: ${inside.length} requests, ${wrong.length} not from ${w.backend}`, { wrong: tally(wrong) });
  }
  t.equal(windows.length, 75, 'every operation opened a window');
  t.ok(checked >= 75 * 5, `${checked} requests started after a 202 and ended before the next operation, each from the reported generation's backend`);
  for (const kind of ['h1-keepalive', 'h1-fresh', 'h2', 'h3'] as const) t.ok(samples.filter((s) => s.kind === kind).length >= 75, `${kind} requests ran throughout`);
  await check('at the end', backendOf(bFile), 8);
});

t.test('SIGKILL of a worker under load: re-forked on the active generation and serving it; /ready and metrics keep answering', async (t) => {
  const before = await call('GET', '/admin/runtime');
  const workers = (before.body['workers'] as { list: { pid: number; generation: number }[] }).list;
  const generation = before.body['generation'];
  const expected = backendOf(before.body['config_source']);
  t.equal(expected, 'gen-b', 'the last activation named gen-b');
  t.equal(workers.length, 2);
  const load = startLoad({ keepAlive: 2, fresh: 0, h2: 0, h3: 0 });
  const panicsBefore = metricValue(await scrape(mport), 'svc_runtime_panics');
  process.kill(workers[0]?.pid ?? 0, 'SIGKILL');
  const metricsDuring = await new Promise<number>((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    }).on('error', reject);
  });
  t.equal(metricsDuring, 200, 'the metrics endpoint answers while a worker is down');
  await served.waitFor((l) => l['msg'] === 'worker re-forked on the active generation', 30_000);
  let ready = 0;
  for (let i = 0; i < 80 && ready !== 200; i++) {
    ready = (await call('GET', '/ready')).status;
    if (ready !== 200) await new Promise((r) => setTimeout(r, 250)); // other processes: poll, bounded
  }
  t.equal(ready, 200, '/ready is 200 again');
  const after = await call('GET', '/admin/runtime');
  const list = (after.body['workers'] as { list: { pid: number; generation: number }[] }).list;
  const fresh = list[0]?.pid ?? 0;
  t.not(fresh, workers[0]?.pid, 'a new worker process');
  t.same(list.map((w) => w.generation), [generation, generation], 'both workers on the active generation');
  const during = await load.stop();
  t.ok(during.some((s) => s.answer === expected), `${during.length} requests while the worker was replaced, ${during.filter((s) => !s.answer.startsWith('gen-')).length} lost on the killed worker's connections`);
  t.same(during.filter((s) => s.answer.startsWith('gen-') && s.answer !== expected).map((s) => s.answer), [], 'no answer from another generation meanwhile');
  t.same(await servedBy(target, { perProtocol: 8 }), allFrom(expected, { perProtocol: 8 }), 'after the re-fork every protocol is served by the active generation, on fresh connections');
  t.ok(await forwardsTo(fresh, pb, () => servedBy(target, { perProtocol: 4, protocols: ['h1'] })), `the re-forked worker (pid ${fresh}) forwards requests to ${expected}`);
  t.equal(metricValue(await scrape(mport), 'svc_runtime_panics') - panicsBefore, 1, 'the one worker crash is counted once');
});
