// Reading the control API's answer in `edge-proxy ctl` (issue 38 item 10): the answer comes from
// whatever listens at the URL, so its shape is not trusted. Its size is bounded by the client
// (MAX_RESPONSE_BYTES); its nesting is bounded here, before it is parsed: a 100,000-deep array
// parses (V8's parser is iterative) but every recursive walk of it afterwards (JSON.stringify of
// the answer to stdout, the problem lines) overflowed the stack and printed "Maximum call stack
// size exceeded". The control API's own answers nest a dozen levels (a plan's diff).

/** Deepest nesting of arrays and objects read in an answer. */
export const MAX_ANSWER_DEPTH = 64;

/**
 * The deepest nesting of `text` as JSON, counted without recursion, stopping as soon as it passes
 * `limit` (then `limit + 1`). Brackets inside strings (escapes included) do not count.
 */
export function nestingDepth(text: string, limit: number): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: the next character is escaped
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return deepest;
}

/** An answer's body: its JSON value (undefined for an empty answer), or why it is not read. */
export type AnswerBody = { readonly ok: true; readonly body: unknown } | { readonly ok: false; readonly problem: 'too_deep' | 'not_json'; readonly message: string };

/** Parses an answer's text under the nesting bound; never throws. */
export function parseAnswer(text: string, maxDepth = MAX_ANSWER_DEPTH): AnswerBody {
  if (text === '') return { ok: true, body: undefined };
  if (nestingDepth(text, maxDepth) > maxDepth) return { ok: false, problem: 'too_deep', message: `the answer nests deeper than ${maxDepth} levels: not read` };
  try {
    return { ok: true, body: JSON.parse(text) as unknown };
  } catch {
    return { ok: false, problem: 'not_json', message: 'the answer is not JSON' };
  }
}
