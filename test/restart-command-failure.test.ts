// A `restart_command` that does not restart the service, run for real (issue 12, "Failure paths"):
// it exits non-zero, cannot be started, hangs past `restart_command_timeout_ms`, or exits 0 while
// nothing stops the service. Each time the workers were drained first, so the node is dark: the
// failure must be logged at error with its status, counted, audited, and the workers re-forked on
// the active generation (listeners bound, /ready 200, traffic served, the snapshot's `listening`
// true again and false while drained), and a further restart must be accepted.
import t from 'tap';
import type { Test } from 'tap';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { api, auditEvents, serve } from './support/serve.ts';
import type { Served } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { getH1, getH3 } from './support/served-by.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { alive, waitReady, workers } from './support/workers.ts';
import { auditSchemaErrors } from './support/audit-schema.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-restart-command-');
const TOKEN = 'admin-token-restart-command-0123456789';
const backendPort = await namedBackend(t, 'backend');

const configText = (p: ServicePorts, watchdog: string): string =>
  serviceConfig({
    ports: p,
    cert: leaf,
    backendPort,
    performance: 'worker_threads: 2',
    extra: `resilience: { watchdog: { drain_grace_ms: 200, ${watchdog} } }`,
    controlApiTls: leaf,
    token: { token: TOKEN, role: 'admin', actor: 'restart-tester' },
  });

const NO_STACK = /\n\s+at .+:\d+:\d+\)?\n/;

/** A log line's level as a name, whether the logger writes pino's numbers or labels. */
const levelOf = (l: Record<string, unknown>): unknown => ({ 30: 'info', 40: 'warn', 50: 'error' } as Record<string, string>)[String(l['level'])] ?? l['level'];

/** Children of `ppid` whose command line is `argv` (from /proc). */
function childrenRunning(ppid: number, argv: readonly string[]): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const cmd = readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0').filter((s) => s.length > 0);
      if (parent === ppid && cmd.join(' ') === argv.join(' ')) out.push(Number(e));
    } catch {
      /* the process ended while we looked */
    }
  }
  return out;
}

/**
 * One failed restart: asks for it, waits for the error line with `code`, then the recovery line;
 * checks the node serves again. `during` runs once the command started (the node is drained).
 */
async function failedRestart(t: Test, served: Served, p: { l: number; c: number; m: number }, code: string, during: () => Promise<void> = async () => {}): Promise<Record<string, unknown>> {
  const before = served.lines.length;
  const after = (l: Record<string, unknown>): boolean => served.lines.indexOf(l) >= before;
  const r = await api(p.c, caPem, 'POST', '/admin/runtime/restart', { token: TOKEN });
  t.match(r, { status: 202, body: { status: 'draining' } }, 'restart accepted');
  await served.waitFor((l) => after(l) && l['msg'] === 'restart command started: the workers are drained', 30_000);
  await during();
  const failed = await served.waitFor((l) => after(l) && l['code'] === code, 30_000);
  t.equal(levelOf(failed), 'error', `${code}: logged at error`);
  await served.waitFor((l) => after(l) && l['msg'] === 'workers re-forked after the failed restart command: serving again', 60_000);
  t.equal(await waitReady({ lport: p.l, cport: p.c, ca: caPem, token: TOKEN }), 200, '/ready 200 again');
  t.equal(await getH1({ lport: p.l, ca: caPem }), 'backend', 'HTTPS served again');
  t.equal(await getH3({ lport: p.l, ca: caPem }), 'backend', 'HTTP/3 served again');
  const generation = (await api(p.c, caPem, 'GET', '/ready')).body['generation'];
  const list = await workers({ lport: p.l, cport: p.c, ca: caPem, token: TOKEN });
  t.same(
    list.map((w) => ({ state: w.state, listening: (w as unknown as { listening: boolean }).listening, generation: w.generation })),
    list.map(() => ({ state: 'serving', listening: true, generation })),
    'every worker re-forked on the active generation, listening',
  );
  const health = (await api(p.c, caPem, 'GET', '/health')).body['watchdog'] as Record<string, unknown>;
  t.match(health, { restart_requested: false, restart_result: 'failed', restart_note: /restart command/ }, 'the watchdog view says the restart failed, and why');
  return failed;
}

t.test('a restart_command that fails, cannot start, hangs or does not restart the service: logged, counted, audited, and the workers come back; a further restart is accepted', async (t) => {
  const p = await freePorts();
  const file = path.join(dir, 'restart.yaml');
  const served = await serve(file, configText(p, 'restart_command: [/bin/false]'));
  t.teardown(() => served.stop());
  const pidsBefore = (await workers({ lport: p.l, cport: p.c, ca: caPem, token: TOKEN })).map((w) => w.pid);

  // 1. Exit status 1. While the command runs, nothing listens: the snapshot must not claim it does.
  const falseLine = await failedRestart(t, served, p, 'EDGE_RESTART_COMMAND_FAILED');
  t.match(falseLine, { exit_code: 1, signal: null, command: '/bin/false', restart_id: /^[0-9a-f-]{36}$/ }, 'the exit status and the command are logged');
  const pidsAfter = (await workers({ lport: p.l, cport: p.c, ca: caPem, token: TOKEN })).map((w) => w.pid);
  t.equal(pidsAfter.filter((pid) => pidsBefore.includes(pid)).length, 0, 'every worker is a new process');

  // 2. A missing executable (a further restart is accepted: the previous one ended).
  const missing = '/nonexistent/edge-proxy-restart';
  writeFileSync(file, configText(p, `restart_command: [${missing}, restart]`));
  t.equal((await api(p.c, caPem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {})).status, 202, 'reload with another command');
  const enoent = await failedRestart(t, served, p, 'EDGE_RESTART_COMMAND_NOT_STARTED');
  t.match(enoent, { errno: 'ENOENT', command: missing }, 'the errno is logged');

  // 3. A command that hangs past the timeout: killed, and while it ran the node was drained.
  writeFileSync(file, configText(p, 'restart_command: [/bin/sleep, "60"], restart_command_timeout_ms: 6000'));
  t.equal((await api(p.c, caPem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {})).status, 202, 'reload with a hanging command');
  let sleeper = 0;
  const hung = await failedRestart(t, served, p, 'EDGE_RESTART_COMMAND_TIMEOUT', async () => {
    // The line is logged as the command is spawned: look for it, bounded (it runs for 6 s; the checks below must fit in that).
    for (let i = 0; i < 40 && sleeper === 0; i++) {
      sleeper = childrenRunning(served.proc.pid as number, ['/bin/sleep', '60'])[0] ?? 0;
      if (sleeper === 0) await new Promise((r) => setTimeout(r, 25));
    }
    t.ok(sleeper > 0, 'the command runs');
    const drained = await workers({ lport: p.l, cport: p.c, ca: caPem, token: TOKEN });
    t.same(
      drained.map((w) => (w as unknown as { listening: boolean }).listening),
      drained.map(() => false),
      'while drained, the snapshot says no worker listens',
    );
    t.equal((await api(p.c, caPem, 'GET', '/ready')).status, 503, 'and /ready is 503');
  });
  t.match(hung, { timeout_ms: 6000 }, 'the timeout is logged');
  t.equal(alive(sleeper), false, 'the hung command was killed');

  // 4. Exit 0, but nothing stopped the service.
  writeFileSync(file, configText(p, 'restart_command: [/bin/true], restart_command_timeout_ms: 1000'));
  t.equal((await api(p.c, caPem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {})).status, 202, 'reload with a command that restarts nothing');
  await failedRestart(t, served, p, 'EDGE_RESTART_COMMAND_NO_RESTART');

  // Counted: every command run, and every failure (as an unexpected runtime error: the catalogue
  // has no failed-hook series). Nothing else failed in this run.
  const text = await scrape(p.m);
  t.equal(metricValue(text, 'svc_watchdog_restart_hooks'), 4, 'four commands run');
  t.equal(metricValue(text, 'svc_runtime_panics'), 4, 'four failures counted');
  t.equal(metricValue(text, 'svc_watchdog_restart_requests'), 4, 'four restarts requested');

  // Audited: one failed restart result per command, naming why, the actor and the generation.
  const results = auditEvents(served).filter((e) => e['action'] === 'restart' && e['event_type'] === 'operation_result' && e['result'] === 'failed');
  t.same(
    results.map((e) => e['reason']),
    ['EDGE_RESTART_COMMAND_FAILED', 'EDGE_RESTART_COMMAND_NOT_STARTED', 'EDGE_RESTART_COMMAND_TIMEOUT', 'EDGE_RESTART_COMMAND_NO_RESTART'],
    'each failure audited with its reason',
  );
  t.match(results[0], { failure_class: 'restart_command', generation: 1, actor: { id: 'restart-tester', roles: ['admin'] } }, 'with the actor and the generation');
  t.same(auditSchemaErrors(results), [], 'in the audit schema (v1)');
  t.notMatch(served.text(), NO_STACK, 'no stack trace in the output');
});
