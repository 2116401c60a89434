// The shared quota store: one ioredis connection per worker to a standalone Redis, and the script
// that decides a request in one round trip.
//
// Algorithm: fixed windows. A contract (limit, window_ms) counts in key
// `<selector key><:b|:s>:<window index>`, the index being floor(now / window_ms) with `now` from
// the Redis server's TIME (one clock for every worker and node, whatever their own clocks say).
// The script reads the counter of every contract of every policy the request matches; only if all
// are below their limit does it increment them all (INCR, and PEXPIRE window_ms on a key's first
// count, so a key outlives its window by less than one window). Otherwise nothing is counted and it
// returns the denying contract whose window ends last, with the milliseconds until that end
// (Retry-After = ceil(ms / 1000), at least 1). A Lua script runs atomically, so concurrent requests
// from every worker can never admit more than the limit in a window.
//
// Caveat of fixed windows: the limit holds per window, not per sliding interval: a client can spend
// a whole window's limit at its end and the next one's at the start of the next, so up to 2 × limit
// pass within one window's length across the edge. The burst contract (a short window) is what
// bounds that; a sliding log or GCRA would not, but would cost a sorted set or float state per key.
//
// Not supported: Redis Cluster (the script builds its window keys from KEYS[i], so they are not
// declared for slot routing) and TLS to Redis (a `rediss://` address is refused; see configure).
//
// Client (ioredis): commandTimeout = timeout_ms bounds each command; enableOfflineQueue false makes
// a command fail at once while disconnected (the failure mode decides immediately, nothing queues);
// autoResendUnfulfilledCommands false, so a check in flight when the connection drops is never sent
// again later (it was already decided by the failure mode); reconnection after 50 ms doubling to
// 2 s (plus up to 20 % jitter, so the workers of many nodes do not reconnect in step); socketTimeout
// closes a connection that stays silent with commands pending (a hung server), which bounds how many
// checks can wait on it.
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import type { Redis } from 'ioredis';
import type { Logger } from '@edge-proxy/telemetry';

/** The decision script (see the header). KEYS[i]: counter key of contract i without its window; ARGV[2i-1]: limit; ARGV[2i]: window_ms. */
export const QUOTA_SCRIPT = `if redis.replicate_commands then redis.replicate_commands() end -- Redis 3.2-4: writes after TIME need effects replication (the default since 5)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local full = {}
local deny, wait = 0, -1
for i = 1, #KEYS do
  local win = tonumber(ARGV[2 * i])
  local idx = math.floor(now / win)
  local k = KEYS[i] .. ':' .. string.format('%d', idx)
  full[i] = k
  local c = tonumber(redis.call('GET', k) or '0')
  if c >= tonumber(ARGV[2 * i - 1]) then
    local left = (idx + 1) * win - now
    if left > wait then deny = i; wait = left end
  end
end
if deny > 0 then return {0, deny, wait} end
for i = 1, #KEYS do
  if redis.call('INCR', full[i]) == 1 then redis.call('PEXPIRE', full[i], ARGV[2 * i]) end
end
return {1, 0, 0}
`;

const SCRIPT_SHA = createHash('sha1').update(QUOTA_SCRIPT).digest('hex');

/**
 * Why a check got no answer from the store, and the failure mode decides: `disconnected` (not sent:
 * no connection), `probing` (not sent: the connection is up but its last command failed, and another
 * check is already finding out whether it answers again), or the command's own failure.
 */
export type StoreFailure = 'timeout' | 'disconnected' | 'probing' | 'auth_failed' | 'error';

/** Health events (`svc_quota_backend_health_total{reason}`). */
export type HealthReason = 'connected' | 'disconnected' | 'timeout' | 'auth_failed' | 'error';

/** The script's answer: allowed, or the 1-based index of the denying contract and ms until its window ends. */
export interface StoreReply {
  readonly allowed: boolean;
  readonly index: number;
  readonly retryAfterMs: number;
}

export type StoreCallback = (failure: StoreFailure | undefined, reply: StoreReply | undefined) => void;

export interface RedisStoreOptions {
  readonly host: string;
  readonly port: number;
  readonly timeoutMs: number;
  readonly password: string | undefined;
  readonly log: Logger | undefined;
  /** A health event; `answering` is the store's state after it. */
  readonly onHealth: (reason: HealthReason, answering: boolean) => void;
}

/** Reconnection delay after `attempt` failed attempts: 50 ms doubling, capped at 2 s, plus up to 20 % jitter. */
export function reconnectDelay(attempt: number, random = Math.random): number {
  const base = Math.min(2000, 50 * 2 ** Math.min(16, Math.max(0, attempt - 1)));
  return Math.round(base + base * 0.2 * random());
}

function isAuthError(message: string): boolean {
  return /^(WRONGPASS|NOAUTH)|invalid password|AUTH failed/i.test(message);
}

/** Redis error message of `err`, first line, bounded (never the command's arguments). */
function messageOf(err: unknown): string {
  const m = err instanceof Error ? err.message : String(err);
  const line = m.split('\n', 1)[0] ?? '';
  return line.length > 200 ? `${line.slice(0, 200)}...` : line;
}

/** How often a store that is connected but not answering is asked whether it answers again, ms. */
const PROBE_MS = 1000;

export class RedisStore {
  readonly address: string;
  readonly password: string | undefined;
  private readonly client: Redis;
  private readonly log: Logger | undefined;
  private readonly onHealth: RedisStoreOptions['onHealth'];
  /** 'connecting' until the first answer or failure; then up or down. */
  private state: 'connecting' | 'up' | 'down' = 'connecting';
  /** What the last logged transition to down said: unreachable, or refused by AUTH (logged again when that changes). */
  private downKind: 'unreachable' | 'auth' | undefined;
  private closing = false;
  /** A command is out while the store is not answering (at most one: the others do not wait on a hung server). */
  private probing = false;
  /**
   * While connected but not answering (a frozen server), a PING every `PROBE_MS`: without it the
   * store would be reported down until a request happened to ask (a reconnection is what brings
   * a stopped server back; a frozen one keeps its connection).
   */
  private prober: NodeJS.Timeout | undefined;

  constructor(o: RedisStoreOptions) {
    this.address = `${o.host}:${o.port}`;
    this.password = o.password;
    this.log = o.log;
    this.onHealth = o.onHealth;
    // ioredis is required here, by the first store a worker builds (require caches it for the
    // next): 2 MiB of heap that a worker without a shared quota store never holds
    // (docs/performance.md "Worker memory").
    const RedisClient = (createRequire(import.meta.url)('ioredis') as { Redis: typeof Redis }).Redis;
    this.client = new RedisClient({
      host: o.host,
      port: o.port,
      password: o.password,
      protocol: 2,
      commandTimeout: o.timeoutMs,
      connectTimeout: Math.max(1000, 10 * o.timeoutMs),
      socketTimeout: Math.max(1000, 10 * o.timeoutMs),
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      retryStrategy: (times) => reconnectDelay(times),
      connectionName: 'edge-proxy-quota',
      disableClientInfo: true,
    });
    this.client.on('ready', () => this.onReady());
    this.client.on('close', () => this.down('disconnected', undefined));
    this.client.on('error', (err: unknown) => {
      const message = messageOf(err);
      this.down(isAuthError(message) ? 'auth_failed' : 'error', message);
    });
  }

  /** Whether the last command or connection event said the store answers. */
  get answering(): boolean {
    return this.state === 'up';
  }

  /** Sets the command timeout of later commands (a new generation changed `timeout_ms`). */
  setTimeout(ms: number): void {
    this.client.options.commandTimeout = ms;
  }

  /** Runs the decision script once; `cb` is called exactly once, within about the command timeout. */
  run(keys: readonly string[], argv: readonly string[], cb: StoreCallback): void {
    if (this.client.status !== 'ready') {
      cb('disconnected', undefined);
      return;
    }
    // Connected but not answering (a timeout, an error): one check at a time asks, the others get
    // the failure mode's decision at once rather than each waiting timeout_ms on a hung server.
    const probe = this.state !== 'up';
    if (probe) {
      if (this.probing) {
        cb('probing', undefined);
        return;
      }
      this.probing = true;
    }
    const args: (string | number)[] = [SCRIPT_SHA, keys.length, ...keys, ...argv];
    const settle = (err: Error | null | undefined, res: unknown): void => {
      if (probe) this.probing = false;
      this.settle(err, res, cb);
    };
    this.client.call('evalsha', args, (err, res) => {
      if (err !== null && err !== undefined) {
        const message = messageOf(err);
        if (message.startsWith('NOSCRIPT')) {
          // The server lost its script cache (SCRIPT FLUSH, a failover): EVAL decides this check and loads the script again.
          args[0] = QUOTA_SCRIPT;
          this.client.call('eval', args, settle);
          return;
        }
        settle(err, undefined);
        return;
      }
      settle(null, res);
    });
  }

  private settle(err: Error | null | undefined, res: unknown, cb: StoreCallback): void {
    if (err !== null && err !== undefined) {
      const message = messageOf(err);
      let failure: StoreFailure;
      if (message === 'Command timed out') failure = 'timeout';
      else if (message.startsWith("Stream isn't writeable") || message.startsWith('Connection is closed') || message.startsWith('Command aborted')) failure = 'disconnected';
      else if (isAuthError(message)) failure = 'auth_failed';
      else failure = 'error';
      if (failure !== 'disconnected') this.down(failure, message);
      cb(failure, undefined);
      return;
    }
    const r = res as [number, number, number] | undefined;
    if (!Array.isArray(r) || r.length !== 3) {
      this.down('error', 'unexpected script reply');
      cb('error', undefined);
      return;
    }
    this.up();
    cb(undefined, { allowed: r[0] === 1, index: Number(r[1]), retryAfterMs: Number(r[2]) });
  }

  private onReady(): void {
    // Load the script at once: the connection's commands run in order, so every check sent after
    // this finds it (EVALSHA, one round trip each); NOSCRIPT only after the cache is flushed.
    this.client.call('script', ['load', QUOTA_SCRIPT], (err) => {
      if (err !== null && err !== undefined) this.down(isAuthError(messageOf(err)) ? 'auth_failed' : 'error', messageOf(err));
    });
    this.up();
  }

  private up(): void {
    this.stopProbe();
    if (this.state === 'up' || this.closing) return;
    const was = this.state;
    this.state = 'up';
    this.downKind = undefined;
    this.log?.info({ address: this.address, was }, was === 'connecting' ? 'quota store connected' : 'quota store answering again: back to distributed quota');
    this.onHealth('connected', true);
  }

  private down(reason: HealthReason, message: string | undefined): void {
    if (this.closing) return;
    if (reason === 'disconnected' && this.state !== 'up') return; // already counted by the event that took it down
    // One line per transition: losing the store, and AUTH starting or ceasing to be the reason
    // (a wrong password deserves its own line); not every reconnection attempt.
    const kind = reason === 'auth_failed' ? 'auth' : 'unreachable';
    const transition = this.state !== 'down' || this.downKind !== kind;
    this.state = 'down';
    this.startProbe();
    if (transition) {
      this.downKind = kind;
      this.log?.warn({ address: this.address, reason, error: message }, 'quota store not answering: the failure mode decides');
    }
    this.onHealth(reason, false);
  }

  private startProbe(): void {
    if (this.prober !== undefined) return;
    this.prober = setInterval(() => {
      if (this.state === 'up' || this.probing || this.client.status !== 'ready') return;
      this.probing = true;
      this.client.call('ping', [], (err) => {
        this.probing = false;
        if (err === null || err === undefined) this.up();
      });
    }, PROBE_MS);
    this.prober.unref();
  }

  private stopProbe(): void {
    if (this.prober === undefined) return;
    clearInterval(this.prober);
    this.prober = undefined;
  }

  /** Closes the connection; no reconnection, no more events. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.stopProbe();
    const status = this.client.status;
    if (status === 'end') return;
    const ended = new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 1000); // ioredis emits no 'end' for a client between reconnection attempts
      timer.unref();
      this.client.once('end', () => {
        clearTimeout(timer);
        resolve();
      });
    });
    this.client.disconnect(false);
    if (status === 'reconnecting' || status === 'close') return;
    await ended;
  }
}
