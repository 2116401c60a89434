// The hedging delay `npm run bench:tail` takes from its phase without hedging: the p95 of the
// answers, read so that the knee of a tail of exactly 5 % and a stall of the machine do not move
// it (see hedgeDelay). Pure: latencies in, a delay out.
import { percentile } from './bench-load.ts';

/**
 * The p95 of one sample of 2xx latencies (ascending), kept on the fast side of the knee. With a
 * tail of exactly 5 %, the p95 is the slowest of the fast answers; when the sample holds a few more
 * slow answers than 5 % of it (requests in flight across its edges), the p95 is one of the slow
 * answers (--slow-ms) and a hedge after it would never fire in time. Then the nearest lower
 * half-point percentile (p94.5, p94, …) that is a fast answer (under slowMs ÷ 2) is taken, and
 * `q` says which (in per mille).
 */
export function kneeP95(sorted: readonly number[], slowMs: number): { valueMs: number; q: number } | undefined {
  for (let q = 950; q >= 500; q -= 5) {
    const v = percentile(sorted, q / 1000);
    if (v < slowMs / 2) return { valueMs: v, q };
  }
  // Half the sample at or over slowMs ÷ 2: no knee to read.
  return undefined;
}

/** Windows with fewer answers than this are left out of the delay (a partial last second). */
const MIN_WINDOW_ANSWERS = 20;

/**
 * The hedging delay from phase A's 2xx answers (`at`: when the request was due, ms; `ms`: its
 * latency): the p95 (kneeP95) of each one-second window of the phase, the median of those,
 * rounded up, at least 1 ms. Since the p95 of a 5 % tail is the slowest fast answer, a single stall
 * of the machine in phase A (a few dozen answers held 100 ms) would set the p95 of the whole
 * phase, and the delay with it; it moves one window's p95, not the median.
 */
export function hedgeDelay(answers: ReadonlyArray<{ readonly at: number; readonly ms: number }>, slowMs: number): { delayMs: number; rule: string; wholeP95Ms: number } {
  if (answers.length === 0) throw new Error('no latencies to take a hedging delay from');
  const t0 = Math.min(...answers.map((a) => a.at));
  const windows = new Map<number, number[]>();
  for (const a of answers) {
    const w = Math.floor((a.at - t0) / 1000);
    const list = windows.get(w) ?? [];
    list.push(a.ms);
    windows.set(w, list);
  }
  const full = [...windows.values()].filter((w) => w.length >= MIN_WINDOW_ANSWERS).map((w) => w.sort((x, y) => x - y));
  const all = answers.map((a) => a.ms).sort((x, y) => x - y);
  const wholeP95Ms = percentile(all, 0.95);
  const samples = full.length > 0 ? full : [all];
  const knees = samples.flatMap((w) => kneeP95(w, slowMs) ?? []);
  if (knees.length === 0) throw new Error(`half of phase A's answers were slow (≥ ${slowMs / 2} ms) in every window: no hedging delay to take`);
  const median = percentile(knees.map((k) => k.valueMs).sort((x, y) => x - y), 0.5);
  const lowered = knees.filter((k) => k.q < 950).length;
  const notes = [
    ...(lowered === 0 ? [] : [`${lowered} took a lower percentile: their p95 was a slow answer`]),
    ...(knees.length === samples.length ? [] : [`${samples.length - knees.length} left out: half their answers took ≥ ${slowMs / 2} ms`]),
  ];
  const rule = `median of the p95 of ${knees.length} one-second window(s)${notes.length === 0 ? '' : ` (of ${samples.length}: ${notes.join('; ')})`}`;
  return { delayMs: Math.max(1, Math.ceil(median)), rule, wholeP95Ms };
}
