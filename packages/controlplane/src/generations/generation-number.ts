// What a generation number is, declared once (issue 38 finding 7): the control API checks request
// bodies and paths with it, the history refuses to record anything else, and the state directory's
// loader keeps only what it accepts. Before, the API took any safe integer (a rollback to -1 was
// answered 404 and recorded) while the loader required a non-negative one, so one request made the
// whole state file unusable at the next start.

/**
 * Largest generation number (2^31 − 1): one activation a second for 68 years. Bounded so that a
 * number the API accepts is one every consumer (JSON, the history, the state file, scripts that
 * hold it in a 32-bit integer) holds exactly.
 */
export const MAX_GENERATION = 2 ** 31 - 1;

/** A generation number: a whole JSON number from 1 to MAX_GENERATION (so not 0, `-0`, a fraction or a string). */
export function isGenerationNumber(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 1 && v <= MAX_GENERATION;
}

/** The highest number given so far (`last_generation`): 0 before the first, else a generation number. */
export function isGenerationCounter(v: unknown): v is number {
  return v === 0 || isGenerationNumber(v);
}

/** What a refused value must be, for a 400 answer naming the field. */
export function generationProblem(field: string): string {
  return `'${field}' must be a generation number (a whole number from 1 to ${MAX_GENERATION})`;
}

/** A path segment as a generation number: decimal digits without a leading zero, in range; else undefined. */
export function parseGenerationText(text: string): number | undefined {
  if (!/^[1-9][0-9]{0,9}$/.test(text)) return undefined;
  const n = Number(text);
  return isGenerationNumber(n) ? n : undefined;
}
