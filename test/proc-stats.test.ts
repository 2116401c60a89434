// The benchmarks' memory readings (scripts/lib/proc-stats.ts): a worker's private memory is what
// another worker adds to a node, so the reading must count what the process alone holds and leave
// out the `node` binary's pages it shares with every other node process.
import t from 'tap';
import type { Test } from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { memoryShares, processTree, rssMiB, treeMemoryShares } from '../scripts/lib/proc-stats.ts';

/** A node process of the same binary holding `mib` MiB it wrote (so resident and private). */
async function holder(t: Test, mib: number): Promise<number> {
  const child = spawn(process.execPath, ['-e', `globalThis.held = Buffer.alloc(${mib} * 1024 * 1024, 7); process.stdout.write('ready\\n'); process.stdin.resume();`], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  const [chunk] = (await once(child.stdout, 'data')) as [Buffer];
  t.equal(chunk.toString().trim(), 'ready', 'the holder wrote its memory');
  return child.pid as number;
}

t.test('private memory counts what the process wrote, not the binary it shares', async (t) => {
  const small = await holder(t, 8);
  const big = await holder(t, 72);
  const a = memoryShares(small);
  const b = memoryShares(big);
  t.ok(Math.abs(b.rssMiB - rssMiB(big)) < 2, `smaps_rollup's RSS (${b.rssMiB.toFixed(1)}) is VmRSS (${rssMiB(big).toFixed(1)})`);
  const grown = b.privateMiB - a.privateMiB;
  t.ok(grown > 56 && grown < 88, `64 MiB more written: private grew by ${grown.toFixed(1)} MiB`);
  for (const [name, m] of [['small', a], ['big', b]] as const) {
    t.ok(m.privateMiB <= m.pssMiB + 0.01 && m.pssMiB <= m.rssMiB + 0.01, `${name}: private ${m.privateMiB.toFixed(1)} ≤ PSS ${m.pssMiB.toFixed(1)} ≤ RSS ${m.rssMiB.toFixed(1)}`);
    // Three processes of one binary run (this test and the two holders): its pages are shared.
    t.ok(m.rssMiB - m.privateMiB > 10, `${name}: ${(m.rssMiB - m.privateMiB).toFixed(1)} MiB of its RSS is shared`);
  }
});

t.test('a tree sums its processes; a process that exited reads as zero', async (t) => {
  const pid = await holder(t, 16);
  const own = memoryShares(process.pid);
  const child = memoryShares(pid);
  const tree = treeMemoryShares(process.pid);
  t.ok(processTree(process.pid).includes(pid), 'the holder is in this process tree');
  t.ok(tree.privateMiB >= own.privateMiB + child.privateMiB - 4, `tree private ${tree.privateMiB.toFixed(1)} ≥ this ${own.privateMiB.toFixed(1)} + the holder ${child.privateMiB.toFixed(1)}`);
  const proc = spawn(process.execPath, ['-e', '0']);
  const gone = proc.pid as number;
  await once(proc, 'exit');
  t.same(memoryShares(gone), { rssMiB: 0, pssMiB: 0, privateMiB: 0 }, 'an exited pid reads as zero');
});
