// W3C Trace Context (https://www.w3.org/TR/trace-context/ §3.2): the `traceparent` header read
// into the correlation fields `trace_id` and `span_id` of logs and audit events. A header that is
// malformed, repeated, all-zero or of version ff is ignored (as the recommendation says: start a
// new trace rather than trust it); the values are lower-case hex and nothing else, so they cannot
// inject anything into a log line.

/** Correlation identifiers from an incoming `traceparent`. */
export interface TraceContext {
  /** 32 lower-case hex digits. */
  readonly trace_id: string;
  /** The caller's span (`parent-id`): 16 lower-case hex digits. */
  readonly span_id: string;
  readonly sampled: boolean;
}

const VERSION_00 = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
/** A later version: the first four fields as version 00 has them, then `-` and more (§3.2.4). */
const FUTURE = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The trace context of a `traceparent` header value (node gives repeated headers as an array or joined), or undefined. */
export function parseTraceparent(value: string | readonly string[] | undefined): TraceContext | undefined {
  if (typeof value !== 'string' || value.length > 512) return undefined;
  const v = value.trim();
  let trace: string | undefined;
  let span: string | undefined;
  let flags: string | undefined;
  const m = VERSION_00.exec(v);
  if (m !== null) [, trace, span, flags] = m;
  else {
    const f = FUTURE.exec(v);
    if (f === null || f[1] === '00' || f[1] === 'ff') return undefined;
    [, , trace, span, flags] = f;
  }
  if (trace === undefined || span === undefined || flags === undefined || /^0+$/.test(trace) || /^0+$/.test(span)) return undefined;
  return { trace_id: trace, span_id: span, sampled: (Number.parseInt(flags, 16) & 1) === 1 };
}
