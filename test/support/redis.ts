// A real `redis-server` for the end-to-end quota tests and bench:quota (DESIGN.md: "real
// `redis-server` in tests"), over the process the data plane's quota tests use
// (packages/dataplane/test/support/redis.ts: a free loopback port, no persistence, so a restart
// starts empty, as a store that came back after a crash). The test can stop it (killed: the client
// sees a disconnect), freeze it (SIGSTOP: connections stay open and nothing answers, the client
// sees its command timeout), resume it, and start it again on the same port; and send it raw RESP
// commands. Killed at teardown.
import net from 'node:net';
import { RedisServer as RedisProcess } from '../../packages/dataplane/test/support/redis.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** A `redis-server` the test controls. */
export interface RedisServer {
  /** Its port on 127.0.0.1. */
  readonly port: number;
  /** `127.0.0.1:<port>`, as `resilience.quota.redis.address` takes it. */
  readonly address: string;
  /** Kills it (as abrupt as a crash) and waits for the exit: from now on a connection to the port is refused. */
  stop(): Promise<void>;
  /** Starts it again on the same port (empty: nothing was persisted); resolves once it accepts connections. */
  start(): Promise<void>;
  /** SIGSTOP: it keeps its connections and answers nothing. */
  freeze(): void;
  /** SIGCONT after `freeze`. */
  thaw(): void;
  /** One command over a fresh connection (RESP, AUTH first when a password is set); the raw reply. */
  command(...args: string[]): Promise<string>;
}

/** Encodes one command as a RESP array of bulk strings. */
function resp(args: readonly string[]): string {
  return `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;
}

/**
 * Sends `commands` on one connection and resolves with everything read until the server has
 * answered each (counted as complete RESP replies at the top level; enough for the simple,
 * bulk-string and error replies INFO, AUTH, DBSIZE and KEYS give here).
 */
function talk(port: number, commands: readonly (readonly string[])[], timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let text = '';
    const timer = setTimeout(() => socket.destroy(new Error(`redis on ${port}: no answer within ${timeoutMs} ms`)), timeoutMs);
    socket.on('connect', () => socket.write(commands.map(resp).join('')));
    socket.on('data', (d: Buffer) => {
      text += d.toString('utf8');
      if (repliesIn(text) >= commands.length) {
        clearTimeout(timer);
        socket.end();
        resolve(text);
      }
    });
    socket.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/** How many complete top-level RESP replies `text` holds (simple, error, integer, bulk, array of bulk/integers). */
function repliesIn(text: string): number {
  let i = 0;
  let n = 0;
  const line = (): string | undefined => {
    const end = text.indexOf('\r\n', i);
    if (end < 0) return undefined;
    const l = text.slice(i, end);
    i = end + 2;
    return l;
  };
  const one = (): boolean => {
    const l = line();
    if (l === undefined) return false;
    const kind = l[0];
    if (kind === '+' || kind === '-' || kind === ':') return true;
    if (kind === '$') {
      const len = Number(l.slice(1));
      if (len < 0) return true;
      // Bulk lengths are bytes; the replies read here are ASCII.
      if (text.length < i + len + 2) return false;
      i += len + 2;
      return true;
    }
    if (kind === '*') {
      const count = Number(l.slice(1));
      for (let k = 0; k < count; k++) if (!one()) return false;
      return true;
    }
    return false;
  };
  while (i < text.length && one()) n++;
  return n;
}

/**
 * Starts `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no [--requirepass X]` on a
 * free port (the process is the quota tests' own, packages/dataplane/test/support/redis.ts);
 * resolves once it accepts connections. Killed at teardown, whatever state the test left it in.
 */
export async function startRedis(t: Teardown, o: { readonly password?: string } = {}): Promise<RedisServer> {
  const server = await RedisProcess.start(o.password === undefined ? {} : { password: o.password });
  t.teardown(() => server.stop());
  const port = server.port;
  const auth = o.password === undefined ? [] : [['AUTH', o.password]];
  return {
    port,
    address: server.address,
    stop: () => server.kill(),
    start: () => server.restart(),
    freeze: () => server.pause(),
    thaw: () => server.resume(),
    async command(...cmd: string[]) {
      const text = await talk(port, [...auth, cmd]);
      // Past the AUTH reply (+OK), the command's own.
      return auth.length === 0 ? text : text.slice(text.indexOf('\r\n') + 2);
    },
  };
}

/** One command's line of `INFO commandstats` (`cmdstat_evalsha:calls=12,usec=...,rejected_calls=0,failed_calls=1`). */
export interface CommandStat {
  readonly calls: number;
  /** Refused before running (wrong arity, NOAUTH...). */
  readonly rejected: number;
  /** Ran and failed (NOSCRIPT, a script error...). */
  readonly failed: number;
}

/** The stats of `command` (lower case) in the text of `INFO commandstats`; zeros when it was never called. */
export function commandStat(info: string, command: string): CommandStat {
  const line = new RegExp(`^cmdstat_${command}:(.*)$`, 'm').exec(info)?.[1] ?? '';
  const field = (name: string): number => Number(new RegExp(`(?:^|,)${name}=(\\d+)`).exec(line)?.[1] ?? 0);
  return { calls: field('calls'), rejected: field('rejected_calls'), failed: field('failed_calls') };
}
