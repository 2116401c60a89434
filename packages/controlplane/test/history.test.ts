// Generation history: statuses through activations, failed prepares and rollbacks; rollback
// eligibility (404/409); bounded bundles, records and entries.
import t from 'tap';
import { GenerationHistory } from '../src/generations/history.ts';

const statuses = (h: GenerationHistory<string>): string => h.retained().map((r) => `${r.generation}:${r.status}${r.rollback_candidate ? '*' : ''}${r.has_bundle ? '' : '-'}`).join(' ');

t.test('activations: active → previous → superseded; failed prepares never active', async (t) => {
  const h = new GenerationHistory<string>();
  t.equal(h.activeGeneration, 0);
  h.activated(1, 'b1');
  t.equal(statuses(h), '1:active');
  h.activated(2, 'b2');
  t.equal(statuses(h), '2:active 1:previous*');
  h.failedPrepare(3, 'upstream.api.tls.ca_file: cannot be used');
  t.equal(statuses(h), '3:failed_prepare- 2:active 1:previous*');
  t.equal(h.retainedGeneration(3)?.note, 'upstream.api.tls.ca_file: cannot be used');
  h.activated(4, 'b4');
  t.equal(statuses(h), '4:active 3:failed_prepare- 2:previous* 1:superseded*');
  t.equal(h.activeGeneration, 4);
  t.equal(h.nextGeneration(), 5);
  t.throws(() => h.activated(4, 'again'), /not newer/);
});

t.test('rollback: target active, the one moved away from rolled_back, previous superseded', async (t) => {
  const h = new GenerationHistory<string>();
  h.activated(1, 'b1');
  h.activated(2, 'b2');
  h.activated(3, 'b3');
  t.equal(h.checkRollback(1), undefined);
  h.rolledBack(1);
  t.equal(statuses(h), '3:rolled_back* 2:superseded* 1:active');
  t.equal(h.activeBundle(), 'b1');
  t.same(h.checkRollback(3), undefined, 'a rolled-back generation can be restored (undo)');
  h.rolledBack(3);
  t.equal(statuses(h), '3:active 2:superseded* 1:rolled_back*');
  h.activated(4, 'b4');
  t.equal(statuses(h), '4:active 3:previous* 2:superseded* 1:rolled_back*');
});

t.test('rollback refusals: 404 unknown, 409 active or not a candidate', async (t) => {
  const h = new GenerationHistory<string>();
  h.activated(1, 'b1');
  h.failedPrepare(2, 'x');
  t.same(h.checkRollback(9), { status: 404, reason: 'generation_not_retained' });
  t.same(h.checkRollback(1), { status: 409, reason: 'already_active' });
  t.same(h.checkRollback(2), { status: 409, reason: 'not_rollback_candidate' });
});

t.test('bounded: bundles for the newest N, records and entries capped', async (t) => {
  const h = new GenerationHistory<string>({ maxBundles: 3, maxRecords: 5, maxEntries: 4 });
  for (let g = 1; g <= 8; g++) {
    h.activated(g, `b${g}`);
    h.record({ operation: 'activate', generation: g, result: 'succeeded', time_unix_ms: g });
  }
  t.equal(statuses(h), '8:active 7:previous* 6:superseded* 5:superseded- 4:superseded-');
  t.same(h.checkRollback(5), { status: 409, reason: 'not_rollback_candidate' }, 'retained without a bundle');
  t.same(h.checkRollback(2), { status: 404, reason: 'generation_not_retained' });
  t.same(h.entries().map((e) => e.generation), [8, 7, 6, 5], 'newest first, capped');
  t.same(h.entries(7).map((e) => e.entry_id), [7]);
  t.equal(h.depth, 5);
});
