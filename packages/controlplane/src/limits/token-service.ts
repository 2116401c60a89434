// The supervisor's side of the token budgets (docs/overload.md "Token budgets"): the node's token
// ledger (token-ledger.ts) fed by the workers' `tokens` messages and answering each with one
// `token-grants` notice; the budgets of the active generation (scoped rate limits, the connection
// caps) configured at every activation; a worker's holdings dropped when it exits; idle buckets
// swept. The ledger is pure; this owns the clock, the one sweep timer and the IPC.
// Window budgets (each route's retry budget: window-ledger.ts) travel in the same messages: their
// asks and settles go to the window ledger, their deposits (primaries) too.
import type { ResolvedConfig } from '@edge-proxy/config';
import { hostClockMs } from '@edge-proxy/ipc';
import type { FromWorker, ToWorker, TokenGrant } from '@edge-proxy/ipc';
import { TokenLedger } from './token-ledger.ts';
import { WindowLedger } from './window-ledger.ts';
import type { WindowBudgetView, WindowLimit } from './window-ledger.ts';
import type { TokenBudgetView, TokenLimit } from './token-ledger.ts';

/** How often full, unheld buckets are dropped, ms. */
const SWEEP_MS = 10_000;

/** The token-ledger budget of rate limit `name` (the data plane's `rateLimitBudget`). */
export function rateLimitBudget(name: string): string {
  return `rl:${name}`;
}

/** The window budget of route `route`'s retries (the data plane's `retryBudget`); its one key is ''. */
export function retryBudget(route: string): string {
  return `retry:${route}`;
}

/**
 * The retry budget's floor, retries per window per route for the node whatever its traffic
 * (the data plane's `MIN_RETRIES_PER_WINDOW`), and its window: ten buckets of 1 s.
 */
export const RETRY_FLOOR = 30;
export const RETRY_WINDOW = { buckets: 10, bucketMs: 1000 } as const;

/** The window budget of quota policy `policy`'s `kind` contract (the data plane's `quotaBudget`); keys: the counter keys. */
export function quotaBudget(policy: string, kind: string): string {
  return `quota:${policy}:${kind}`;
}

/**
 * The window budgets of `config`: each route's retry budget (floor 30 per 10 s window plus
 * `per_route_ratio_percent[route] ?? ratio_percent` % of its primaries), when retries are on; and
 * the quota's local counters (backend `local`, or `failure_mode: local_fallback`): each contract of
 * each policy, `limit` per fixed window of `window_ms` on multiples since the epoch (`alignMs`: the
 * epoch's offset from the host's clock).
 */
export function windowBudgets(config: ResolvedConfig['config'], alignMs = 0): Map<string, WindowLimit> {
  const out = new Map<string, WindowLimit>();
  const r = config.resilience.retry_budget;
  if (r.enabled && r.max_attempts >= 2) {
    for (const u of Object.values(config.upstream)) out.set(retryBudget(u.name), { base: RETRY_FLOOR, ratioPercent: r.per_route_ratio_percent[u.name] ?? r.ratio_percent, ...RETRY_WINDOW });
  }
  const q = config.resilience.quota;
  if (q.enabled && (q.backend === 'local' || q.failure_mode === 'local_fallback')) {
    for (const p of q.policies) {
      for (const [kind, c] of [['burst', p.burst], ['sustained', p.sustained]] as const) {
        if (c !== undefined) out.set(quotaBudget(p.name, kind), { base: c.limit, ratioPercent: 0, buckets: 1, bucketMs: c.window_ms, alignMs });
      }
    }
  }
  return out;
}

/** The connection-cap budgets (the data plane's `CONNECTION_BUDGETS`). */
export const CONNECTION_BUDGETS = { cap: 'conn', source: 'conn-src', rate: 'conn-rate' } as const;

/** The queue-cap budgets (the data plane's `QUEUE_BUDGETS`, resilience/queue-places.ts): `rq-global`, and `rq:<route>` per route. */
export const QUEUE_BUDGETS = { global: 'rq-global', routePrefix: 'rq:' } as const;

/** The token-ledger budget of pool `pool`'s fail-open (the data plane's `failOpenBudget`, auth/fail-open-lease.ts); its one key is ''. */
export function failOpenBudget(pool: string): string {
  return `auth-fo:${pool}`;
}

/**
 * The token budgets of `config`: every scoped rate limit, the three connection caps, the route
 * queues' places (slots held while a request waits: `rq-global` of `global_cap`, and each route's of
 * `caps[route] ?? default_cap`; a cap of 0 has none, its worker refuses without asking), and the
 * fail-open budget of each pool whose effective external authorization (its own or `default_auth`)
 * has `fail_open_per_second` (rate and burst the value).
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
    const failOpen = u.auth?.external?.failure_mode === 'allow' ? u.auth.external.fail_open_per_second : undefined;
    if (failOpen !== undefined) out.set(failOpenBudget(u.name), { rate: failOpen, burst: failOpen });
  }
  return out;
}

export interface TokenServiceOptions {
  /** Sends a notice to one worker. */
  readonly send: (worker: number, notice: Extract<ToWorker, { type: 'token-grants' }>) => void;
  /** A monotonic clock, ms. */
  readonly now?: () => number;
  /** The host's monotonic clock, ms (window budgets: deposits are dated by it in the workers). */
  readonly hostNow?: () => number;
}

export class TokenService {
  readonly ledger = new TokenLedger();
  /** The window budgets (retry budgets), on the host's monotonic clock. */
  readonly windows = new WindowLedger();
  private readonly hostNow: () => number;
  /** The epoch's offset from the host's clock, fixed at start (a quota's windows fall on multiples of window_ms since the epoch). */
  private readonly alignMs: number;
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
    this.hostNow = o.hostNow ?? hostClockMs;
    this.alignMs = Math.round(Date.now() - this.hostNow());
    this.sweeper = setInterval(() => {
      this.ledger.sweep(this.now());
      this.windows.sweep(this.hostNow());
    }, SWEEP_MS);
    this.sweeper.unref();
  }

  /** The budgets of the generation just activated, for `workers` workers. */
  configure(resolved: ResolvedConfig, workers: number): void {
    this.ledger.configure(tokenBudgets(resolved.config), workers);
    this.windows.configure(windowBudgets(resolved.config, this.alignMs), workers);
  }

  /** One worker's `tokens` message: settles first (their units serve the asks), then one answer per ask, in one notice. */
  receive(worker: number, m: Extract<FromWorker, { type: 'tokens' }>): void {
    this.messages++;
    const now = this.now();
    const host = this.hostNow();
    const w = this.windows;
    for (const d of m.deposits ?? []) w.deposit(d.budget, d.key, d.n, d.at, host);
    for (const s of m.settles) {
      if (w.has(s.budget)) w.settle(worker, s.budget, s.key, s.unused, s.forget, host, s.until);
      else this.ledger.settle(worker, s.budget, s.key, s.unused, s.forget, now);
    }
    if (m.asks.length === 0) return;
    const grants: TokenGrant[] = m.asks.map((a) => ({ budget: a.budget, key: a.key, ...(w.has(a.budget) ? w.ask(worker, a.budget, a.key, a.want, a.waiting, a.holding, host, a.ahead === true) : this.ledger.ask(worker, a.budget, a.key, a.want, a.waiting, a.holding, now)) }));
    this.answers++;
    this.send(worker, { type: 'token-grants', grants });
  }

  /** Every budget's contract, keys and holdings (the snapshot's `admission.token_budgets`). */
  view(): TokenBudgetView[] {
    return this.ledger.views();
  }

  /** Every window budget now (the snapshot's `admission.window_budgets`). */
  windowView(): WindowBudgetView[] {
    return this.windows.views(this.hostNow());
  }

  /** Worker `worker` exited: its tokens count as spent, its slots (connections) come back. */
  workerGone(worker: number): void {
    this.ledger.dropWorker(worker, this.now());
    this.windows.dropWorker(worker);
  }

  close(): void {
    clearInterval(this.sweeper);
  }
}
