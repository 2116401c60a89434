// Route queues: FIFO per route, caps, O(1) cancel, round-robin drain, expiry on one timer.
// A fake clock drives `expireDue` directly; the timer itself is checked with real short waits
// that await the expire callback (no sleeps used as synchronisation).
import t from 'tap';
import { RouteQueues } from '../src/resilience/route-queue.ts';
import type { QueueSlot, QueueTimer, Waiter } from '../src/resilience/route-queue.ts';

class W implements Waiter {
  readonly route: string;
  readonly name: string;
  queuedAt = -1;
  queueSlot: QueueSlot | null = null;
  expiredAt = -1;
  private readonly log: string[];
  admitHook: (() => void) | undefined;
  expireHook: (() => void) | undefined;

  constructor(log: string[], route: string, name: string) {
    this.log = log;
    this.route = route;
    this.name = name;
  }

  onAdmit(): void {
    this.log.push(`admit ${this.name}`);
    this.admitHook?.();
  }

  onExpire(): void {
    this.log.push(`expire ${this.name}`);
    this.expireHook?.();
  }
}

function setup(start = 0) {
  const clock = { now: start };
  const q = new RouteQueues(() => clock.now);
  const log: string[] = [];
  const w = (route: string, name: string) => new W(log, route, name);
  const put = (route: string, name: string, maxWaitMs = 1000): W => {
    const x = w(route, name);
    if (!q.enqueue(x, 100, 1000, maxWaitMs)) throw new Error(`${name} not queued`);
    return x;
  };
  // Admits up to `n` waiters (a budget of freed slots), then refuses.
  const budget = (n: number) => (): boolean => n-- > 0;
  return { clock, q, log, w, put, budget };
}

t.test('FIFO per route; a full round that admits nothing stops the drain', async (t) => {
  const { q, log, put, budget } = setup();
  put('a', 'a1');
  put('a', 'a2');
  put('a', 'a3');
  t.equal(q.depth('a'), 3);
  t.ok(q.hasWaiters('a'));
  t.notOk(q.hasWaiters('b'), 'a new request of b may go ahead');
  q.drain(budget(2));
  t.same(log, ['admit a1', 'admit a2']);
  t.equal(q.depth('a'), 1);
  let calls = 0;
  q.drain(() => (calls++, false));
  t.equal(calls, 1, 'a refused head is asked once per drain');
  q.drain(budget(5));
  t.same(log, ['admit a1', 'admit a2', 'admit a3']);
  t.equal(q.total, 0);
  t.notOk(q.hasWaiters('a'));
  q.drain(() => t.fail('nothing to ask'));
  q.close();
});

t.test('caps: per-route cap, global cap, cap 0 is always full; live values per enqueue', async (t) => {
  const { q, w } = setup();
  t.equal(q.enqueue(w('a', 'a1'), 2, 3, 1000), true);
  t.equal(q.enqueue(w('a', 'a2'), 2, 3, 1000), true);
  t.equal(q.enqueue(w('a', 'a3'), 2, 3, 1000), false, 'route cap 2 reached');
  t.equal(q.enqueue(w('a', 'a3'), 3, 3, 1000), true, 'a raised cap applies to the next enqueue');
  t.equal(q.enqueue(w('b', 'b1'), 2, 3, 1000), false, 'global cap 3 reached');
  t.equal(q.enqueue(w('b', 'b1'), 2, 4, 1000), true);
  t.equal(q.enqueue(w('c', 'c1'), 0, 100, 1000), false, 'cap 0: shed at once');
  t.equal(q.enqueue(w('a', 'a4'), 1, 100, 1000), false, 'a lowered cap refuses newcomers, keeps the queued');
  t.equal(q.depth('a'), 3);
  t.equal(q.total, 4);
  t.same(q.depths(), { a: 3, b: 1 });
  const x = w('d', 'd1');
  t.equal(q.enqueue(x, 5, 100, 1000), true);
  t.equal(q.enqueue(x, 5, 100, 1000), true, 'queued twice: stays where it is');
  t.equal(q.depth('d'), 1);
  q.close();
  t.equal(q.enqueue(w('e', 'e1'), 5, 100, 1000), false, 'closed: refuses');
  t.equal(q.total, 5, 'close expires nobody');
});

t.test('cancel at head, middle and tail keeps the order of the others; cancelling twice is a no-op', async (t) => {
  const { q, log, put } = setup();
  const ws = ['1', '2', '3', '4', '5'].map((n) => put('a', `a${n}`));
  t.equal(q.cancel(ws[2] as W), true, 'middle');
  t.equal(q.cancel(ws[0] as W), true, 'head');
  t.equal(q.cancel(ws[4] as W), true, 'tail');
  t.equal(q.cancel(ws[4] as W), false, 'again');
  t.equal(q.depth('a'), 2);
  t.equal(q.total, 2);
  q.drain(() => true);
  t.same(log, ['admit a2', 'admit a4'], 'cancelled waiters are not called back');
  // A cancelled waiter can queue again, at the tail, with its slot reused.
  const again = ws[0] as W;
  const slot = again.queueSlot;
  put('a', 'x');
  t.equal(q.enqueue(again, 10, 10, 1000), true);
  t.equal(again.queueSlot, slot, 'the slot is allocated once per waiter');
  q.drain(() => true);
  t.same(log.slice(2), ['admit x', 'admit a1']);
  t.equal(q.cancel(new W([], 'z', 'never')), false, 'never queued');
  q.close();
});

t.test('round-robin across routes, within one drain and across drains', async (t) => {
  const { q, log, put, budget } = setup();
  for (const n of [1, 2, 3]) put('a', `a${n}`);
  for (const n of [1, 2, 3]) put('b', `b${n}`);
  put('c', 'c1');
  q.drain(() => true);
  t.same(log, ['admit a1', 'admit b1', 'admit c1', 'admit a2', 'admit b2', 'admit a3', 'admit b3']);
  log.length = 0;
  // One freed slot per drain (the usual case): routes still take turns.
  for (const n of [4, 5, 6]) put('a', `a${n}`);
  for (const n of [4, 5, 6]) put('b', `b${n}`);
  for (let i = 0; i < 6; i++) q.drain(budget(1));
  t.same(log, ['admit a4', 'admit b4', 'admit a5', 'admit b5', 'admit a6', 'admit b6']);
  q.close();
});

t.test('a route whose head is refused stops; the others go on; no overtaking inside a route', async (t) => {
  const { q, log, put } = setup();
  put('a', 'a1');
  put('a', 'a2');
  put('b', 'b1');
  put('b', 'b2');
  // Upstream of route a is full: its head is refused, and a2 must not be asked in its place.
  const asked: string[] = [];
  q.drain((x) => (asked.push((x as W).name), x.route !== 'a'));
  t.same(asked, ['a1', 'b1', 'b2'], 'a asked once, b served until empty');
  t.same(log, ['admit b1', 'admit b2']);
  t.same(q.depths(), { a: 2 });
  q.close();
});

t.test('re-entrancy: onAdmit that enqueues, cancels, or frees slots (nested drain)', async (t) => {
  const { q, log, w, put } = setup();
  const a1 = put('a', 'a1');
  const a2 = put('a', 'a2');
  put('a', 'a3');
  put('b', 'b1');
  let slots = 1;
  const take = (): boolean => (slots > 0 ? (slots--, true) : false);
  // a1's admission cancels a2 (its client went away) and queues c1.
  a1.admitHook = () => {
    q.cancel(a2);
    t.equal(q.enqueue(w('c', 'c1'), 10, 10, 1000), true);
  };
  q.drain(take);
  t.same(log, ['admit a1']);
  t.same(q.depths(), { a: 1, b: 1, c: 1 });
  // The route that became non-empty during the drain joined last in the round order (b, a, c).
  log.length = 0;
  q.drain(() => true);
  t.same(log, ['admit b1', 'admit a3', 'admit c1']);
  t.equal(q.total, 0);
  q.close();
});

t.test('re-entrancy: a drain started from onAdmit is folded in, and refused routes are asked again', async (t) => {
  const { q, log, put } = setup();
  put('a', 'a1');
  const b1 = put('b', 'b1');
  let slots = 0;
  const asked: string[] = [];
  // Route a needs a global slot (none free); route b's request does not (say it is answered
  // from elsewhere) and, admitted, ends at once and frees a slot, then drains again.
  const tryAdmit = (x: Waiter): boolean => {
    asked.push((x as W).name);
    if (x.route === 'b') return true;
    return slots > 0 ? (slots--, true) : false;
  };
  b1.admitHook = () => {
    slots++;
    q.drain(tryAdmit);
  };
  q.drain(tryAdmit);
  t.same(asked, ['a1', 'b1', 'a1'], 'a1 refused, b1 admitted, a1 asked again after the nested drain');
  t.same(log, ['admit b1', 'admit a1']);
  t.equal(q.total, 0);
  q.close();
});

t.test('re-entrancy: tryAdmit that cancels the waiter it admits still tells it, and the queue stays consistent', async (t) => {
  const { q, log, put } = setup();
  const a1 = put('a', 'a1');
  put('a', 'a2');
  q.drain((x) => {
    if (x === a1) q.cancel(a1);
    return true;
  });
  t.same(log, ['admit a1', 'admit a2']);
  t.equal(q.total, 0);
  q.close();
});

t.test('expiry (fake clock): earliest deadline first, only those due, onExpire after leaving the queue', async (t) => {
  const { clock, q, log, put } = setup(1000);
  const a1 = put('a', 'a1', 100); // due 1100
  clock.now = 1010;
  put('b', 'b1', 100); // due 1110
  clock.now = 1020;
  put('a', 'a2', 50); // max_wait_ms lowered by an activation: due 1070, before a1
  a1.expireHook = () => t.equal(a1.queueSlot?.fifo, null, 'left the queue before its callback');
  clock.now = 1069;
  q.expireDue();
  t.same(log, []);
  clock.now = 1100;
  q.expireDue();
  t.same(log, ['expire a2', 'expire a1']);
  t.equal(a1.queuedAt, 1000);
  t.same(q.depths(), { b: 1 });
  clock.now = 5000;
  q.expireDue();
  t.same(log, ['expire a2', 'expire a1', 'expire b1']);
  t.equal(q.total, 0);
  q.close();
});

t.test('the one timer is armed at the earliest deadline, re-armed after each expiry, never per waiter', async (t) => {
  const clock = { now: 0 };
  const armed: { fn: () => void; delay: number; cleared: boolean }[] = [];
  const timers: QueueTimer = {
    set(fn, delay) {
      const h = { fn, delay, cleared: false };
      armed.push(h);
      return h;
    },
    clear(h) {
      (h as { cleared: boolean }).cleared = true;
    },
  };
  const fire = (at: number) => {
    clock.now = at;
    const h = armed.at(-1)!;
    t.notOk(h.cleared, `the live timer fires at ${at}`);
    h.fn();
  };
  const q = new RouteQueues(() => clock.now, timers);
  const log: string[] = [];
  q.enqueue(new W(log, 'a', 'a1'), 10, 10, 100); // due 100
  t.same(armed.map((h) => h.delay), [100]);
  clock.now = 10;
  const b1 = new W(log, 'b', 'b1');
  q.enqueue(b1, 10, 10, 100); // due 110: later than the armed one, no new timer
  t.equal(armed.length, 1);
  clock.now = 20.5;
  q.enqueue(new W(log, 'a', 'a2'), 10, 10, 49); // due 69.5: earlier, re-armed (rounded up)
  t.same(armed.map((h) => [h.delay, h.cleared]), [[100, true], [49, false]]);
  fire(69.5);
  t.same(log, ['expire a2']);
  t.equal(armed.at(-1)!.delay, 31, 're-armed for a1 (due 100)');
  fire(99.5); // Node rounds to whole ms: the timer may fire a little before the deadline
  t.same(log, ['expire a2'], 'nothing expired early');
  t.equal(armed.at(-1)!.delay, 1, 're-armed for the remainder');
  fire(100);
  t.same(log, ['expire a2', 'expire a1']);
  t.equal(armed.at(-1)!.delay, 10, 're-armed for b1');
  const count = armed.length;
  q.drain(() => true);
  t.equal(armed.length, count, 'an admission does not re-arm');
  fire(110);
  t.same(log, ['expire a2', 'expire a1', 'admit b1']);
  t.equal(armed.length, count, 'nothing queued: no timer');
  q.enqueue(new W(log, 'c', 'c1'), 10, 10, 5);
  q.close();
  t.equal(armed.at(-1)!.cleared, true, 'close clears the timer');
});

t.test('expiry (real timer): waiters expire in deadline order, a few ms late', async (t) => {
  const q = new RouteQueues();
  const log: string[] = [];
  const lateness: number[] = [];
  const expired = (n: number) => new Promise<void>((resolve) => {
    let left = n;
    for (const x of ws) {
      x.expireHook = () => {
        lateness.push(performance.now() - (x.queuedAt + waits.get(x)!));
        if (--left === 0) resolve();
      };
    }
  });
  const waits = new Map<W, number>();
  const ws: W[] = [];
  const add = (route: string, name: string, wait: number) => {
    const x = new W(log, route, name);
    waits.set(x, wait);
    ws.push(x);
    t.equal(q.enqueue(x, 10, 10, wait), true);
    return x;
  };
  add('a', 'a1', 60);
  add('b', 'b1', 20);
  add('a', 'a2', 40);
  const gone = add('b', 'b2', 30);
  const done = expired(3);
  q.cancel(gone);
  // The queue's timer is unref'd (a worker's sockets keep the process alive, not its queues):
  // hold the loop open meanwhile. This timer only keeps the process alive; it synchronises nothing.
  const keep = setTimeout(() => t.fail('no expiry within 5 s'), 5000);
  await done;
  clearTimeout(keep);
  t.same(log, ['expire b1', 'expire a2', 'expire a1']);
  t.equal(q.total, 0);
  // The design bound (≤ 1 ms plus the event loop's own delay) is checked with the fake timer
  // above; on a shared, loaded test machine the loop itself can be tens of ms late, so this only
  // checks that the real timer is the one doing it (timing claims live in benchmarks).
  for (const l of lateness) {
    t.ok(l >= 0, `not early (${l.toFixed(2)} ms)`);
    t.ok(l <= 100, `late by ${l.toFixed(2)} ms`);
  }
  q.close();
});

t.test('close clears the timer: nobody expires after it', async (t) => {
  const q = new RouteQueues();
  const log: string[] = [];
  const x = new W(log, 'a', 'a1');
  q.enqueue(x, 10, 10, 5);
  q.close();
  // A second queue's waiter, due later than x, proves time has passed x's deadline.
  const q2 = new RouteQueues();
  const y = new W(log, 'a', 'y');
  const keep = setTimeout(() => t.fail('no expiry within 5 s'), 5000);
  await new Promise<void>((resolve) => {
    y.expireHook = resolve;
    q2.enqueue(y, 10, 10, 30);
  });
  clearTimeout(keep);
  t.same(log, ['expire y']);
  t.equal(q.total, 1, 'still queued: the caller answers it');
  q2.close();
});

// Random operations against invariants, seeded so that a failure replays: FIFO per route, each
// waiter called back at most once and never after a cancel, counts consistent, a drain stops
// only when every route left with waiters had its head refused, expiry takes exactly the due
// waiters in deadline order.
t.test('random operations keep the invariants', async (t) => {
  for (const seed of [1, 2, 3, 4, 5]) {
    let x = seed * 2654435761;
    const rnd = (n: number): number => {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      return (x >>> 0) % n;
    };
    const clock = { now: 0 };
    const q = new RouteQueues(() => clock.now, { set: () => 0, clear: () => undefined });
    const log: string[] = [];
    const routes = ['a', 'b', 'c'];
    const model = new Map<string, W[]>(routes.map((r) => [r, []]));
    const deadlines = new Map<W, number>();
    const done = new Set<W>();
    const all: W[] = [];
    let problems = 0;
    const fail = (msg: string) => {
      if (problems++ < 5) t.fail(`seed ${seed}: ${msg}`);
    };
    const remove = (w: W) => {
      const list = model.get(w.route)!;
      const i = list.indexOf(w);
      if (i >= 0) list.splice(i, 1);
      return i;
    };
    for (let op = 0; op < 3000; op++) {
      clock.now += rnd(5);
      const kind = rnd(10);
      if (kind < 5) {
        const r = routes[rnd(3)]!;
        const w = new W(log, r, `${r}${op}`);
        w.admitHook = () => {
          if (done.has(w)) fail(`${w.name} called back twice`);
          done.add(w);
          if (remove(w) !== 0) fail(`${w.name} admitted out of FIFO order`);
        };
        w.expireHook = () => {
          if (done.has(w)) fail(`${w.name} called back twice`);
          done.add(w);
          remove(w);
        };
        all.push(w);
        const cap = rnd(5);
        const globalCap = rnd(9);
        const wait = 1 + rnd(60);
        const total = [...model.values()].reduce((s, l) => s + l.length, 0);
        const expect = model.get(r)!.length < cap && total < globalCap;
        if (q.enqueue(w, cap, globalCap, wait) !== expect) fail(`enqueue ${w.name} ≠ ${expect}`);
        if (expect) {
          model.get(r)!.push(w);
          deadlines.set(w, clock.now + wait);
        }
      } else if (kind < 7 && all.length > 0) {
        const w = all[rnd(all.length)]!;
        const queued = remove(w) >= 0;
        if (q.cancel(w) !== queued) fail(`cancel ${w.name} ≠ ${queued}`);
        if (queued) done.add(w); // any later callback is a defect
      } else if (kind < 9) {
        const open = new Set(routes.filter(() => rnd(2) === 0));
        let budget = rnd(4);
        const refused = new Set<string>();
        q.drain((w) => {
          if (model.get(w.route)![0] !== w) fail(`${(w as W).name} asked but not the head`);
          if (open.has(w.route) && budget > 0) {
            budget--;
            return true;
          }
          refused.add(w.route);
          return false;
        });
        for (const r of routes) if (model.get(r)!.length > 0 && !refused.has(r)) fail(`drain stopped with ${r}'s head never refused`);
      } else {
        const due = [...deadlines].filter(([w, d]) => d <= clock.now && model.get(w.route)!.includes(w)).map(([w]) => w);
        const before = log.length;
        q.expireDue();
        const expired = log.slice(before).map((l) => l.slice('expire '.length));
        if (expired.length !== due.length) fail(`${expired.length} expired, ${due.length} due`);
        const ds = expired.map((n) => deadlines.get(all.find((w) => w.name === n)!)!);
        for (let i = 1; i < ds.length; i++) if (ds[i]! < ds[i - 1]!) fail('expired out of deadline order');
      }
      const total = [...model.values()].reduce((s, l) => s + l.length, 0);
      if (q.total !== total) fail(`total ${q.total} ≠ ${total}`);
      for (const r of routes) if (q.depth(r) !== model.get(r)!.length) fail(`depth ${r}`);
    }
    t.equal(problems, 0, `seed ${seed}: no invariant broken`);
    q.close();
  }
});
