// The bound on the Redis keys one worker lets requests create (docs/quota.md "Redis sizing"; issue
// 38, finding 5: one client rotating a header at 500 req/s had added 8,877 keys in 20 s, every one
// living for the sustained window, in the Redis the whole fleet shares).
//
// A request whose selector has not been sent to Redis in the current window of a contract creates
// a key there (`<selector key>:<b|s>:<window index>`, by the script's INCR). Before Redis is asked,
// each such *new key* is charged, per policy and contract, to two budgets of the contract's window
// (the same fixed windows as the contracts, aligned on multiples of `window_ms` since the epoch):
//
// - the policy's `max_keys_per_window`: new keys this worker sends per window, every source together;
// - the source's `max_new_keys_per_source`: new keys one client source sends per window. A source is
//   the client address; for IPv6 its /64 (one subscriber's prefix: an attacker holding a /64 would
//   otherwise have 2^64 sources).
//
// A request with a new key over either budget is not sent to Redis: the `failure_mode` decides it
// (QuotaControl). Keys already sent this window are never refused, so a source's known selectors
// keep working while it floods new ones. Only keys charged are remembered, so the memory of one
// contract is at most `max_keys_per_window` selectors and as many sources; a window's state is
// dropped when the next window begins. Per worker: the node's figure is × workers (issue 39 will
// make budgets node-wide).
//
// Why this bounds Redis: a contract's key of window i is created by a request in window i and
// expires `window_ms` after its first count, so at any time only keys of the current and the
// previous window exist: at most 2 × `max_keys_per_window` keys per contract, policy and worker.
import { isIPv4, isIPv6 } from 'node:net';
import type { CompiledPolicy, ContractKind } from './policy.ts';

/** Why a new key was refused (`reason` label of `svc_quota_keys_refused_total`). */
export type KeyRefusal = 'source_budget' | 'policy_cap';

/** The budget's answer for one request. */
export type KeyBudgetVerdict =
  | { readonly ok: true; /** New keys charged, per policy index (the same order as the request's policies). */ readonly created: readonly number[] }
  | { readonly ok: false; readonly policy: CompiledPolicy; readonly contract: ContractKind; readonly reason: KeyRefusal; /** ms until the refusing contract's window ends (its budget starts again). */ readonly retryAfterMs: number };

/** One contract's budget in its current window. */
interface WindowBudget {
  index: number;
  /** Selector keys charged this window (never refused again in it). */
  readonly seen: Set<string>;
  /** New keys charged per source this window. */
  readonly sources: Map<string, number>;
}

/**
 * The source a client address is charged to: an IPv4 address as is (an IPv4-mapped IPv6 address
 * as its IPv4), an IPv6 address as its /64 (the first four groups, `2001:db8:0:1::/64`), anything
 * else (a Unix socket path, an empty address) as is.
 */
export function sourceOf(address: string): string {
  if (isIPv4(address)) return address;
  if (!isIPv6(address)) return address;
  const lower = address.toLowerCase();
  const mapped = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/.exec(lower);
  if (mapped !== null) return mapped[1] as string;
  const zoneless = lower.split('%', 1)[0] as string;
  const [head = '', tail] = zoneless.split('::', 2);
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  // An embedded IPv4 tail (`::ffff:1.2.3.4`, `64:ff9b::1.2.3.4`) takes two groups, in the low 64 bits.
  const width = (gs: readonly string[]): number => gs.reduce((n, g) => n + (g.includes('.') ? 2 : 1), 0);
  const zeros = tail === undefined ? 0 : Math.max(0, 8 - width(left) - width(right));
  const groups = [...left, ...new Array<string>(zeros).fill('0'), ...right];
  return `${groups
    .slice(0, 4)
    .map((g) => parseInt(g, 16).toString(16))
    .join(':')}::/64`;
}

/** The new-key budgets of one worker, per (policy, contract). Pure: the caller passes `now`. */
export class KeyBudget {
  private readonly windows = new Map<string, WindowBudget>();

  /**
   * Charges the new keys of one request at `now` (ms since the epoch): `keys[i]` is the selector
   * key of `policies[i]`, `address` the client address. All or nothing: a refused request charges
   * no budget, so it does not spend another policy's.
   */
  admit(policies: readonly CompiledPolicy[], keys: readonly string[], address: string, now: number): KeyBudgetVerdict {
    let source: string | undefined;
    const charges: { w: WindowBudget; key: string; source: string; policy: number }[] = [];
    for (let i = 0; i < policies.length; i++) {
      const p = policies[i] as CompiledPolicy;
      const key = keys[i] as string;
      for (const c of p.contracts) {
        const w = this.window(p, c.kind, c.windowMs, now);
        if (w.seen.has(key)) continue;
        source ??= sourceOf(address);
        // One request charges a window at most once: a window belongs to one policy's contract.
        const reason: KeyRefusal | undefined = w.seen.size >= p.maxKeysPerWindow ? 'policy_cap' : (w.sources.get(source) ?? 0) >= p.maxNewKeysPerSource ? 'source_budget' : undefined;
        if (reason !== undefined) return { ok: false, policy: p, contract: c.kind, reason, retryAfterMs: (w.index + 1) * c.windowMs - now };
        charges.push({ w, key, source, policy: i });
      }
    }
    const created = new Array<number>(policies.length).fill(0);
    for (const x of charges) {
      x.w.seen.add(x.key);
      x.w.sources.set(x.source, (x.w.sources.get(x.source) ?? 0) + 1);
      created[x.policy] = (created[x.policy] as number) + 1;
    }
    return { ok: true, created };
  }

  /** Drops the budgets of policies not in `names` (a new generation removed them). */
  retain(names: ReadonlySet<string>): void {
    for (const id of this.windows.keys()) if (!names.has(id.slice(0, id.indexOf('\u0000')))) this.windows.delete(id);
  }

  /** Selector keys remembered now, every policy and contract together (tests: the memory bound). */
  get size(): number {
    let n = 0;
    for (const w of this.windows.values()) n += w.seen.size;
    return n;
  }

  private window(p: CompiledPolicy, kind: ContractKind, windowMs: number, now: number): WindowBudget {
    const id = `${p.name}\u0000${kind}\u0000${windowMs}`;
    const index = Math.floor(now / windowMs);
    let w = this.windows.get(id);
    if (w === undefined) {
      w = { index, seen: new Set(), sources: new Map() };
      this.windows.set(id, w);
    } else if (w.index !== index) {
      // A new window: every key of the last one expires within a window; the budgets start again.
      w.index = index;
      w.seen.clear();
      w.sources.clear();
    }
    return w;
  }
}
