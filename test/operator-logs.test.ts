// Logs for operators (issue 12 item 9) and QUIC handshakes in the downstream TLS metrics (item 6),
// with real `edge-proxy serve` processes: JSON lines carry the level as a string, an ISO-8601 time
// and who wrote them (supervisor, or worker and its slot); a 502 from a backend that refuses
// connections is one warn line naming the upstream, the backend and the code; a hundred failing
// requests are a bounded number of lines whose counts add up to every failure; SIGTERM logs the
// start and the end of the drain; under a simulated journal (JOURNAL_STREAM naming the file the
// child writes its stdout to) plain lines start with their sd-daemon(3) priority and no time.
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, fstatSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { namedBackend } from './support/backends.ts';
import { serve } from './support/serve.ts';
import { getH1, getH3 } from './support/served-by.ts';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const dir = mkdtempSync(path.join(tmpdir(), 'edge-operator-logs-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const okPort = await namedBackend(t, 'ok');
// Nothing listens there: every connection is refused (a dead backend).
const deadPort = await freePort();

const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

function configText(p: { l: number; m: number }, format: 'json' | 'plain'): string {
  return `
listen: { address: 127.0.0.1, port: ${p.l}, tls: { cert: ${server.cert}, key: ${server.key} } }
log: { format: ${format}, level: info }
performance: { worker_threads: 2, timeouts: { shutdown_drain_ms: 4000 } }
upstream:
  live: { route: { path_prefix: /ok }, backends: [{ id: up, address: "127.0.0.1:${okPort}" }] }
  dead: { route: { path_prefix: /dead }, backends: [{ id: gone, address: "127.0.0.1:${deadPort}" }] }
observability:
  metrics: { address: 127.0.0.1, port: ${p.m} }
  control_api: { enabled: false }
`;
}

/** Whether a line is one of the throttled failure lines. */
const isFailureLine = (l: Record<string, unknown>): boolean => typeof l['msg'] === 'string' && l['msg'].startsWith('upstream failure answered with ');

t.test('JSON: string levels, roles and worker ids; answered failures logged, throttled and accounted for; QUIC handshakes counted; the SIGTERM drain logged', async (t) => {
  const p = { l: await freePort(), m: await freePort() };
  const served = await serve(path.join(dir, 'json.yaml'), configText(p, 'json'));
  t.teardown(() => served.stop());
  const target = { lport: p.l, ca: caPem };

  const serving = served.lines.find((l) => l['msg'] === 'edge-proxy serving') ?? {};
  t.match(serving, { level: 'info', role: 'supervisor', pid: served.proc.pid }, 'the supervisor says it is the supervisor');
  t.match(serving['time'], ISO, 'an ISO-8601 time');
  t.notOk('worker' in serving, 'a supervisor line about itself has no worker field');
  t.match(serving['worker_flags'], /(^| )--max-semi-space-size=16( |$)/, 'the start line names the V8 flags the workers run with');
  t.match(serving['worker_flags'], /(^| )--heap-growing-percent=50( |$)/, 'and the old generation\'s growing factor');
  t.match(serving['worker_malloc'], /(^|:)glibc\.malloc\.trim_threshold=\d+(:|$)/, 'and the malloc tunables they get');
  t.notOk(served.lines.some((l) => typeof l['level'] === 'number'), 'no numeric level anywhere');

  // One 502: the backend refuses the connection.
  t.match(await getH1(target, '/dead/one'), /^status 502: 502 Bad Gateway: transport/, 'the proxy answers 502');
  const first = await served.waitFor(isFailureLine);
  t.match(first, { level: 'warn', role: 'worker', msg: 'upstream failure answered with 502', upstream: 'dead', backend: 'gone', status: 502, code: 'EDGE_UPSTREAM_TRANSPORT', generation: 1, suppressed: 0 }, 'one warn line: upstream, backend, code');
  t.match(first['cause'], /^ECONNREFUSED: connect ECONNREFUSED 127\.0\.0\.1:\d+$/, 'and why: the socket error, in the client\'s words');
  t.ok(first['worker'] === 0 || first['worker'] === 1, `from a worker slot (${String(first['worker'])})`);
  t.match(first['time'], ISO);
  t.type(first['duration_ms'], 'number', 'with the duration');
  t.not(first['pid'], served.proc.pid, 'written by the worker process');
  // glibc (2.36) parses GLIBC_TUNABLES in the process's own copy of its environment and writes a NUL
  // over each ':' as it goes, so /proc shows the variable's tunables as separate strings.
  const environ = `\0${readFileSync(`/proc/${String(first['pid'])}/environ`, 'latin1')}`;
  const tunables = `GLIBC_TUNABLES=${String(serving['worker_malloc'])}`;
  t.ok(environ.includes(`\0${tunables}\0`) || environ.includes(`\0${tunables.replaceAll(':', '\0')}\0`), 'whose environment holds the malloc tunables the start line names');

  // A hundred more, ten at a time: the backend's circuit breaker opens after a few, then it is 503
  // (circuit open). Every answer is one line or counted in one; the lines are bounded.
  const statuses = new Map<number, number>([[502, 1]]);
  const started = performance.now();
  for (let round = 0; round < 10; round++) {
    const answers = await Promise.all(Array.from({ length: 10 }, () => getH1(target, '/dead/flood')));
    for (const a of answers) {
      const status = Number(/^status (\d+)/.exec(a)?.[1] ?? 0);
      statuses.set(status, (statuses.get(status) ?? 0) + 1);
    }
  }
  const elapsedS = (performance.now() - started) / 1000;
  t.same([...statuses.keys()].filter((s) => s !== 502 && s !== 503), [], `only 502 and 503 answers (${JSON.stringify([...statuses])})`);
  const accounted = (status: number): number => served.lines.filter((l) => isFailureLine(l) && l['status'] === status).reduce((s, l) => s + 1 + Number(l['suppressed']), 0);
  // The counts of the last interval are written when it ends (one second).
  await served.waitFor(() => accounted(502) === statuses.get(502) && accounted(503) === (statuses.get(503) ?? 0), 15_000).catch(() => undefined);
  t.equal(accounted(502), statuses.get(502), `every 502 is one line or counted in one (${statuses.get(502)})`);
  t.equal(accounted(503), statuses.get(503) ?? 0, `every 503 is one line or counted in one (${statuses.get(503) ?? 0})`);
  const lines = served.lines.filter(isFailureLine);
  t.comment(`answers ${JSON.stringify([...statuses])} in ${elapsedS.toFixed(1)} s: ${lines.length} lines, suppressed ${lines.map((l) => String(l['suppressed'])).join(',')}`);
  // Per worker and kind (transport 502, then 503 once the breaker opened): one line at once, then one per second.
  const bound = 2 * 2 * (Math.ceil(elapsedS) + 3);
  t.ok(lines.length <= bound, `${lines.length} lines for 101 failures (bound ${bound})`);
  t.ok(lines.length < 101, 'fewer lines than failures');
  t.ok(lines.some((l) => Number(l['suppressed']) > 0), 'a line carries a suppressed count');
  for (const l of lines.filter((x) => x['status'] === 503)) t.match(l, { level: 'warn', upstream: 'dead', backend: null, code: 'EDGE_SHED_CIRCUIT_OPEN' });

  // QUIC handshakes in the downstream TLS series: N HTTP/3 requests on fresh connections, nothing else.
  const N = 6;
  const before = await scrape(p.m);
  for (let i = 0; i < N; i++) t.equal(await getH3(target, '/ok'), 'ok', `HTTP/3 request ${i + 1} on its own connection`);
  const after = await scrape(p.m);
  const moved = (name: string, labels: Record<string, string> = {}): number => metricValue(after, name, labels) - metricValue(before, name, labels);
  t.equal(moved('svc_downstream_tls_handshake_success_total'), N, 'svc_downstream_tls_handshake_success_total moved by N');
  t.equal(moved('svc_downstream_tls_alpn_total', { listener: '127.0.0.1:' + String(p.l), protocol: 'h3' }), N, 'svc_downstream_tls_alpn_total{protocol="h3"} moved by N');
  t.equal(moved('svc_downstream_tls_certificate_selection_total', { selection: 'default' }), N, 'one certificate selection each (the default identity)');
  t.equal(moved('svc_downstream_tls_handshake_failure_total'), 0, 'no failure counted');

  // SIGTERM: the supervisor logs the drain's start and end, each worker its own.
  t.equal(await served.stop(), 0, 'exit 0 after SIGTERM');
  const drainStart = await served.waitFor((l) => l['msg'] === 'shutdown: draining the workers');
  t.match(drainStart, { level: 'info', role: 'supervisor', drain_ms: 4000 });
  t.match(await served.waitFor((l) => l['msg'] === 'shutdown: drain finished'), { level: 'info', role: 'supervisor', duration_ms: Number });
  for (const w of [0, 1]) {
    t.match(await served.waitFor((l) => l['msg'] === 'drain started: listeners closed to new connections' && l['worker'] === w), { level: 'info', role: 'worker', grace_ms: 4000 }, `worker ${w}: drain started`);
    t.match(await served.waitFor((l) => l['msg'] === 'drain finished' && l['worker'] === w), { level: 'info', role: 'worker', duration_ms: Number }, `worker ${w}: drain finished`);
  }
  const order = (msg: string): number => served.lines.findIndex((l) => l['msg'] === msg);
  t.ok(order('shutdown: draining the workers') < order('shutdown: drain finished') && order('shutdown: drain finished') < order('edge-proxy stopped'), 'start, end, stopped: in that order');
});

/** Polls `file` until `predicate` holds for its text (the child writes it; there is no event to await). */
async function fileUntil(file: string, predicate: (text: string) => boolean, timeoutMs = 30_000): Promise<string> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const text = readFileSync(file, 'utf8');
    if (predicate(text)) return text;
    if (performance.now() > deadline) throw new Error(`not in time; the file holds:\n${text.slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

t.test('plain under the journal (JOURNAL_STREAM names the stdout file): `<N>` priorities, no timestamps', async (t) => {
  const p = { l: await freePort(), m: await freePort() };
  const configFile = path.join(dir, 'plain.yaml');
  writeFileSync(configFile, configText(p, 'plain'));
  const out = path.join(dir, 'journal.out');
  // O_APPEND: the supervisor and both workers write this one file, as they would the journal's socket.
  const fd = openSync(out, 'a');
  const st = fstatSync(fd, { bigint: true });
  const proc = spawn(process.execPath, [path.join(root, 'packages/cli/src/main.ts'), 'serve', '-c', configFile, '--state-dir', path.join(dir, 'plain-state')], {
    stdio: ['ignore', fd, 'pipe'],
    env: { ...process.env, JOURNAL_STREAM: `${st.dev}:${st.ino}` },
  });
  closeSync(fd);
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await once(proc, 'exit');
    }
  });
  await fileUntil(out, (s) => s.includes('edge-proxy serving'));
  t.match(await getH1({ lport: p.l, ca: caPem }, '/dead/x'), /^status 502/, 'a 502');
  const text = await fileUntil(out, (s) => s.includes('upstream failure answered with 502'));
  const lines = text.split('\n').filter((l) => l.length > 0 && !l.startsWith('{"audit":true'));
  t.match(lines.find((l) => l.includes('edge-proxy serving')), /^<6>INFO \[supervisor\] edge-proxy serving generation=1 /, 'info: <6>, who, no time');
  t.match(lines.find((l) => l.includes('upstream failure answered with 502')), /^<4>WARN \[worker [01]\] upstream failure answered with 502 upstream=dead backend=gone status=502 code=EDGE_UPSTREAM_TRANSPORT cause="ECONNREFUSED: connect ECONNREFUSED 127\.0\.0\.1:\d+" duration_ms=\d+ generation=1 request_id=[0-9a-f-]{36} suppressed=0$/, 'warn: <4>');
  t.same(lines.filter((l) => !/^<[0-7]>[A-Z]+ \[(supervisor|worker [01])\] /.test(l)), [], 'every line starts with its priority and who wrote it');
  t.same(lines.filter((l) => /\d{4}-\d\d-\d\dT\d\d:\d\d/.test(l)), [], 'no line repeats the time journald records');
  proc.kill('SIGTERM');
  const [code] = (await once(proc, 'exit')) as [number | null];
  t.equal(code, 0, `exit 0 after SIGTERM ${stderr}`);
  const final = await fileUntil(out, (s) => s.includes('edge-proxy stopped'));
  t.match(final, /^<6>INFO \[supervisor\] shutdown: draining the workers drain_ms=4000$/m, 'the drain start');
  t.match(final, /^<6>INFO \[supervisor\] shutdown: drain finished duration_ms=\d+$/m, 'the drain end');
});
