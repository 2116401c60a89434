// HTTP/3 slow and aborted uploads (issue 38, Deliver 8) against a real `edge-proxy serve` (one
// worker, `global_inflight_limit: 4`), a real HTTP/1.1 backend that reads each body to its end
// before answering (test/support/controlled-backend.ts, `echo-sha256`), and the project's HTTP/3
// client. A body stalled forever is cut at `client_body_idle_ms`, one trickled a byte at a time at
// `client_body_total_ms` (408 both); a stream reset mid-body and a connection closed mid-body abort
// the backend request. Each time: the in-flight slots return to 0 (`svc_inflight_requests`), the
// backend holds nothing, and no backend ever reads a truncated body to its end (with
// `content-length` and without: a chunked upstream body must not be terminated as if complete).
import t from 'tap';
import { Http3ClientSession } from '@edge-proxy/http3';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { loadNow, pollUntil, startProxy } from './support/overload.ts';
import type { StartedProxy } from './support/overload.ts';

const files = serviceFiles(t, 'edge-h3-upload-');
const be = await controlledBackend(t, 'up');
be.set({ kind: 'echo-sha256' }, '/up');

const p: StartedProxy = await startProxy(t, files, 'h3-upload', {
  // The minimum body rate off (its grace and rate: test/dataplane-conn-bounds.test.ts), so the total deadline shows on its own.
  performance: 'global_inflight_limit: 4, timeouts: { client_body_idle_ms: 1000, client_body_total_ms: 2500 }, body: { client_body_min_bytes_per_s: 0 }',
  upstream: `{ up: { route: { path_prefix: /up }, backends: [{ id: up-1, address: "127.0.0.1:${be.port}" }] } }`,
  resilience: '{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false } }',
});

async function session(t: { teardown(fn: () => unknown): void }): Promise<Http3ClientSession> {
  const s = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 10_000 });
  t.teardown(() => s.close(true).catch(() => undefined));
  return s;
}

/** Released at the end of the file: what a stalled body waits for. */
let release: () => void = () => undefined;
const never = new Promise<void>((r) => (release = r));
t.teardown(() => release());

/** `head` bytes in chunks of at most 10,000, then nothing more until the file ends (a stall). */
async function* stalledAfter(head: number): AsyncGenerator<Uint8Array> {
  for (let sent = 0; sent < head; sent += 10_000) yield Buffer.alloc(Math.min(10_000, head - sent), 0x61);
  await never;
}

/** What the backend saw of the requests under `prefix`: arrivals, and bodies read to their end. */
function backendSaw(prefix: string): { arrivals: number; complete: number } {
  return { arrivals: be.arrivals.filter((a) => a.path.startsWith(prefix)).length, complete: be.bodies.filter((b) => b.path.startsWith(prefix)).length };
}

/** The in-flight slots of the worker, polled until `n` (they follow requests within a scrape). */
const inflightReaches = (n: number, ms = 8000): Promise<number> => pollUntil(async () => (await loadNow(p)).inflight, (v) => v === n, ms);

/** One normal 10 KB upload: `200 <sha>` expected. */
async function normalUpload(s: Http3ClientSession, path: string): Promise<number> {
  return (await s.fetch({ method: 'POST', path, headers: { 'content-length': '10000' }, body: Buffer.alloc(10_000, 0x62), timeoutMs: 8000 })).status;
}

t.test('stalled: 4 uploads send 10 KB of 100 KB and stop; they hold the 4 slots until client_body_idle_ms, then 408 each, the slots are back to 0, and no backend read a body to its end', async (t) => {
  const s = await session(t);
  const before = be.abandoned;
  const t0 = performance.now();
  const answers = Array.from({ length: 4 }, (_, i) =>
    s.fetch({ method: 'POST', path: `/up/stall-${i}`, headers: { 'content-length': '100000' }, body: stalledAfter(10_000), timeoutMs: 10_000 }).then((r) => ({ status: r.status, ms: performance.now() - t0 })),
  );
  t.equal(await inflightReaches(4), 4, 'while they stall: 4 slots held (the worker\'s whole global_inflight_limit)');
  const done = await Promise.all(answers);
  t.same(done.map((d) => d.status), [408, 408, 408, 408], '408 each');
  t.ok(done.every((d) => d.ms >= 900 && d.ms < 5000), `at the idle deadline (1000 ms): ${done.map((d) => d.ms.toFixed(0)).join(', ')} ms`);
  t.equal(await inflightReaches(0), 0, 'svc_inflight_requests back to 0');
  await pollUntil(async () => be.inflight, (n) => n === 0, 5000);
  const saw = backendSaw('/up/stall-');
  t.equal(saw.complete, 0, `no backend read a stalled body to its end (${saw.arrivals} requests had reached it)`);
  t.equal(be.abandoned - before, saw.arrivals, 'each one that reached the backend was aborted, none answered');
  t.equal(await normalUpload(s, '/up/after-stall'), 200, 'the freed slots serve a normal upload');
});

t.test('trickled: 1 byte every 200 ms (never idle for 1 s) is cut at client_body_total_ms (2500 ms) with 408; slot back, backend aborted', async (t) => {
  const s = await session(t);
  let open = true;
  t.teardown(() => (open = false));
  async function* trickle(): AsyncGenerator<Uint8Array> {
    for (let i = 0; i < 1000 && open; i++) {
      yield Buffer.from('x');
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  const t0 = performance.now();
  const r = await s.fetch({ method: 'POST', path: '/up/trickle', headers: { 'content-length': '1000' }, body: trickle(), timeoutMs: 10_000 });
  const ms = performance.now() - t0;
  open = false;
  t.equal(r.status, 408);
  t.ok(ms >= 2400 && ms < 6000, `408 after ${ms.toFixed(0)} ms (total deadline 2500 ms)`);
  t.equal(await inflightReaches(0), 0, 'svc_inflight_requests back to 0');
  await pollUntil(async () => be.inflight, (n) => n === 0, 5000);
  t.equal(backendSaw('/up/trickle').complete, 0, 'the backend never read the trickled body to its end');
});

for (const framing of ['content-length', 'chunked'] as const) {
  t.test(`aborted (${framing}): 20 uploads reset by the client after 50 KB: backend requests aborted, no truncated body read as complete, slots back to 0`, async (t) => {
    const s = await session(t);
    const prefix = `/up/reset-${framing}-`;
    const before = be.abandoned;
    // The client's response deadline (300 ms) resets each stream (RESET_STREAM) with its body half sent.
    const outcomes = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        s.fetch({ method: 'POST', path: `${prefix}${i}`, headers: framing === 'content-length' ? { 'content-length': '100000' } : {}, body: stalledAfter(50_000), timeoutMs: 300 }).then(
          (r) => `answered ${r.status}`,
          (e: unknown) => String((e as { code?: unknown }).code),
        ),
      ),
    );
    t.same(new Set(outcomes), new Set(['EDGE_H3_TIMEOUT']), 'each stream was reset by the client before any answer');
    t.equal(await inflightReaches(0), 0, 'svc_inflight_requests back to 0');
    await pollUntil(async () => be.inflight, (n) => n === 0, 5000);
    const saw = backendSaw(prefix);
    t.equal(saw.complete, 0, `no backend read a truncated body to its end (${saw.arrivals} requests had reached it)`);
    t.equal(be.abandoned - before, saw.arrivals, 'every request that reached the backend was abandoned by the proxy (aborted), none answered');
    t.equal(await normalUpload(s, `${prefix}after`), 200, 'the same connection serves a normal upload');
  });
}

t.test('connection closed mid-body: 4 uploads on a connection that closes after 50 KB each: backend requests aborted, no body complete, slots back to 0', async (t) => {
  const s = await Http3ClientSession.connect({ host: '127.0.0.1', port: p.lport, serverName: 'localhost', ca: p.ca, handshakeTimeoutMs: 10_000 });
  const before = be.abandoned;
  const outcomes = Array.from({ length: 4 }, (_, i) => s.fetch({ method: 'POST', path: `/up/close-${i}`, body: stalledAfter(50_000), timeoutMs: 10_000 }).then(() => 'answered', () => 'failed'));
  await inflightReaches(4);
  await s.close(true);
  t.same(await Promise.all(outcomes), ['failed', 'failed', 'failed', 'failed'], 'the client\'s requests ended with its connection');
  t.equal(await inflightReaches(0), 0, 'svc_inflight_requests back to 0');
  await pollUntil(async () => be.inflight, (n) => n === 0, 5000);
  const saw = backendSaw('/up/close-');
  t.equal(saw.complete, 0, `no backend read a body to its end (${saw.arrivals} requests had reached it)`);
  t.equal(be.abandoned - before, saw.arrivals, 'each one that reached the backend was aborted');
});
