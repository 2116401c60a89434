// The shared body-total deadline timer: an item expires once its deadline has passed, never
// before, at most one resolution late; a deleted item never expires; the sweep stops when empty.
import t from 'tap';
import { DeadlineSweep } from '../src/proxy/deadline-sweep.ts';

t.test('expires due items only, within the resolution, and forgets deleted ones', async (t) => {
  const sweep = new DeadlineSweep(5);
  const start = performance.now();
  let firedAt = 0;
  const fired = new Promise<void>((resolve) => {
    sweep.add({ deadline: start + 30, expire: () => ((firedAt = performance.now()), resolve()) });
  });
  let lateFired = false;
  const late = { deadline: start + 60_000, expire: () => (lateFired = true) };
  let deletedFired = false;
  const deleted = { deadline: start + 10, expire: () => (deletedFired = true) };
  sweep.add(late);
  sweep.add(deleted);
  sweep.delete(deleted);
  await fired;
  t.ok(firedAt >= start + 30, `not before its deadline (${(firedAt - start).toFixed(1)} ms)`);
  t.ok(firedAt < start + 30 + 200, 'soon after it (bounded generously for a loaded machine)');
  t.equal(deletedFired, false, 'a deleted item never expires');
  t.equal(lateFired, false, 'an item not yet due stays');
  t.equal(sweep.size, 1);
  sweep.delete(late);
  t.equal(sweep.size, 0);
});
