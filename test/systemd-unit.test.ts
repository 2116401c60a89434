// What deploy/ ships for systemd, checked with systemd's own tools (issue 12 item 1):
// - `systemd-analyze verify` on the unit, its /opt/edge-proxy paths rewritten to this checkout (the
//   tool checks that every Exec command exists): exit 0 and not one warning;
// - `systemd-analyze security --offline=true`: overall exposure at most EXPOSURE_MAX (it was 6.2
//   before the unit was hardened);
// - the directives the service relies on (Type=notify, NotifyAccess=main, ExecReload through
//   `edge-proxy ctl reload`, WatchdogSec=, the state, logs and runtime directories);
// - `systemd-sysusers --root` on the shipped sysusers.d file creates the unit's User=;
// - the polkit rule (plain ES5 for polkitd's duktape) allows exactly the example restart_command:
//   user edge-proxy, verb restart, unit edge-proxy.service, and nothing else.
// PID 1 is not systemd on the test machines, so the unit is not started here; the notification
// protocol it relies on is test/systemd-notify.test.ts.
import t from 'tap';
import type { Test } from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import vm from 'node:vm';
// acorn comes with eslint (a devDependency); it parses the rule as polkitd's ES5 engine would.
import { parse } from 'acorn';
import { parseConfigText } from '@edge-proxy/config';
import { toolPath } from '../scripts/system-tools.ts';

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-sd-unit-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const unitText = readFileSync(path.join(root, 'deploy/edge-proxy.service'), 'utf8');
/** The exposure the hardened unit must stay at or below (systemd 252 scores it 1.6; 6.2 before). */
const EXPOSURE_MAX = 2.5;
/** The restart_command the polkit rule allows and deploy/config.example.yaml shows. */
const RESTART_COMMAND = ['/usr/bin/systemctl', '--no-block', 'restart', 'edge-proxy.service'];

/** A systemd tool, or a failure naming the Debian package (scripts/system-tools.ts installs it). */
function tool(t: Test, command: string): string | undefined {
  const p = toolPath(command);
  if (p === undefined) t.fail(`${command} is missing: install the Debian package systemd`);
  return p;
}

/** The unit with its install prefix pointing at this checkout (so its Exec commands exist). */
function localUnit(): string {
  const d = path.join(dir, 'unit');
  mkdirSync(d, { recursive: true });
  const file = path.join(d, 'edge-proxy.service');
  writeFileSync(file, unitText.replaceAll('/opt/edge-proxy', root));
  return file;
}

/** `Key=value` assignments of the [Service] section, in order (comments dropped). */
function serviceAssignments(): [string, string][] {
  const section = unitText.split(/^\[Service\]$/m)[1]?.split(/^\[/m)[0] ?? '';
  return section
    .split('\n')
    .filter((l) => /^[A-Za-z]+=/.test(l))
    .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)] as [string, string]);
}

t.test('systemd-analyze verify: the unit loads with no warning', async (t) => {
  const analyze = tool(t, 'systemd-analyze');
  if (analyze === undefined) return;
  const r = spawnSync(analyze, ['verify', localUnit()], { encoding: 'utf8' });
  t.equal(r.status, 0, 'exit 0');
  t.equal(r.stderr.trim(), '', 'no warning (an unknown or misspelt directive is one)');
});

t.test(`systemd-analyze security: overall exposure ≤ ${EXPOSURE_MAX}`, async (t) => {
  const analyze = tool(t, 'systemd-analyze');
  if (analyze === undefined) return;
  const r = spawnSync(analyze, ['security', '--offline=true', '--no-pager', localUnit()], { encoding: 'utf8' });
  const m = /Overall exposure level for edge-proxy\.service: (\d+\.\d+)/.exec(r.stdout);
  t.ok(m !== null, 'an overall exposure is printed', { stdout: r.stdout.slice(-300), stderr: r.stderr.slice(0, 300) });
  const exposure = Number(m?.[1]);
  t.ok(exposure <= EXPOSURE_MAX, `exposure ${exposure} ≤ ${EXPOSURE_MAX}`);
  const json = spawnSync(analyze, ['security', '--offline=true', '--json=short', localUnit()], { encoding: 'utf8' });
  const checks = JSON.parse(json.stdout) as { name: string; set: boolean }[];
  const set = (name: string): boolean | undefined => checks.find((c) => c.name === name)?.set;
  for (const name of ['PrivateDevices=', 'ProtectKernelTunables=', 'ProtectControlGroups=', 'RestrictNamespaces=~user', 'SystemCallArchitectures=', 'SystemCallFilter=~@privileged', 'NoNewPrivileges=', 'RestrictSUIDSGID=', 'LockPersonality=', 'UMask=']) t.equal(set(name), true, `${name} satisfied`);
  // Known and deliberate (the unit says why): V8's JIT, and port 443 without root.
  t.equal(set('MemoryDenyWriteExecute='), false, 'MemoryDenyWriteExecute= stays unset (V8 JIT)');
});

t.test('the directives the service relies on', async (t) => {
  const a = serviceAssignments();
  const one = (key: string): string | undefined => {
    const all = a.filter(([k]) => k === key);
    return all.length === 1 ? all[0]?.[1] : undefined;
  };
  t.equal(one('Type'), 'notify', 'Type=notify (systemd 252 has no notify-reload)');
  t.equal(one('NotifyAccess'), 'main', 'only the supervisor may notify');
  t.equal(one('ExecReload'), '/opt/edge-proxy/packages/cli/bin/edge-proxy ctl reload -c /etc/edge-proxy/config.yaml', 'reload goes through the CLI: a rejected reload fails `systemctl reload`');
  t.equal(one('ExecStart'), '/opt/edge-proxy/packages/cli/bin/edge-proxy serve -c /etc/edge-proxy/config.yaml', 'ExecStart: serve, the main process');
  t.match(one('WatchdogSec'), /^\d+s$/, 'WatchdogSec= set');
  for (const d of ['StateDirectory', 'LogsDirectory', 'RuntimeDirectory']) t.equal(one(d), 'edge-proxy', `${d}=edge-proxy`);
  t.equal(one('User'), 'edge-proxy', 'User=edge-proxy (deploy/sysusers.d creates it)');
  t.equal(one('KillMode'), 'mixed', 'SIGTERM to the supervisor only: it drains the workers');
});

t.test('sysusers.d: systemd-sysusers creates the unit user, without a login shell', async (t) => {
  const sysusers = tool(t, 'systemd-sysusers');
  if (sysusers === undefined) return;
  const fakeRoot = path.join(dir, 'root');
  mkdirSync(path.join(fakeRoot, 'etc'), { recursive: true });
  writeFileSync(path.join(fakeRoot, 'etc/passwd'), '');
  writeFileSync(path.join(fakeRoot, 'etc/group'), '');
  const r = spawnSync(sysusers, [`--root=${fakeRoot}`, path.join(root, 'deploy/sysusers.d/edge-proxy.conf')], { encoding: 'utf8' });
  t.equal(r.status, 0, `systemd-sysusers exit 0 ${r.stderr}`);
  const [user] = readFileSync(path.join(fakeRoot, 'etc/passwd'), 'utf8').split('\n').filter((l) => l.startsWith('edge-proxy:'));
  t.match(user, /^edge-proxy:x:\d+:\d+:[^:]*:\/var\/lib\/edge-proxy:\/usr\/sbin\/nologin$/, 'user edge-proxy, home /var/lib/edge-proxy, no login shell');
  const uid = Number(user?.split(':')[2]);
  t.ok(uid > 0 && uid < 1000, `a system uid (${uid})`);
  t.match(readFileSync(path.join(fakeRoot, 'etc/group'), 'utf8'), /^edge-proxy:x:\d+:$/m, 'group edge-proxy');
});

t.test('polkit rule: user edge-proxy may restart edge-proxy.service, nothing else', async (t) => {
  const text = readFileSync(path.join(root, 'deploy/polkit/50-edge-proxy-restart.rules'), 'utf8');
  t.doesNotThrow(() => parse(text, { ecmaVersion: 5 }), 'plain ES5 (polkitd 122 on Debian 12 embeds duktape)');
  // polkit's JavaScript API as documented in polkit(8): addRule, Result, action.id/lookup, subject.user.
  const Result = { YES: 'yes', NO: 'no', NOT_HANDLED: null };
  const rules: ((action: unknown, subject: unknown) => unknown)[] = [];
  vm.runInNewContext(text, { polkit: { Result, addRule: (f: (a: unknown, s: unknown) => unknown) => rules.push(f) } });
  t.equal(rules.length, 1, 'one rule');
  const decide = (id: string, unit: string, verb: string, user: string): unknown => {
    const details: Record<string, string> = { unit, verb };
    return rules[0]?.({ id, lookup: (k: string) => details[k] }, { user });
  };
  const manage = 'org.freedesktop.systemd1.manage-units';
  const table: [string, string, string, string, unknown][] = [
    [manage, 'edge-proxy.service', 'restart', 'edge-proxy', 'yes'],
    [manage, 'edge-proxy.service', 'stop', 'edge-proxy', null],
    [manage, 'edge-proxy.service', 'start', 'edge-proxy', null],
    [manage, 'edge-proxy.service', 'reload-or-restart', 'edge-proxy', null],
    [manage, 'sshd.service', 'restart', 'edge-proxy', null],
    [manage, 'edge-proxy.service', 'restart', 'www-data', null],
    ['org.freedesktop.systemd1.manage-unit-files', 'edge-proxy.service', 'restart', 'edge-proxy', null],
  ];
  for (const [id, unit, verb, user, want] of table) t.equal(decide(id, unit, verb, user), want, `${user}: ${verb} ${unit} (${id.split('.').pop()}) → ${String(want)}`);
});

t.test('deploy/config.example.yaml: restart_command is the one the polkit rule allows', async (t) => {
  const parsed = parseConfigText(readFileSync(path.join(root, 'deploy/config.example.yaml'), 'utf8'));
  t.ok(parsed.ok);
  const cfg = (parsed.ok ? parsed.value : {}) as { resilience?: { watchdog?: { restart_command?: string[] } } };
  t.same(cfg.resilience?.watchdog?.restart_command, RESTART_COMMAND, '--no-block: the command returns once the job is queued (the restart stops this very process)');
});
