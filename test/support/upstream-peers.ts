// Which processes hold established connections to a backend: proof that a given worker (a re-forked
// one, say) proxied requests, not only that it exists. Upstream connections are kept alive by the
// workers' pools, so right after a burst of requests every worker that forwarded one still holds
// its connection; `ss -p` names the owning process (same user: no privileges needed).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { toolPath } from '../../scripts/system-tools.ts';

const run = promisify(execFile);

/** Pids owning an established TCP connection to 127.0.0.1:`port` (the client side). */
export async function pidsConnectedTo(port: number): Promise<Set<number>> {
  const ss = toolPath('ss');
  if (ss === undefined) throw new Error('ss missing: install the Debian package iproute2');
  const { stdout } = await run(ss, ['-Htnp', 'state', 'established', 'dst', `127.0.0.1:${port}`]);
  const pids = new Set<number>();
  for (const m of stdout.matchAll(/pid=(\d+)/g)) pids.add(Number(m[1]));
  return pids;
}

/**
 * Whether process `pid` forwards to 127.0.0.1:`port`: after each `burst` of requests (fresh
 * connections, spread over the workers by the kernel), looks for its upstream connection; bounded
 * to `tries` bursts, since an idle upstream connection may have been closed in between.
 */
export async function forwardsTo(pid: number, port: number, burst: () => Promise<unknown>, tries = 5): Promise<boolean> {
  for (let i = 0; i < tries; i++) {
    await burst();
    if ((await pidsConnectedTo(port)).has(pid)) return true;
  }
  return false;
}
