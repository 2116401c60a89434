// The overload benchmark's backend (scripts/lib/slow-backend.ts): its capacity is what every figure
// of `npm run bench:overload` is a multiple of, so it must serve exactly K at once, in FIFO order,
// and drop (not serve) a request whose client left while it waited.
import t from 'tap';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { startSlowBackend } from '../scripts/lib/slow-backend.ts';

function get(port: number, path: string, signal?: AbortSignal): Promise<{ status: number; ms: number }> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent: false, signal }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, ms: performance.now() - t0 }));
    });
    req.on('error', reject);
  });
}

t.test('serves K at once, the rest in FIFO order after them', async (t) => {
  const b = await startSlowBackend({ concurrency: 2, serviceMs: 100 });
  t.teardown(() => b.close());
  const order: string[] = [];
  const answers = await Promise.all(['a', 'b', 'c', 'd'].map(async (name, i) => {
    await new Promise((r) => setTimeout(r, i * 5));
    const a = await get(b.port, `/${name}`);
    order.push(name);
    return a;
  }));
  t.same(answers.map((a) => a.status), [200, 200, 200, 200]);
  // Two served in the first 100 ms, two waited for them: about 100 and 200 ms.
  t.ok(answers.slice(0, 2).every((a) => a.ms >= 90 && a.ms < 180), `first two ${answers.slice(0, 2).map((a) => a.ms.toFixed(0))} ms`);
  t.ok(answers.slice(2).every((a) => a.ms >= 180), `last two ${answers.slice(2).map((a) => a.ms.toFixed(0))} ms`);
  t.same(order.slice(2).sort(), ['c', 'd']);
  const s = b.stats();
  t.equal(s.served, 4);
  t.equal(s.maxQueued, 2);
  t.equal(s.queued + s.active, 0);
});

t.test('a request whose client left while queued is dropped, not served', async (t) => {
  const b = await startSlowBackend({ concurrency: 1, serviceMs: 100 });
  t.teardown(() => b.close());
  const first = get(b.port, '/first');
  await new Promise((r) => setTimeout(r, 10));
  const gone = get(b.port, '/gone', AbortSignal.timeout(30)).catch((err: Error) => err.name);
  t.equal(await gone, 'AbortError');
  t.equal((await first).status, 200);
  await new Promise((r) => setTimeout(r, 50));
  const s = b.stats();
  t.equal(s.served, 1);
  t.equal(s.dropped, 1);
});
