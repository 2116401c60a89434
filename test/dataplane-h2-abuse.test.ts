// HTTP/2 abuse against a real worker process (issue 11, item 13): rounds of an attack mix (rapid
// reset, CONTINUATION flood, SETTINGS and PING floods from a peer that does not read, a zero
// flow-control window under large responses, HPACK dynamic-table churn) with hand-built frames,
// and a client that stops reading with responses on their way.
// The worker runs with the memory probe of test/support/worker-memory.ts: once every downstream
// connection it accepted has closed (or 15 s have passed), a full GC and its memoryUsage(), so the
// test can tell retained JavaScript (a leak) from memory that the allocators keep after use (a
// high-water mark). Figures go to the TAP comments.
//
// The rounds found a leak (issue 19): a session whose write node never completes stops reading
// its socket, never sees the client leave, and kept 100 streams and their header blocks for ever
// (about 0.5 MiB of heap per round, and growing RSS). connection-deadlines.ts now cuts a session
// whose output has not moved for `client_send_idle_ms`; the rounds check that every connection of
// a round is closed once its clients have left.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import { spawn } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import type { AddressInfo } from 'node:net';
import type tls from 'node:tls';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import * as F from './support/h2-frames.ts';
import { listeningLine } from './support/serve.ts';
import { memoryProbe, memoryProbeArgs } from './support/worker-memory.ts';

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-h2abuse-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'default', ca, { sans: ['localhost'] });
const caPem = readFileSync(ca.cert);

const big = Buffer.alloc(4 * 1024 * 1024, 1);
const backend = http.createServer((req, res) => {
  if (req.url === '/big') return void res.end(big);
  // Quiet for 2.5 × client_send_idle_ms: before its head (a long poll), then between two chunks.
  if (req.url === '/slow') return void setTimeout(() => res.end('late'), 2500);
  if (req.url === '/drip') {
    res.write('first ');
    return void setTimeout(() => res.end('second'), 2500);
  }
  res.end('ok');
});
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => {
  backend.closeAllConnections();
  return new Promise<void>((resolve) => backend.close(() => resolve()));
});

const file = path.join(dir, 'config.yaml');
writeFileSync(
  file,
  `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert.cert}, key: ${cert.key} } }
performance: { new_connections_per_sec: 100000, new_connections_burst: 100000, timeouts: { client_send_idle_ms: 1000, client_idle_ms: 1000 } }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }] } }
`,
);
const worker = spawn(process.execPath, [...memoryProbeArgs, path.join(root, 'packages/dataplane/src/worker/standalone.ts'), '-c', file, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
t.teardown(() => {
  if (worker.exitCode === null) worker.kill('SIGKILL');
});
const probe = memoryProbe(worker);
/** The worker's JSON log lines (stderr). */
const logLines: Record<string, unknown>[] = [];
const logged = new EventEmitter();
readline.createInterface({ input: worker.stderr! }).on('line', (line) => {
  if (probe.line(line)) return;
  if (line.startsWith('{')) {
    logLines.push(JSON.parse(line) as Record<string, unknown>);
    logged.emit('line');
  }
});
const line = await listeningLine(worker);
const port = (JSON.parse(line.toString().split('\n')[0] ?? '{}') as { listeners: { tcp: number }[] }).listeners[0]?.tcp as number;

const MiB = (n: number): number => Math.round(n / 104857.6) / 10;
/** Once the worker's downstream connections have closed: VmRSS in MiB, then the heap after a forced full GC. */
async function memory(): Promise<{ rss: number; heapUsed: number; heapTotal: number; open: number; waitedMs: number }> {
  const m = await probe.read();
  return { rss: Math.round(m.rssMiB), heapUsed: MiB(m.heapUsed), heapTotal: MiB(m.heapTotal), open: m.open, waitedMs: m.waitedMs };
}

/** Legitimate requests refused (REFUSED_STREAM) and retried, reported with the attack rounds. */
let refusedRetried = 0;

async function legitimateGet(retryRefused = true): Promise<number> {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  try {
    const s = session.request({ ':path': '/' });
    s.resume();
    const [h] = (await once(s, 'response')) as [http2.IncomingHttpHeaders];
    return Number(h[':status']);
  } catch (err) {
    // REFUSED_STREAM means the stream was not processed and may be retried (RFC 9113 §8.7), as
    // browsers do. With client_idle_ms at 1 s here, a session whose first request comes late
    // (this process is busy writing the attacks' megabytes on a loaded CI machine) can be closed
    // as idle, and the request that crosses its GOAWAY is refused. One retry on a fresh session;
    // a worker that refused legitimate streams outright still fails the test.
    if (retryRefused && (err as { code?: string; message?: string }).code === 'ERR_HTTP2_STREAM_ERROR' && /REFUSED_STREAM/.test(String((err as Error).message))) {
      refusedRetried++;
      return legitimateGet(false);
    }
    throw err;
  } finally {
    session.close();
  }
}

/** `count` HEADERS + RST_STREAM(CANCEL) pairs (CVE-2023-44487). */
function rapidReset(count: number): Buffer {
  const parts: Buffer[] = [];
  for (let i = 0; i < count; i++) parts.push(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1 + 2 * i, F.requestBlock('/')), F.frame(F.RST_STREAM, 0, 1 + 2 * i, F.u32(8)));
  return Buffer.concat(parts);
}

/** One round: four connections per attack, all at once; resolves once every one of them is closed. */
async function attackRound(): Promise<void> {
  const sockets: tls.TLSSocket[] = [];
  const open = async (read: boolean, bytes: Buffer): Promise<void> => {
    const s = await F.rawH2(port, read);
    sockets.push(s);
    s.write(bytes);
  };
  const attacks: [boolean, () => Buffer][] = [
    [true, () => rapidReset(2000)],
    // A header block that never ends: HEADERS without END_HEADERS, then CONTINUATION frames.
    [true, () => Buffer.concat([F.frame(F.HEADERS, 0, 1, F.requestBlock('/')), ...Array.from({ length: 2000 }, (_, i) => F.frame(F.CONTINUATION, 0, 1, Buffer.concat(Array.from({ length: 10 }, (_, k) => F.indexedLiteral(`x-c${i}-${k}`, 'v'.repeat(90))))))])],
    [false, () => Buffer.concat(Array.from({ length: 5000 }, (_, i) => F.settings([[F.SETTINGS_HEADER_TABLE_SIZE, 4096 + (i % 7)]])))],
    [false, () => Buffer.concat(Array.from({ length: 10000 }, (_, i) => F.frame(F.PING, 0, 0, Buffer.alloc(8, i & 255))))],
    [false, () => Buffer.concat([F.settings([[F.SETTINGS_INITIAL_WINDOW_SIZE, 0]]), ...Array.from({ length: 100 }, (_, i) => F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1 + 2 * i, F.requestBlock('/big')))])],
    [true, () => Buffer.concat(Array.from({ length: 500 }, (_, i) => F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1 + 2 * i, Buffer.concat([F.requestBlock('/'), ...Array.from({ length: 40 }, (_, k) => F.indexedLiteral(`x-h${i}-${k}`, 'v'.repeat(100)))]))))],
  ];
  await Promise.all(attacks.flatMap(([read, bytes]) => Array.from({ length: 4 }, () => open(read, bytes()))));
  // Let the worker take in what was sent (the non-reading peers never finish), then hang up.
  await legitimateGet();
  for (const s of sockets) s.destroy();
  await Promise.all(sockets.map((s) => (s.closed ? undefined : once(s, 'close'))));
}

t.test('every HTTP/2 session is offered at most 100 concurrent streams', async (t) => {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  t.teardown(() => session.close());
  const [settings] = (await once(session, 'remoteSettings')) as [http2.Settings];
  t.equal(settings.maxConcurrentStreams, 100);
});

t.test('rapid reset: the session is closed with an error GOAWAY after a few hundred resets, not a thousand', async (t) => {
  const s = await F.rawH2(port, false);
  t.teardown(() => s.destroy());
  const goaway = F.nextGoaway(s, 10_000);
  s.resume();
  s.write(rapidReset(1000));
  const g = await goaway;
  // node's reset-rate limit closes the session with INTERNAL_ERROR.
  t.not(g.errorCode, http2.constants.NGHTTP2_NO_ERROR, `GOAWAY with error code ${g.errorCode}`);
  t.ok(g.lastStreamId < 2 * 400, `last stream processed: ${g.lastStreamId} (${(g.lastStreamId + 1) / 2} streams)`);
  t.equal(await legitimateGet(), 200);
});

t.test('a client that stops reading with responses on their way is cut after client_send_idle_ms, not held for ever', async (t) => {
  // Windows wide open, so node sends until the loopback socket buffers are full, then twenty 4-MiB
  // responses wait on a client that reads nothing: each is cut after `client_send_idle_ms`
  // (forward.ts), then the idle session's GOAWAY cannot be written either. Before issue 19 that
  // session stayed until the client left; now its socket is destroyed.
  const s = await F.rawH2(port, false);
  t.teardown(() => s.destroy());
  const streams = 20;
  const seen = logLines.length;
  const t0 = performance.now();
  s.write(
    Buffer.concat([
      F.settings([[F.SETTINGS_INITIAL_WINDOW_SIZE, 0x7fffffff]]),
      F.frame(F.WINDOW_UPDATE, 0, 0, F.u32(0x7fffffff - 65535)),
      ...Array.from({ length: streams }, (_, i) => F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1 + 2 * i, F.requestBlock('/big'))),
    ]),
  );
  const stalled = (): Record<string, unknown> | undefined => logLines.slice(seen).find((l) => l['reason'] === 'send_stalled');
  const limit = AbortSignal.timeout(20_000);
  while (stalled() === undefined && !limit.aborted) await once(logged, 'line', { signal: limit }).catch(() => undefined);
  const line = stalled();
  t.ok(line, `the worker logged the cut (${((performance.now() - t0) / 1000).toFixed(1)} s after the requests; send idle 1 s, client idle 1 s)`);
  t.equal(line?.['level'], 'warn');
  t.equal(line?.['msg'], 'downstream connections refused or cut');
  t.equal(line?.['example_source'], '127.0.0.1', 'with the source address');
  // The client reads now: what the buffers held, then the end of a connection the worker closed.
  let bytes = 0;
  s.on('data', (d: Buffer) => (bytes += d.length));
  s.resume();
  const closed = await Promise.race([once(s, 'close').then(() => true), new Promise<boolean>((r) => setTimeout(r, 10_000, false))]);
  t.ok(closed, 'the connection was closed by the worker');
  t.ok(bytes < streams * big.length, `the client got ${(bytes / 1048576).toFixed(1)} MiB of ${(streams * big.length) / 1048576} MiB before the end`);
  t.equal(await legitimateGet(), 200, 'a legitimate client is served');
});

t.test('a quiet stream is not a stuck one: a long poll and a pause inside a body outlast client_send_idle_ms', async (t) => {
  const seen = logLines.length;
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  t.teardown(() => session.close());
  const get = async (p: string): Promise<[number, string]> => {
    const s = session.request({ ':path': p });
    const [h] = (await once(s, 'response')) as [http2.IncomingHttpHeaders];
    let body = '';
    for await (const c of s) body += String(c);
    return [Number(h[':status']), body];
  };
  const t0 = performance.now();
  t.same(await Promise.all([get('/slow'), get('/drip')]), [
    [200, 'late'],
    [200, 'first second'],
  ]);
  t.ok(performance.now() - t0 >= 2500, 'both waited on the backend longer than the send idle time');
  t.same(logLines.slice(seen).filter((l) => l['reason'] === 'send_stalled'), [], 'no connection was cut');
});

t.test('rounds of the attack mix: no JavaScript retained, resident memory bounded, the worker keeps serving', async (t) => {
  const rounds = 5;
  const base = await memory();
  const after: Awaited<ReturnType<typeof memory>>[] = [];
  for (let i = 0; i < rounds; i++) {
    await attackRound();
    after.push(await memory());
  }
  t.comment(`baseline: RSS ${base.rss} MiB, heap used ${base.heapUsed} MiB of ${base.heapTotal} MiB (after a full GC)`);
  t.comment(`legitimate requests refused (REFUSED_STREAM) and served on a retry: ${refusedRetried}`);
  after.forEach((m, i) => t.comment(`after round ${i + 1}: RSS ${m.rss} MiB, heap used ${m.heapUsed} MiB of ${m.heapTotal} MiB; connections closed ${m.waitedMs} ms after the clients left`));
  // A stuck session is cut `client_send_idle_ms` (1 s here) after its output last moved.
  after.forEach((m, i) => t.equal(m.open, 0, `round ${i + 1}: every downstream connection closed once its client left (${m.open} still open after ${m.waitedMs} ms)`));
  const last = after[rounds - 1]!;
  // The first two rounds still warm caches (optimised code, metric series): a clean-clone run
  // read 31 → 34.4 → 36.3 → 36.4 MiB. A leak grows with every round after them, so round 2 is the
  // reference, and the lower of the last two rounds is compared (one sample swings by 2-3 MiB).
  const late = Math.min(last.heapUsed, after[rounds - 2]!.heapUsed);
  t.ok(late - after[1]!.heapUsed < 5, `live JS heap after a full GC, round 2 → ${rounds - 1}-${rounds}: ${after[1]!.heapUsed} → ${late} MiB (no leak)`);
  t.ok(last.heapUsed - base.heapUsed < 16, `live JS heap after a full GC, baseline → round ${rounds}: ${base.heapUsed} → ${last.heapUsed} MiB`);
  // RSS: the allocators keep what the rounds needed (docs/decisions.md "HTTP/2 abuse"); how much
  // depends on the machine's load, so only a loose bound is asserted here and the figures are
  // reported above.
  t.ok(last.rss - base.rss < 320, `RSS stays bounded: ${base.rss} → ${last.rss} MiB`);
  t.equal(worker.exitCode, null, 'the worker is still running');
  t.equal(await legitimateGet(), 200, 'a legitimate client is served after the rounds');
});
