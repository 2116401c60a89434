// The lease messages at the process boundary (ipc lease.ts, messages.ts): well-formed batches
// pass, anything else is dropped, never acted on.
import t from 'tap';
import { isFromWorker, isNotice, isToWorker, MAX_LEASE_ENTRIES, MAX_LEASE_KEY } from '../src/index.ts';

const ask = { key: 'global', need: 1, extra: 0, give: 0, used: 0, asks: true };
const grant = { key: 'global', add: 1, revoke: 0, contended: false, reply: true, exhausted: false, block: 1, limit: 8, nodeHeld: 1 };

t.test('worker → supervisor: lease asks', async (t) => {
  t.equal(isFromWorker({ type: 'lease', asks: [ask] }), true);
  t.equal(isFromWorker({ type: 'lease', asks: [] }), true);
  const bad: unknown[] = [
    { type: 'lease' },
    { type: 'lease', asks: 'x' },
    { type: 'lease', asks: [null] },
    { type: 'lease', asks: [{ ...ask, key: 7 }] },
    { type: 'lease', asks: [{ ...ask, key: 'k'.repeat(MAX_LEASE_KEY + 1) }] },
    { type: 'lease', asks: [{ ...ask, need: -1 }] },
    { type: 'lease', asks: [{ ...ask, extra: 1.5 }] },
    { type: 'lease', asks: [{ ...ask, give: Number.NaN }] },
    { type: 'lease', asks: [{ ...ask, used: '1' }] },
    { type: 'lease', asks: [{ ...ask, asks: 1 }] },
    { type: 'lease', asks: Array.from({ length: MAX_LEASE_ENTRIES + 1 }, () => ask) },
  ];
  for (const m of bad) t.equal(isFromWorker(m), false, JSON.stringify(m).slice(0, 80));
  t.equal(isFromWorker({ type: 'lease', asks: [{ ...ask, key: 'k'.repeat(MAX_LEASE_KEY) }] }), true, 'a key of the longest length');
});

t.test('supervisor → worker: lease grants, a notice', async (t) => {
  const m = { type: 'lease', grants: [grant] } as const;
  t.equal(isToWorker(m), true);
  t.equal(isNotice(m), true);
  for (const field of ['add', 'revoke', 'block', 'limit', 'nodeHeld']) t.equal(isToWorker({ type: 'lease', grants: [{ ...grant, [field]: -1 }] }), false, field);
  for (const field of ['contended', 'reply', 'exhausted']) t.equal(isToWorker({ type: 'lease', grants: [{ ...grant, [field]: 'yes' }] }), false, field);
  t.equal(isToWorker({ type: 'lease', grants: {} }), false);
});
