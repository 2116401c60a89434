// Who decides whether a request's trace is sampled (`observability.tracing.sample_ratio` and
// `trust_incoming_sampling`). The W3C `traceparent` a client sends carries a sampled flag (W3C
// Trace Context §3.2.2.5); a plain parent-based sampler obeys it, so any client that writes
// `…-01` makes every one of its requests exported, whatever the ratio (issue 38, finding 6). By
// default the caller's flag is therefore not trusted: the server span of a request with a caller's
// `traceparent` is sampled with probability `sample_ratio` by a draw of ours, and it is still the
// caller's trace (same trace id, the caller's span as parent), so a sampled span links up. The
// attempts follow the server span (local parent), so the `traceparent` sent upstream carries OUR
// decision. With `trust_incoming_sampling: true` (a caller that is part of the operator's own
// tracing) the caller's flag decides, as the OTel default ParentBased sampler does.
//
// The draw is a random number, not the trace-id ratio the OTel SDK uses for new traces: the trace
// id of a caller's `traceparent` is chosen by the caller, and the trace-id ratio sampler samples
// every id whose folded 32-bit value is small (`…0001` is sampled at any ratio above 0).
import type { Attributes, Context, Link, SpanKind } from '@opentelemetry/api';
import type { Sampler, SamplingResult } from '@opentelemetry/sdk-trace-base';

/** `SamplingDecision` of the OTel SDK (a const enum there): NOT_RECORD and RECORD_AND_SAMPLED. */
const NOT_RECORD = 0;
const RECORD_AND_SAMPLED = 2;

/** Whether a request whose caller sent a valid `traceparent` is sampled: the pure decision. */
export function sampleIncoming(opts: { readonly trusted: boolean; readonly callerSampled: boolean; readonly ratio: number; readonly draw: number }): boolean {
  if (opts.trusted) return opts.callerSampled;
  // `draw` is uniform in [0, 1): ratio 0 never samples, ratio 1 always does.
  return opts.draw < opts.ratio;
}

/**
 * The sampler of a span whose parent is a caller's (remote) context when the caller is not
 * trusted: `sample_ratio` by a draw of `random` (default `Math.random`), whatever the caller's flag.
 */
export class UntrustedParentSampler implements Sampler {
  private readonly ratio: number;
  private readonly random: () => number;

  constructor(ratio: number, random: () => number = Math.random) {
    this.ratio = ratio;
    this.random = random;
  }

  shouldSample(_context: Context, _traceId: string, _name: string, _kind: SpanKind, _attributes: Attributes, _links: Link[]): SamplingResult {
    return { decision: sampleIncoming({ trusted: false, callerSampled: false, ratio: this.ratio, draw: this.random() }) ? RECORD_AND_SAMPLED : NOT_RECORD };
  }

  toString(): string {
    return `UntrustedParentSampler{ratio=${this.ratio}}`;
  }
}
