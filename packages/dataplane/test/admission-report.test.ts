// A worker's reports for the node's adaptive limit and brownout (resilience/admission-report.ts),
// with a fake clock and timers: response batches at most once per WINDOW_MS and none while idle;
// in-use counts, while brownout is enabled, at most once per INUSE_REPORT_MS and only when changed,
// so the node hears a change at most INUSE_REPORT_MS late; every report carries both.
import t from 'tap';
import { INUSE_REPORT_MS, WINDOW_MS } from '@edge-proxy/ipc';
import type { AdmissionReport } from '@edge-proxy/ipc';
import { AdmissionReporter } from '../src/resilience/admission-report.ts';
import { EventEmitter, once } from 'node:events';
import { Metrics } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { resolvedForTest } from './support/resolved-config.ts';

function harness() {
  let now = 0;
  let inUse = 0;
  const sent: (AdmissionReport & { at: number })[] = [];
  let timers: { fn: () => void; at: number; id: number }[] = [];
  let id = 0;
  const r = new AdmissionReporter(
    (m) => sent.push({ ...m, at: now }),
    () => inUse,
    {
      now: () => now,
      set: (fn, ms) => {
        timers.push({ fn, at: now + ms, id: ++id });
        return id;
      },
      clear: (h) => (timers = timers.filter((x) => x.id !== h)),
    },
  );
  /** Moves the clock to `to`, firing due timers in order. */
  const advance = (to: number): void => {
    for (;;) {
      const next = timers.filter((x) => x.at <= to).sort((a, b) => a.at - b.at)[0];
      if (next === undefined) break;
      timers = timers.filter((x) => x !== next);
      now = next.at;
      next.fn();
    }
    now = to;
  };
  return { r, sent, advance, timers: () => timers.length, setInUse: (n: number) => ((inUse = n), r.changed()) };
}

t.test('response batches: one report per WINDOW_MS at most, carrying every sample since the last; nothing while idle', async (t) => {
  const h = harness();
  t.equal(WINDOW_MS, 100);
  h.advance(5);
  h.r.sample(true);
  h.advance(50);
  h.r.sample(false);
  h.r.sample(false);
  h.advance(104);
  t.same(h.sent, [], 'nothing before the batch is WINDOW_MS old');
  h.advance(105);
  t.same(h.sent, [{ samples: 3, high: 1, inUse: 0, at: 105 }], 'the batch at 100 ms after its first sample');
  h.advance(10_000);
  t.same(h.sent.length, 1, 'idle: no report, no timer left');
  t.equal(h.timers(), 0);
  // 1,000 samples in 1 s: 10 reports.
  for (let ms = 10_000; ms < 11_000; ms++) {
    h.advance(ms);
    h.r.sample(ms % 10 === 0);
  }
  h.advance(11_200);
  const batches = h.sent.slice(1);
  t.equal(batches.length, 10, '1,000 responses over 1 s: 10 reports, not 1,000');
  t.equal(batches.reduce((n, b) => n + b.samples, 0), 1000, 'every sample reported once');
  t.equal(batches.reduce((n, b) => n + b.high, 0), 100, 'and every slow one');
  t.ok(batches.every((b, i) => i === 0 || b.at - (batches[i - 1]?.at ?? 0) >= WINDOW_MS), 'at least WINDOW_MS apart');
});

t.test('in-use counts: only while tracked (brownout enabled), within INUSE_REPORT_MS of a change, at most once per INUSE_REPORT_MS', async (t) => {
  const h = harness();
  t.equal(INUSE_REPORT_MS, 10);
  h.setInUse(3);
  h.advance(1000);
  t.same(h.sent, [], 'not tracked (brownout disabled): the count goes with lease asks only');
  h.r.track(true);
  h.advance(1000);
  t.same(h.sent, [{ samples: 0, high: 0, inUse: 3, at: 1000 }], 'tracking starts with the count now');
  h.advance(1003);
  h.setInUse(4);
  h.advance(1009);
  t.equal(h.sent.length, 1, 'not again within 10 ms of the last report');
  h.setInUse(5);
  h.advance(1010);
  t.same(h.sent.at(-1), { samples: 0, high: 0, inUse: 5, at: 1010 }, 'the change at 1003 reported at 1010 (7 ms late, the count then)');
  h.advance(2000);
  h.setInUse(6);
  h.advance(2000);
  t.same(h.sent.at(-1), { samples: 0, high: 0, inUse: 6, at: 2000 }, 'after a quiet spell: at once (the next timer turn)');
  h.advance(2001);
  h.setInUse(7);
  h.setInUse(6);
  h.advance(2100);
  t.equal(h.sent.length, 3, 'a change undone before the report sends nothing');
  // A burst of changes every ms for 100 ms: at most 10 reports, each count at most 10 ms old.
  const before = h.sent.length;
  for (let ms = 3000; ms < 3100; ms++) {
    h.advance(ms);
    h.setInUse(ms - 2990);
  }
  h.advance(3200);
  const burst = h.sent.slice(before);
  t.ok(burst.length <= 11, `at most one report per 10 ms (${burst.length} for 100 changes)`);
  t.ok(burst.every((b) => b.at - (b.inUse + 2990) <= INUSE_REPORT_MS), 'each carries a count at most 10 ms old');
  t.equal(burst.at(-1)?.inUse, 109, 'the last count reported');
  // Samples ride along with an in-use report, and the batch timer then has nothing to send.
  h.r.sample(true);
  h.setInUse(1);
  h.advance(3300);
  t.same(h.sent.at(-1), { samples: 1, high: 1, inUse: 1, at: 3200 }, 'one report carries both');
  t.equal(h.sent.length, before + burst.length + 1, 'the batch timer found nothing left');
  h.r.track(false);
  h.setInUse(2);
  h.advance(4000);
  t.equal(h.sent.length, before + burst.length + 1, 'tracking off: no more in-use reports');
});

t.test('a closed channel: the report is dropped, the reporter goes on', async (t) => {
  let calls = 0;
  const r = new AdmissionReporter(
    () => {
      calls++;
      throw new Error('channel closed');
    },
    () => 1,
    { now: () => 0, set: (fn) => (fn(), 1), clear: () => {} },
  );
  r.track(true);
  t.equal(calls, 1, 'sent (and thrown) once');
  r.close();
});

t.test('a count a lease ask carried, undone before the timer fired: reported (the node takes the latest of the two ways)', async (t) => {
  const h = harness();
  h.setInUse(2);
  h.r.track(true);
  h.advance(0);
  t.same(h.sent, [{ samples: 0, high: 0, inUse: 2, at: 0 }], 'tracking starts with the count now, 2');
  h.advance(5);
  h.setInUse(3);
  // The lease ask of that take goes out first and carries 3: the node counts 3 for this worker.
  h.r.heard(3);
  h.setInUse(2);
  h.advance(100);
  t.same(h.sent.at(-1), { samples: 0, high: 0, inUse: 2, at: 10 }, "back at 2 (the last report's count): reported at 10, as the ask left the node at 3");
  t.equal(h.sent.length, 2, 'one report');
  h.setInUse(3);
  h.setInUse(2);
  h.advance(200);
  t.equal(h.sent.length, 2, 'a change undone before the report, with no ask between: nothing (the node is at 2)');
});

// The same through a worker's overload control: the lease ask and the admission report, in the
// order they leave the worker, leave the node's count of this worker at its in-use count.
t.test('overload control: a global slot taken, asked for, and given back in one turn: the node hears 0 again', async (t) => {
  const resolved = await resolvedForTest({
    listen: { tls: { cert: 'c', key: 'k' } },
    performance: { global_inflight_limit: 10, per_upstream_inflight_limit: 10, per_backend_inflight_limit: 10 },
    resilience: { adaptive_admission: { enabled: false }, brownout: { enabled: true, trigger_inflight_percent: 50, recover_inflight_percent: 20 }, circuit_breaker: { enabled: false } },
    upstream: { app: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: '127.0.0.1:1' }] } },
    observability: { control_api: { enabled: false } },
  });
  const dp = new Dataplane(new Metrics('worker'));
  t.teardown(() => dp.close());
  const ov = dp.deps.overload;
  // What the supervisor does with the two ways (supervisor.ts): the latest message sets the count.
  const heard: { via: string; n: number }[] = [];
  const reported = new EventEmitter();
  ov.joinNode(
    (asks) => {
      for (const a of asks) if (a.key === 'global') heard.push({ via: 'lease', n: a.used });
    },
    (r) => {
      heard.push({ via: 'report', n: r.inUse });
      reported.emit('report');
    },
  );
  // Tracking starts with 0 in use: nothing to report (the node counts a new worker 0).
  dp.commit(dp.prepare(resolved, 1));
  await new Promise((r) => setImmediate(r));
  ov.leaseGrants([{ key: 'global', add: 1, revoke: 0, contended: false, reply: true, exhausted: false, block: 1, limit: 10, nodeHeld: 0 }]);
  await new Promise((r) => setImmediate(r));
  heard.length = 0;
  const rt = dp.acquire();
  t.teardown(() => dp.release(rt));
  t.ok(ov.tryGlobal(rt), 'a global slot taken');
  ov.leaseTable.flush();
  t.same(heard, [{ via: 'lease', n: 1 }], 'its lease ask (headroom) carried 1');
  ov.releaseGlobal();
  const next = once(reported, 'report');
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'none'>((r) => (timer = setTimeout(() => r('none'), 5000)));
  t.equal(await Promise.race([next.then(() => 'report' as const), late]), 'report', 'an admission report followed (within INUSE_REPORT_MS; 5 s allowed)');
  clearTimeout(timer);
  t.same(heard.at(-1), { via: 'report', n: 0 }, "the node's last word on this worker: 0 in use");
});
