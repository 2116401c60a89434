// Command-line numbers of the benchmark scripts, checked the same way in each.

/** `v` (the value of `--name`) as a number that `ok` accepts; throws naming the option otherwise. */
export function numberArg(name: string, v: string | undefined, ok: (n: number) => boolean): number {
  const n = Number(v);
  if (v === undefined || v.trim() === '' || !Number.isFinite(n) || !ok(n)) throw new Error(`--${name}: bad value ${JSON.stringify(v)}`);
  return n;
}
