// The quota's local counters under a supervisor (resilience/quota/quota-control.ts over the
// window leases of token-lease.ts), on a fake clock: each contract a window budget of the node,
// a request waits for the supervisor when its lease is empty, is admitted with a unit of every
// contract, denied with the window's wait when the node's window is full (then locally, with no
// message), and denied lease_unavailable when the supervisor does not answer — never admitted.
import t from 'tap';
import { Metrics } from '@edge-proxy/telemetry';
import { QuotaControl, quotaBudget } from '../src/resilience/quota/quota-control.ts';
import type { QuotaVerdict } from '../src/resilience/quota/quota-control.ts';
import { LEASE_WAIT_MS } from '../src/resilience/token-lease.ts';
import { counterValue, facts, policy, quotaSettings } from './support/quota.ts';
import { harness } from './support/token-leases.ts';

t.test('backend local under a supervisor: the node counts; waits on an empty lease; full → denied with the wait, then locally; no answer → lease_unavailable', async (t) => {
  const h = harness({}, 5000);
  const metrics = new Metrics('worker');
  const q = new QuotaControl(metrics, 4);
  q.lease(h.leases);
  q.configure(quotaSettings({ backend: 'local', redis: undefined, policies: [policy('tenant', { routes: ['api'], sustained: { limit: 1, window_ms: 60_000 } })] }), undefined);
  const pols = q.policiesFor('api');
  const key = `${pols[0]?.key(facts({ 'x-tenant': 'acme' })) ?? ''}:s`;
  const B = quotaBudget('tenant', 'sustained');
  const verdicts: QuotaVerdict[] = [];
  q.check(pols, facts({ 'x-tenant': 'acme' }), (v) => verdicts.push(v));
  t.same(verdicts, [], 'the lease is empty: waiting for the supervisor');
  h.turn();
  t.same(h.sent, [{ asks: [{ budget: B, key, want: 1, waiting: 1, holding: 0 }], settles: [] }], 'one ask for the waiting request');
  h.leases.granted([{ budget: B, key, granted: 1, waitMs: 0, block: 1, from: 0, until: 60_000 }]);
  t.match(verdicts, [{ allowed: true, mode: 'local' }], 'admitted with the unit');
  q.check(pols, facts({ 'x-tenant': 'acme' }), (v) => verdicts.push(v));
  h.turn();
  h.leases.granted([{ budget: B, key, granted: 0, waitMs: 55_000, block: 1, from: 0, until: 60_000 }]);
  t.match(verdicts[1], { allowed: false, policy: 'tenant', reason: 'sustained_exceeded', retryAfterS: 55, mode: 'local' }, 'the node\'s window is full: denied until it ends');
  h.sent.length = 0;
  q.check(pols, facts({ 'x-tenant': 'acme' }), (v) => verdicts.push(v));
  h.turn();
  t.match(verdicts[2], { allowed: false, reason: 'sustained_exceeded', retryAfterS: 55 }, 'and again at once, locally');
  t.same(h.sent, [], 'without a message');
  q.check(pols, facts({ 'x-tenant': 'other' }), (v) => verdicts.push(v));
  h.turn();
  h.advance(LEASE_WAIT_MS);
  h.turn();
  t.match(verdicts[3], { allowed: false, reason: 'lease_unavailable', retryAfterS: 1, mode: 'local' }, 'no answer within the lease wait: denied, never admitted');
  t.equal(await counterValue(metrics, 'svc_quota_policy_outcomes_total', { policy: 'tenant', decision: 'allow', backend_mode: 'local' }), 1);
  t.equal(await counterValue(metrics, 'svc_quota_policy_outcomes_total', { policy: 'tenant', decision: 'deny', reason: 'sustained_exceeded', backend_mode: 'local' }), 2);
  t.equal(q.localKeys, 0, 'nothing counted in the worker\'s own memory');
});
