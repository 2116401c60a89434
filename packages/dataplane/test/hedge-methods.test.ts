// `hedging.safe_methods` (issue 38, finding 6): validation accepts exactly the methods the request
// path may send twice (RETRY_METHODS, the only requests given more than one attempt, hedges
// included), so no listed method validates and is then never hedged, and refuses every other with
// EDGE_CONFIG_HEDGING_METHOD at its index.
import t from 'tap';
import { validateConfig } from '@edge-proxy/config';
import { RETRY_METHODS } from '../src/resilience/retry-control.ts';

const METHODS = ['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE', 'POST', 'PATCH', 'CONNECT', 'PROPFIND', 'LOCK', 'PURGE'];

const doc = (safe: string[]): Record<string, unknown> => ({
  listen: { address: '127.0.0.1', port: 9889 },
  upstream: { api: { route: { path_prefix: '/' }, backends: [{ id: 'a', address: '127.0.0.1:9' }] } },
  resilience: { hedging: { enabled: true, delay_ms: 50, safe_methods: safe } },
});

t.test('safe_methods: each method valid exactly when the request path may retry it', async (t) => {
  for (const m of METHODS) {
    const r = validateConfig(doc(['GET', m].filter((x, i, a) => a.indexOf(x) === i)), '/tmp');
    const hedgeIssues = r.ok ? [] : r.issues.filter((i) => i.code === 'EDGE_CONFIG_HEDGING_METHOD').map((i) => i.path);
    t.same(hedgeIssues, RETRY_METHODS.has(m) ? [] : [m === 'GET' ? 'resilience.hedging.safe_methods[0]' : 'resilience.hedging.safe_methods[1]'], `${m}: ${RETRY_METHODS.has(m) ? 'accepted' : 'refused at its index'}`);
  }
  t.same([...RETRY_METHODS].sort(), ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PUT'], 'the retry methods: RFC 9110 §9.2.2 idempotent, TRACE aside');
});
