// The whole suite under CPU pressure: a busy loop holds one core while `npm test` runs, several
// rounds in a row (default 3). A timing assumption that only holds on an idle machine shows up
// here as a failure. Usage: npm run test:loaded [-- --rounds N] [-- <tap args>]
// Ends with one line per round and exits non-zero if any round failed.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const argv = process.argv.slice(2);
let rounds = 3;
const i = argv.indexOf('--rounds');
if (i >= 0) {
  rounds = Number(argv[i + 1]);
  argv.splice(i, 2);
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 20) throw new Error('--rounds takes an integer from 1 to 20');
}

// One core's worth of load: a child that never yields. Killed on every way out.
const busy = spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' });
const stopBusy = (): void => {
  if (busy.exitCode === null && busy.signalCode === null) busy.kill('SIGKILL');
};
process.on('exit', stopBusy);
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    stopBusy();
    process.exit(130);
  });
}

function round(): Promise<{ code: number; last: string; seconds: number }> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(root, 'scripts', 'test.ts'), ...argv], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    let tail = '';
    child.stdout.on('data', (c: Buffer) => {
      process.stdout.write(c);
      tail = (tail + c.toString('utf8')).slice(-4096);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      const last = tail.trim().split('\n').pop() ?? '';
      resolve({ code: code ?? 1, last, seconds: (performance.now() - started) / 1000 });
    });
  });
}

const results: string[] = [];
let failed = 0;
for (let r = 1; r <= rounds; r++) {
  console.log(`\n=== round ${r} of ${rounds}, one core held by a busy loop (pid ${busy.pid})`);
  const { code, last, seconds } = await round();
  if (code !== 0) failed++;
  results.push(`round ${r}: ${last} in ${seconds.toFixed(0)} s (exit ${code})`);
}
stopBusy();
console.log(`\n${results.join('\n')}`);
process.exitCode = failed === 0 ? 0 : 1;
