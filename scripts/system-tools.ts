// System tools the test suites drive (independent peers, servers, checkers), each with the Debian
// package that provides it. Missing tools are installed with apt-get when running as root;
// otherwise the check fails naming the package, so a test never fails for an unexplained reason.
import { spawnSync } from 'node:child_process';

/** One tool the tests need: the command looked up on PATH and the Debian package that ships it. */
export interface SystemTool {
  command: string;
  debianPackage: string;
  purpose: string;
}

/** Every tool any suite needs. Grows with the suites; nothing else installs system packages. */
export const SYSTEM_TOOLS: readonly SystemTool[] = [
  { command: 'openssl', debianPackage: 'openssl', purpose: 'test certificates' },
  { command: 'curl', debianPackage: 'curl', purpose: 'HTTP/1.1 and HTTP/2 client' },
  { command: 'h2load', debianPackage: 'nghttp2-client', purpose: 'the distinct-key flood of test/rate-limit-memory.test.ts (HTTP/2, URIs from a file)' },
  { command: 'jq', debianPackage: 'jq', purpose: 'the rollout script of docs/operations.md (test/ctl.test.ts)' },
  { command: 'gtlsclient', debianPackage: 'ngtcp2-client', purpose: 'independent HTTP/3 client (ngtcp2 + GnuTLS)' },
  { command: 'gtlsserver', debianPackage: 'ngtcp2-server', purpose: 'independent HTTP/3 server (ngtcp2 + GnuTLS)' },
  { command: 'promtool', debianPackage: 'prometheus', purpose: 'checks the metrics exposition and rules' },
  { command: 'prometheus', debianPackage: 'prometheus', purpose: 'the operator bundle proven in a real Prometheus (test/bundle-prometheus.test.ts)' },
  { command: 'redis-server', debianPackage: 'redis-server', purpose: 'the distributed quota store (started by the tests on a free loopback port)' },
  { command: 'tcpdump', debianPackage: 'tcpdump', purpose: 'counts the UDP datagrams of a port (bench:proxy --datagrams, test/datagram-capture.test.ts)' },
  { command: 'ss', debianPackage: 'iproute2', purpose: 'which worker process holds an upstream connection (a re-forked worker serves)' },
  { command: 'chromium', debianPackage: 'chromium', purpose: 'browser loading a page over HTTP/3 (driven by playwright-core)' },
  { command: 'systemd-analyze', debianPackage: 'systemd', purpose: 'verifies the shipped unit and scores its hardening (systemd-analyze verify / security)' },
  { command: 'systemd-sysusers', debianPackage: 'systemd', purpose: 'creates the service user from the shipped sysusers.d file (into a temp root)' },
];

/** Directories searched besides PATH: Debian installs some servers (gtlsserver) in sbin. */
const EXTRA_PATH = ['/usr/local/sbin', '/usr/sbin', '/sbin'];

/** Full path of a system tool, or undefined. Tests use this to run the tools they need. */
export function toolPath(command: string): string | undefined {
  const search = [...(process.env['PATH'] ?? '').split(':'), ...EXTRA_PATH].filter((d) => d.length > 0);
  const r = spawnSync('sh', ['-c', 'for d in "$@"; do [ -x "$d/$0" ] && { echo "$d/$0"; exit 0; }; done; exit 1', command, ...search], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

function has(command: string): boolean {
  return toolPath(command) !== undefined;
}

function aptInstall(packages: string[]): boolean {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const update = spawnSync('apt-get', ['update', '-qq'], { stdio: 'inherit', env });
  if (update.status !== 0) return false;
  const install = spawnSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...packages], {
    stdio: 'inherit',
    env,
  });
  return install.status === 0;
}

/** Checks (and, as root, installs) the system tools; one pass or one failure naming what is missing. */
export async function ensureSystemTools(): Promise<{ passed: number; failed: number; skipped: number }> {
  console.log('== system tools');
  let missing = SYSTEM_TOOLS.filter((t) => !has(t.command));
  if (missing.length > 0 && process.getuid?.() === 0) {
    const packages = [...new Set(missing.map((t) => t.debianPackage))];
    console.log(`installing Debian packages: ${packages.join(' ')}`);
    aptInstall(packages);
    missing = SYSTEM_TOOLS.filter((t) => !has(t.command));
  }
  if (missing.length === 0) {
    console.log(`ok - system tools present (${SYSTEM_TOOLS.map((t) => t.command).join(', ')})`);
    return { passed: 1, failed: 0, skipped: 0 };
  }
  for (const t of missing) {
    console.log(`not ok - missing ${t.command} (${t.purpose}): install the Debian package ${t.debianPackage}`);
  }
  return { passed: 0, failed: 1, skipped: 0 };
}
