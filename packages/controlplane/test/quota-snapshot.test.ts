// The snapshot's quota summary merges the workers' views conservatively (the worst worker wins).
import t from 'tap';
import { quotaSummary } from '../src/supervisor/quota-snapshot.ts';

t.test('quota off: the configured store, disabled', async (t) => {
  t.same(quotaSummary([], { enabled: false, backend: 'redis' }), { backend_mode: 'distributed', availability: 'disabled' });
  t.same(quotaSummary([{ backend_mode: 'local', availability: 'disabled' }], { enabled: false, backend: 'local' }), { backend_mode: 'local', availability: 'disabled' });
});

t.test('no heartbeat yet: a local store is available, a Redis one not known to answer', async (t) => {
  t.same(quotaSummary([], { enabled: true, backend: 'local' }), { backend_mode: 'local', availability: 'available' });
  t.same(quotaSummary([], { enabled: true, backend: 'redis' }), { backend_mode: 'distributed', availability: 'unavailable' });
});

t.test('one worker on its local fallback makes the node local_fallback and degraded', async (t) => {
  const ok = { backend_mode: 'distributed', availability: 'available' } as const;
  t.same(quotaSummary([ok, ok], { enabled: true, backend: 'redis' }), ok);
  t.same(quotaSummary([ok, { backend_mode: 'local_fallback', availability: 'degraded' }], { enabled: true, backend: 'redis' }), { backend_mode: 'local_fallback', availability: 'degraded' });
  t.same(quotaSummary([{ backend_mode: 'distributed', availability: 'unavailable' }, ok], { enabled: true, backend: 'redis' }), { backend_mode: 'distributed', availability: 'unavailable' });
});
