// The supervisor's side of the token budgets (docs/overload.md "Token budgets"): the node's token
// ledger (token-ledger.ts) fed by the workers' `tokens` messages and answering each with one
// `token-grants` notice; the budgets of the active generation (scoped rate limits, the connection
// caps) configured at every activation; a worker's holdings dropped when it exits; idle buckets
// swept. The ledger is pure; this owns the clock, the one sweep timer and the IPC.
import type { ResolvedConfig } from '@edge-proxy/config';
import type { FromWorker, ToWorker, TokenGrant } from '@edge-proxy/ipc';
import { TokenLedger } from './token-ledger.ts';
import type { TokenBudgetView, TokenLimit } from './token-ledger.ts';

/** How often full, unheld buckets are dropped, ms. */
const SWEEP_MS = 10_000;

/** The token-ledger budget of rate limit `name` (the data plane's `rateLimitBudget`). */
export function rateLimitBudget(name: string): string {
  return `rl:${name}`;
}

/** The connection-cap budgets (the data plane's `CONNECTION_BUDGETS`). */
export const CONNECTION_BUDGETS = { cap: 'conn', source: 'conn-src', rate: 'conn-rate' } as const;

/** The queue-cap budgets (the data plane's `QUEUE_BUDGETS`, resilience/queue-places.ts): `rq-global`, and `rq:<route>` per route. */
export const QUEUE_BUDGETS = { global: 'rq-global', routePrefix: 'rq:' } as const;

/**
 * The token budgets of `config`: every scoped rate limit, the three connection caps, and the route
 * queues' places (slots held while a request waits: `rq-global` of `global_cap`, and each route's of
 * `caps[route] ?? default_cap`; a cap of 0 has none, its worker refuses without asking).
 */
export function tokenBudgets(config: ResolvedConfig['config']): Map<string, TokenLimit> {
  const out = new Map<string, TokenLimit>();
  for (const rl of config.resilience.rate_limits) out.set(rateLimitBudget(rl.name), { rate: rl.requests_per_second, burst: rl.burst });
  const p = config.performance;
  out.set(CONNECTION_BUDGETS.cap, { rate: 0, burst: p.max_connections });
  out.set(CONNECTION_BUDGETS.source, { rate: 0, burst: p.max_connections_per_source });
  out.set(CONNECTION_BUDGETS.rate, { rate: p.new_connections_per_sec, burst: p.new_connections_burst });
  const q = config.resilience.route_queue;
  if (q.global_cap > 0) out.set(QUEUE_BUDGETS.global, { rate: 0, burst: q.global_cap });
  for (const u of Object.values(config.upstream)) {
    const cap = q.caps[u.name] ?? q.default_cap;
    if (cap > 0) out.set(`${QUEUE_BUDGETS.routePrefix}${u.name}`, { rate: 0, burst: cap });
  }
  return out;
}

export interface TokenServiceOptions {
  /** Sends a notice to one worker. */
  readonly send: (worker: number, notice: Extract<ToWorker, { type: 'token-grants' }>) => void;
  /** A monotonic clock, ms. */
  readonly now?: () => number;
}

export class TokenService {
  readonly ledger = new TokenLedger();
  private readonly send: TokenServiceOptions['send'];
  private readonly now: () => number;
  private readonly sweeper: NodeJS.Timeout;
  /** `tokens` messages received (the lease traffic of the token budgets). */
  messages = 0;
  /** `token-grants` notices sent. */
  answers = 0;

  constructor(o: TokenServiceOptions) {
    this.send = o.send;
    this.now = o.now ?? (() => performance.now());
    this.sweeper = setInterval(() => this.ledger.sweep(this.now()), SWEEP_MS);
    this.sweeper.unref();
  }

  /** The budgets of the generation just activated, for `workers` workers. */
  configure(resolved: ResolvedConfig, workers: number): void {
    this.ledger.configure(tokenBudgets(resolved.config), workers);
  }

  /** One worker's `tokens` message: settles first (their units serve the asks), then one answer per ask, in one notice. */
  receive(worker: number, m: Extract<FromWorker, { type: 'tokens' }>): void {
    this.messages++;
    const now = this.now();
    for (const s of m.settles) this.ledger.settle(worker, s.budget, s.key, s.unused, s.forget, now);
    if (m.asks.length === 0) return;
    const grants: TokenGrant[] = m.asks.map((a) => ({ budget: a.budget, key: a.key, ...this.ledger.ask(worker, a.budget, a.key, a.want, a.waiting, a.holding, now) }));
    this.answers++;
    this.send(worker, { type: 'token-grants', grants });
  }

  /** Every budget's contract, keys and holdings (the snapshot's `admission.token_budgets`). */
  view(): TokenBudgetView[] {
    return this.ledger.views();
  }

  /** Worker `worker` exited: its tokens count as spent, its slots (connections) come back. */
  workerGone(worker: number): void {
    this.ledger.dropWorker(worker, this.now());
  }

  close(): void {
    clearInterval(this.sweeper);
  }
}
