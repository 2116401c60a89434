// The node's adaptive admission and brownout (limits/node-admission.ts, issue 39), with a fake
// clock: one limit stepped from every worker's batches (one node window, not one per worker), the
// `global` budget following it in the lease ledger (a lowered limit revokes, a raised one serves a
// waiting worker), the brownout state from the sum of the workers' in-use counts with the spec's
// hysteresis, a dead worker's count gone at once, a notice broadcast on each change only, the
// greeting of a new worker, activations (disabled, re-enabled, a narrower range), the views.
import t from 'tap';
import { validateConfig } from '@edge-proxy/config';
import type { ResolvedConfig } from '@edge-proxy/config';
import type { LeaseGrant, ToWorker } from '@edge-proxy/ipc';
import { Metrics } from '@edge-proxy/telemetry';
import { NodeAdmission } from '../src/limits/node-admission.ts';
import { LeaseService } from '../src/limits/lease-service.ts';

type Config = ResolvedConfig['config'];
type Notice = Extract<ToWorker, { type: 'admission' }>;

function config(resilience: Record<string, unknown>, global = 16): Config {
  const r = validateConfig(
    {
      listen: { address: '127.0.0.1', port: 8443, tls: { cert: '/tmp/c.pem', key: '/tmp/k.pem' } },
      upstream: { app: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: '127.0.0.1:1' }] } },
      performance: { global_inflight_limit: global, per_upstream_inflight_limit: global },
      resilience,
    },
    '/tmp',
  );
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value.config;
}

const ADAPTIVE = { adaptive_admission: { min_limit: 4, max_limit: 16, decrease_step: 4, increase_step: 4, high_latency_ms: 100 }, brownout: { enabled: false } };

function harness() {
  let now = 1000;
  const notices: { limit: number; brownout: boolean }[] = [];
  const limits: number[] = [];
  const metrics = new Metrics('supervisor');
  const a = new NodeAdmission({
    broadcast: (n: Notice) => notices.push({ limit: n.limit, brownout: n.brownout }),
    onLimit: (l) => limits.push(l),
    clock: { now: () => now, stamp: () => 5e12 + now },
    metrics,
  });
  return {
    a,
    notices,
    limits,
    metrics,
    at: (ms: number) => (now = ms),
    gauge: async (name: string): Promise<number | undefined> => (await metrics.gauge(name).get()).values[0]?.value,
  };
}

t.test('adaptive: the batches of every worker make one node window; one step per window, within [min, max]', async (t) => {
  const h = harness();
  h.a.configure(config(ADAPTIVE));
  t.same(h.notices, [{ limit: 16, brownout: false }], 'the first commit tells every worker the limit: max_limit');
  t.equal(h.a.limit, 16);
  // Window opened at the commit (t=1000). Reports inside 100 ms only collect.
  h.at(1040);
  h.a.report(0, { samples: 5, high: 5, inUse: 3 });
  h.at(1080);
  h.a.report(1, { samples: 5, high: 0, inUse: 2 });
  t.same(h.limits, [], 'no step before the window is 100 ms old');
  // The report at 100 ms closes it: 10 samples, 5 slow (50 % > 10 %): high, 16 - 4.
  h.at(1100);
  h.a.report(2, { samples: 0, high: 0, inUse: 1 });
  t.same(h.limits, [], 'a report without samples is no observation (the window stays open)');
  h.at(1101);
  h.a.report(2, { samples: 1, high: 0, inUse: 1 });
  t.same(h.limits, [12], 'one step down for the node: 4 workers would not make it 4 steps');
  t.same(h.notices.at(-1), { limit: 12, brownout: false }, 'broadcast');
  // Each later window: one more step, down to min_limit 4 and no lower.
  for (let i = 1; i <= 4; i++) {
    h.at(1101 + i * 100);
    h.a.report(i % 3, { samples: 10, high: 2, inUse: 0 });
  }
  t.same(h.limits, [12, 8, 4], 'down to min_limit, then held there (no change: no callback)');
  t.same(h.notices.map((n) => n.limit), [16, 12, 8, 4], 'a notice per change only');
  // Healthy windows: up by increase_step to max_limit.
  for (let i = 5; i <= 10; i++) {
    h.at(1101 + i * 100);
    h.a.report(0, { samples: 10, high: 1, inUse: 0 });
  }
  t.same(h.limits, [12, 8, 4, 8, 12, 16], 'back up to max_limit (1 slow of 10 is not high)');
  t.equal(await h.gauge('svc_adaptive_admission_limit'), 16, "svc_adaptive_admission_limit: the node's limit");
  t.same(h.a.view(), { adaptiveEnabled: true, adaptiveLimit: 16, minLimit: 4, maxLimit: 16, inflight: 0, brownoutActive: false }, 'the view');
});

t.test('adaptive admission disabled: the limit is global_inflight_limit and reports move nothing; re-enabled starts at max_limit', async (t) => {
  const h = harness();
  h.a.configure(config({ ...ADAPTIVE, adaptive_admission: { ...ADAPTIVE.adaptive_admission, enabled: false } }, 20));
  t.equal(h.a.limit, 20, 'global_inflight_limit');
  h.at(1200);
  h.a.report(0, { samples: 10, high: 10, inUse: 0 });
  t.same(h.limits, [], 'no step');
  t.same(h.a.view(), { adaptiveEnabled: false, adaptiveLimit: 20, minLimit: 20, maxLimit: 20, inflight: 0, brownoutActive: false });
  h.a.configure(config(ADAPTIVE, 20));
  t.equal(h.a.limit, 16, 're-enabled: max_limit');
  t.same(h.notices.map((n) => n.limit), [20, 16], 'each activation that changed it told the workers');
  // A narrower range clamps the limit at the commit.
  h.a.configure(config({ ...ADAPTIVE, adaptive_admission: { ...ADAPTIVE.adaptive_admission, max_limit: 10 } }, 20));
  t.equal(h.a.limit, 10, 'clamped into the new [4, 10]');
});

t.test('the global budget follows the node limit in the lease ledger: lowered revokes, raised serves a waiting worker; a commit keeps it', async (t) => {
  let now = 0;
  const sent: [number, LeaseGrant[]][] = [];
  // Wired as the supervisor wires them: a step sets the budget's limit, a commit reads the node's limit.
  const ref: { leases?: LeaseService } = {};
  const a = new NodeAdmission({ broadcast: () => {}, onLimit: (l) => ref.leases?.setGlobalLimit(l), clock: { now: () => now, stamp: () => now } });
  const leases = new LeaseService({ workers: 2, send: (w, g) => sent.push([w, g]), globalLimit: () => a.limit, now: () => now });
  ref.leases = leases;
  t.teardown(() => leases.close());
  const global = (): number | undefined => leases.view().find((b) => b.key === 'global')?.limit;
  const c = config(ADAPTIVE);
  a.configure(c);
  leases.configure(c);
  t.equal(global(), 16, 'the budget starts at max_limit');
  leases.receive(0, [{ key: 'global', need: 16, extra: 0, give: 0, used: 0, asks: true }]);
  t.equal(sent.at(-1)?.[1][0]?.add, 16, 'worker 0 granted 16');
  sent.length = 0;
  now = 100;
  a.report(0, { samples: 10, high: 10, inUse: 16 });
  t.same(sent.map(([w, g]) => [w, g[0]?.key, g[0]?.revoke, g[0]?.limit]), [[0, 'global', 4, 12]], 'a high window: the limit lowered to 12, 4 of the 16 revoked from the holder');
  leases.configure(c);
  t.equal(global(), 12, "a commit configures the budget at the node's limit, not global_inflight_limit");
  leases.receive(0, [{ key: 'global', need: 0, extra: 0, give: 4, used: 12, asks: false }]);
  sent.length = 0;
  leases.receive(1, [{ key: 'global', need: 2, extra: 0, give: 0, used: 0, asks: true }]);
  t.equal(sent.filter(([w]) => w === 1).reduce((n, [, g]) => n + (g[0]?.add ?? 0), 0), 0, 'at 12 of 12 nothing is free for worker 1');
  now = 200;
  a.report(0, { samples: 10, high: 0, inUse: 12 });
  t.equal(global(), 16, 'a healthy window: 16');
  t.same(sent.filter(([w]) => w === 1).map(([, g]) => g[0]?.add).filter((n) => n !== 0), [2], 'the raise serves worker 1 at once');
});

t.test('brownout: the node in-flight count is the sum of the workers\' reports; trigger and recover with hysteresis; a dead worker stops counting at once', async (t) => {
  const h = harness();
  h.a.configure(config({ adaptive_admission: { enabled: false }, brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 20 } }, 10));
  t.same(h.notices, [{ limit: 10, brownout: false }]);
  h.a.report(0, { samples: 0, high: 0, inUse: 2 });
  h.a.workerInUse(1, 1);
  h.a.report(2, { samples: 0, high: 0, inUse: 1 });
  t.equal(h.a.view().inflight, 4, '4 in flight over 3 workers');
  t.equal(h.a.view().brownoutActive, false, '40 %: below the trigger');
  h.a.workerInUse(3, 1);
  t.same(h.notices.at(-1), { limit: 10, brownout: true }, '5 of 10 (50 %, the trigger): active, broadcast at once; no worker alone is above 20 %');
  t.equal(await h.gauge('svc_brownout_active'), 1, 'svc_brownout_active 1');
  h.a.report(0, { samples: 0, high: 0, inUse: 0 });
  t.equal(h.a.view().brownoutActive, true, '3 of 10 (30 %, above recover): still active');
  h.a.workerInUse(1, 0);
  t.same(h.notices.at(-1), { limit: 10, brownout: false }, '2 of 10 (20 %, the recover): inactive');
  t.equal(await h.gauge('svc_brownout_active'), 0);
  t.equal(h.notices.length, 3, 'one notice per transition, none for counts that changed nothing');
  // A worker holding 5 dies: its requests stop counting at once.
  h.a.workerInUse(2, 5);
  t.equal(h.notices.at(-1)?.brownout, true);
  h.a.workerGone(2);
  t.same([h.a.view().inflight, h.notices.at(-1)?.brownout], [1, false], 'worker 2 gone: 1 in flight (worker 3), inactive, broadcast');
  h.a.workerGone(2);
  t.equal(h.notices.length, 5, 'a second exit changes nothing');
  t.same(h.a.greeting(), [{ type: 'admission', limit: 10, brownout: false, sentAt: 5e12 + 1000 }], 'a new worker is told the limit and the state');
});

t.test('brownout against the limit in force: a lowered adaptive limit can trigger it; disabling it at a commit ends it', async (t) => {
  const h = harness();
  h.a.configure(config({ ...ADAPTIVE, brownout: { trigger_inflight_percent: 90, recover_inflight_percent: 50 } }));
  h.a.workerInUse(0, 11);
  t.equal(h.a.view().brownoutActive, false, '11 of 16: 68.75 %');
  h.at(1100);
  h.a.report(1, { samples: 10, high: 10, inUse: 0 });
  t.same([h.a.limit, h.a.view().brownoutActive], [12, true], 'limit 12: 11 of 12 is 91.7 %: active at the step');
  t.same(h.notices.at(-1), { limit: 12, brownout: true }, 'one notice carries both');
  h.a.configure(config({ ...ADAPTIVE, brownout: { enabled: false } }));
  t.same(h.notices.at(-1), { limit: 12, brownout: false }, 'brownout disabled: inactive at the commit');
  h.a.workerInUse(0, 16);
  t.equal(h.a.view().brownoutActive, false, 'and stays so');
});
