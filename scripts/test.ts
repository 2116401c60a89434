// The whole test suite, as CI runs it: system tools check, lint, type check, then every tap suite.
// Ends with the plain line `N passed, N failed[, N skipped]` and exits non-zero on any failure.
import { spawn } from 'node:child_process';
import { ensureSystemTools } from './system-tools.ts';

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

/** tap closes with `# { total: N, pass: N, fail: N, skip: N, todo: N }`; read the counts from it. */
function tapSummary(output: string): StepResult | undefined {
  const line = output.split('\n').reverse().find((l) => /^# \{ total: \d+/.test(l));
  if (line === undefined) return undefined;
  const count = (key: string): number => Number(new RegExp(`${key}: (\\d+)`).exec(line)?.[1] ?? 0);
  return { passed: count('pass'), failed: count('fail'), skipped: count('skip') + count('todo') };
}

async function main(): Promise<void> {
  const totals: StepResult = { passed: 0, failed: 0, skipped: 0 };
  const add = (r: StepResult): void => {
    totals.passed += r.passed;
    totals.failed += r.failed;
    totals.skipped += r.skipped;
  };
  const tools = await ensureSystemTools();
  add(tools);
  add(await check('lint (eslint)', 'eslint', ['.']));
  add(await check('type check (tsc --noEmit)', 'tsc', ['--noEmit', '-p', 'tsconfig.json']));
  console.log('\n== tap');
  const tap = await run('tap', ['--reporter=tap', ...process.argv.slice(2)], true);
  const summary = tapSummary(tap.output);
  // tap reports a test created after its parent ended (a top-level await between tests) as an
  // error but may still sum up as passing: count each such lost test as a failure.
  const lost = (tap.output.match(/cannot create subtest after parent test ends/g) ?? []).length;
  if (lost > 0) {
    console.log(`not ok - ${lost} test(s) created after their parent ended were never run`);
    add({ passed: 0, failed: lost, skipped: 0 });
  }
  if (summary === undefined) {
    console.log(`not ok - tap printed no summary (exit ${tap.code})`);
    add({ passed: 0, failed: 1, skipped: 0 });
  } else {
    add(summary);
    if (tap.code !== 0 && summary.failed === 0) add({ passed: 0, failed: 1, skipped: 0 });
  }
  const skipped = totals.skipped > 0 ? `, ${totals.skipped} skipped` : '';
  console.log(`\n${totals.passed} passed, ${totals.failed} failed${skipped}`);
  process.exitCode = totals.failed === 0 ? 0 : 1;
}

await main();
