// Command lines of the benchmark scripts, parsed and checked the same way in each.
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { ParseArgsConfig } from 'node:util';

/** `v` (the value of `--name`) as a number that `ok` accepts; throws naming the option otherwise. */
export function numberArg(name: string, v: string | undefined, ok: (n: number) => boolean): number {
  const n = Number(v);
  if (v === undefined || v.trim() === '' || !Number.isFinite(n) || !ok(n)) throw new Error(`--${name}: bad value ${JSON.stringify(v)}`);
  return n;
}

/**
 * `parseArgs` for a benchmark's command line, its error in one line (`--alt-flags
 * --max-semi-space-size=8` is "ambiguous": write `--alt-flags=--max-semi-space-size=8`). Throws,
 * so that a script's exported parser can be tested; `commandLine` turns the throw into exit 2.
 */
export function benchArgs<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    throw new Error(err instanceof Error ? err.message.split('\n').join(' ') : String(err));
  }
}

/** A script's command line, parsed by `parse`: a bad one ends the script with one stderr line and exit 2, not a stack trace. */
export function commandLine<R>(parse: () => R): R {
  try {
    return parse();
  } catch (err) {
    return usageError(err instanceof Error ? err.message : String(err));
  }
}

/** `benchArgs` at a script's top level: a bad command line ends it (exit 2). */
export function scriptArgs<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  return commandLine(() => benchArgs(config));
}

/** Ends a benchmark script over a bad command line: one stderr line, exit 2. */
export function usageError(message: string): never {
  process.stderr.write(`${path.basename(process.argv[1] ?? 'bench')}: ${message}\n`);
  process.exit(2);
}
