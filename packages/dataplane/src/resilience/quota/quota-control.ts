// The quota of one worker (docs/quota.md): the generation's compiled policies, the shared Redis
// store or the local counters, the failure mode, the health the snapshot reports and the metrics.
// The request path asks `check` once per request that matches policies; every failure of the store
// becomes the failure mode's decision, never an exception, a 5xx or a wait past timeout_ms.
//
// The local counters (backend `local`, and the `local_fallback` of `redis`) are the node's under
// a supervisor (`lease`): each contract of each policy is a window budget of the supervisor
// (controlplane limits/window-ledger.ts: `limit` per fixed window per key, whole again at each
// window's start), leased to the workers like the rate limits' tokens (token-lease.ts); a request
// whose lease is empty waits for the supervisor's answer (at most LEASE_WAIT_MS; unanswered: denied
// `lease_unavailable`, never admitted past the node's count). A worker alone counts in its memory.
import type { Metrics, CounterSeries, Logger } from '@edge-proxy/telemetry';
import { compilePolicies } from './policy.ts';
import type { CompiledPolicy, ContractKind, QuotaConfig, QuotaRequestFacts } from './policy.ts';
import { LocalCounters } from './local-counters.ts';
import type { ContractDecision } from './local-counters.ts';
import { KeyBudget } from './key-budget.ts';
import type { KeyRefusal } from './key-budget.ts';
import { RedisStore } from './redis-store.ts';
import { PENDING, UNAVAILABLE } from '../token-lease.ts';
import type { Lease, TokenLeases } from '../token-lease.ts';
import type { HealthReason, StoreFailure, StoreReply } from './redis-store.ts';

/** Where decisions come from (`backend_mode` label): Redis, local counters standing in for it, or local counters by configuration. */
export type QuotaMode = 'distributed' | 'local_fallback' | 'local';

/**
 * `availability` of the health summary: `available` (the mode's store answers), `degraded` (Redis
 * does not answer and the local fallback decides), `unavailable` (Redis does not answer and
 * `failure_mode` allow or deny decides), `disabled` (quota off).
 */
export type QuotaAvailability = 'available' | 'degraded' | 'unavailable' | 'disabled';

/** The decision on one request. */
export interface QuotaVerdict {
  readonly allowed: boolean;
  /** Seconds for `Retry-After` when denied (ceil, at least 1); 0 when allowed. */
  readonly retryAfterS: number;
  /** The denying policy; undefined when allowed. */
  readonly policy: string | undefined;
  /** `within_quota`, `burst_exceeded`, `sustained_exceeded`, `store_unavailable` or `key_budget_exceeded` (failure_mode allow/deny). */
  readonly reason: string;
  readonly mode: QuotaMode;
}

export type QuotaFailureMode = QuotaConfig['failure_mode'];

/** What `configure` reads of a generation's configuration (a `ResolvedConfig['config']` fits). */
export interface QuotaSettings {
  readonly resilience: { readonly quota: QuotaConfig };
}

const ALLOW: Readonly<Record<QuotaMode, QuotaVerdict>> = {
  distributed: Object.freeze({ allowed: true, retryAfterS: 0, policy: undefined, reason: 'within_quota', mode: 'distributed' }),
  local_fallback: Object.freeze({ allowed: true, retryAfterS: 0, policy: undefined, reason: 'within_quota', mode: 'local_fallback' }),
  local: Object.freeze({ allowed: true, retryAfterS: 0, policy: undefined, reason: 'within_quota', mode: 'local' }),
};
const ALLOW_UNAVAILABLE: QuotaVerdict = Object.freeze({ allowed: true, retryAfterS: 0, policy: undefined, reason: 'store_unavailable', mode: 'distributed' });
const ALLOW_KEY_BUDGET: QuotaVerdict = Object.freeze({ allowed: true, retryAfterS: 0, policy: undefined, reason: 'key_budget_exceeded', mode: 'distributed' });

/** Parses `host:port`, `[v6]:port` or `redis://host:port`; `undefined` when malformed or TLS (`rediss://`, not supported). */
export function parseRedisAddress(address: string): { host: string; port: number } | undefined {
  const m = /^(?:redis:\/\/)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})\/?$/.exec(address);
  if (m === null) return undefined;
  const raw = m[1] as string;
  const port = Number(m[2]);
  if (port < 1 || port > 65535) return undefined;
  return { host: raw.startsWith('[') ? raw.slice(1, -1) : raw, port };
}

export class QuotaControl {
  private readonly metrics: Metrics;
  private readonly workers: number;
  private readonly log: Logger | undefined;
  private readonly local = new LocalCounters();
  /** The new-key budgets (key-budget.ts), charged before Redis is asked. */
  private readonly budget = new KeyBudget();
  private policies: readonly CompiledPolicy[] = [];
  private readonly byRoute = new Map<string, readonly CompiledPolicy[]>();
  private backend: 'local' | 'redis' = 'local';
  private enabled = false;
  private failureMode: QuotaFailureMode = 'local_fallback';
  private store: RedisStore | undefined;
  /** Why there is no store although the backend is redis (a malformed or `rediss://` address). */
  private storeProblem: string | undefined;
  private readonly series = new Map<string, CounterSeries>();
  private readonly now: () => number;
  /** The node's counters, leased (from `lease`); undefined: this worker's own `local`. */
  private leases: TokenLeases | undefined;

  constructor(metrics: Metrics, workers: number, log?: Logger, now: () => number = Date.now) {
    this.metrics = metrics;
    this.workers = Math.max(1, workers);
    this.log = log;
    this.now = now;
  }

  /** From now on the local counters are the node's, leased through `leases` (a worker under a supervisor). */
  lease(leases: TokenLeases): void {
    this.leases = leases;
  }

  /** At each commit: the generation's quota config and the resolved AUTH secret (undefined when none). Reconnects only if address/auth changed. */
  configure(config: QuotaSettings, authToken: string | undefined): void {
    const q = config.resilience.quota;
    this.policies = compilePolicies(q);
    this.byRoute.clear();
    this.budget.retain(new Set(this.policies.map((p) => p.name)));
    this.failureMode = q.failure_mode;
    this.backend = q.backend;
    this.enabled = q.enabled;
    const wantsStore = q.enabled && q.backend === 'redis' && this.policies.length > 0;
    if (!wantsStore || q.redis === undefined) {
      if (wantsStore) this.noStore('`backend: redis` without a `redis` block');
      else this.storeProblem = undefined;
      this.dropStore();
      return;
    }
    const target = parseRedisAddress(q.redis.address);
    if (target === undefined) {
      this.noStore(/^rediss:\/\//i.test(q.redis.address) ? 'TLS to Redis (rediss://) is not supported' : 'the Redis address is not host:port');
      this.dropStore();
      return;
    }
    this.storeProblem = undefined;
    const address = `${target.host}:${target.port}`;
    if (this.store !== undefined && this.store.address === address && this.store.password === authToken) {
      this.store.setTimeout(q.redis.timeout_ms);
      return;
    }
    this.dropStore();
    this.store = new RedisStore({
      host: target.host,
      port: target.port,
      timeoutMs: q.redis.timeout_ms,
      password: authToken,
      log: this.log,
      onHealth: (reason, answering) => this.healthEvent(reason, answering),
    });
  }

  private noStore(problem: string): void {
    if (this.storeProblem !== problem) {
      this.log?.error({ problem }, 'quota store not usable: the failure mode decides every request');
      this.metrics.counter('svc_quota_backend_health_total').inc({ backend_mode: this.mode(false), reason: 'error' });
    }
    this.storeProblem = problem;
  }

  private dropStore(): void {
    const s = this.store;
    this.store = undefined;
    if (s !== undefined) void s.close();
  }

  /** Policies that apply to `route` (precompiled per generation; empty array when quota is off). */
  policiesFor(route: string): readonly CompiledPolicy[] {
    let list = this.byRoute.get(route);
    if (list === undefined) {
      list = this.policies.filter((p) => p.routes === undefined || p.routes.has(route));
      this.byRoute.set(route, list);
    }
    return list;
  }

  /**
   * Decides for one request; calls `done` exactly once, within timeout_ms + a little, never
   * throws. `done` runs synchronously when the decision is local (backend `local`, or the store
   * known to be down), later when Redis is asked.
   */
  check(policies: readonly CompiledPolicy[], facts: QuotaRequestFacts, done: (v: QuotaVerdict) => void): void {
    if (policies.length === 0) {
      done(ALLOW[this.backend === 'local' ? 'local' : 'distributed']);
      return;
    }
    let keys: string[];
    try {
      const all = policies.map((p) => p.key(facts));
      // A policy whose dimension is missing under `key_fallback: none` does not apply to the request.
      if (all.includes(undefined)) {
        policies = policies.filter((_, i) => all[i] !== undefined);
        keys = all.filter((k): k is string => k !== undefined);
      } else keys = all as string[];
    } catch (err) {
      // A facts object that throws is a bug of the caller; the request still gets a decision.
      this.log?.error({ err }, 'quota key extraction failed; request allowed');
      done(ALLOW_UNAVAILABLE);
      return;
    }
    if (policies.length === 0) {
      done(ALLOW[this.backend === 'local' ? 'local' : 'distributed']);
      return;
    }
    if (this.backend === 'local') {
      this.decideLocal(policies, keys, 'local', done);
      return;
    }
    const store = this.store;
    if (store === undefined) {
      this.failure(policies, keys, done);
      return;
    }
    // Every new key is charged before Redis is asked; over a budget, the failure mode decides.
    const budget = this.budget.admit(policies, keys, facts.clientIp, this.now());
    if (!budget.ok) {
      this.keysRefused(budget.policy, budget.reason);
      if (this.failureMode === 'local_fallback') this.decideLocal(policies, keys, 'local_fallback', done);
      else done(this.budgetVerdict(policies, keys, budget.policy, budget.retryAfterMs));
      return;
    }
    for (let i = 0; i < policies.length; i++) if ((budget.created[i] as number) > 0) this.keysCreated(policies[i] as CompiledPolicy, budget.created[i] as number);
    const argv: string[] = [];
    const redisKeys: string[] = [];
    for (let i = 0; i < policies.length; i++) {
      for (const c of (policies[i] as CompiledPolicy).contracts) {
        redisKeys.push((keys[i] as string) + c.suffix);
        argv.push(c.argv[0], c.argv[1]);
      }
    }
    let settled = false;
    store.run(redisKeys, argv, (failure: StoreFailure | undefined, reply: StoreReply | undefined) => {
      if (settled) return;
      settled = true;
      if (failure !== undefined || reply === undefined) this.failure(policies, keys, done);
      else done(this.storeVerdict(policies, reply));
    });
  }

  /** The store did not answer: the failure mode decides (the local fallback, the node's counters, perhaps later). */
  private failure(policies: readonly CompiledPolicy[], keys: readonly string[], done: (v: QuotaVerdict) => void): void {
    if (this.failureMode === 'local_fallback') this.decideLocal(policies, keys, 'local_fallback', done);
    else done(this.failureVerdict(policies, keys));
  }

  /** The local counters decide: this worker's (alone), or the node's through the leases (at once when they hold units, else on the supervisor's answer). */
  private decideLocal(policies: readonly CompiledPolicy[], keys: readonly string[], mode: 'local' | 'local_fallback', done: (v: QuotaVerdict) => void): void {
    const leases = this.leases;
    if (leases === undefined) {
      done(this.localVerdict(policies, keys, mode));
      return;
    }
    const now = leases.now();
    const held: Lease[] = [];
    const owners: { policy: CompiledPolicy; kind: ContractKind }[] = [];
    for (let i = 0; i < policies.length; i++) {
      const p = policies[i] as CompiledPolicy;
      for (const c of p.contracts) {
        held.push(leases.lease(quotaBudget(p.name, c.kind), (keys[i] as string) + c.suffix, now));
        owners.push({ policy: p, kind: c.kind });
      }
    }
    const v = leases.takeAll(held, now);
    if (v !== PENDING) {
      done(this.nodeVerdict(leases, v, held, owners, policies, mode));
      return;
    }
    leases.wait(held, (x) => done(this.nodeVerdict(leases, x, held, owners, policies, mode)));
  }

  /** The verdict of the node's counters: 0 admitted (a unit of each contract spent), seconds (a contract's window is full), or UNAVAILABLE. */
  private nodeVerdict(leases: TokenLeases, v: number, held: readonly Lease[], owners: readonly { policy: CompiledPolicy; kind: ContractKind }[], policies: readonly CompiledPolicy[], mode: 'local' | 'local_fallback'): QuotaVerdict {
    if (v === 0) {
      for (const p of policies) this.outcome(p, 'allow', 'within_quota', mode);
      return ALLOW[mode];
    }
    if (v === UNAVAILABLE) {
      // The supervisor did not answer in time: denied, never admitted past the node's count.
      const first = policies[0] as CompiledPolicy;
      this.outcome(first, 'deny', 'lease_unavailable', mode);
      return { allowed: false, retryAfterS: 1, policy: first.name, reason: 'lease_unavailable', mode };
    }
    // The denying contract: the one whose lease refuses for longest.
    const now = leases.now();
    let at = 0;
    let longest = -1;
    for (let i = 0; i < held.length; i++) {
      const l = held[i] as Lease;
      const w = leases.holds(l) ? 0 : leases.blocked(l, now);
      if (w > longest) {
        longest = w;
        at = i;
      }
    }
    const o = owners[at] as { policy: CompiledPolicy; kind: ContractKind };
    const reason = `${o.kind}_exceeded`;
    this.outcome(o.policy, 'deny', reason, mode);
    return { allowed: false, retryAfterS: v, policy: o.policy.name, reason, mode };
  }

  private storeVerdict(policies: readonly CompiledPolicy[], reply: StoreReply): QuotaVerdict {
    if (reply.allowed) {
      for (const p of policies) this.outcome(p, 'allow', 'within_quota', 'distributed');
      return ALLOW.distributed;
    }
    let n = reply.index;
    for (const p of policies) {
      if (n > p.contracts.length) {
        n -= p.contracts.length;
        continue;
      }
      const reason = `${(p.contracts[n - 1] ?? p.contracts[0])?.kind ?? 'sustained'}_exceeded`;
      this.outcome(p, 'deny', reason, 'distributed');
      return { allowed: false, retryAfterS: retryAfterSeconds(reply.retryAfterMs), policy: p.name, reason, mode: 'distributed' };
    }
    // An index past the policies cannot come from our script; deny on the first policy rather than guess.
    const p = policies[0] as CompiledPolicy;
    this.outcome(p, 'deny', 'sustained_exceeded', 'distributed');
    return { allowed: false, retryAfterS: retryAfterSeconds(reply.retryAfterMs), policy: p.name, reason: 'sustained_exceeded', mode: 'distributed' };
  }

  private failureVerdict(policies: readonly CompiledPolicy[], keys: readonly string[]): QuotaVerdict {
    switch (this.failureMode) {
      case 'local_fallback':
        return this.localVerdict(policies, keys, 'local_fallback');
      case 'allow':
        for (const p of policies) this.outcome(p, 'allow', 'store_unavailable', 'distributed');
        return ALLOW_UNAVAILABLE;
      case 'deny': {
        for (const p of policies) this.outcome(p, 'deny', 'store_unavailable', 'distributed');
        const first = policies[0] as CompiledPolicy;
        return { allowed: false, retryAfterS: 1, policy: first.name, reason: 'store_unavailable', mode: 'distributed' };
      }
    }
  }

  /** A request with a new key over a budget: the failure mode decides, as if the store had not answered (reason `key_budget_exceeded` for allow/deny). */
  private budgetVerdict(policies: readonly CompiledPolicy[], keys: readonly string[], refusing: CompiledPolicy, retryAfterMs: number): QuotaVerdict {
    switch (this.failureMode) {
      case 'local_fallback':
        return this.localVerdict(policies, keys, 'local_fallback');
      case 'allow':
        for (const p of policies) this.outcome(p, 'allow', 'key_budget_exceeded', 'distributed');
        return ALLOW_KEY_BUDGET;
      case 'deny':
        this.outcome(refusing, 'deny', 'key_budget_exceeded', 'distributed');
        return { allowed: false, retryAfterS: retryAfterSeconds(retryAfterMs), policy: refusing.name, reason: 'key_budget_exceeded', mode: 'distributed' };
    }
  }

  private keysCreated(p: CompiledPolicy, n: number): void {
    this.cached(`c\u0000${p.name}\u0000${p.selectorDimensions}`, 'svc_quota_keys_created_total', { policy: p.name, selector_dimensions: p.selectorDimensions }).inc(n);
  }

  private keysRefused(p: CompiledPolicy, reason: KeyRefusal): void {
    this.cached(`r\u0000${p.name}\u0000${p.selectorDimensions}\u0000${reason}`, 'svc_quota_keys_refused_total', { policy: p.name, selector_dimensions: p.selectorDimensions, reason }).inc();
  }

  private cached(id: string, name: string, labels: Record<string, string>): CounterSeries {
    let s = this.series.get(id);
    if (s === undefined) {
      s = this.metrics.counterSeries(name, labels);
      this.series.set(id, s);
    }
    return s;
  }

  private localVerdict(policies: readonly CompiledPolicy[], keys: readonly string[], mode: 'local' | 'local_fallback'): QuotaVerdict {
    const d: ContractDecision = this.local.decide(policies, keys, this.workers, this.now());
    if (d.allowed || d.policy === undefined) {
      for (const p of policies) this.outcome(p, 'allow', 'within_quota', mode);
      return ALLOW[mode];
    }
    const reason = `${d.contract ?? 'sustained'}_exceeded`;
    this.outcome(d.policy, 'deny', reason, mode);
    return { allowed: false, retryAfterS: retryAfterSeconds(d.retryAfterMs), policy: d.policy.name, reason, mode };
  }

  private outcome(p: CompiledPolicy, decision: 'allow' | 'deny', reason: string, mode: QuotaMode): void {
    const id = `${p.name}\u0000${p.selectorDimensions}\u0000${decision}\u0000${reason}\u0000${mode}`;
    let s = this.series.get(id);
    if (s === undefined) {
      s = this.metrics.counterSeries('svc_quota_policy_outcomes_total', { policy: p.name, decision, reason, selector_dimensions: p.selectorDimensions, backend_mode: mode });
      this.series.set(id, s);
    }
    s.inc();
  }

  private mode(answering: boolean): QuotaMode {
    if (this.backend === 'local') return 'local';
    return answering || this.failureMode !== 'local_fallback' ? 'distributed' : 'local_fallback';
  }

  private healthEvent(reason: HealthReason, answering: boolean): void {
    this.metrics.counter('svc_quota_backend_health_total').inc({ backend_mode: this.mode(answering), reason });
  }

  /** For heartbeats/snapshot: { backend_mode, availability } (see `QuotaAvailability`). */
  health(): { backend_mode: QuotaMode; availability: QuotaAvailability } {
    if (!this.enabled) return { backend_mode: this.backend === 'local' ? 'local' : 'distributed', availability: 'disabled' };
    if (this.backend === 'local' || this.policies.length === 0) return { backend_mode: this.backend === 'local' ? 'local' : 'distributed', availability: 'available' };
    const answering = this.store?.answering ?? false;
    const mode = this.mode(answering);
    if (answering) return { backend_mode: mode, availability: 'available' };
    return { backend_mode: mode, availability: this.failureMode === 'local_fallback' ? 'degraded' : 'unavailable' };
  }

  /** Local counters held now (tests: the memory bound). */
  get localKeys(): number {
    return this.local.size;
  }

  async close(): Promise<void> {
    const s = this.store;
    this.store = undefined;
    if (s !== undefined) await s.close();
  }
}

/** The window budget of `policy`'s `kind` contract (the supervisor's `quotaBudget`, controlplane limits/token-service.ts). */
export function quotaBudget(policy: string, kind: string): string {
  return `quota:${policy}:${kind}`;
}

/** `Retry-After` seconds for a window ending in `ms`: ceil, at least 1. */
export function retryAfterSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}
