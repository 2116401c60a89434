// The operator's V8 flags for the workers (EDGE_PROXY_WORKER_FLAGS), with real `edge-proxy serve`
// processes. Node refuses `--heap-growing-percent` and `--memory-saver-mode` in NODE_OPTIONS ("is not
// allowed in NODE_OPTIONS", and the service does not start), and the shipped unit's wrapper passes
// no Node flags, so this variable is where an operator changes the workers' defaults. Checked: the
// workers run with the operator's flags in place of the defaults they name (their command lines,
// the start line), and still serve; a value that is not a list of flags, or a flag node refuses,
// stops the start with one coded line and no stack trace; `edge-proxy -c` (the unit's
// ExecStartPre) reports the same line before the start.
import t from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { serve } from './support/serve.ts';
import { runEdgeProxy } from './support/edge-proxy-command.ts';
import type { CommandRun } from './support/edge-proxy-command.ts';
import { namedBackend } from './support/backends.ts';
import { getH1 } from './support/served-by.ts';
import { freePorts, serviceConfig, serviceFiles } from './support/service-config.ts';
import type { ServicePorts } from './support/service-config.ts';

const { dir, leaf, caPem } = serviceFiles(t, 'edge-worker-flags-');
const backendPort = await namedBackend(t, 'backend');
const STACK = /^\s+at .+/m;

const configText = (p: ServicePorts): string =>
  serviceConfig({ ports: p, cert: leaf, performance: 'worker_threads: 2', backendPort, controlApiTls: leaf, token: { token: 'admin-token-worker-flags-0123456789', role: 'admin', actor: 'flags' } });

/** A process's arguments, from /proc. */
const cmdline = (pid: number): string[] => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((a) => a !== '');

t.test('the workers run with the operator\'s flags in place of the defaults they name, and serve', async (t) => {
  const p = await freePorts();
  const served = await serve(path.join(dir, 'flags.yaml'), configText(p), 60_000, { EDGE_PROXY_WORKER_FLAGS: ' --heap-growing-percent=0   --max_semi_space_size=8 ' });
  t.teardown(() => served.stop());
  const serving = served.lines.find((l) => l['msg'] === 'edge-proxy serving') ?? {};
  t.equal(serving['worker_flags'], '--heap-growing-percent=0 --max_semi_space_size=8', 'the start line names the flags the workers run with: the operator\'s, no default beside them');
  const supervisor = served.proc.pid as number;
  const workerPids = readFileSync(`/proc/${supervisor}/task/${supervisor}/children`, 'utf8').split(' ').filter((s) => s !== '').map(Number).filter((pid) => cmdline(pid).some((a) => a.endsWith('worker/main.ts')));
  t.equal(workerPids.length, 2, `two worker processes (${workerPids.join(', ')})`);
  for (const pid of workerPids) {
    const args = cmdline(pid);
    t.ok(args.includes('--heap-growing-percent=0') && args.includes('--max_semi_space_size=8'), `worker ${pid} runs with the operator's flags`);
    t.notOk(args.some((a) => a.startsWith('--heap-growing-percent=5') || a.startsWith('--max-semi-space-size=')), `and with neither default (${args.filter((a) => a.startsWith('--')).join(' ')})`);
  }
  t.equal(await getH1({ lport: p.l, ca: caPem }, '/'), 'backend', 'a request is proxied');
});

/** Runs `edge-proxy serve` with EDGE_PROXY_WORKER_FLAGS set, to its end (bounded: a hang is a failure). */
async function serveWith(flags: string, name: string): Promise<CommandRun> {
  const file = path.join(dir, `${name}.yaml`);
  writeFileSync(file, configText(await freePorts()));
  return runEdgeProxy(['serve', '-c', file, '--state-dir', path.join(dir, `state-${name}`)], { env: { EDGE_PROXY_WORKER_FLAGS: flags } });
}

const refused = [
  { name: 'a flag and its value apart', flags: '--max-semi-space-size 8', says: /^edge-proxy serve: EDGE_STARTUP_WORKER_FLAGS: EDGE_PROXY_WORKER_FLAGS: "8" is not a --flag or --flag=value$/ },
  { name: 'a script path', flags: '--max-old-space-size=256 /tmp/other.js', says: /^edge-proxy serve: EDGE_STARTUP_WORKER_FLAGS: EDGE_PROXY_WORKER_FLAGS: "\/tmp\/other\.js" is not a --flag or --flag=value$/ },
  { name: 'a flag node does not know', flags: '--heap-growing-percent=0 --no-such-v8-flag', says: /^edge-proxy serve: EDGE_STARTUP_WORKER_FLAGS: EDGE_PROXY_WORKER_FLAGS=--heap-growing-percent=0 --no-such-v8-flag: node refused them \(exit 9\): .*bad option: --no-such-v8-flag$/ },
];

for (const r of refused) {
  t.test(`${r.name}: one coded line on stderr, exit 1, no worker forked`, async (t) => {
    const out = await serveWith(r.flags, r.name.replace(/\W+/g, '-'));
    t.equal(out.code, 1, 'exit 1');
    const lines = out.stderr.split('\n').filter((l) => l !== '');
    t.equal(lines.length, 1, `exactly one stderr line: ${out.stderr}`);
    t.match(lines[0], r.says, 'the code, the variable and what is wrong with it');
    t.notMatch(out.stderr + out.stdout, STACK, 'no stack trace');
    t.notOk(out.stdout.includes('"role":"worker"'), 'no worker ever logged');
  });
}

t.test('edge-proxy -c reports what serve would refuse, and passes flags node takes', async (t) => {
  const file = path.join(dir, 'check.yaml');
  writeFileSync(file, configText(await freePorts()));
  const check = (flags: string): Promise<CommandRun> => runEdgeProxy(['-c', file], { env: { EDGE_PROXY_WORKER_FLAGS: flags } });
  const good = await check('--heap-growing-percent=0');
  t.equal(good.code, 0, `valid with flags node takes: ${good.stderr}`);
  t.match(good.stdout, /: valid \(/);
  const bad = await check('--no-such-v8-flag');
  t.equal(bad.code, 1, 'exit 1');
  t.same(bad.stderr.split('\n').filter((l) => l !== '').map((l) => l.replace(/\(exit 9\): .*bad option/, '(exit 9): … bad option')), [
    'EDGE_PROXY_WORKER_FLAGS=--no-such-v8-flag: EDGE_STARTUP_WORKER_FLAGS: node refused them (exit 9): … bad option: --no-such-v8-flag',
    `${file}: valid, but not on this host (1 problem)`,
  ]);
  const malformed = await check('--x 8');
  t.equal(malformed.code, 1);
  t.match(malformed.stderr, /^EDGE_PROXY_WORKER_FLAGS: EDGE_STARTUP_WORKER_FLAGS: "8" is not a --flag or --flag=value\n/);
});
