// Mutation testing of the modules where a silent defect hurts most (docs/testing.md).
//
//   npm run test:mutation                 every module, one after the other
//   npm run test:mutation -- router auth  only the named modules
//   npm run test:mutation -- --list       the module names
//
// One StrykerJS run per module, with the command runner: each mutant is judged by running only
// the unit test files that cover the module, each as a plain `node file.test.ts` (tap's runner is
// skipped: 0.3 s instead of 1.6 s per file), stopping at the first failed assertion. The runs are
// in place (`inPlace`), because the packages import each other through the workspace symlinks in
// node_modules, which resolve to the real package directories: in a sandbox copy, a worker forked
// by the pool tests would load the unmutated sources. So do not edit, lint or type-check the
// mutated module while its run is under way. Stryker restores the file at the end (and on Ctrl-C);
// after a hard kill, `git checkout -- <file>` does. The JSON and HTML reports of each module are
// written to reports/mutation/<module>.{json,html}; the closing table is the one docs/testing.md
// shows.
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

interface MutationModule {
  /** The files (and line ranges, `file.ts:10-120`) whose mutants are judged. */
  readonly mutate: readonly string[];
  /** The unit test files that cover them, run in order; the first failure kills the mutant. */
  readonly tests: readonly string[];
}

const cfg = 'packages/config';
const dp = 'packages/dataplane';
const cp = 'packages/controlplane';

/** The modules, in the order `npm run test:mutation` runs them. */
export const MODULES: Readonly<Record<string, MutationModule>> = {
  rules: {
    mutate: [`${cfg}/src/rules/context.ts`, `${cfg}/src/rules/control-plane.ts`, `${cfg}/src/rules/listeners.ts`, `${cfg}/src/rules/resilience.ts`, `${cfg}/src/rules/upstreams.ts`],
    tests: [`${cfg}/test/rules.test.ts`],
  },
  diff: { mutate: [`${cfg}/src/diff.ts`], tests: [`${cfg}/test/diff.test.ts`, `${cfg}/test/resolve.test.ts`] },
  router: { mutate: [`${dp}/src/routing/router.ts`], tests: [`${dp}/test/router.test.ts`] },
  // The selectors' policies. Not hash.ts, maglev.ts, backend-stats.ts, request-key.ts: instrumented,
  // the hash inner loops make balancing.test.ts (100 000 picks, hash rings, properties) run 28 s
  // instead of 8 s per mutant, over half an hour for the module.
  balancing: {
    mutate: ['round-robin', 'random', 'selector', 'least-connections', 'latency-aware', 'consistent-hash', 'sticky-cid'].map((f) => `${dp}/src/balancing/${f}.ts`),
    tests: [`${dp}/test/balancing.test.ts`, `${dp}/test/request-key.test.ts`],
  },
  health: {
    mutate: [`${dp}/src/health/health-state.ts`, `${dp}/src/health/health-registry.ts`, `${dp}/src/resilience/circuit-breaker.ts`],
    tests: [`${dp}/test/health-breaker.test.ts`],
  },
  'protocol-policy': { mutate: [`${dp}/src/policy/protocol-policy.ts`], tests: [`${dp}/test/protocol-policy.test.ts`] },
  'two-phase': { mutate: [`${cp}/src/supervisor/two-phase.ts`], tests: [`${cp}/test/two-phase.test.ts`, `${cp}/test/two-phase-messages.test.ts`, `${cp}/test/worker-pool.test.ts`] },
  // The activation path only (re-fork handover, activate, the pool's side of two-phase): every
  // mutant costs a run of worker-pool.test.ts with real workers (~8 s), the whole file would take
  // over an hour.
  'worker-pool': { mutate: [`${cp}/src/supervisor/worker-pool.ts:179-254`], tests: [`${cp}/test/worker-pool.test.ts`] },
  // The worker's side of prepare, commit and abort: its unit test over an in-memory endpoint first, then the pool's tests with real workers.
  'ipc-worker': { mutate: [`${dp}/src/worker/ipc-worker.ts:139-177`], tests: [`${dp}/test/ipc-worker.test.ts`, `${cp}/test/worker-pool.test.ts`] },
  auth: { mutate: [`${cp}/src/api/auth.ts`], tests: [`${cp}/test/auth.test.ts`, `${cp}/test/api-server.test.ts`] },
  // The node's circuit breakers (issue 39): the supervisor's pure policy and its owner, and the worker's follower.
  'node-breakers': {
    mutate: [`${cp}/src/breakers/node-breaker.ts`, `${cp}/src/breakers/node-breakers.ts`, `${dp}/src/resilience/breaker-follower.ts`],
    tests: [`${cp}/test/node-breaker.test.ts`, `${dp}/test/breaker-follower.test.ts`],
  },
  // The node's in-flight leases (issue 39): the supervisor's pure ledger and the worker's lease table.
  leases: { mutate: [`${cp}/src/limits/lease-ledger.ts`, `${dp}/src/resilience/lease.ts`], tests: [`${cp}/test/lease-ledger.test.ts`, `${dp}/test/lease.test.ts`] },
  // The node's token budgets (issue 39): the supervisor's pure token and window ledgers and the worker's token leases.
  tokens: {
    mutate: [`${cp}/src/limits/token-ledger.ts`, `${cp}/src/limits/window-ledger.ts`, `${dp}/src/resilience/token-lease.ts`],
    tests: [`${cp}/test/token-ledger.test.ts`, `${cp}/test/window-ledger.test.ts`, `${dp}/test/token-lease.test.ts`, `${dp}/test/retry-lease.test.ts`, `${dp}/test/quota-node.test.ts`],
  },
};

interface Counts {
  mutants: number;
  killed: number;
  survived: number;
  timeout: number;
  noCoverage: number;
  errors: number;
}

/** Score as Stryker counts it: detected (killed + timeout) over valid mutants. */
function score(c: Counts): number {
  const valid = c.killed + c.timeout + c.survived + c.noCoverage;
  return valid === 0 ? 0 : ((c.killed + c.timeout) / valid) * 100;
}

function countReport(file: string): Counts {
  const report = JSON.parse(readFileSync(file, 'utf8')) as { files: Record<string, { mutants: { status: string }[] }> };
  const c: Counts = { mutants: 0, killed: 0, survived: 0, timeout: 0, noCoverage: 0, errors: 0 };
  for (const f of Object.values(report.files)) {
    for (const m of f.mutants) {
      c.mutants++;
      if (m.status === 'Killed') c.killed++;
      else if (m.status === 'Survived') c.survived++;
      else if (m.status === 'Timeout') c.timeout++;
      else if (m.status === 'NoCoverage') c.noCoverage++;
      else c.errors++; // CompileError, RuntimeError, Ignored: not counted in the score
    }
  }
  return c;
}

function runStryker(configFile: string): Promise<number> {
  const bin = path.resolve('node_modules/@stryker-mutator/core/bin/stryker.js');
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, 'run', configFile], { stdio: 'inherit' });
    child.on('error', reject);
    child.on('close', (code) => resolve(code ?? 1));
  });
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  if (args.includes('--list')) {
    console.log(Object.keys(MODULES).join('\n'));
    return;
  }
  const unknown = args.filter((a) => !(a in MODULES));
  if (unknown.length > 0) {
    console.error(`unknown module: ${unknown.join(', ')} (known: ${Object.keys(MODULES).join(', ')})`);
    process.exitCode = 2;
    return;
  }
  const names = args.length > 0 ? args : Object.keys(MODULES);
  mkdirSync('.stryker-tmp', { recursive: true });
  mkdirSync('reports/mutation', { recursive: true });
  const rows: string[] = [];
  for (const name of names) {
    const mod = MODULES[name] as MutationModule;
    const reportFile = `reports/mutation/${name}.json`;
    const config = {
      $schema: './node_modules/@stryker-mutator/core/schema/stryker-schema.json',
      testRunner: 'command',
      // The Node 24 running this script (type stripping); TAP output is not needed, the exit code
      // is. TAP_BAIL: a file stops at its first failed assertion (a killed mutant costs ~0.5 s
      // instead of the whole file: 8 s for balancing.test.ts).
      commandRunner: { command: mod.tests.map((f) => `TAP_BAIL=1 '${process.execPath}' ${f} > /dev/null 2>&1`).join(' && ') },
      coverageAnalysis: 'off',
      mutate: mod.mutate,
      inPlace: true,
      // No `// @ts-nocheck` header: in place, Stryker would write it into every TS file of the
      // repository (and restore them all at the end, undoing edits made meanwhile); Node's type
      // stripping does not type-check, so the header is not needed.
      disableTypeChecks: false,
      concurrency: 1,
      // Generous: a mutant that makes a test wait on a deadline is a timeout (detected), not noise.
      timeoutMS: 20_000,
      timeoutFactor: 2,
      reporters: ['clear-text', 'progress', 'json', 'html'],
      jsonReporter: { fileName: reportFile },
      htmlReporter: { fileName: `reports/mutation/${name}.html` },
      clearTextReporter: { allowColor: false, logTests: false, reportScoreTable: true },
      tempDirName: '.stryker-tmp',
      cleanTempDir: true,
      thresholds: { high: 85, low: 70, break: null },
    };
    const configFile = `.stryker-tmp/stryker-${name}.json`;
    writeFileSync(configFile, `${JSON.stringify(config, null, 2)}\n`);
    console.log(`\n== mutation: ${name} (${mod.mutate.join(', ')}) judged by ${mod.tests.join(', ')}`);
    const started = Date.now();
    const code = await runStryker(configFile);
    if (code !== 0) {
      console.error(`stryker exited ${code} on ${name}`);
      process.exitCode = 1;
      continue;
    }
    const c = countReport(reportFile);
    const minutes = ((Date.now() - started) / 60_000).toFixed(1);
    rows.push(`| ${name} | ${c.mutants} | ${c.killed} | ${c.survived} | ${c.timeout} | ${c.noCoverage + c.errors} | ${score(c).toFixed(1)} % | ${minutes} min |`);
  }
  console.log('\n| module | mutants | killed | survived | timeout | other | score | run time |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) console.log(r);
}

await main();
