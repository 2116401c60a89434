// scripts/lib/free-port.ts: two test files running at once (tap's TAP_JOB_ID 0 and 1) never draw
// the same port, one process does not draw a port it drew recently, and every port lies below the kernel's
// ephemeral range (where port-0 sockets of other tests are handed out). CI once failed a file
// with `listen EADDRINUSE` when the other file drew the port its proxy was about to bind.
import t from 'tap';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** Under the quarter of a class (about 400 ports) a process remembers. */
const DRAWS = 300;

/** The ports a fresh process with `TAP_JOB_ID=job` (none: outside tap) draws, DRAWS of them. */
function draw(job: string | undefined): Promise<number[]> {
  const env = { ...process.env };
  delete env['TAP_JOB_ID'];
  if (job !== undefined) env['TAP_JOB_ID'] = job;
  const code = `import { freePort } from ${JSON.stringify(path.join(root, 'scripts/lib/free-port.ts'))};
const ports = [];
for (let i = 0; i < ${DRAWS}; i++) ports.push(await freePort());
console.log(JSON.stringify(ports));`;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--input-type=module', '-e', code], { env, timeout: 60_000 }, (err, stdout) => (err === null ? resolve(JSON.parse(stdout) as number[]) : reject(err)));
  });
}

t.test('two tap jobs draw from disjoint ports, no process the same port twice in 300 draws, all below the ephemeral range', async (t) => {
  const ephemeral = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  const [a, b, outside] = await Promise.all([draw('0'), draw('1'), draw(undefined)]);
  for (const [name, ports] of [['job 0', a], ['job 1', b], ['outside tap', outside]] as const) {
    t.equal(new Set(ports).size, DRAWS, `${name}: ${DRAWS} draws, ${DRAWS} distinct ports`);
    t.ok(ports.every((p) => p >= 20_000 && p < ephemeral), `${name}: every port in [20000, ${ephemeral})`);
  }
  const inA = new Set(a);
  t.same(b.filter((p) => inA.has(p)), [], 'job 1 drew none of job 0\'s ports');
  const classes = (ports: readonly number[]): number[] => [...new Set(ports.map((p) => p % 8))];
  t.equal(classes(a).length, 1, 'job 0 draws from one residue class');
  t.equal(classes(b).length, 1, 'job 1 draws from one residue class');
  t.equal(classes(outside).length, 1, 'a script outside tap draws from one residue class');
  t.equal(new Set([...classes(a), ...classes(b), ...classes(outside)]).size, 3, 'three different classes');
});
