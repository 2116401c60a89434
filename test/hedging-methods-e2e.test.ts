// `hedging.safe_methods` with a method that may not be sent twice (issue 38, finding 6): refused by
// `edge-proxy -c` (exit 1, one `path: EDGE_CONFIG_HEDGING_METHOD: ...` line per method, every
// other problem of the file still reported) and by an activation against a real `edge-proxy serve`
// (400, the active generation unchanged). The run-time side (a method outside safe_methods is
// never hedged, PUT included) is in test/hedge-e2e.test.ts.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { controlledBackend } from './support/controlled-backend.ts';
import { api } from './support/serve.ts';
import { serviceFiles } from './support/service-config.ts';
import { request, snapshot, startProxy } from './support/overload.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const files = serviceFiles(t, 'edge-hedge-methods-');

/** `edge-proxy -c` on a file whose `resilience` block is `resilience`: exit status, error lines, summary line. */
function validate(name: string, resilience: string): { status: number | null; lines: string[]; summary: string } {
  const file = path.join(files.dir, `${name}.yaml`);
  writeFileSync(file, `listen: { address: 127.0.0.1, port: 9889, tls: { cert: ${files.leaf.cert}, key: ${files.leaf.key} } }\nupstream:\n  api: { route: { path_prefix: / }, backends: [{ id: a, address: "127.0.0.1:9" }] }\nresilience:\n${resilience}`);
  const r = spawnSync(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), '-c', file], { encoding: 'utf8', timeout: 30_000 });
  const all = r.stderr.split('\n').filter((l) => l.length > 0);
  return { status: r.status, lines: all.filter((l) => !l.startsWith(file)), summary: all.filter((l) => l.startsWith(file)).join(' | ') };
}
const codes = (lines: readonly string[]): string[] => lines.map((l) => l.split(': ').slice(0, 2).join(': '));

t.test('edge-proxy -c: safe_methods [POST] exits 1 with one coded line', async (t) => {
  const r = validate('post', '  hedging: { safe_methods: [POST] }\n');
  t.equal(r.status, 1, 'exit 1');
  t.same(codes(r.lines), ['resilience.hedging.safe_methods[0]: EDGE_CONFIG_HEDGING_METHOD'], r.lines.join('\n'));
  t.match(r.lines[0], /^resilience\.hedging\.safe_methods\[0\]: EDGE_CONFIG_HEDGING_METHOD: POST cannot be hedged: a hedge sends the request twice/);
  t.equal(r.summary, `${path.join(files.dir, 'post.yaml')}: invalid (1 error)`, 'the summary line');
});

t.test('edge-proxy -c: PATCH and TRACE refused at their index, the five methods sent twice accepted, beside another error of the file', async (t) => {
  const r = validate('mixed', '  hedging: { enabled: true, delay_ms: 0, safe_methods: [GET, PATCH, PUT, TRACE, DELETE, OPTIONS, HEAD] }\n');
  t.equal(r.status, 1, 'exit 1');
  t.same(
    codes(r.lines).sort(),
    ['resilience.hedging.delay_ms: EDGE_CONFIG_HEDGING_DELAY', 'resilience.hedging.safe_methods[1]: EDGE_CONFIG_HEDGING_METHOD', 'resilience.hedging.safe_methods[3]: EDGE_CONFIG_HEDGING_METHOD'],
    r.lines.join('\n'),
  );
  const ok = validate('ok', '  hedging: { enabled: true, safe_methods: [GET, HEAD, OPTIONS, PUT, DELETE] }\n');
  t.equal(ok.status, 0, `GET, HEAD, OPTIONS, PUT, DELETE: valid (${ok.lines.join(' | ')})`);
  const disabled = validate('disabled', '  hedging: { enabled: false, safe_methods: [GET, POST] }\n');
  t.same([disabled.status, codes(disabled.lines)], [1, ['resilience.hedging.safe_methods[1]: EDGE_CONFIG_HEDGING_METHOD']], 'refused with hedging disabled too');
});

t.test('an activation listing POST in safe_methods is refused with 400 and the code; the active generation keeps serving', async (t) => {
  const be = await controlledBackend(t, 'be');
  const p = await startProxy(
    t,
    files,
    'activate',
    {
      performance: 'global_inflight_limit: 50, per_upstream_inflight_limit: 50, per_backend_inflight_limit: 50',
      upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: be, address: "127.0.0.1:${be.port}" }] } }`,
      resilience: '{ hedging: { enabled: true, delay_ms: 100 } }',
    },
    'operator',
  );
  t.equal((await request(p, 'h1', { path: '/before' })).status, 200, 'serving');
  writeFileSync(p.configFile, p.configText.replace('hedging: { enabled: true, delay_ms: 100 }', 'hedging: { enabled: true, delay_ms: 100, safe_methods: [GET, POST] }'));
  const refused = await api(p.cport, p.ca, 'POST', '/admin/runtime/activate', { token: p.token }, {});
  t.equal(refused.status, 400, 'activation refused: 400');
  const text = JSON.stringify(refused.body);
  t.match(text, /EDGE_CONFIG_HEDGING_METHOD/, 'the code');
  t.match(text, /resilience\.hedging\.safe_methods\[1\]/, 'the path of POST');
  t.equal((await snapshot(p))['generation'], 1, 'generation 1 still active');
  t.equal((await request(p, 'h2', { path: '/after' })).status, 200, 'still serving');
});
