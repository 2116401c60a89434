// `edge-proxy ctl` without sockets: arguments → request (method, path, body), answer → exit status
// and failure line, the token file and URL rules, -c's address mapping. Table-driven; the real
// binary against a real service is test/ctl.test.ts.
import t from 'tap';
import { argsOf } from '../src/ctl-command.ts';
import { CTL_EXIT, ctlRequest, exitForStatus, failureLine, outcomeOf, problemLines } from '../src/ctl-request.ts';
import type { CtlArgs } from '../src/ctl-request.ts';
import { connectHost, parseUrl, tokenOf } from '../src/ctl-target.ts';

t.test('arguments map to the documented requests', async (t) => {
  const paths = { reload: '/custom/reload', reloadCerts: '/custom/certs' };
  const cases: [CtlArgs, ReturnType<typeof ctlRequest>][] = [
    [{ operation: 'status' }, { method: 'GET', path: '/admin/runtime' }],
    [{ operation: 'history' }, { method: 'GET', path: '/admin/runtime/history' }],
    [{ operation: 'history', generation: 7 }, { method: 'GET', path: '/admin/runtime/history/7' }],
    [{ operation: 'validate', configPath: 'c.yaml' }, { method: 'POST', path: '/admin/runtime/validate', body: { config_path: '/etc/edge/c.yaml' } }],
    [{ operation: 'preview', configPath: '/abs/c.yaml', reason: 'r' }, { method: 'POST', path: '/admin/runtime/preview', body: { config_path: '/abs/c.yaml', reason: 'r' } }],
    [
      { operation: 'activate', configPath: 'c.yaml', expectedGeneration: 3, reason: 'rollout', requestedBy: 'bot' },
      { method: 'POST', path: '/admin/runtime/activate', body: { config_path: '/etc/edge/c.yaml', expected_generation: 3, reason: 'rollout', requested_by: 'bot' } },
    ],
    [{ operation: 'activate' }, { method: 'POST', path: '/admin/runtime/activate', body: {} }],
    [{ operation: 'reload', expectedGeneration: 0 }, { method: 'POST', path: '/custom/reload', body: { expected_generation: 0 } }],
    [
      { operation: 'rollback', to: 2, expectedActiveGeneration: 3, reason: 'bad' },
      { method: 'POST', path: '/admin/runtime/rollback', body: { target_generation: 2, expected_active_generation: 3, reason: 'bad' } },
    ],
    [{ operation: 'reload-certs' }, { method: 'POST', path: '/custom/certs', body: {} }],
    [{ operation: 'restart' }, { method: 'POST', path: '/admin/runtime/restart', body: {} }],
  ];
  for (const [args, expected] of cases) t.same(ctlRequest(args, paths, '/etc/edge'), expected, JSON.stringify(args));
  t.equal(ctlRequest({ operation: 'reload' }).path, '/admin/runtime/reload', 'default reload path');
  t.equal(ctlRequest({ operation: 'reload-certs' }).path, '/admin/runtime/reload-certs', 'default reload-certs path');
});

t.test('parsed options map to arguments and connection options; bad numbers are usage errors', async (t) => {
  const m = argsOf('rollback', { to: 2, 'expected-active-generation': 3, reason: 'x', url: 'https://h:1', 'token-file': '/t', insecure: true, timeout: 500 }, '/etc/d.yaml');
  t.same(m, { args: { operation: 'rollback', to: 2, expectedActiveGeneration: 3, reason: 'x' }, options: { defaultConfig: '/etc/d.yaml', insecure: true, timeoutMs: 500, url: 'https://h:1', tokenFile: '/t' } });
  t.same(argsOf('history', { generation: 4, config: '/c.yaml' }, '/d'), { args: { operation: 'history', generation: 4 }, options: { defaultConfig: '/d', insecure: false, config: '/c.yaml' } });
  // Generation numbers: the control API's rule (1 to 2^31 - 1), checked before anything is sent.
  const gen = (name: string): string => `${name} must be a generation number (a whole number from 1 to 2147483647)`;
  t.equal(argsOf('rollback', { to: Number.NaN }, '/d'), gen('--to'));
  t.equal(argsOf('rollback', { to: -1 }, '/d'), gen('--to'));
  t.equal(argsOf('rollback', { to: 0 }, '/d'), gen('--to'));
  t.equal(argsOf('rollback', { to: 2 ** 31 }, '/d'), gen('--to'));
  t.same(argsOf('rollback', { to: 2 ** 31 - 1 }, '/d'), { args: { operation: 'rollback', to: 2 ** 31 - 1 }, options: { defaultConfig: '/d', insecure: false } }, 'the largest generation number');
  t.equal(argsOf('activate', { 'expected-generation': 1.5 }, '/d'), gen('--expected-generation'));
  t.equal(argsOf('history', { generation: Number.NaN }, '/d'), gen('N'));
  for (const timeout of [0, 1.5, 2 ** 31, 1e12]) t.equal(argsOf('status', { timeout }, '/d'), '--timeout must be a whole number of ms from 1 to 2147483647', `--timeout ${timeout}`);
  t.equal(argsOf('activate', { reason: 'r'.repeat(4097) }, '/d'), '--reason is longer than 4096 characters');
  t.same(argsOf('activate', { reason: 'line one\nline two' }, '/d'), { args: { operation: 'activate', reason: 'line one\nline two' }, options: { defaultConfig: '/d', insecure: false } }, 'a reason may hold a newline (the service keeps it printable)');
  t.equal(argsOf('activate', { 'config-path': '/a\u0000b' }, '/d'), '--config-path must not contain control characters');
  t.equal(argsOf('status', { url: 'https://h:1/\n' }, '/d'), '--url must not contain control characters');
  t.equal(argsOf('status', { 'token-file': '' }, '/d'), '--token-file must be a non-empty text');
});

t.test('HTTP statuses map to exit statuses', async (t) => {
  const cases: [number, number][] = [
    [200, CTL_EXIT.ok],
    [202, CTL_EXIT.ok],
    [400, CTL_EXIT.invalid],
    [413, CTL_EXIT.invalid],
    [405, CTL_EXIT.invalid],
    [401, CTL_EXIT.denied],
    [403, CTL_EXIT.denied],
    [404, CTL_EXIT.not_found],
    [409, CTL_EXIT.conflict],
    [500, CTL_EXIT.server_error],
    [503, CTL_EXIT.server_error],
    [504, CTL_EXIT.server_error],
    [302, CTL_EXIT.unreachable],
    [101, CTL_EXIT.unreachable],
  ];
  for (const [status, exit] of cases) t.equal(exitForStatus(status), exit, String(status));
  t.same([CTL_EXIT.ok, CTL_EXIT.usage, CTL_EXIT.unreachable, CTL_EXIT.invalid, CTL_EXIT.conflict, CTL_EXIT.denied, CTL_EXIT.not_found, CTL_EXIT.server_error], [0, 1, 1, 2, 3, 4, 5, 6]);
});

t.test('plans: validate and preview fail as activation would; activate itself goes by the status', async (t) => {
  t.same(outcomeOf('validate', 200, { candidate_status: 'activatable' }), { exit: 0 });
  t.same(outcomeOf('preview', 200, { candidate_status: 'unchanged' }), { exit: 0 });
  t.match(outcomeOf('validate', 200, { candidate_status: 'invalid' }), { exit: 2, reason: 'invalid_config' });
  t.match(outcomeOf('preview', 200, { candidate_status: 'stale_generation' }), { exit: 3, reason: 'stale_generation' });
  t.match(outcomeOf('validate', 200, { candidate_status: 'restart_required' }), { exit: 3, reason: 'restart_required' });
  // The snapshot has no candidate_status, and a 202 of activate is success whatever it holds.
  t.same(outcomeOf('activate', 202, { status: 'active', candidate_status: 'invalid' }), { exit: 0 });
  t.same(outcomeOf('activate', 400, { reason: 'invalid_config', message: 'm' }), { exit: 2, reason: 'invalid_config', message: 'm' });
  t.same(outcomeOf('status', 502, undefined), { exit: 6, reason: 'http_error', message: 'the answer carries no JSON error' });
  t.match(outcomeOf('status', 200, undefined), { exit: 1, reason: 'invalid_response' });
  t.match(outcomeOf('status', 200, [1]), { exit: 1, reason: 'invalid_response' });
});

t.test('every problem of an answer, once, as path: CODE: message', async (t) => {
  const body = {
    reason: 'restart_required',
    plan: {
      errors: [{ path: '', code: 'EDGE_CONFIG_YAML_SYNTAX', message: 'line 2' }],
      rejected_changes: [
        { path: 'listeners[0].port', change: 'modified', activation: 'restart', reason: 'listener bind change' },
        { path: 'log.format', change: 'modified', activation: 'restart' },
        { path: 'expected_generation', code: 'stale_generation', message: 'expected generation 7, active is 1' },
      ],
    },
    errors: [{ path: 'observability.control_api.tls', code: 'EDGE_CONFIG_TLS_UNREADABLE', message: 'cannot read' }],
    history_entry: { rejected_changes: [{ path: 'ignored', code: 'X', message: 'y' }] },
  };
  t.same(problemLines(body), [
    'observability.control_api.tls: EDGE_CONFIG_TLS_UNREADABLE: cannot read',
    '(document): EDGE_CONFIG_YAML_SYNTAX: line 2',
    'listeners[0].port: restart: listener bind change',
    'log.format: restart: modified',
    'expected_generation: stale_generation: expected generation 7, active is 1',
  ]);
  t.same(problemLines({ errors: [{ path: 'a', code: 'C', message: 'm' }], plan: { errors: [{ path: 'a', code: 'C', message: 'm' }] } }), ['a: C: m'], 'the same problem once');
  t.same(problemLines(undefined), []);
  t.same(problemLines({ errors: 'no', plan: [] }), []);
});

t.test('the failure line is one line', async (t) => {
  t.equal(failureLine('activate', 400, 'invalid_config', 'bad', ['a: C: m', 'b: D: n']), 'edge-proxy ctl activate: 400 invalid_config: bad; a: C: m; b: D: n');
  t.equal(failureLine('status', undefined, 'timeout', 'late'), 'edge-proxy ctl status: - timeout: late');
  t.equal(failureLine('status', 500, 'x', 'two\nlines\r\u0000'), 'edge-proxy ctl status: 500 x: two lines  ');
});

t.test('token files: one token, trailing newline trimmed', async (t) => {
  t.equal(tokenOf('abc\n'), 'abc');
  t.equal(tokenOf('abc\r\n'), 'abc');
  t.equal(tokenOf('abc'), 'abc');
  for (const bad of ['', '\n', 'a b\n', 'abc\n\n', 'abc\nsecond\n', 'tab\there', 'é', 'x'.repeat(4097)]) t.equal(tokenOf(bad), undefined, JSON.stringify(bad.slice(0, 20)));
  t.equal(tokenOf('x'.repeat(4096)), 'x'.repeat(4096));
});

t.test('--url: an https origin only', async (t) => {
  t.equal((parseUrl('https://127.0.0.1:9443') as URL).origin, 'https://127.0.0.1:9443');
  t.equal((parseUrl('https://[::1]:9443/') as URL).hostname, '[::1]');
  t.match(parseUrl('http://127.0.0.1:9443'), /HTTPS only/);
  t.match(parseUrl('https://u:p@h:1'), /credentials in the URL are refused/);
  t.match(parseUrl('https://h:1/admin'), /origin only/);
  t.match(parseUrl('https://h:1?x=1'), /origin only/);
  t.match(parseUrl('not a url'), /not a URL/);
});

t.test('-c: a wildcard bind address means this host’s loopback', async (t) => {
  t.equal(connectHost('0.0.0.0'), '127.0.0.1');
  t.equal(connectHost('::'), '::1');
  t.equal(connectHost('10.1.2.3'), '10.1.2.3');
  t.equal(connectHost('::1'), '::1');
});
