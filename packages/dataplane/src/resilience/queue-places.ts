// Places in the route queues, counted for the node (docs/overload.md "Queue caps"): under a
// supervisor, `route_queue.global_cap` and each route's cap (`caps[route] ?? default_cap`) are slot
// budgets of its token ledger — `rq-global`, and `rq:<route>` per route — leased through the
// worker's token leases (token-lease.ts) the way the connection caps are. A request that must
// queue asks for one place of its route's budget and one of `rq-global`, all or none; it holds
// them while it waits in its worker's queue and gives them back as it leaves (admitted, timed out,
// gone), so at most `global_cap` requests wait on the node and at most a route's cap on that route,
// however the kernel spread them over workers. A place is granted only to the request waiting for
// it (a worker keeps none idle), so a request is refused only when the node's places are all held
// (or are on their way back in the same turn).
//
// A route queue is entered only at a limit, so the ask costs at most a round trip or two (the
// route's place first, then the global one) there and nothing on the path of a request admitted
// at once. Without a supervisor the queues count their own waiters (route-queue.ts).
import { PENDING, UNAVAILABLE } from './token-lease.ts';
import type { Lease, TokenLeases } from './token-lease.ts';

/** The token-ledger budgets of the queue caps (the supervisor's limits/token-service.ts names them the same). */
export const QUEUE_BUDGETS = { global: 'rq-global', routePrefix: 'rq:' } as const;

/** The budget of route `route`'s queue cap. */
export function queueBudget(route: string): string {
  return `${QUEUE_BUDGETS.routePrefix}${route}`;
}

/** What the node said to an ask for places: held (queue now), refused (the queue is full), or no answer in time. */
export type PlaceVerdict = 'granted' | 'full' | 'unavailable';

/** The places one waiting request holds: its route's, then the global one. */
export type Places = readonly Lease[];

/** The verdict of a token-lease answer (0: spent; seconds: refused; `UNAVAILABLE`). */
export function placeVerdict(v: number): PlaceVerdict {
  return v === 0 ? 'granted' : v === UNAVAILABLE ? 'unavailable' : 'full';
}

/** A worker's asks for queue places. */
export class QueuePlaces {
  private leases: TokenLeases | undefined;

  /** From now on the queue caps are the node's, leased through `leases` (the worker joined a supervisor). */
  join(leases: TokenLeases): void {
    this.leases = leases;
  }

  /** Whether the places are the node's (a supervisor leads them). */
  get leased(): boolean {
    return this.leases !== undefined;
  }

  /**
   * Takes a place of `route`'s queue and one of the global queue for a request. Returns the places
   * held (`granted`), or the verdict without waiting (`full`, `unavailable`), or undefined when
   * `done` will hear it once the supervisor answered (never synchronously). Only when `leased`.
   */
  take(route: string, now: number, done: (v: PlaceVerdict, places: Places) => void): Places | 'full' | 'unavailable' | undefined {
    const leases = this.leases as TokenLeases;
    // The route's first: a route at its cap is refused without touching the global budget.
    const list = [leases.lease(queueBudget(route), '', now, true), leases.lease(QUEUE_BUDGETS.global, '', now, true)];
    const v = leases.takeAll(list, now);
    if (v === PENDING) {
      leases.wait(list, (x) => done(placeVerdict(x), list));
      return undefined;
    }
    if (v === 0) return list;
    return v === UNAVAILABLE ? 'unavailable' : 'full';
  }

  /** Gives places taken by `take` back to the node (with this turn's message). */
  release(places: Places, now: number): void {
    const leases = this.leases;
    if (leases === undefined) return;
    for (const l of places) leases.release(l, now);
  }
}
