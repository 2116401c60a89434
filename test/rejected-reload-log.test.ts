// A rejected reload or activation is logged at error with every error line (issue 12, "Failure
// paths"), whether it came from SIGHUP (`systemctl reload`) or the control API, and nothing of the
// candidate file's content reaches the log: the lines are path, code and the code's meaning. Both
// paths are counted alike.
import t from 'tap';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { freePort } from '../scripts/lib/free-port.ts';
import { api, serve } from './support/serve.ts';
import { namedBackend } from './support/backends.ts';
import { metricValue, scrape } from './support/exposition.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-rejected-reload-');
const TOKEN = 'operator-token-rejected-reload-0123456789';
const backendPort = await namedBackend(t, 'backend');
// Stands in for a value that must never be logged (a rule message would quote it).
const MARKER = 'SECRET-MARKER-7c1e';

/** A log line's level as a name, whether the logger writes pino's numbers or labels. */
const levelOf = (l: Record<string, unknown>): unknown => ({ 30: 'info', 40: 'warn', 50: 'error' } as Record<string, string>)[String(l['level'])] ?? l['level'];

/** `controlApiExtra`: more `control_api` lines (the rejected candidates add one). */
const configText = (p: ServicePorts, controlApiExtra = ''): string =>
  serviceConfig({ ports: p, cert: leaf, backendPort, performance: 'worker_threads: 1', controlApiTls: leaf, token: { token: TOKEN, role: 'operator', actor: 'reloader' }, controlApiExtra });

t.test('rejected SIGHUP reload, API reload and API activate: one error line each, with every error (path, code, meaning) and no file content', async (t) => {
  const p = await freePorts();
  const file = path.join(dir, 'reload.yaml');
  const served = await serve(file, configText(p));
  t.teardown(() => served.stop());
  // Two errors: an allowlist entry that is no CIDR block (its rule message would quote the
  // marker) and a worker count of the wrong type.
  const bad = configText(p, `    ip_allowlist: ["10.0.0.0/33${MARKER}"]\n`).replace('worker_threads: 1', 'worker_threads: "one"');
  writeFileSync(file, bad);

  served.proc.kill('SIGHUP');
  const hup = await served.waitFor((l) => String(l['msg']).startsWith('SIGHUP reload rejected'));
  t.equal(levelOf(hup), 'error', 'SIGHUP: logged at error');
  t.match(hup, { operation: 'reload', requested_by: 'SIGHUP', status: 400, reason: 'invalid_config', active_generation: 1, config_source: file });
  const paths = (hup['errors'] as { path: string; code: string; message: string }[]).map((e) => e.path).sort();
  t.same(paths, ['observability.control_api.ip_allowlist', 'performance.worker_threads'], 'every error line, by path');
  for (const e of hup['errors'] as Record<string, unknown>[]) t.match(e, { code: /^EDGE_CONFIG_[A-Z_]+$/, message: /\w/ });
  t.match(hup['msg'], /performance\.worker_threads: EDGE_CONFIG_TYPE: .+; observability|observability\.control_api\.ip_allowlist: EDGE_CONFIG_/, 'the message lists them too');

  const reload = await api(p.c, caPem, 'POST', '/admin/runtime/reload', { token: TOKEN }, {});
  t.equal(reload.status, 400);
  const viaApi = await served.waitFor((l) => String(l['msg']).startsWith('reload rejected'));
  t.equal(levelOf(viaApi), 'error', 'API reload: logged at error');
  t.match(viaApi, { requested_by: 'reloader', status: 400, reason: 'invalid_config' });
  t.equal((viaApi['errors'] as unknown[]).length, 2, 'API reload: both error lines');

  // A restart-required change through activate: 409, its rejected change logged.
  const moved = path.join(dir, 'moved.yaml');
  writeFileSync(moved, configText({ ...p, l: await freePort() }));
  const act = await api(p.c, caPem, 'POST', '/admin/runtime/activate', { token: TOKEN }, { config_path: moved });
  t.equal(act.status, 409);
  const activate = await served.waitFor((l) => String(l['msg']).startsWith('activate rejected'));
  t.equal(levelOf(activate), 'error', 'activate: logged at error');
  t.match(activate, { status: 409, reason: 'restart_required', config_source: moved, errors: [{ path: /^listen/ }] }, 'activate: the restart-required change is the error line');

  // A good reload is one info line.
  writeFileSync(file, configText(p));
  served.proc.kill('SIGHUP');
  const accepted = await served.waitFor((l) => l['msg'] === 'SIGHUP reload');
  t.equal(levelOf(accepted), 'info', 'an accepted SIGHUP reload is logged at info');
  t.match(accepted, { status: 202, generation: 2 });
  // Counted alike, whether by signal or API.
  const text = await scrape(p.m);
  t.equal(metricValue(text, 'svc_runtime_rejections_total', { reason: 'invalid_config' }), 2, 'SIGHUP and API reload rejections counted');
  t.equal(metricValue(text, 'svc_runtime_rejections_total', { reason: 'restart_required' }), 1, 'the activate rejection counted');
  t.equal(metricValue(text, 'svc_runtime_activation_total', { result: 'success' }), 1, 'the accepted SIGHUP reload counted');
  t.notMatch(served.text(), MARKER, 'nothing of the candidate file is logged');
  t.notMatch(served.text(), /\n\s+at .+:\d+:\d+\)?\n/, 'no stack trace');
});
