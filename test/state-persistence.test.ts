// Issue 12 item 2: a process restart no longer undoes API rollouts. A real `edge-proxy serve`
// activates a second configuration through the API, is stopped with SIGTERM and started again with
// the same command line (same -c FILE, same --state-dir): the activated configuration serves on
// every protocol, the history continues (entries and numbers), SIGHUP reads the activated path,
// and a rollback to a generation of the previous process works. `--force-config` starts from FILE,
// so does an edited FILE (the way restart-required changes apply); a torn state file is one coded
// error line and a start from FILE, serving, not a crash; the watchdog's restart cooldown holds
// across the restart its restart_command made.
import t from 'tap';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { freePort } from '../scripts/lib/free-port.ts';
import { namedBackend } from './support/backends.ts';
import { api, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { allFrom, servedBy } from './support/served-by.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-state-e2e-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const TOKEN = 'operator-token-0123456789abcdef';
const [blue, green, green2] = [await namedBackend(t, 'blue'), await namedBackend(t, 'green'), await namedBackend(t, 'green-2')];
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
const call = (method: string, p: string, body?: unknown) => api(cport, caPem, method, p, { token: TOKEN }, body);
/** What answers on fresh HTTP/1.1, HTTP/2 and HTTP/3 connections (one worker: 3 each). */
const answers = () => servedBy({ lport, ca: caPem }, { perProtocol: 3 });
const all = (body: string) => allFrom(body, { perProtocol: 3 });
const isError = (l: Record<string, unknown>): boolean => l['level'] === 'error';
const noStack = (s: Served): boolean => !/\n\s+at .+:\d+:\d+\)?\n/.test(s.text());

interface Entry {
  entry_id: number;
  operation: string;
  generation: number;
  result: string;
  target_generation?: number;
}
async function history(): Promise<{ active_generation: number; retained_generations: { generation: number; status: string }[]; entries: Entry[] }> {
  const h = await call('GET', '/admin/runtime/history');
  t.equal(h.status, 200);
  return h.body as never;
}

t.test('activate → SIGTERM → the same command line: the activated config serves, history continues, rollback to a pre-restart generation works', async (t) => {
  let served = await serve(configFile, configFor(blue));
  t.teardown(() => served.stop());
  t.same(await answers(), all('blue'), 'generation 1 (blue) at first start');
  t.match(await call('POST', '/admin/runtime/activate', { config_path: greenFile, expected_generation: 1, reason: 'rollout' }), { status: 202, body: { generation: 2 } });
  t.same(await answers(), all('green'), 'generation 2 (green) after the activation');
  const before = await history();
  t.equal(await served.stop(), 0, 'SIGTERM: exit 0');

  const stateFile = path.join(served.stateDir, 'generations.json');
  t.equal(statSync(stateFile).mode & 0o777, 0o600, 'the state file is 0600');
  t.same(readdirSync(served.stateDir).sort(), ['fingerprint.key', 'generations.json'], 'no temporary file left (no compile-cache/ either: the suite shares one, support/serve.ts)');
  t.notOk(readFileSync(stateFile, 'utf8').includes(readFileSync(server.key, 'utf8').split('\n')[1] ?? '-'), 'no key material copied into the state');

  served = await serve(configFile, configFor(blue));
  t.same(await answers(), all('green'), 'after the restart the activated generation (green) serves on every protocol');
  const snap = await call('GET', '/admin/runtime');
  t.match(snap.body, { generation: 2, config_source: greenFile, state: { generations: 'saved' } });
  const after = await history();
  t.equal(after.active_generation, 2, 'the same generation number');
  t.same(after.entries.slice(1), before.entries, 'every entry of the previous process kept, in order');
  t.match(after.entries[0], { entry_id: (before.entries[0]?.entry_id ?? 0) + 1, operation: 'resume', generation: 2, result: 'succeeded', requested_by: 'startup' });
  t.match(after.retained_generations, [
    { generation: 2, status: 'active' },
    { generation: 1, status: 'previous', rollback_candidate: true, has_bundle: true },
  ]);
  t.ok(
    served.lines.some((l) => l['msg'] === 'resumed generation 2 from the state directory'),
    'the resume is logged',
  );
  t.same(served.lines.filter(isError), [], 'no error line');

  // SIGHUP reads the activated path (green.yaml), as before the restart.
  writeFileSync(greenFile, configFor(green2));
  served.proc.kill('SIGHUP');
  await served.waitFor((l) => l['msg'] === 'SIGHUP reload');
  t.same(await answers(), all('green-2'), 'SIGHUP reloaded green.yaml: generation 3');
  t.equal((await history()).active_generation, 3);

  const rb = await call('POST', '/admin/runtime/rollback', { target_generation: 1, expected_active_generation: 3 });
  t.match(rb, { status: 202, body: { generation: 1 } }, 'rollback to the generation of the previous process');
  t.same(await answers(), all('blue'), 'the rollback to generation 1 (blue) serves');
  t.match(await call('POST', '/admin/runtime/activate', { config_path: greenFile, expected_generation: 1 }), { status: 202, body: { generation: 4 } }, 'numbers continue after the restart');
  t.equal(await served.stop(), 0);
});

t.test('serve --force-config starts from -c FILE as a new generation, history kept', async (t) => {
  const served = await serve(configFile, configFor(blue), 60_000, {}, ['--force-config']);
  t.teardown(() => served.stop());
  t.same(await answers(), all('blue'), 'the -c file (blue) serves, not the activated green');
  const h = await history();
  t.equal(h.active_generation, 5, 'a new number after the saved ones');
  t.match(h.entries[0], { operation: 'activate', generation: 5, result: 'succeeded', reason: 'startup with --force-config' });
  t.match(h.retained_generations.slice(0, 2), [
    { generation: 5, status: 'active' },
    { generation: 4, status: 'previous' },
  ]);
  t.equal(await served.stop(), 0);
});

t.test('an edited -c file applies at the next start as a new generation, a restart-required change included (worker_threads 1 → 2)', async (t) => {
  const served = await serve(configFile, configFor(blue).replace('worker_threads: 1', 'worker_threads: 2'));
  t.teardown(() => served.stop());
  const snap = await call('GET', '/admin/runtime');
  t.match(snap.body, { generation: 6, config_source: configFile, workers: { expected: 2 } });
  t.same(await answers(), all('blue'));
  t.match((await history()).entries[0], { operation: 'activate', generation: 6, reason: `startup: -c ${configFile} changed` });
  t.equal(await served.stop(), 0);
});

t.test('a torn state file: one coded error line, start from -c FILE as generation 1, serving, exit 0 on SIGTERM', async (t) => {
  const stateDir = path.join(dir, 'state-config.yaml');
  writeFileSync(path.join(stateDir, 'generations.json'), '{"version":1,"saved_at_unix_ms":17');
  const served = await serve(configFile, configFor(blue));
  t.teardown(() => served.stop());
  t.same(await answers(), all('blue'), 'the -c file serves');
  const errors = served.lines.filter(isError);
  t.match(errors, [{ code: 'EDGE_STATE_INVALID', problem: 'not JSON', moved_to: path.join(stateDir, 'generations.json.invalid') }], 'exactly one error line, coded');
  t.equal((await history()).active_generation, 1);
  t.ok(noStack(served), 'no stack trace');
  t.equal(served.proc.exitCode, null, 'still running');
  t.equal(await served.stop(), 0, 'SIGTERM: exit 0');
  t.equal(readFileSync(path.join(stateDir, 'generations.json.invalid'), 'utf8'), '{"version":1,"saved_at_unix_ms":17', 'kept for inspection');
});

t.test('the watchdog cooldown survives the restart its restart_command makes: the same fault does not restart the new process again', async (t) => {
  // Stands in for `systemctl restart`: stops the service as systemd would (the supervisor is its parent).
  const script = path.join(dir, 'restart-command.mjs');
  writeFileSync(script, "process.kill(process.ppid, 'SIGTERM');\n");
  const file = path.join(dir, 'watchdog.yaml');
  const text = `${configFor(blue).replace('worker_threads: 1', 'worker_threads: 1, timeouts: { shutdown_drain_ms: 1000 }')}resilience: { watchdog: { enabled: true, check_interval_ms: 1000, unhealthy_consecutive_windows: 1, restart_cooldown_ms: 600000, drain_grace_ms: 500, restart_command: [${process.execPath}, ${script}] } }\n`;
  /** SIGCONT, if the process still exists (the liveness check may have killed it). */
  const resume = (pid: number): void => {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      /* gone */
    }
  };
  /** SIGSTOPs the worker: its heartbeats stop, so every window is unhealthy (`worker_silent`). */
  const freezeWorker = async (): Promise<number> => {
    const snap = await call('GET', '/admin/runtime');
    const pid = (snap.body['workers'] as { list: { pid: number }[] }).list[0]?.pid ?? 0;
    t.ok(pid > 0, 'worker pid');
    process.kill(pid, 'SIGSTOP');
    return pid;
  };
  let served = await serve(file, text);
  t.teardown(() => served.stop());
  const exited = once(served.proc, 'exit');
  const frozen = await freezeWorker();
  t.teardown(() => resume(frozen));
  await exited;
  t.ok(served.lines.some((l) => l['msg'] === 'restart requested' && l['actor'] === 'watchdog'), 'the watchdog asked for the restart');
  const saved = JSON.parse(readFileSync(path.join(served.stateDir, 'watchdog.json'), 'utf8')) as { version: number; last_restart_at_unix_ms: number };
  t.equal(saved.version, 1);
  t.ok(Date.now() - saved.last_restart_at_unix_ms < 60_000, 'the restart time is kept');

  served = await serve(file, text);
  const again = await freezeWorker();
  t.teardown(() => resume(again));
  // Unhealthy windows pile up without a restart: with unhealthy_consecutive_windows 1, only the
  // kept cooldown can hold it.
  let health = await api(cport, caPem, 'GET', '/health');
  for (let i = 0; i < 100 && ((health.body['watchdog'] as { consecutive_unhealthy_windows: number }).consecutive_unhealthy_windows ?? 0) < 2; i++) {
    await new Promise((r) => setTimeout(r, 100));
    health = await api(cport, caPem, 'GET', '/health');
  }
  t.match(health.body['watchdog'], { degraded: true, unhealthy_reasons: ['worker_silent'], restart_requested: false }, 'degraded, no restart requested');
  t.ok((health.body['watchdog'] as { consecutive_unhealthy_windows: number }).consecutive_unhealthy_windows >= 2, 'two unhealthy windows in a row, held by the cooldown');
  t.equal(served.proc.exitCode, null, 'still running');
  resume(again);
  t.equal(await served.stop(), 0);
});
