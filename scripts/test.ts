// The whole test suite, as CI runs it: system tools check, lint, type check, then every tap suite.
// Ends with the plain line `N passed, N failed[, N skipped]` and exits non-zero on any failure.
import { spawn } from 'node:child_process';
import { ensureSystemTools } from './system-tools.ts';
import { suiteCompileCache } from './lib/suite-compile-cache.ts';
import { accountTap } from './lib/tap-accounting.ts';
import type { FileProblem } from './lib/tap-accounting.ts';

interface StepResult {
  passed: number;
  failed: number;
  skipped: number;
}

function run(cmd: string, args: string[], capture: boolean): Promise<{ code: number; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => {
      process.stdout.write(chunk);
      if (capture) output += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? 1, output }));
  });
}

async function check(name: string, cmd: string, args: string[]): Promise<StepResult> {
  console.log(`\n== ${name}`);
  const { code } = await run(cmd, args, false);
  console.log(code === 0 ? `ok - ${name}` : `not ok - ${name} (exit ${code})`);
  return code === 0 ? { passed: 1, failed: 0, skipped: 0 } : { passed: 0, failed: 1, skipped: 0 };
}

/**
 * Every node process of the suite (each test file, and each CLI, supervisor and worker they start)
 * loads TypeScript: with one compile cache for the run (scripts/lib/suite-compile-cache.ts), only
 * the first to load a file strips it (Node's stripper costs 0.3-0.7 s of CPU per process, most of a
 * short CLI run). An operator's NODE_COMPILE_CACHE (or NODE_DISABLE_COMPILE_CACHE) is left alone.
 */
function shareCompileCache(): void {
  if (process.env['NODE_COMPILE_CACHE'] || process.env['NODE_DISABLE_COMPILE_CACHE']) return;
  process.env['NODE_COMPILE_CACHE'] = suiteCompileCache();
}

async function main(): Promise<void> {
  shareCompileCache();
  const totals: StepResult = { passed: 0, failed: 0, skipped: 0 };
  const add = (r: StepResult): void => {
    totals.passed += r.passed;
    totals.failed += r.failed;
    totals.skipped += r.skipped;
  };
  const problems: FileProblem[] = [];
  const step = (name: string, r: StepResult): void => {
    add(r);
    if (r.failed > 0) problems.push({ file: name, reason: 'failed (output above)' });
  };
  step('system tools', await ensureSystemTools());
  step('lint (eslint)', await check('lint (eslint)', 'eslint', ['.']));
  step('type check (tsc --noEmit)', await check('type check (tsc --noEmit)', 'tsc', ['--noEmit', '-p', 'tsconfig.json']));
  console.log('\n== tap');
  const tap = await run('tap', ['--reporter=tap', ...process.argv.slice(2)], true);
  // Counted file by file (scripts/lib/tap-accounting.ts): a crashed, killed or timed-out file, or
  // one that registers no tests, is a failure of its own, named below.
  const account = accountTap(tap.output);
  add(account);
  problems.push(...account.problems);
  // tap reports a test created after its parent ended (a top-level await between tests) as an
  // error but may still sum up as passing: count each such lost test as a failure.
  const lost = (tap.output.match(/cannot create subtest after parent test ends/g) ?? []).length;
  if (lost > 0) {
    problems.push({ file: 'tap', reason: `${lost} test(s) created after their parent ended were never run` });
    add({ passed: 0, failed: lost, skipped: 0 });
  }
  if (account.passed + account.failed === 0) {
    problems.push({ file: 'tap', reason: `no test ran (exit ${tap.code})` });
    add({ passed: 0, failed: 1, skipped: 0 });
  } else if (tap.code !== 0 && account.failed === 0) {
    problems.push({ file: 'tap', reason: `exited ${tap.code} with no failure in its output` });
    add({ passed: 0, failed: 1, skipped: 0 });
  }
  if (problems.length > 0) {
    console.log('\nfailed:');
    for (const p of problems) console.log(`  ${p.file}: ${p.reason}`);
  }
  const skipped = totals.skipped > 0 ? `, ${totals.skipped} skipped` : '';
  console.log(`\n${totals.passed} passed, ${totals.failed} failed${skipped}`);
  process.exitCode = totals.failed === 0 ? 0 : 1;
}

await main();
