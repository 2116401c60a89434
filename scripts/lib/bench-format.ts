// Table cells and verdicts of the benchmark reports (bench:overload, bench:tail), written once.

/** A number with `digits` decimals, or '–' when there is none. */
export function fmt(v: number | undefined, digits = 0): string {
  return v !== undefined && Number.isFinite(v) ? v.toFixed(digits) : '–';
}

/** A percentage with `digits` decimals, or '–'. */
export function fmtPct(v: number, digits = 1): string {
  return Number.isFinite(v) ? `${v.toFixed(digits)} %` : '–';
}

/** Counts by label (`transport 3, tls 1`), or '–' when there are none. */
export function fmtCounts(c: Readonly<Record<string, number>>): string {
  const e = Object.entries(c);
  return e.length === 0 ? '–' : e.map(([k, v]) => `${k} ${v}`).join(', ');
}

/** One target of a benchmark: met, not met, or not measured (undefined), and what was seen. */
export interface Verdict {
  readonly target: string;
  readonly met: boolean | undefined;
  readonly detail: string;
}
