// HTTP/2 sessions that abuse header blocks, against real `edge-proxy serve` (2 workers), with
// hand-built frames (issue 38): an HPACK bomb (finding 10: refused stream by stream, the session
// stayed open) is closed with GOAWAY ENHANCE_YOUR_CALM after a bounded count; a CONTINUATION flood
// over many connections (Deliver 8) has each connection closed within a bound of frames and time,
// the worker's memory bounded, and a canary served throughout; a slow CONTINUATION (one frame a
// second) is closed by the header deadline. Figures go to the TAP comments.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type tls from 'node:tls';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import * as F from './support/h2-frames.ts';
import { serve } from './support/serve.ts';
import { listenTracked } from './support/backends.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-h2sessions-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);

let backendRequests = 0;
const appPort = await listenTracked(
  t,
  http.createServer((_req, res) => {
    backendRequests++;
    res.end('ok');
  }),
);

const HEADER_MS = 3000;
const [port, mport] = [await freePort(), await freePort()];
const served = await serve(
  path.join(dir, 'config.yaml'),
  `
listen: { address: 127.0.0.1, port: ${port}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance:
  worker_threads: 2
  new_connections_per_sec: 100000
  new_connections_burst: 100000
  timeouts: { client_header_ms: ${HEADER_MS} }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${appPort}" }]
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { enabled: false }
`,
);
t.teardown(() => served.stop());

/** Sum of a worker counter over its label sets, from the supervisor's metrics endpoint. */
async function metricSum(name: string): Promise<number> {
  const text = await new Promise<string>((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
        let b = '';
        res.on('data', (c: Buffer) => (b += c.toString()));
        res.on('end', () => resolve(b));
      })
      .on('error', reject);
  });
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

/** The supervisor's child processes (its workers), from /proc. */
function workerPids(pid: number): number[] {
  return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
}

/** VmRSS of every worker, MiB. */
function workersRss(): number[] {
  return workerPids(served.proc.pid as number).map((pid) => {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return Math.round(Number(m?.[1] ?? 0) / 1024);
  });
}

/** A canary on its own HTTP/2 connection: `count` GETs one after the other; statuses and the slowest, ms. */
async function canary(count: number, gapMs: number): Promise<{ statuses: number[]; maxMs: number }> {
  const session = http2.connect(`https://localhost:${port}`, { ca: caPem });
  session.on('error', () => {});
  const statuses: number[] = [];
  let maxMs = 0;
  try {
    for (let i = 0; i < count; i++) {
      const t0 = performance.now();
      const s = session.request({ ':path': '/canary' });
      s.resume();
      const [h] = (await once(s, 'response')) as [http2.IncomingHttpHeaders];
      await once(s, 'end');
      statuses.push(Number(h[':status']));
      maxMs = Math.max(maxMs, performance.now() - t0);
      await new Promise((r) => setTimeout(r, gapMs));
    }
  } finally {
    session.close();
  }
  return { statuses, maxMs: Math.round(maxMs) };
}

/** An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1). */
function hpackInt(n: number, first: number, v: number): Buffer {
  const max = (1 << n) - 1;
  if (v < max) return Buffer.from([first | v]);
  const out = [first | max];
  v -= max;
  while (v >= 128) {
    out.push((v & 127) | 128);
    v >>= 7;
  }
  out.push(v);
  return Buffer.from(out);
}

/** A literal with incremental indexing and a new name (RFC 7541 §6.2.1), any length. */
function bigIndexed(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x40]), hpackInt(7, 0, name.length), Buffer.from(name), hpackInt(7, 0, value.length), Buffer.from(value)]);
}

/**
 * Frames received on `s`, by type, until it closes; the streams each type was received on; the
 * first GOAWAY's error code and last stream id (RFC 9113 §6.8: the highest stream the proxy
 * processed, nghttp2's `lastProcStreamID`, which is what the refused-block watch counts from).
 */
function frameCounter(s: tls.TLSSocket): { counts: Map<number, number>; streams: (type: number) => Set<number>; goaway: () => number | undefined; goawayLastStream: () => number | undefined; closed: Promise<void> } {
  const counts = new Map<number, number>();
  const ids = new Map<number, Set<number>>();
  let goaway: number | undefined;
  let goawayLast: number | undefined;
  let buf = Buffer.alloc(0);
  s.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 9) {
      const len = buf.readUIntBE(0, 3);
      if (buf.length < 9 + len) return;
      const type = buf[3] as number;
      counts.set(type, (counts.get(type) ?? 0) + 1);
      let set = ids.get(type);
      if (set === undefined) ids.set(type, (set = new Set()));
      set.add(buf.readUInt32BE(5) & 0x7fffffff);
      if (type === 0x7 && goaway === undefined) {
        goawayLast = buf.readUInt32BE(9) & 0x7fffffff;
        goaway = buf.readUInt32BE(13);
      }
      buf = buf.subarray(9 + len);
    }
  });
  const closed = new Promise<void>((resolve) => s.once('close', () => resolve()));
  return { counts, streams: (type) => ids.get(type) ?? new Set(), goaway: () => goaway, goawayLastStream: () => goawayLast, closed };
}

/**
 * Writes `batch()` on `s` every `everyMs` until it closes or `limitMs` pass; resolves with the
 * batches written and whether the proxy closed the connection.
 */
async function keepSending(s: tls.TLSSocket, batch: (i: number) => Buffer, everyMs: number, limitMs: number): Promise<{ batches: number; closedByProxy: boolean; ms: number }> {
  const t0 = performance.now();
  let batches = 0;
  while (!s.destroyed && !s.writableEnded && performance.now() - t0 < limitMs) {
    // A peer under backpressure waits, as a real client's kernel would make it.
    if (!s.write(batch(batches++))) await Promise.race([once(s, 'drain'), once(s, 'close')]);
    await new Promise((r) => setTimeout(r, everyMs));
  }
  const closedByProxy = s.destroyed || s.readableEnded;
  return { batches, closedByProxy, ms: Math.round(performance.now() - t0) };
}

const authority = 'localhost';

t.test('an HPACK bomb session is sent GOAWAY ENHANCE_YOUR_CALM after a bounded count of refused header blocks; a client on another connection is unaffected', async (t) => {
  const closesBefore = await metricSum('svc_downstream_h2_refused_block_closes_total');
  const backendBefore = backendRequests;
  const s = await F.rawH2(port, false);
  t.teardown(() => s.destroy());
  const frames = frameCounter(s);
  s.resume();
  // The first block puts a 4,000-byte entry in the proxy's dynamic table; every later one
  // references it 200 times in 200 bytes (800 KB and 200 fields decoded from each), which node
  // refuses stream by stream (more fields than it accepts) with RST_STREAM ENHANCE_YOUR_CALM.
  s.write(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1, Buffer.concat([F.requestBlock('/seed', authority), bigIndexed('x-bomb', 'b'.repeat(4000))])));
  let stream = 3;
  // 20 blocks every 10 ms: up to 2,000 a second (the finding's attack sent about 800 per connection).
  const bomb = (): Buffer => Buffer.concat(Array.from({ length: 20 }, () => F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, (stream += 2) - 2, Buffer.concat([F.requestBlock('/bomb', authority), Buffer.alloc(200, 0xbe)]))));
  const [sent, probe] = await Promise.all([keepSending(s, bomb, 10, 20_000), canary(20, 50)]);
  await Promise.race([frames.closed, new Promise((r) => setTimeout(r, 5000))]);
  const blocks = sent.batches * 20;
  const resets = frames.counts.get(F.RST_STREAM) ?? 0;
  t.comment(`bomb: ${blocks} header blocks sent in ${sent.ms} ms before the proxy closed the connection; ${resets} refused (RST_STREAM); GOAWAY code 0x${(frames.goaway() ?? -1).toString(16)}`);
  t.comment(`canary during the bomb: ${probe.statuses.length} GETs, statuses ${[...new Set(probe.statuses)].join(',')}, slowest ${probe.maxMs} ms`);
  t.equal(frames.goaway(), http2.constants.NGHTTP2_ENHANCE_YOUR_CALM, 'GOAWAY ENHANCE_YOUR_CALM (0xb)');
  t.ok(sent.closedByProxy, 'the proxy closed the connection');
  t.ok(sent.ms < 10_000, `within ${sent.ms} ms of the first bomb`);
  // 100 per 10 s, read every 200 ms: the limit plus what arrives in one check interval (400 at
  // this rate), with room for a late sweep on a loaded machine.
  t.ok(resets > 100 && resets < 1500, `${resets} blocks refused before the close: more than the limit (100), bounded`);
  t.same(new Set(probe.statuses), new Set([200]), 'every canary request answered 200');
  t.equal(await metricSum('svc_downstream_h2_refused_block_closes_total'), closesBefore + 1, 'one close counted in svc_downstream_h2_refused_block_closes_total');
  t.equal(backendRequests - backendBefore, 20 + 1, 'the backend saw the canary and the seed request, no bomb');
  await served.waitFor((l) => l['msg'] === 'downstream connections refused or cut' && l['reason'] === 'h2_refused_blocks');
});

t.test("the same bomb under node's field count (each block answered 431 by the protocol policy) is closed the same way", async (t) => {
  const closesBefore = await metricSum('svc_downstream_h2_refused_block_closes_total');
  const backendBefore = backendRequests;
  const s = await F.rawH2(port, false);
  t.teardown(() => s.destroy());
  const frames = frameCounter(s);
  s.resume();
  s.write(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, 1, Buffer.concat([F.requestBlock('/seed', authority), bigIndexed('x-bomb', 'b'.repeat(4000))])));
  let stream = 3;
  // 100 references: 104 fields (node accepts 128), 400 KB decoded into JavaScript strings each.
  const bomb = (): Buffer => Buffer.concat(Array.from({ length: 10 }, () => F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, (stream += 2) - 2, Buffer.concat([F.requestBlock('/bomb', authority), Buffer.alloc(100, 0xbe)]))));
  const sent = await keepSending(s, bomb, 10, 20_000);
  await Promise.race([frames.closed, new Promise((r) => setTimeout(r, 5000))]);
  // The count is the proxy's, not what the client read: the GOAWAY names the last stream the proxy
  // processed (decoded), read in the same turn as the watch's count that closed the session; the
  // bomb streams are 3, 5, ... up to it, and none reached the backend: each was refused. What the
  // client sees of them is split and can be short: a 431 for each block the policy refused, RST_STREAM
  // ENHANCE_YOUR_CALM for each node refused below JavaScript while 100 streams (maxConcurrentStreams)
  // still had their 431 unflushed (a loaded worker: 82 answers and 28 resets of 110 refused), and
  // nothing for an answer still queued when the GOAWAY ended the session (nghttp2 sends no frame
  // after a terminating GOAWAY). Counting only the 431s read was a flake (92 read, 100+ refused).
  const last = frames.goawayLastStream() ?? 1;
  const refused = (last - 1) / 2;
  const bombStreams = (type: number): number => [...frames.streams(type)].filter((id) => id !== 1).length;
  const answered = bombStreams(F.HEADERS);
  const reset = bombStreams(F.RST_STREAM);
  t.comment(`bomb under the field count: ${sent.batches * 10} blocks sent in ${sent.ms} ms; the proxy had refused ${refused} (GOAWAY last stream ${last}) when it closed; the client read ${answered} answers 431 and ${reset} RST_STREAM; GOAWAY code 0x${(frames.goaway() ?? -1).toString(16)}`);
  t.equal(frames.goaway(), http2.constants.NGHTTP2_ENHANCE_YOUR_CALM, 'GOAWAY ENHANCE_YOUR_CALM (0xb)');
  t.ok(sent.closedByProxy && sent.ms < 10_000, `closed by the proxy within ${sent.ms} ms`);
  t.ok(refused > 100 && refused < 1000, `${refused} blocks refused before the close: more than the limit (100), bounded`);
  t.ok(answered > 0, `the protocol policy answered them 431 (${answered} answers read)`);
  t.ok(backendRequests - backendBefore <= 1, `no bomb reached the backend (${backendRequests - backendBefore} request: the seed)`);
  t.equal(await metricSum('svc_downstream_h2_refused_block_closes_total'), closesBefore + 1, 'counted');
});

t.test('a client whose few header blocks are refused keeps its session', async (t) => {
  const s = await F.rawH2(port, false);
  t.teardown(() => s.destroy());
  const frames = frameCounter(s);
  s.resume();
  // Ten oversized blocks (more fields than node accepts) among ordinary requests.
  const parts: Buffer[] = [];
  let id = 1;
  for (let i = 0; i < 10; i++) {
    parts.push(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, id, Buffer.concat([F.requestBlock('/big', authority), ...Array.from({ length: 200 }, (_, k) => F.indexedLiteral(`x-${i}-${k}`, 'v'))])));
    id += 2;
    parts.push(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, id, F.requestBlock('/ok', authority)));
    id += 2;
  }
  s.write(Buffer.concat(parts));
  // A few check intervals, then one more ordinary request must still be answered on the session.
  await new Promise((r) => setTimeout(r, 1000));
  s.write(F.frame(F.HEADERS, F.END_HEADERS | F.END_STREAM, id, F.requestBlock('/after', authority)));
  await new Promise((r) => setTimeout(r, 500));
  t.equal(frames.goaway(), undefined, 'no GOAWAY');
  t.equal(frames.counts.get(F.RST_STREAM), 10, 'the ten oversized blocks were refused');
  t.ok((frames.counts.get(F.HEADERS) ?? 0) >= 11, `the eleven ordinary requests were answered (${frames.counts.get(F.HEADERS)} HEADERS frames)`);
  t.notOk(s.destroyed, 'the connection is open');
});

t.test('a CONTINUATION flood over 20 connections: each is closed within a bound, worker memory bounded, the canary served', async (t) => {
  const rssBefore = workersRss();
  const sockets = await Promise.all(Array.from({ length: 20 }, () => F.rawH2(port, true)));
  t.teardown(() => sockets.forEach((s) => s.destroy()));
  const counters = sockets.map(frameCounter);
  // HEADERS without END_HEADERS, then CONTINUATION frames without end (each 10 new 100-byte
  // fields), sent as fast as the connection takes them for up to 15 s.
  const floods = sockets.map((s, c) => {
    s.write(F.frame(F.HEADERS, 0, 1, F.requestBlock('/', authority)));
    return keepSending(s, (i) => Buffer.concat(Array.from({ length: 20 }, (_, j) => F.frame(F.CONTINUATION, 0, 1, Buffer.concat(Array.from({ length: 10 }, (_, k) => F.indexedLiteral(`x-${c}-${i}-${j}-${k}`, 'v'.repeat(90))))))), 2, 15_000);
  });
  const [results, probe] = await Promise.all([Promise.all(floods), canary(40, 50)]);
  await Promise.all(counters.map((c) => Promise.race([c.closed, new Promise((r) => setTimeout(r, 5000))])));
  const rssAfter = workersRss();
  const frames = results.map((r) => r.batches * 20);
  const times = results.map((r) => r.ms);
  t.comment(`CONTINUATION frames sent per connection before the close: min ${Math.min(...frames)}, max ${Math.max(...frames)}; closed after ${Math.min(...times)}-${Math.max(...times)} ms`);
  t.comment(`GOAWAY codes: ${[...new Set(counters.map((c) => c.goaway()))].join(', ')}; worker RSS ${rssBefore.join('/')} → ${rssAfter.join('/')} MiB`);
  t.comment(`canary during the flood: ${probe.statuses.length} GETs, statuses ${[...new Set(probe.statuses)].join(',')}, slowest ${probe.maxMs} ms`);
  t.same(
    results.map((r) => r.closedByProxy),
    results.map(() => true),
    'every flooding connection was closed by the proxy',
  );
  t.ok(Math.max(...times) < 10_000, `each within ${Math.max(...times)} ms`);
  t.ok(Math.max(...frames) < 5000, `each after at most ${Math.max(...frames)} CONTINUATION frames`);
  t.same(new Set(probe.statuses), new Set([200]), 'every canary request answered 200');
  rssAfter.forEach((rss, i) => t.ok(rss - (rssBefore[i] ?? 0) < 150, `worker ${i + 1}: RSS ${rssBefore[i]} → ${rss} MiB`));
});

t.test('a slow CONTINUATION (one frame a second) is closed by the header deadline', async (t) => {
  const s = await F.rawH2(port, true);
  t.teardown(() => s.destroy());
  const frames = frameCounter(s);
  s.write(F.frame(F.HEADERS, 0, 1, F.requestBlock('/', authority)));
  const sent = await keepSending(s, (i) => F.frame(F.CONTINUATION, 0, 1, F.indexedLiteral(`x-slow-${i}`, 'v')), 1000, 30_000);
  await Promise.race([frames.closed, new Promise((r) => setTimeout(r, 5000))]);
  t.comment(`slow CONTINUATION: ${sent.batches} frames over ${sent.ms} ms; GOAWAY code ${frames.goaway()}`);
  t.ok(sent.closedByProxy, 'the proxy closed the connection');
  t.ok(sent.ms < HEADER_MS + 3000, `within ${sent.ms} ms (client_header_ms ${HEADER_MS})`);
});
