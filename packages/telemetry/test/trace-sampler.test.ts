// The sampling decision of trace-sampler.ts, pure: who decides for a caller's trace, with an
// injected draw; and the OTel ParentBasedSampler built as tracing.ts builds it, on span contexts.
import t from 'tap';
import { ROOT_CONTEXT, SpanKind, TraceFlags, trace } from '@opentelemetry/api';
import { ParentBasedSampler, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-base';
import { UntrustedParentSampler, sampleIncoming } from '../src/trace-sampler.ts';

t.test('sampleIncoming: trusted follows the caller\'s flag; untrusted is the draw against the ratio', async (t) => {
  const rows: [trusted: boolean, callerSampled: boolean, ratio: number, draw: number, sampled: boolean][] = [
    [true, true, 0, 0.5, true],
    [true, false, 1, 0, false],
    [false, true, 0, 0, false],
    [false, true, 0.1, 0.0999, true],
    [false, true, 0.1, 0.1, false],
    [false, false, 0.1, 0.05, true],
    [false, false, 1, 0.999999, true],
    [false, true, 0, 0.999999, false],
  ];
  for (const [trusted, callerSampled, ratio, draw, sampled] of rows) t.equal(sampleIncoming({ trusted, callerSampled, ratio, draw }), sampled, JSON.stringify({ trusted, callerSampled, ratio, draw }));
});

t.test('ParentBasedSampler with UntrustedParentSampler: remote parents by the draw, local parents followed, roots by trace-id ratio', async (t) => {
  const draws = [0.01, 0.5, 0.01, 0.5];
  const untrusted = new UntrustedParentSampler(0.1, () => draws.shift() ?? 1);
  const sampler = new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(0), remoteParentSampled: untrusted, remoteParentNotSampled: untrusted });
  const ctx = (flags: number, isRemote: boolean) => trace.setSpanContext(ROOT_CONTEXT, { traceId: '00000000000000000000000000000001', spanId: '00f067aa0ba902b7', traceFlags: flags, isRemote });
  const decide = (c = ROOT_CONTEXT): number => sampler.shouldSample(c, '00000000000000000000000000000001', 'GET', SpanKind.SERVER, {}, []).decision;
  t.same([decide(ctx(TraceFlags.SAMPLED, true)), decide(ctx(TraceFlags.SAMPLED, true)), decide(ctx(TraceFlags.NONE, true)), decide(ctx(TraceFlags.NONE, true))], [2, 0, 2, 0], 'remote parent: draw 0.01 samples, 0.5 does not, whatever the caller\'s flag');
  t.same([decide(ctx(TraceFlags.SAMPLED, false)), decide(ctx(TraceFlags.NONE, false))], [2, 0], 'local parent (the server span of an attempt): followed');
  t.equal(decide(), 0, 'no parent: the root sampler (ratio 0)');
  t.equal(draws.length, 0, 'one draw per remote-parent decision, none for local parents');
});
