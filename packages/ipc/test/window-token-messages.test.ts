// The window budgets' fields of the token messages at the process boundary (ipc tokens.ts,
// messages.ts): deposits, asks ahead, a grant's bucket, a settle's bucket. Well-formed ones pass,
// anything else is dropped, never acted on; messages without them are the token budgets' as before.
import t from 'tap';
import { hostClockMs, isFromWorker, isToWorker } from '../src/index.ts';

const ask = { budget: 'retry:app', key: '', want: 3, waiting: 0, holding: 1 };
const settle = { budget: 'retry:app', key: '', unused: 2, forget: false };
const deposit = { budget: 'retry:app', key: '', n: 4, at: 123_456.5 };
const grant = { budget: 'retry:app', key: '', granted: 3, waitMs: 0, block: 3 };

t.test('worker → supervisor: deposits, an ask ahead, a settle of one bucket', async (t) => {
  const good: unknown[] = [
    { type: 'tokens', asks: [ask], settles: [settle] },
    { type: 'tokens', asks: [], settles: [], deposits: [deposit] },
    { type: 'tokens', asks: [{ ...ask, ahead: true }], settles: [{ ...settle, until: 124_000 }], deposits: [] },
  ];
  for (const m of good) t.equal(isFromWorker(m), true, JSON.stringify(m).slice(0, 100));
  const bad: unknown[] = [
    { type: 'tokens', asks: [], settles: [], deposits: 'x' },
    { type: 'tokens', asks: [], settles: [], deposits: [{ ...deposit, n: -1 }] },
    { type: 'tokens', asks: [], settles: [], deposits: [{ ...deposit, n: 1.5 }] },
    { type: 'tokens', asks: [], settles: [], deposits: [{ ...deposit, at: Number.NaN }] },
    { type: 'tokens', asks: [], settles: [], deposits: [{ ...deposit, at: '1' }] },
    { type: 'tokens', asks: [{ ...ask, ahead: 1 }], settles: [] },
    { type: 'tokens', asks: [], settles: [{ ...settle, until: Number.POSITIVE_INFINITY }] },
  ];
  for (const m of bad) t.equal(isFromWorker(m), false, JSON.stringify(m).slice(0, 100));
});

t.test("supervisor → worker: a grant's bucket", async (t) => {
  t.equal(isToWorker({ type: 'token-grants', grants: [grant] }), true, 'a token budget grant, no bucket');
  t.equal(isToWorker({ type: 'token-grants', grants: [{ ...grant, from: 1000, until: 2000 }] }), true, 'a window grant');
  t.equal(isToWorker({ type: 'token-grants', grants: [{ ...grant, until: 'soon' }] }), false);
  t.equal(isToWorker({ type: 'token-grants', grants: [{ ...grant, from: Number.NaN, until: 2000 }] }), false);
});

t.test('hostClockMs: the host monotonic clock in ms, never going back', async (t) => {
  const a = hostClockMs();
  const b = hostClockMs();
  t.ok(Number.isFinite(a) && b >= a, `${a} then ${b}`);
  t.ok(Math.abs(b - Number(process.hrtime.bigint() / 1000n) / 1000) < 1000, 'process.hrtime in ms');
});
