// `edge-proxy [-c FILE]`: validate a configuration file and report every problem, one per line.
import { checkLogFile, formatIssue, inactiveFeatures, loadConfigFile } from '@edge-proxy/config';

/** Exit statuses of the validate command. */
export const EXIT_OK = 0;
export const EXIT_INVALID = 1;
export const EXIT_USAGE = 2;

/** Output sinks, so tests and the binary share one implementation. */
export interface Output {
  out(line: string): void;
  err(line: string): void;
}

/** Validates `file`; prints a summary on success or one `path: CODE: message` line per issue. */
export async function validateCommand(file: string, output: Output): Promise<number> {
  const result = await loadConfigFile(file);
  // Beyond the file itself, what `serve` would meet on this host: its log file (log-file.ts).
  const issues = result.ok ? checkLogFile(result.value.config.log.file) : result.issues;
  if (!result.ok || issues.length > 0) {
    for (const i of issues) output.err(formatIssue(i));
    output.err(`${file}: invalid (${issues.length} error${issues.length === 1 ? '' : 's'})`);
    return EXIT_INVALID;
  }
  const c = result.value.config;
  // Valid, but this host could not carry it out (an account that does not exist, no `taskset`,
  // worker flags node refuses): `serve` would refuse to start with the same line.
  const { hostProblems, operatorWorkerFlags } = await import('@edge-proxy/controlplane'); // only for a valid file: `ctl` never loads it
  const flags = await operatorWorkerFlags(process.env, process.execPath);
  const host = [...hostProblems(c), ...('problem' in flags ? [flags.problem] : [])];
  if (host.length > 0) {
    for (const p of host) output.err(`${p.path}: ${p.code}: ${p.message}`);
    output.err(`${file}: valid, but not on this host (${host.length} problem${host.length === 1 ? '' : 's'})`);
    return EXIT_INVALID;
  }
  const pools = Object.values(c.upstream);
  const backends = pools.reduce((n, p) => n + p.backends.length, 0);
  output.out(`${result.source.path}: valid (${c.listeners.length} listener${c.listeners.length === 1 ? '' : 's'}, ${pools.length} upstream pool${pools.length === 1 ? '' : 's'}, ${backends} backend${backends === 1 ? '' : 's'}; ${result.source.fingerprint})`);
  // Enabled by default, not enforced yet: said, never silently claimed.
  for (const f of inactiveFeatures(c)) output.out(`${f.path}: not active yet: ${f.message}`);
  return EXIT_OK;
}
