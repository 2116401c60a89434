// The node's lease service (docs/overload.md "One node, one set of limits"): the supervisor's
// owner of the lease ledger (lease-ledger.ts). It hears the workers' `lease` messages and their
// exits, sends the ledger's grants, runs the ledger's one timer, and hands the ledger the budgets
// of each committed generation. Budget families plug in as spec providers (`addBudgets`); the
// in-flight limits are the built-in one (`inflightBudgets`).
import type { ResolvedConfig } from '@edge-proxy/config';
import { backendBudgetKey, backendLimitBinds } from '@edge-proxy/ipc';
import type { LeaseAsk, LeaseGrant } from '@edge-proxy/ipc';
import { LeaseLedger } from './lease-ledger.ts';
import type { BudgetSpec, BudgetView, Outgoing } from './lease-ledger.ts';

type Config = ResolvedConfig['config'];

/** The budgets one family defines for a configuration (keys prefixed by the family). */
export type BudgetProvider = (config: Config) => ReadonlyMap<string, BudgetSpec>;

/**
 * The in-flight budgets of a configuration (docs/overload.md): `global` (limit `globalLimit`, the
 * node's adaptive limit in force, by default `global_inflight_limit`), and `upstream:<pool>` for
 * every pool when `per_upstream_inflight_limit` is below `global_inflight_limit` (at or above it the
 * global budget bounds every pool already; the workers then take no upstream slot either), and
 * `backend:<pool>/<id>` for every backend when `per_backend_inflight_limit` is below both
 * (`backendLimitBinds`, the function the workers decide by too).
 */
export function inflightBudgets(config: Config, globalLimit: number = config.performance.global_inflight_limit): Map<string, BudgetSpec> {
  const p = config.performance;
  const m = new Map<string, BudgetSpec>([['global', { kind: 'slots', limit: globalLimit }]]);
  if (p.per_upstream_inflight_limit < p.global_inflight_limit) for (const u of Object.values(config.upstream)) m.set(upstreamKey(u.name), { kind: 'slots', limit: p.per_upstream_inflight_limit });
  if (backendLimitBinds(p)) for (const u of Object.values(config.upstream)) for (const b of u.backends) m.set(backendBudgetKey(u.name, b.id), { kind: 'slots', limit: p.per_backend_inflight_limit });
  return m;
}

/** The budget key of pool `name`'s in-flight limit. */
export function upstreamKey(name: string): string {
  return `upstream:${name}`;
}

export interface LeaseServiceOptions {
  /** Workers of the node. */
  readonly workers: number;
  /** Sends one worker its grants (a `lease` notice). */
  readonly send: (worker: number, grants: LeaseGrant[]) => void;
  readonly now?: () => number;
  readonly ackMs?: number;
  readonly relaxMs?: number;
  /** The `global` budget's limit at a commit (the node's adaptive limit in force); default `global_inflight_limit`. */
  readonly globalLimit?: (config: Config) => number;
}

/** Lease traffic since start: messages (and entries) in each direction. */
export interface LeaseTraffic {
  readonly asksIn: number;
  readonly grantsOut: number;
}

export class LeaseService {
  private readonly ledger: LeaseLedger;
  private readonly send: (worker: number, grants: LeaseGrant[]) => void;
  private readonly now: () => number;
  private readonly providers: Map<string, BudgetProvider>;
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;
  private closed = false;
  private asksIn = 0;
  private grantsOut = 0;

  constructor(opts: LeaseServiceOptions) {
    this.ledger = new LeaseLedger({ workers: opts.workers, ...(opts.ackMs === undefined ? {} : { ackMs: opts.ackMs }), ...(opts.relaxMs === undefined ? {} : { relaxMs: opts.relaxMs }) });
    this.send = opts.send;
    this.now = opts.now ?? (() => performance.now());
    const globalLimit = opts.globalLimit;
    this.providers = new Map<string, BudgetProvider>([['inflight', globalLimit === undefined ? (c) => inflightBudgets(c) : (c) => inflightBudgets(c, globalLimit(c))]]);
  }

  /** Adds a budget family (its keys must not collide with another family's); applied at the next `configure`. */
  addBudgets(name: string, provider: BudgetProvider): void {
    this.providers.set(name, provider);
  }

  /** A generation was committed: its budgets hold node-wide from now (lowered limits revoke, raised ones serve waiting workers). */
  configure(config: Config): void {
    const specs = new Map<string, BudgetSpec>();
    for (const p of this.providers.values()) for (const [k, s] of p(config)) specs.set(k, s);
    this.dispatch(this.ledger.configure(specs, this.now()));
  }

  /** The node's adaptive limit moved: the `global` budget's limit from now (lowered: revokes; raised: serves waiting workers). */
  setGlobalLimit(limit: number): void {
    this.dispatch(this.ledger.setLimit('global', limit, this.now()));
  }

  /** A worker's `lease` message. */
  receive(worker: number, asks: readonly LeaseAsk[]): void {
    this.asksIn++;
    this.dispatch(this.ledger.ask(worker, asks, this.now()));
  }

  /** A worker exited: everything it held comes back to the node now (a re-forked worker starts empty). */
  workerGone(worker: number): void {
    this.dispatch(this.ledger.drop(worker, this.now()));
  }

  /** Every budget and each worker's part (the snapshot's `admission.leases`). */
  view(): BudgetView[] {
    return this.ledger.view();
  }

  traffic(): LeaseTraffic {
    return { asksIn: this.asksIn, grantsOut: this.grantsOut };
  }

  close(): void {
    this.closed = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private dispatch(out: Outgoing[]): void {
    for (const o of out) {
      if (o.grants.length === 0) continue;
      this.grantsOut++;
      this.send(o.worker, o.grants);
    }
    this.arm();
  }

  /** One timer, at the ledger's next due time. */
  private arm(): void {
    if (this.closed) return;
    const now = this.now();
    const due = this.ledger.nextDue();
    if (due === undefined) {
      if (this.timer !== undefined) clearTimeout(this.timer);
      this.timer = undefined;
      this.timerAt = Infinity;
      return;
    }
    if (this.timer !== undefined && this.timerAt <= due) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timerAt = due;
    this.timer = setTimeout(
      () => {
        this.timer = undefined;
        this.timerAt = Infinity;
        this.dispatch(this.ledger.tick(this.now()));
      },
      Math.max(0, due - now),
    );
    this.timer.unref();
  }
}
