// W3C traceparent parsing: valid headers give the correlation fields; anything malformed,
// repeated, all-zero or version ff gives nothing (never a partial or injected value).
import t from 'tap';
import { parseTraceparent } from '../src/index.ts';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN = '00f067aa0ba902b7';

t.test('valid headers', async (t) => {
  t.same(parseTraceparent(`00-${TRACE}-${SPAN}-01`), { trace_id: TRACE, span_id: SPAN, sampled: true });
  t.same(parseTraceparent(`00-${TRACE}-${SPAN}-00`), { trace_id: TRACE, span_id: SPAN, sampled: false });
  t.same(parseTraceparent(` 00-${TRACE}-${SPAN}-03 `), { trace_id: TRACE, span_id: SPAN, sampled: true }, 'surrounding spaces');
  t.same(parseTraceparent(`01-${TRACE}-${SPAN}-01-future-fields`), { trace_id: TRACE, span_id: SPAN, sampled: true }, 'a later version with more fields');
});

t.test('refused', async (t) => {
  const bad: (string | string[] | undefined)[] = [
    undefined,
    '',
    `00-${TRACE}-${SPAN}-01-extra`, // version 00 has exactly four fields
    `ff-${TRACE}-${SPAN}-01`,
    `00-${'0'.repeat(32)}-${SPAN}-01`,
    `00-${TRACE}-${'0'.repeat(16)}-01`,
    `00-${TRACE.toUpperCase()}-${SPAN}-01`,
    `00-${TRACE.slice(1)}-${SPAN}-01`,
    `00-${TRACE}-${SPAN}`,
    `00-${TRACE}-${SPAN}-01\n{"injected":true}`,
    [`00-${TRACE}-${SPAN}-01`, `00-${TRACE}-${SPAN}-01`],
    `00-${TRACE}-${SPAN}-01`.padEnd(600, 'x'),
  ];
  for (const v of bad) t.equal(parseTraceparent(v), undefined, JSON.stringify(v)?.slice(0, 80) ?? 'undefined');
});
