// The worker's breaker registry inside the Dataplane: one structured line per transition (warn
// when it opens, info on half-open and closed) naming upstream and backend, the `breaker` event,
// the views of the active generation, and state that survives a generation swap keeping the
// backend and goes with one that drops it. No sockets: the registry is driven as the request path
// will drive it.
import t from 'tap';
import { jsonLog } from './support/json-log.ts';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfigText } from '@edge-proxy/config';
import type { ResolvedConfig } from '@edge-proxy/config';
import { Metrics } from '@edge-proxy/telemetry';
import { Dataplane } from '../src/runtime/dataplane.ts';
import { breakerPolicy } from '../src/resilience/breaker-registry.ts';
import type { BreakerTransition } from '../src/resilience/breaker-registry.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-breaker-dp-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const cert = makeLeaf(dir, 'server', ca, { sans: ['localhost'] });

async function config(backends: string, openMs: number): Promise<ResolvedConfig> {
  const r = await loadConfigText(
    `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${cert.cert}, key: ${cert.key} } }
resilience: { circuit_breaker: { failure_threshold: 2, open_ms: ${openMs} } }
upstream:
  api: { route: { path_prefix: /api }, backends: [${backends}] }
  web: { route: { path_prefix: / }, backends: [{ id: w, address: "127.0.0.1:9" }] }`,
    dir,
  );
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return r.value;
}

t.test('transitions are logged once each, with upstream and backend; views follow the active generation', async (t) => {
  const { lines, wrote, logger } = jsonLog();
  const dp = new Dataplane(new Metrics('worker'), undefined, logger);
  t.teardown(() => dp.close());
  const events: BreakerTransition[] = [];
  dp.events.on('breaker', (tr: BreakerTransition) => events.push(tr));
  t.same(dp.breakerViews(), [], 'no generation: no view');
  dp.commit(dp.prepare(await config('{ id: a, address: "127.0.0.1:7" }, { id: b, address: "127.0.0.1:8" }', 40), 1));
  const rt = dp.current!;
  t.equal(rt.deps.breakers, dp.breakers, 'the request path reaches the registry through deps');
  const policy = breakerPolicy(rt.config.resilience.circuit_breaker);
  const [a, b] = rt.upstreams.get('api')!.backends;
  const breakers = lines.length;
  dp.breakers.record(a!.key, 'failure', false, policy);
  dp.breakers.record(a!.key, 'failure', false, policy);
  t.notOk(dp.breakers.mayTry(a!.key, policy), 'two failures (failure_threshold 2): open');
  t.ok(dp.breakers.mayTry(b!.key, policy), 'the other backend is untouched');
  t.same(dp.breakerViews().map((v) => [v.upstream, v.backend, v.state, v.failures]), [['api', 'a', 'open', 0], ['api', 'b', 'closed', 0], ['web', 'w', 'closed', 0]]);
  const until = dp.breakerViews()[0]?.openUntilUnixMs ?? 0;
  t.ok(until > Date.now() - 1000 && until <= Date.now() + 40, 'open until about open_ms from now');
  await new Promise((r) => setTimeout(r, 50));
  t.ok(dp.breakers.begin(a!.key, policy), 'after open_ms the next attempt is a probe');
  dp.breakers.record(a!.key, 'success', true, policy);
  while (lines.length < breakers + 3) await once(wrote, 'line');
  t.same(lines.slice(breakers).map((l) => [l['level'], l['msg'], l['upstream'], l['backend'], l['from'], l['to'], l['consecutive_failures'], l['open_ms']]), [
    ['warn', 'circuit breaker opened: backend failing, not picked until open_ms elapsed', 'api', 'a', 'closed', 'open', 2, 40],
    ['info', 'circuit breaker half-open: open_ms elapsed, the next request probes the backend', 'api', 'a', 'open', 'half_open', undefined, undefined],
    ['info', 'circuit breaker closed: the probe succeeded', 'api', 'a', 'half_open', 'closed', undefined, undefined],
  ]);
  t.same(events.map((e) => `${e.from}→${e.to}`), ['closed→open', 'open→half_open', 'half_open→closed'], 'one event per transition');

  // A generation that keeps `a` and drops `b`: a's breaker (opened again) survives the swap, b's goes.
  dp.breakers.record(a!.key, 'failure', false, policy);
  dp.breakers.record(a!.key, 'failure', false, policy);
  dp.breakers.record(b!.key, 'failure', false, policy);
  dp.commit(dp.prepare(await config('{ id: a, address: "127.0.0.1:7" }', 40), 2));
  t.same(dp.breakerViews().map((v) => [v.backend, v.state]), [['a', 'open'], ['w', 'closed']], 'the breaker outlives the generation swap; b is gone');
  t.equal(dp.breakers.status(b!.key), 'closed', 'and its state with it');
});
