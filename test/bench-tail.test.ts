// `npm run bench:tail`'s own parts: the backend's tail and failures must be exactly the share
// asked (the hedging delay is read off the knee they make), the same for the same seed, and
// counted as the proxy's upstream load; the delay rule must stay on the fast side of the knee;
// the command line and the generated proxy configurations must be what the run relies on.
import t from 'tap';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfigText } from '@edge-proxy/config';
import { parseTailArgs, tailProxyConfig } from '../scripts/bench/tail.ts';
import { hedgeDelay, kneeP95 } from '../scripts/lib/hedge-delay.ts';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { exactShare, mulberry32, startTailBackend } from '../scripts/lib/tail-backend.ts';

t.test('exactShare: exactly the share in every block, the same sequence for the same seed', async (t) => {
  for (const [percent, block, hits] of [[5, 20, 1], [10, 10, 1], [3, 100, 3], [40, 5, 2]] as const) {
    const pick = exactShare(percent, mulberry32(7));
    const seq = Array.from({ length: block * 50 }, () => pick());
    for (let b = 0; b < 50; b++) t.equal(seq.slice(b * block, (b + 1) * block).filter(Boolean).length, hits, `${percent} %: block ${b} has ${hits}`);
    const again = exactShare(percent, mulberry32(7));
    t.same(Array.from({ length: seq.length }, () => again()), seq, `${percent} %: same seed, same sequence`);
  }
  // Not one fixed position: the draw moves within the blocks, and another seed gives another pattern.
  const pick = exactShare(5, mulberry32(1));
  const positions = new Set(Array.from({ length: 20 * 40 }, () => pick()).flatMap((s, i) => (s ? [i % 20] : [])));
  t.ok(positions.size >= 8, `positions vary across blocks (${positions.size} of 20 seen)`);
  const a = exactShare(5, mulberry32(1));
  const b = exactShare(5, mulberry32(2));
  t.not(Array.from({ length: 200 }, () => a()).join(), Array.from({ length: 200 }, () => b()).join());
  t.equal(Array.from({ length: 100 }, exactShare(0, mulberry32(1))).some(Boolean), false);
  t.equal(Array.from({ length: 100 }, exactShare(100, mulberry32(1))).every(Boolean), true);
  t.throws(() => exactShare(2.5, mulberry32(1)));
  t.throws(() => exactShare(101, mulberry32(1)));
});

t.test('kneeP95: the p95, or the nearest fast percentile below it when the p95 is a slow answer', async (t) => {
  const fast = (n: number): number[] => Array.from({ length: n }, (_, i) => 1 + (i / n) * 4);
  // 95 fast (1-5 ms) + 5 slow: the p95 is the last fast answer.
  const exact = [...fast(95), ...Array.from({ length: 5 }, () => 200)].sort((x, y) => x - y);
  t.same(kneeP95(exact, 200), { valueMs: exact[94], q: 950 });
  // 94 fast + 6 slow: the p95 and the p94.5 are slow answers, the p94 is the last fast one.
  const more = [...fast(94), ...Array.from({ length: 6 }, () => 200)].sort((x, y) => x - y);
  t.same(kneeP95(more, 200), { valueMs: more[93], q: 940 });
  t.equal(kneeP95([300, 300, 300], 200), undefined, 'no fast answers: no knee');
});

t.test('hedgeDelay: the median of the per-second p95s, rounded up, at least 1 ms; one stalled second does not move it', async (t) => {
  // 5 seconds of 100 answers each: 95 fast (1-5 ms) and 5 slow (200 ms).
  const second = (s: number, fastMs: (i: number) => number): Array<{ at: number; ms: number }> =>
    Array.from({ length: 100 }, (_, i) => ({ at: 1000 + s * 1000 + i * 10, ms: i % 20 === 7 ? 200 : fastMs(i) }));
  const calm = [0, 1, 2, 3, 4].flatMap((s) => second(s, (i) => 1 + (i / 100) * 4));
  const d = hedgeDelay(calm, 200);
  t.equal(d.delayMs, 5);
  t.match(d.rule, /^median of the p95 of 5 one-second window\(s\)$/);
  // Second 2 stalled: its fast answers took 50-100 ms. The whole phase's p95 is one of them; the delay is not.
  const stalled = [0, 1, 2, 3, 4].flatMap((s) => second(s, (i) => (s === 2 ? 50 + i / 2 : 1 + (i / 100) * 4)));
  const s = hedgeDelay(stalled, 200);
  t.equal(s.delayMs, 5);
  t.ok(s.wholeP95Ms >= 50, `the whole phase's p95 (${s.wholeP95Ms} ms) is the stall's`);
  t.match(s.rule, /^median of the p95 of 5 one-second window\(s\)$/);
  // A second stalled past slowMs / 2 has no knee: it is left out.
  const frozen = [0, 1, 2, 3, 4].flatMap((s) => second(s, (i) => (s === 2 ? 150 : 1 + (i / 100) * 4)));
  const f = hedgeDelay(frozen, 200);
  t.equal(f.delayMs, 5);
  t.match(f.rule, /^median of the p95 of 4 one-second window\(s\) \(of 5: 1 left out/);
  t.throws(() => hedgeDelay([{ at: 0, ms: 300 }, { at: 1, ms: 300 }], 200), /half/);
  t.equal(hedgeDelay([{ at: 0, ms: 0.2 }, { at: 1, ms: 0.3 }], 200).delayMs, 1, 'at least 1 ms (too few answers for a window: the whole sample)');
  t.throws(() => hedgeDelay([], 200));
});

t.test('parseTailArgs: defaults, and bad values refused', async (t) => {
  const d = parseTailArgs([]);
  t.match(d, { rate: 300, seconds: 10, warmup: 1, slowPercent: 5, slowMs: 200, failPercent: 10, seed: 1, delayMs: undefined, connections: 64, deadlineMs: 5000, printConfig: false, serveBackends: false });
  t.same([...d.phases], ['A', 'B', 'C']);
  t.same(d.failModes, ['reset', '503']);
  t.same(parseTailArgs(['--fail-mode', '503', '--phases', 'a,c']).failModes, ['503']);
  t.same([...parseTailArgs(['--phases', 'B', '--delay-ms', '7']).phases], ['B']);
  for (const bad of [['--rate', '0'], ['--rate', 'x'], ['--seconds', ''], ['--phases', 'A,D'], ['--phases', 'B'], ['--fail-mode', 'drop'], ['--slow-percent', '5.5'], ['--delay-ms', '0'], ['--nope']]) {
    t.throws(() => parseTailArgs(bad), `${bad.join(' ')} refused`);
  }
});

t.test('tailProxyConfig: each phase configuration validates and sets what the run relies on', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-tail-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const leaf = makeLeaf(dir, 'server', makeCa(dir), { sans: ['localhost', '127.0.0.1'] });
  const base = { listenPort: 20001, metricsPort: 20002, cert: leaf.cert, key: leaf.key, backendPorts: [20011, 20012, 20013] };
  const a = await loadConfigText(tailProxyConfig({ ...base, hedgeDelayMs: undefined, retryRatioPercent: 20 }), dir);
  t.ok(a.ok, a.ok ? 'phase A valid' : JSON.stringify(a.issues));
  if (a.ok) {
    const c = a.value.config as unknown as { resilience: Record<string, Record<string, unknown>>; upstreams: Array<{ backends: unknown[] }> };
    t.match(c.resilience, { adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, retry_budget: { ratio_percent: 20 }, hedging: { enabled: false } });
  }
  const cText = tailProxyConfig({ ...base, hedgeDelayMs: undefined, retryRatioPercent: undefined });
  t.notMatch(cText, /retry_budget|hedging/, 'phase C keeps the default budget');
  const c = await loadConfigText(cText, dir);
  t.ok(c.ok, c.ok ? 'phase C valid' : JSON.stringify(c.issues));
  const b = await loadConfigText(tailProxyConfig({ ...base, hedgeDelayMs: 12, retryRatioPercent: 20 }), dir);
  t.ok(b.ok, b.ok ? 'phase B valid' : JSON.stringify(b.issues));
  if (b.ok) t.match((b.value.config as unknown as { resilience: unknown }).resilience, { hedging: { enabled: true, delay_ms: 12 }, retry_budget: { ratio_percent: 20 } });
});

function get(port: number, p: string, signal?: AbortSignal): Promise<{ status: number; body: string } | { error: string }> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: p, agent: false, signal }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', (err: Error & { code?: string }) => resolve({ error: err.code ?? err.name }));
  });
}

t.test('tail backend: the slow share answers late, failures reset or 503, every request is counted', async (t) => {
  const b = await startTailBackend({ slowPercent: 50, slowMs: 60, failPercent: 50, seed: 3 });
  t.teardown(() => b.close());
  const answers = await Promise.all(Array.from({ length: 10 }, () => get(b.port, '/x')));
  t.same(answers.map((a) => ('status' in a ? a.status : a.error)), Array(10).fill(200));
  t.match(b.stats(), { received: 10, fast: 5, slow: 5, failed: 0, abandoned: 0, failMode: 'none' });

  const mode = await get(b.port, '/__mode?fail=reset&reset=1');
  t.match(mode, { status: 200 });
  const resets = await Promise.all(Array.from({ length: 10 }, () => get(b.port, '/x')));
  t.equal(resets.filter((a) => 'error' in a && a.error === 'ECONNRESET').length, 5, 'half reset without an answer');
  t.match(b.stats(), { received: 10, failed: 5, failMode: 'reset' });

  await get(b.port, '/__mode?fail=503&reset=1');
  const statuses = await Promise.all(Array.from({ length: 10 }, () => get(b.port, '/x')));
  t.equal(statuses.filter((a) => 'status' in a && a.status === 503).length, 5, 'half answer 503');

  // A slow request whose client leaves is counted abandoned, not answered.
  await get(b.port, '/__mode?fail=none&reset=1');
  await Promise.all(Array.from({ length: 2 }, () => get(b.port, '/x', AbortSignal.timeout(30))));
  // The backend sees the close a moment after the client's abort.
  for (let i = 0; i < 200 && b.stats().abandoned === 0; i++) await new Promise((r) => setTimeout(r, 5));
  t.match(b.stats(), { received: 2, fast: 1, slow: 0, abandoned: 1 });
  const stats = JSON.parse(((await get(b.port, '/__stats')) as { body: string }).body) as Record<string, unknown>;
  t.match(stats, { received: 2, abandoned: 1 }, '/__stats is not counted');
});
