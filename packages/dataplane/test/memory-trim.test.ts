// `performance.memory_trim` (runtime/memory-trim.ts): when a worker counts as quiet, when it trims,
// and that it does not trim again without new growth. The clock, the RSS and the collection are
// the test's; test/memory-trim.test.ts runs the real collection in a served worker.
import t from 'tap';
import { MemoryTrim } from '../src/runtime/memory-trim.ts';
import type { MemoryTrimmed } from '@edge-proxy/telemetry';
import type { MemoryTrimSettings } from '../src/runtime/memory-trim.ts';

const MiB = 1024 * 1024;
const DEFAULTS: MemoryTrimSettings = { enabled: true, idle_ms: 10_000, quiet_rps: 10, min_growth_bytes: 32 * MiB };

function rig(settings: MemoryTrimSettings | undefined = DEFAULTS) {
  const state = { now: 0, requests: 0, rss: 200 * MiB, settings: settings as MemoryTrimSettings | undefined, collections: 0, trims: [] as MemoryTrimmed[], unavailable: [] as string[] };
  const trim = new MemoryTrim({
    settings: () => state.settings,
    requests: () => state.requests,
    now: () => state.now,
    rss: () => state.rss,
    collect: () => {
      state.collections++;
      state.rss = 150 * MiB;
    },
    onTrim: (r) => state.trims.push(r),
    onUnavailable: (reason) => state.unavailable.push(reason),
    manual: true,
  });
  /** `seconds` ticks one second apart, with `rps` new requests in each. */
  const run = (seconds: number, rps: number): void => {
    for (let i = 0; i < seconds; i++) {
      state.now += 1000;
      state.requests += rps;
      trim.tick();
    }
  };
  return { state, trim, run };
}

t.test('a worker that grew and then went quiet trims once, after idle_ms of quiet', async (t) => {
  const { state, run } = rig();
  run(1, 0); // the first look: the baseline (200 MiB)
  state.rss = 300 * MiB;
  run(30, 5000); // busy
  t.equal(state.collections, 0, 'never while busy');
  run(9, 3); // 3 req/s: quiet, but only 9 s of it
  t.equal(state.collections, 0, 'not before idle_ms of quiet');
  run(1, 0);
  t.equal(state.collections, 1, 'trimmed at 10 s of quiet');
  t.same(state.trims.map((r) => [r.rssBefore / MiB, r.rssAfter / MiB]), [[300, 150]]);
  run(60, 0);
  t.equal(state.collections, 1, 'not again without new growth, however long the quiet lasts');
});

t.test('a request rate above quiet_rps restarts the quiet period', async (t) => {
  const { state, run } = rig();
  run(1, 0);
  state.rss = 300 * MiB;
  run(8, 0);
  run(1, 11); // 11 > quiet_rps
  run(9, 0);
  t.equal(state.collections, 0, 'the busy second reset the count');
  run(1, 0);
  t.equal(state.collections, 1, '10 quiet seconds after the busy one');
});

t.test('growth is measured from the last trim: below min_growth_bytes no trim, above it one more', async (t) => {
  const { state, run } = rig();
  run(1, 0);
  state.rss = 240 * MiB;
  run(1, 100);
  run(12, 0);
  t.equal(state.collections, 1, '40 MiB of growth over the baseline: trimmed to 150');
  state.rss = 170 * MiB;
  run(1, 100);
  run(12, 0);
  t.equal(state.collections, 1, '20 MiB over the last trim is below 32 MiB: kept');
  state.rss = 190 * MiB;
  run(1, 100);
  run(12, 0);
  t.equal(state.collections, 2, '40 MiB over the last trim: trimmed again');
});

t.test('disabled, or no active generation yet: never trims, and the quiet count starts over when enabled', async (t) => {
  const { state, run } = rig({ ...DEFAULTS, enabled: false });
  run(1, 0);
  state.rss = 400 * MiB;
  run(30, 0);
  t.equal(state.collections, 0, 'enabled: false');
  state.settings = undefined;
  run(30, 0);
  t.equal(state.collections, 0, 'no generation');
  state.settings = DEFAULTS; // live: the next generation turns it on
  run(9, 0);
  t.equal(state.collections, 0, 'the quiet seconds while disabled do not count');
  run(2, 0);
  t.same(state.trims.map((r) => [r.rssBefore / MiB, r.rssAfter / MiB]), [[400, 150]], 'the growth since the first second counts, enabled or not');
});

t.test('quiet_rps 0: only a second without any request is quiet; min_growth_bytes 0: any quiet period trims once', async (t) => {
  const { state, run } = rig({ ...DEFAULTS, quiet_rps: 0, min_growth_bytes: 0, idle_ms: 2000 });
  run(1, 0);
  run(5, 1);
  t.equal(state.collections, 0, 'one request a second is not quiet');
  run(2, 0);
  t.equal(state.collections, 1);
  run(5, 0);
  t.equal(state.collections, 1, 'one trim per quiet period');
  run(1, 1);
  run(2, 0);
  t.equal(state.collections, 2, 'a new quiet period after a request');
});

t.test('a collection that throws turns the trim off for the process, reported once; the worker goes on', async (t) => {
  const unavailable: string[] = [];
  let now = 0;
  let calls = 0;
  const trim = new MemoryTrim({
    settings: () => ({ ...DEFAULTS, idle_ms: 1000, min_growth_bytes: 0 }),
    requests: () => 0,
    now: () => now,
    rss: () => 100 * MiB,
    collect: () => {
      calls++;
      throw new Error('collector gone');
    },
    onTrim: () => t.fail('no trim'),
    onUnavailable: (reason) => unavailable.push(reason),
    manual: true,
  });
  for (let i = 0; i < 10; i++) {
    now += 1000;
    t.doesNotThrow(() => trim.tick());
  }
  t.equal(calls, 1, 'tried once');
  t.same(unavailable, ['collector gone'], 'reported once');
});

t.test('the real collector: reached without a global gc, and it runs', async (t) => {
  t.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined', 'the test runs without --expose-gc');
  const trims: MemoryTrimmed[] = [];
  let now = 0;
  let requests = 0;
  const trim = new MemoryTrim({ settings: () => ({ ...DEFAULTS, idle_ms: 1000, min_growth_bytes: 0 }), requests: () => requests, now: () => now, onTrim: (r) => trims.push(r), onUnavailable: (reason) => t.fail(reason), manual: true });
  for (let i = 0; i < 3; i++) {
    now += 1000;
    trim.tick();
  }
  requests++;
  t.equal(trims.length, 1, 'one trim');
  t.ok(trims[0] !== undefined && trims[0].durationMs > 0 && trims[0].rssAfter > 0, 'measured');
  t.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined', 'and nothing was added to the globals');
});
