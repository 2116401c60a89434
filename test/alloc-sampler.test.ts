// bench:proxy --alloc-profile's sampler (scripts/lib/alloc-sampler.ts), in a real node process:
// by default the profile counts every byte allocated, garbage included; with
// EDGE_ALLOC_SURVIVORS=1 (--alloc-survivors) only what the young generation did not free (promoted
// by a scavenge, or allocated in the old generation by V8's pretenuring). A process allocating
// about 100 MiB of short-lived arrays must read as about that in the first mode; in the second, as
// nearly nothing when it keeps none of them, and at least what it keeps when it keeps one in eight.
import t from 'tap';
import type { Test } from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { waitForJsonLine } from '../scripts/lib/bench-peers.ts';

const sampler = path.join(import.meta.dirname, '..', 'scripts', 'lib', 'alloc-sampler.ts');

// Waits for "go" on stdin, then allocates 96 Ki arrays of 126 numbers (about 1 KiB each with
// their headers), keeping one in KEEP (none for 0), and says how many it kept.
const ALLOCATOR = `
const keepEvery = Number(process.env.KEEP);
const kept = [];
process.stdin.once('data', () => {
  for (let i = 0; i < 96 * 1024; i++) {
    const a = new Array(126).fill(i);
    if (keepEvery > 0 && i % keepEvery === 0) kept.push(a);
  }
  globalThis.kept = kept;
  console.log(JSON.stringify({ event: 'allocated', kept: kept.length }));
});
console.log(JSON.stringify({ event: 'ready' }));
`;

interface ProfileNode {
  readonly selfSize: number;
  readonly children: readonly ProfileNode[];
}

function totalBytes(n: ProfileNode): number {
  return n.children.reduce((sum, c) => sum + totalBytes(c), n.selfSize);
}

/** Runs the allocator under the sampler and returns the MiB its profile counts. */
async function sampledMiB(t: Test, survivors: boolean, keepEvery: number): Promise<number> {
  const dir = mkdtempSync(path.join(tmpdir(), 'alloc-sampler-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const out = path.join(dir, 'profile.json');
  const env = { ...process.env, EDGE_ALLOC_OUT: out, KEEP: String(keepEvery), ...(survivors ? { EDGE_ALLOC_SURVIVORS: '1' } : {}) };
  const child = spawn(process.execPath, ['--max-semi-space-size=8', '--import', sampler, '--input-type=module', '-e', ALLOCATOR], { stdio: ['pipe', 'pipe', 'inherit'], env });
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  // Each wait starts before what causes the line, as bench:proxy's profileRun does.
  const next = (event: string): Promise<unknown> => waitForJsonLine(child, `"event":"${event}"`, `no ${event} line`, 30_000);
  await next('ready');
  const sampling = next('alloc-sampling');
  child.kill('SIGUSR2');
  await sampling;
  const allocated = next('allocated');
  child.stdin.write('go\n');
  await allocated;
  const written = next('alloc-written');
  child.kill('SIGUSR2');
  await written;
  const profile = JSON.parse(readFileSync(out, 'utf8')) as { head: ProfileNode };
  return totalBytes(profile.head) / 2 ** 20;
}

t.test('every byte allocated, garbage included', async (t) => {
  const mib = await sampledMiB(t, false, 8);
  t.ok(mib > 80 && mib < 130, `about 100 MiB allocated: the profile counts ${mib.toFixed(1)} MiB`);
});

t.test('--alloc-survivors: what the scavenges freed is not counted', async (t) => {
  const mib = await sampledMiB(t, true, 0);
  t.ok(mib < 5, `none of it kept: the profile counts ${mib.toFixed(1)} MiB`);
});

t.test('--alloc-survivors: what was kept is', async (t) => {
  const mib = await sampledMiB(t, true, 8);
  // One array in eight is kept (about 12 MiB); V8 may also pretenure the site once its arrays
  // survive, and then count dead arrays it allocated in the old generation.
  t.ok(mib > 10 && mib < 80, `one array in eight kept (about 12 MiB): the profile counts ${mib.toFixed(1)} MiB`);
});
