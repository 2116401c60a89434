// Issue 38 finding 7: one request poisoned the state file. `POST /admin/runtime/rollback
// {"target_generation": -1}` was answered 404 but recorded; the loader refuses negative numbers,
// so at the next restart the whole state was discarded (EDGE_STATE_INVALID): history gone,
// numbering back at 1, the -c file serving instead of the active generation. Against a real
// `edge-proxy serve`: every number the state cannot hold is refused with 400 on every endpoint
// that takes one, before anything is recorded; a restart with the same state directory keeps the
// active generation and the history; and a hand-edited state file with bad records among good
// ones loses those records only (one coded warning line, counted, the file rewritten).
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-numbers-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'operator-token-numbers-0123456789abcdef';
const [blue, green] = [await namedBackend(t, 'blue'), await namedBackend(t, 'green')];
const [lport, cport, mport] = [await freePort(), await freePort(), await freePort()];

const configFor = (appPort: number): string => `
listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: json, level: info }
performance: { worker_threads: 1 }
upstream: { app: { route: { path_prefix: / }, backends: [{ id: b, address: "127.0.0.1:${appPort}" }] } }
observability:
  metrics: { address: 127.0.0.1, port: ${mport} }
  control_api: { address: 127.0.0.1, port: ${cport}, auth: { bearer_tokens: [{ token: ${TOKEN}, role: admin, actor_id: deploy-bot }] } }
`;
const configFile = path.join(dir, 'config.yaml');
const greenFile = path.join(dir, 'green.yaml');
writeFileSync(greenFile, configFor(green));
const stateFile = path.join(dir, 'state-config.yaml', 'generations.json');
const call = (method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKEN }, body);
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 2 });
const all = (body: string) => allFrom(body, { perProtocol: 2 });

/** A POST whose body is sent as written: JSON that JSON.stringify cannot produce (`1e309`, `-0`). */
function rawPost(p: string, raw: string): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port: cport, path: p, method: 'POST', ca: caPem, servername: 'localhost', agent: false, headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(raw)) } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }));
    });
    req.setTimeout(30_000, () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(raw);
  });
}

function scrape(): Promise<string> {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: mport, path: '/metrics' }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve(text));
    }).on('error', reject);
  });
}

interface History {
  active_generation: number;
  retained_generations: { generation: number; status: string }[];
  entries: { entry_id: number; operation: string; generation: number; target_generation?: number }[];
}
const history = async (): Promise<History> => (await call('GET', '/admin/runtime/history')).body as never;
const stateErrors = (s: Served) => s.lines.filter((l) => typeof l['code'] === 'string' && String(l['code']).startsWith('EDGE_STATE'));

/** Every spelling the state cannot hold, as raw JSON: the finding's -1 and its neighbours. */
const BAD = ['-1', '1e309', '"1"', String(2 ** 53), '0', '-0', '1.5', 'null', '2147483648', '[1]', '{"n":1}', 'true'];

t.test('numbers the state cannot hold are refused (400) on every endpoint before anything is recorded; a restart keeps the active generation and the history', async (t) => {
  let served = await serve(configFile, configFor(blue));
  t.teardown(() => served.stop());
  t.match(await call('POST', '/admin/runtime/activate', { config_path: greenFile, expected_generation: 1 }), { status: 202, body: { generation: 2 } });
  const before = await history();

  const refused: string[] = [];
  const bodies: [string, (v: string) => string][] = [
    ['/admin/runtime/rollback', (v) => `{"target_generation": ${v}}`],
    ['/admin/runtime/rollback', (v) => `{"target_generation": 1, "expected_active_generation": ${v}}`],
    ['/admin/runtime/activate', (v) => `{"config_path": ${JSON.stringify(greenFile)}, "expected_generation": ${v}}`],
    ['/admin/runtime/preview', (v) => `{"config_path": ${JSON.stringify(greenFile)}, "expected_generation": ${v}}`],
    ['/admin/runtime/validate', (v) => `{"config_path": ${JSON.stringify(greenFile)}, "expected_generation": ${v}}`],
    ['/admin/runtime/reload', (v) => `{"expected_generation": ${v}}`],
  ];
  for (const [route, body] of bodies) {
    for (const v of BAD) {
      const r = await rawPost(route, body(v));
      if (r.status === 400 && r.body['reason'] === 'invalid_request' && /must be a generation number \(a whole number from 1 to 2147483647\)/.test(String(r.body['message']))) refused.push(`${route} ${v}`);
      else t.fail(`${route} ${body(v)}: ${r.status} ${JSON.stringify(r.body)}`);
    }
  }
  t.equal(refused.length, bodies.length * BAD.length, `all ${bodies.length * BAD.length} bodies refused with 400 invalid_request`);
  for (const seg of ['-1', '0', '00', '1.5', '1e3', '2147483648', '9007199254740993', '..', '%2e%2e']) {
    t.match(await call('GET', `/admin/runtime/history/${seg}`), { status: 400, body: { reason: 'invalid_request' } }, `GET history/${seg}: 400`);
  }
  t.match(await call('GET', '/admin/runtime/history/2147483647'), { status: 404 }, 'the largest generation number is a number (not retained: 404)');
  // A generation number that is not retained is still an answer the state can hold: 404, recorded.
  t.match(await call('POST', '/admin/runtime/rollback', { target_generation: 99 }), { status: 404, body: { reason: 'generation_not_retained' } });
  const after = await history();
  t.same(after.entries.slice(1), before.entries, 'no refused request left an entry');
  t.match(after.entries[0], { operation: 'rollback', target_generation: 99, result: 'rejected' }, 'only the 404 was recorded');
  t.equal(await served.stop(), 0);
  t.notOk(/"(target_)?generation":-|"(target_)?generation":0[,}]/.test(readFileSync(stateFile, 'utf8')), 'no number below 1 in the state file');

  served = await serve(configFile, configFor(blue));
  t.same(stateErrors(served), [], 'the restart finds the state usable: no EDGE_STATE_* line');
  t.same(await answers(), all('green'), 'the active generation (green) serves after the restart, not the -c file');
  const resumed = await history();
  t.equal(resumed.active_generation, 2, 'the same active generation');
  t.same(resumed.entries.slice(1), after.entries, 'every entry kept');
  t.match(resumed.entries[0], { operation: 'resume', generation: 2, result: 'succeeded' });
  t.equal(await served.stop(), 0);
});

t.test('a hand-edited state file with bad records among good ones: those records are dropped (one coded warning, counted), the active generation and the rest kept, the file rewritten', async (t) => {
  const saved = JSON.parse(readFileSync(stateFile, 'utf8')) as { history: { slots: Record<string, unknown>[]; entries: Record<string, unknown>[]; last_entry_id: number } };
  const goodEntries = saved.history.entries.length;
  const lastId = saved.history.last_entry_id;
  // The finding's record (target -1), a fractional generation, and a slot with a negative number.
  saved.history.entries.splice(1, 0, { ...saved.history.entries[0], entry_id: lastId - 0.5, target_generation: -1 });
  saved.history.entries.push({ ...saved.history.entries[0], entry_id: lastId + 1, generation: 1.5 });
  saved.history.last_entry_id = lastId + 1;
  saved.history.slots.unshift({ generation: -3, status: 'superseded' });
  writeFileSync(stateFile, JSON.stringify(saved));
  const edited = readFileSync(stateFile, 'utf8');

  const served = await serve(configFile, configFor(blue));
  t.teardown(() => served.stop());
  const warn = served.lines.filter((l) => l['code'] === 'EDGE_STATE_RECORD_DROPPED');
  t.equal(warn.length, 1, 'one warning line');
  t.match(warn[0], { dropped_count: 3, dropped: [{ at: 'history.slots[0]', problem: 'malformed generation' }, { at: 'history.entries[1]', problem: 'malformed entry_id' }, { at: `history.entries[${goodEntries + 1}]`, problem: 'malformed generation', id: lastId + 1 }], copied_to: `${stateFile}.invalid` });
  t.same(served.lines.filter((l) => l['code'] === 'EDGE_STATE_INVALID'), [], 'the state as a whole is not discarded');
  t.same(await answers(), all('green'), 'the active generation still serves');
  const h = await history();
  t.equal(h.active_generation, 2);
  t.equal(h.entries.length, goodEntries + 1, 'every good entry kept, and the resume');
  t.ok(h.entries.every((e) => Number.isSafeInteger(e.generation) && e.generation >= 1 && (e.target_generation === undefined || e.target_generation >= 1)), 'no bad number in the history');
  const metrics = await scrape();
  t.match(metrics, /svc_state_records_dropped_total\{record="entry"\} 2\b/, 'two entries counted');
  t.match(metrics, /svc_state_records_dropped_total\{record="slot"\} 1\b/, 'one slot counted');
  t.equal(readFileSync(`${stateFile}.invalid`, 'utf8'), edited, 'the file as it was is kept for inspection');
  const rewritten = JSON.parse(readFileSync(stateFile, 'utf8')) as typeof saved;
  const numbers = [...rewritten.history.slots.map((s) => s['generation']), ...rewritten.history.entries.flatMap((e) => [e['entry_id'], e['generation'], e['target_generation'] ?? 1])];
  t.ok(numbers.every((n) => Number.isSafeInteger(n) && (n as number) >= 1), 'the file is rewritten without the bad records');
  t.equal(rewritten.history.entries.length, goodEntries + 1, 'the good entries and the resume');
  t.equal(await served.stop(), 0);
  t.ok(existsSync(stateFile));
});
