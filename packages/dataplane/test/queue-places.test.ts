// A worker's asks for the node's route-queue places (resilience/queue-places.ts, docs/overload.md
// "Queue caps") over its token leases, on a fake clock and a fake channel: the route's place asked
// first and the global one after it, all or none; a refusal asks nothing more and is remembered for
// a millisecond; a refused second place gives the first back; the supervisor's silence past the
// wait; places given back one of each.
import t from 'tap';
import { LEASE_WAIT_MS } from '../src/resilience/token-lease.ts';
import { QUEUE_BUDGETS, QueuePlaces, placeVerdict, queueBudget } from '../src/resilience/queue-places.ts';
import type { PlaceVerdict, Places } from '../src/resilience/queue-places.ts';
import { harness } from './support/token-leases.ts';
import type { Harness } from './support/token-leases.ts';

const RQ_A = queueBudget('a');

/** Places leased through a harness, and what each pending take heard. */
function setup(): { h: Harness; places: QueuePlaces; heard: { v: PlaceVerdict; places: Places }[]; take: (route?: string) => ReturnType<QueuePlaces['take']> } {
  const h = harness();
  const places = new QueuePlaces();
  places.join(h.leases);
  const heard: { v: PlaceVerdict; places: Places }[] = [];
  return { h, places, heard, take: (route = 'a') => places.take(route, h.now(), (v, p) => heard.push({ v, places: p })) };
}

/** The asks of the last message, as `budget want/waiting`. */
const asks = (h: Harness): string[] => (h.sent.at(-1)?.asks ?? []).map((a) => `${a.budget} ${a.want}/${a.waiting}`);

t.test('budget names: rq-global and rq:<route> (the supervisor names them the same: limits/token-service.ts)', async (t) => {
  t.equal(QUEUE_BUDGETS.global, 'rq-global');
  t.equal(queueBudget('api'), 'rq:api');
  t.equal(new QueuePlaces().leased, false, 'not leased before the worker joins a supervisor');
});

t.test('the verdict of a token-lease answer', async (t) => {
  t.same([0, 1, 5, -2].map(placeVerdict), ['granted', 'full', 'full', 'unavailable']);
});

t.test("granted: the route's place asked first, then the global one; the request holds one of each", async (t) => {
  const { h, heard, take } = setup();
  t.equal(take(), undefined, 'no place held: the answer comes later');
  t.equal(h.sent.length, 0, 'nothing sent before the end of the turn');
  h.turn();
  t.same(asks(h), [`${RQ_A} 1/1`], "one ask, for the route's place only");
  h.leases.granted([{ budget: RQ_A, key: '', granted: 1, waitMs: 0, block: 1 }]);
  t.same(heard, [], 'not decided on one place of two');
  h.turn();
  t.same(asks(h), ['rq-global 1/1'], 'then the global place');
  h.leases.granted([{ budget: 'rq-global', key: '', granted: 1, waitMs: 0, block: 1 }]);
  t.equal(heard.length, 1);
  t.equal(heard[0]?.v, 'granted');
  t.same(heard[0]?.places.map((l) => [l.budget, l.inUse, l.tokens]), [[RQ_A, 1, 0], ['rq-global', 1, 0]], 'one of each in use, none idle');
  t.equal(h.sent.length, 2, 'two messages in all');
});

t.test('the requests of one turn on one route: one ask sized to them', async (t) => {
  const { h, take } = setup();
  t.equal(take(), undefined);
  t.equal(take(), undefined);
  t.equal(take('b'), undefined);
  h.turn();
  t.same(asks(h), [`${RQ_A} 2/2`, 'rq:b 1/1'], 'one message: two places wanted and waiting on a, one on b');
});

t.test("refused the route's place: 503 queue_full, the global budget never asked; the worker refuses the route locally for a millisecond", async (t) => {
  const { h, heard, take } = setup();
  take();
  h.turn();
  h.leases.granted([{ budget: RQ_A, key: '', granted: 0, waitMs: 1, block: 1 }]);
  t.same(heard.map((x) => x.v), ['full']);
  h.turn();
  t.equal(h.sent.length, 1, 'nothing more sent');
  t.equal(take(), 'full', 'within the millisecond: refused at once');
  h.turn();
  t.equal(h.sent.length, 1, 'without asking');
  h.advance(1);
  t.equal(take(), undefined, 'after it: asked again');
  h.turn();
  t.same(asks(h), [`${RQ_A} 1/1`]);
});

t.test("refused the global place: the route's place goes back to the node", async (t) => {
  const { h, heard, take } = setup();
  take();
  h.turn();
  h.leases.granted([{ budget: RQ_A, key: '', granted: 1, waitMs: 0, block: 1 }]);
  h.turn();
  h.leases.granted([{ budget: 'rq-global', key: '', granted: 0, waitMs: 1, block: 1 }]);
  t.same(heard.map((x) => x.v), ['full']);
  h.turn();
  t.same(h.sent.at(-1)?.settles, [{ budget: RQ_A, key: '', unused: 1, forget: false }], 'the one place of the route given back');
});

t.test('held places: taken at once, nothing asked; released, one of each goes back', async (t) => {
  const { h, places, heard, take } = setup();
  take();
  h.turn();
  h.leases.granted([{ budget: RQ_A, key: '', granted: 1, waitMs: 0, block: 1 }]);
  h.turn();
  h.leases.granted([{ budget: 'rq-global', key: '', granted: 1, waitMs: 0, block: 1 }]);
  const held = heard[0]?.places as Places;
  places.release(held, h.now());
  h.turn();
  t.same(h.sent.at(-1)?.settles, [{ budget: RQ_A, key: '', unused: 1, forget: false }, { budget: 'rq-global', key: '', unused: 1, forget: false }], 'one of each given back');
  t.same(held.map((l) => l.inUse), [0, 0]);
  places.release(held, h.now());
  h.turn();
  t.equal(h.sent.at(-1)?.settles.length, 2, 'a second release gives nothing back');
  // A grant that came for nobody (late) is held idle: the next request takes it without asking.
  h.leases.granted([{ budget: RQ_A, key: '', granted: 1, waitMs: 0, block: 1 }, { budget: 'rq-global', key: '', granted: 1, waitMs: 0, block: 1 }]);
  const sent = h.sent.length;
  const now = take();
  t.ok(Array.isArray(now), 'places held by the worker: taken at once');
  h.turn();
  t.equal(h.sent.length, sent, 'nothing sent');
});

t.test('the supervisor silent past the wait: unavailable, and so is the next request while the ask stays unanswered', async (t) => {
  const { h, heard, take } = setup();
  take();
  h.turn();
  h.advance(LEASE_WAIT_MS - 1);
  t.same(heard, [], 'still waiting 1 ms before the wait ends');
  h.advance(1);
  h.turn();
  t.same(heard.map((x) => x.v), ['unavailable']);
  t.equal(take(), 'unavailable', 'the next one: at once');
});
