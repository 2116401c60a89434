// The shared body-total deadline timer: an item expires once its deadline has passed, never
// before, at most one resolution late; a deleted item never expires; the sweep stops when empty.
import t from 'tap';
import { DeadlineSweep } from '../src/proxy/deadline-sweep.ts';

t.test('expires due items only, within the resolution, and forgets deleted ones', async (t) => {
  const sweep = new DeadlineSweep(5);
  const start = performance.now();
  let firedAt = 0;
  const fired = new Promise<void>((resolve) => {
    sweep.add({ deadline: start + 30, sweepSlot: -1, expire: () => ((firedAt = performance.now()), resolve()) });
  });
  let lateFired = false;
  const late = { deadline: start + 60_000, sweepSlot: -1, expire: () => (lateFired = true) };
  let deletedFired = false;
  const deleted = { deadline: start + 10, sweepSlot: -1, expire: () => (deletedFired = true) };
  sweep.add(late);
  sweep.add(deleted);
  sweep.delete(deleted);
  await fired;
  t.ok(firedAt >= start + 30, `not before its deadline (${(firedAt - start).toFixed(1)} ms)`);
  // Not a precision check: the event loop of a test process on a loaded 2-core machine can lag by
  // hundreds of ms. The bound proves the item fires by itself, once due, without further adds.
  t.ok(firedAt < start + 30 + 2000, `soon after it (${(firedAt - start).toFixed(1)} ms; bounded generously for a loaded machine)`);
  t.equal(deletedFired, false, 'a deleted item never expires');
  t.equal(lateFired, false, 'an item not yet due stays');
  t.equal(sweep.size, 1);
  sweep.delete(late);
  t.equal(sweep.size, 0);
});

t.test('removal from the middle keeps every other item tracked exactly once', async (t) => {
  const sweep = new DeadlineSweep(5);
  const start = performance.now();
  const fired: number[] = [];
  let allDue = (): void => {};
  const dueFired = new Promise<void>((resolve) => (allDue = resolve));
  const expire = (i: number) => (): void => {
    fired.push(i);
    if (fired.length === 3) allDue();
  };
  const items = Array.from({ length: 10 }, (_, i) => ({ deadline: start + (i % 2 === 0 ? 20 : 60_000), sweepSlot: -1, expire: expire(i) }));
  for (const item of items) sweep.add(item);
  sweep.add(items[0] as (typeof items)[number]);
  t.equal(sweep.size, 10, 'adding a tracked item again does not track it twice');
  for (const i of [3, 0, 9, 4]) sweep.delete(items[i] as (typeof items)[number]);
  sweep.delete(items[3] as (typeof items)[number]);
  t.equal(sweep.size, 6, 'a second delete is a no-op');
  t.same(items.map((x) => x.sweepSlot >= 0), [false, true, true, false, false, true, true, true, true, false]);
  await dueFired;
  t.same([...fired].sort((a, b) => a - b), [2, 6, 8], 'the due items left expire once each; deleted ones never');
  t.equal(sweep.size, 3, 'the items not yet due remain');
  for (const item of items) sweep.delete(item);
  t.equal(sweep.size, 0);
});
