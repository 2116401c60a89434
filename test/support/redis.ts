// A real `redis-server` for the quota tests and benchmark (DESIGN.md: "real `redis-server` in
// tests"): started on a free loopback port with no persistence (`--save '' --appendonly no`), so a
// restart starts empty, which is what a store that came back after a crash looks like. The test
// can stop it (SIGTERM: connections closed, the client sees a disconnect), freeze it (SIGSTOP:
// connections stay open and nothing answers, the client sees its command timeout), resume it, and
// start it again on the same port. Every process it started is killed at teardown.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import net from 'node:net';
import { freePort } from '../../scripts/lib/free-port.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** A `redis-server` the test controls. */
export interface RedisServer {
  /** Its port on 127.0.0.1. */
  readonly port: number;
  /** `127.0.0.1:<port>`, as `resilience.quota.redis.address` takes it. */
  readonly address: string;
  /** The running process's id (undefined while stopped). */
  readonly pid: number | undefined;
  /** SIGTERM, then waits for the exit: from now on a connection to the port is refused. */
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

/** Resolves once something accepts a TCP connection on 127.0.0.1:`port`, or rejects when `proc` exits first or after `timeoutMs`. */
async function accepting(port: number, proc: ChildProcess, output: () => string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`redis-server exited (${proc.exitCode ?? proc.signalCode}) before listening:\n${output()}`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`redis-server not listening on ${port} within ${timeoutMs} ms:\n${output()}`);
    await new Promise((r) => setTimeout(r, 20)); // another process starting: poll, bounded
  }
}

/**
 * Starts `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no [--requirepass X]` on a
 * free port (or `port`); resolves once it accepts connections. Killed (SIGKILL, after SIGCONT) at
 * teardown, whatever state the test left it in.
 */
export async function startRedis(t: Teardown, o: { readonly password?: string; readonly port?: number } = {}): Promise<RedisServer> {
  const port = o.port ?? (await freePort());
  let proc: ChildProcess | undefined;
  let output = '';
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--protected-mode', 'no', ...(o.password === undefined ? [] : ['--requirepass', o.password])];
  const launch = async (): Promise<void> => {
    output = '';
    const p = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    proc = p;
    p.stdout?.on('data', (d: Buffer) => (output += d.toString()));
    p.stderr?.on('data', (d: Buffer) => (output += d.toString()));
    await accepting(port, p, () => output);
  };
  const gone = (p: ChildProcess | undefined): boolean => p === undefined || p.exitCode !== null || p.signalCode !== null;
  t.teardown(async () => {
    const p = proc;
    if (gone(p)) return;
    p?.kill('SIGCONT');
    p?.kill('SIGKILL');
    if (!gone(p)) await once(p as ChildProcess, 'exit');
  });
  await launch();
  const auth = o.password === undefined ? [] : [['AUTH', o.password]];
  return {
    port,
    address: `127.0.0.1:${port}`,
    get pid() {
      return gone(proc) ? undefined : proc?.pid;
    },
    async stop() {
      const p = proc;
      if (gone(p)) return;
      p?.kill('SIGCONT');
      p?.kill('SIGTERM');
      if (!gone(p)) await once(p as ChildProcess, 'exit');
    },
    async start() {
      if (!gone(proc)) throw new Error('redis-server is already running');
      await launch();
    },
    freeze() {
      proc?.kill('SIGSTOP');
    },
    thaw() {
      proc?.kill('SIGCONT');
    },
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
