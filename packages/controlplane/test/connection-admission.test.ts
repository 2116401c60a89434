// The displacement policy of the control API's connection limits, table-driven (no sockets).
import t from 'tap';
import { admitConnection } from '../src/net/connection-admission.ts';
import type { ConnectionView } from '../src/net/connection-admission.ts';

const c = (id: number, source: string, openedAt: number, proven = false): ConnectionView => ({ id, source, openedAt, proven });
const limits = { maxConnections: 4, maxPerSource: 2 };

const cases: [string, ConnectionView[], string, ReturnType<typeof admitConnection>][] = [
  ['room left: admitted, nobody displaced', [c(1, 'a', 1)], 'b', { admit: true }],
  ['per-source limit: the source pays with its oldest unproven', [c(1, 'a', 5), c(2, 'a', 3)], 'a', { admit: true, evict: 2, limit: 'per_source' }],
  ['per-source limit, oldest proven: the next oldest unproven goes', [c(1, 'a', 1, true), c(2, 'a', 3)], 'a', { admit: true, evict: 2, limit: 'per_source' }],
  ['per-source limit, all proven: dropped', [c(1, 'a', 1, true), c(2, 'a', 3, true)], 'a', { admit: false, limit: 'per_source' }],
  ['global limit: the largest source pays, not the oldest connection overall', [c(1, 'b', 1), c(2, 'a', 2), c(3, 'a', 3), c(4, 'c', 0)], 'd', { admit: true, evict: 2, limit: 'global' }],
  ['global limit, largest source all proven: the next source pays', [c(1, 'a', 1, true), c(2, 'a', 2, true), c(3, 'b', 3), c(4, 'c', 4, true)], 'd', { admit: true, evict: 3, limit: 'global' }],
  ['global limit, everyone proven: dropped', [c(1, 'a', 1, true), c(2, 'b', 2, true), c(3, 'c', 3, true), c(4, 'd', 4, true)], 'e', { admit: false, limit: 'global' }],
  ['equal ages: the lower id goes', [c(7, 'a', 1), c(3, 'a', 1)], 'a', { admit: true, evict: 3, limit: 'per_source' }],
];

for (const [name, open, source, want] of cases) {
  t.test(name, async (t) => {
    t.same(admitConnection(open, source, limits), want);
  });
}
