// Spawns the real edge-proxy binary (the bin wrapper and main.ts) and checks exit codes and output.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeLeaf } from '../../../scripts/lib/certs.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const main = path.join(root, 'packages/cli/src/main.ts');
const wrapper = path.join(root, 'packages/cli/bin/edge-proxy');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-cli-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
makeLeaf(dir, 'server', undefined);

function run(args: string[], viaWrapper = false) {
  const r = viaWrapper
    ? spawnSync(wrapper, args, { encoding: 'utf8', timeout: 30_000 })
    : spawnSync(process.execPath, [main, ...args], { encoding: 'utf8', timeout: 30_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

const valid = path.join(dir, 'valid.yaml');
writeFileSync(valid, `listen:\n  tls: { cert: server.crt, key: server.key }\nupstream:\n  api:\n    route: { path_prefix: / }\n    backends: [{ id: a, address: 127.0.0.1:8080 }]\n`);
const invalid = path.join(dir, 'invalid.yaml');
writeFileSync(
  invalid,
  `listen:\n  port: 70000\n  tls: { cert: server.crt }\nupstream:\n  api:\n    route: { path_prefix: / }\n    backends: [{ id: a, address: 127.0.0.1:8080 }, { id: a, address: x }]\nresilience:\n  brownout: { trigger_inflight_percent: 50, recover_inflight_percent: 70 }\n  watchdog: { restart_hook: /bin/true }\n`,
);

t.test('a valid file exits 0 with a summary', async (t) => {
  const r = run(['-c', valid]);
  t.equal(r.status, 0, r.stderr);
  t.match(r.stdout, /valid\.yaml: valid \(1 listener, 1 upstream pool, 1 backend; sha256:[0-9a-f]{64}\)/);
  t.equal(r.stderr, '');
  // Features the spec turns on by default would be said here if nothing enforced them; none is left.
  const notActive = r.stdout.split('\n').filter((l) => / not active yet: /.test(l)).map((l) => l.split(':')[0]);
  t.same(notActive, []);
});

t.test('the route-decision header is refused while not built (fail closed), by -c and by serve; request auth, rate limits, quota and span export are accepted', async (t) => {
  const failOpen = path.join(dir, 'fail-open.yaml');
  writeFileSync(
    failOpen,
    `listen:\n  port: 0\n  tls: { cert: server.crt, key: server.key }\nupstream:\n  api:\n    route: { path_prefix: / }\n    backends: [{ id: a, address: 127.0.0.1:8080 }]\n    auth:\n      jwt: { algorithms: [RS256], jwks: { url: "https://idp.example/jwks.json" } }\n      external: { url: "http://127.0.0.1:9/authz", failure_mode: deny }\nresilience:\n  rate_limits: [{ name: one-per-second, requests_per_second: 1, burst: 1 }]\n  quota: { enabled: true, failure_mode: deny, policies: [{ name: t, dimensions: [client_ip], burst: { limit: 2, window_ms: 60000 } }] }\nobservability:\n  tracing: { enabled: true }\n  routing: { expose_header: true }\n`,
  );
  for (const args of [['-c', failOpen], ['serve', '-c', failOpen]]) {
    const r = run(args);
    t.equal(r.status, 1, `${args.join(' ')} exits 1`);
    t.match(r.stderr, /^observability\.routing\.expose_header: EDGE_CONFIG_NOT_BUILT: .*not built yet/m, `${args[0]}: the route-decision header refused`);
    t.notMatch(r.stderr, /resilience\.(rate_limits|quota)|upstream\.api\.auth|observability\.tracing/, `${args[0]}: request auth, rate limits, quota and span export are not refused`);
  }
});

t.test('the long option and the bin wrapper behave the same', async (t) => {
  const r = run(['--config', valid], true);
  t.equal(r.status, 0, r.stderr);
  t.match(r.stdout, /valid/);
});

t.test('an invalid file exits 1 with one line per error: path, code, message', async (t) => {
  const r = run(['-c', invalid]);
  t.equal(r.status, 1);
  const lines = r.stderr.trim().split('\n');
  t.same(lines.slice(0, -1).map((l) => l.split(': ').slice(0, 2).join(': ')).sort(), [
    'listen.port: EDGE_CONFIG_RANGE',
    'listen.tls.key: EDGE_CONFIG_TLS_PARTIAL_PAIR',
    'resilience.brownout.recover_inflight_percent: EDGE_CONFIG_BROWNOUT_HYSTERESIS',
    'resilience.watchdog.restart_hook: EDGE_CONFIG_WATCHDOG_RESTART_HOOK',
    'upstream.api.backends[1].id: EDGE_CONFIG_DUPLICATE_BACKEND_ID',
  ]);
  t.match(lines.at(-1), /invalid\.yaml: invalid \(5 errors\)/);
  t.equal(r.stdout, '');
});

t.test('a missing file names the path; the default path is /etc/edge-proxy/config.yaml', async (t) => {
  const r = run(['-c', path.join(dir, 'absent.yaml')]);
  t.equal(r.status, 1);
  t.match(r.stderr, /EDGE_CONFIG_READ: .*absent\.yaml: no such file/);
  const d = run([]);
  t.not(d.status, 0);
  t.match(d.stderr, /\/etc\/edge-proxy\/config\.yaml/);
});

t.test('-V and --version print the version; -h prints usage', async (t) => {
  for (const flag of ['-V', '--version']) {
    const r = run([flag]);
    t.equal(r.status, 0);
    t.match(r.stdout.trim(), /^\d+\.\d+\.\d+$/);
  }
  const h = run(['-h']);
  t.equal(h.status, 0);
  t.match(h.stdout, /edge-proxy \[-c FILE\]/);
  t.match(h.stdout, /--config/);
});

t.test('unknown options and a missing option value are usage errors (exit 2)', async (t) => {
  const r = run(['--bogus']);
  t.equal(r.status, 2);
  t.match(r.stderr, /Unknown argument: bogus/);
  const m = run(['-c']);
  t.equal(m.status, 2);
});

t.test('serve with an invalid configuration exits 1 with one line per error and starts nothing', async (t) => {
  const r = run(['serve', '-c', invalid]);
  t.equal(r.status, 1);
  t.match(r.stderr, /listen\.port: EDGE_CONFIG_RANGE/);
  t.match(r.stderr, /edge-proxy serve: EDGE_STARTUP_CONFIG: /);
});
