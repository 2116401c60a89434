// A real redis-server for tests (Debian's, from PATH): started on a free loopback port, in a temp
// dir, no persistence; stopped, restarted on the same port, paused (SIGSTOP, a hung server) and
// resumed. `redis-cli` runs commands against it. Every process is killed by `stop` (call it in
// teardown). Reusable by the end-to-end helpers.
import { spawn, execFile } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';

export interface RedisServerOptions {
  /** `--requirepass`. */
  readonly password?: string;
}

/** A free loopback TCP port (bound on port 0, then released). */
export async function freePort(): Promise<number> {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const port = (srv.address() as net.AddressInfo).port;
  srv.close();
  await once(srv, 'close');
  return port;
}

export class RedisServer {
  readonly port: number;
  readonly password: string | undefined;
  private readonly dir: string;
  private child: ChildProcess | undefined;

  private constructor(port: number, password: string | undefined) {
    this.port = port;
    this.password = password;
    this.dir = mkdtempSync(path.join(tmpdir(), 'edge-redis-'));
  }

  /** Starts a server on a free port; resolves when it accepts connections. */
  static async start(o: RedisServerOptions = {}): Promise<RedisServer> {
    for (let attempt = 0; ; attempt++) {
      const s = new RedisServer(await freePort(), o.password);
      try {
        await s.restart();
        return s;
      } catch (err) {
        await s.stop();
        if (attempt >= 4) throw err; // the port was taken between freePort and the bind, five times
      }
    }
  }

  /** `host:port` for `resilience.quota.redis.address`. */
  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  get running(): boolean {
    return this.child !== undefined;
  }

  /** (Re)starts the server on its port; resolves when it logs "Ready to accept connections". */
  async restart(): Promise<void> {
    if (this.child !== undefined) throw new Error('redis-server is already running');
    const args = ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', this.dir, '--daemonize', 'no'];
    if (this.password !== undefined) args.push('--requirepass', this.password);
    const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.child = child;
    let out = '';
    const ready = new Promise<void>((resolve, reject) => {
      const onData = (b: Buffer): void => {
        out += b.toString();
        if (out.includes('Ready to accept connections')) {
          child.stdout?.off('data', onData);
          child.stdout?.resume();
          resolve();
        }
      };
      child.stdout?.on('data', onData);
      child.stderr?.resume();
      child.once('exit', (code) => reject(new Error(`redis-server exited (${String(code)}) before it was ready: ${out.slice(-500)}`)));
      child.once('error', reject);
    });
    try {
      await ready;
    } catch (err) {
      this.child = undefined;
      throw err;
    }
  }

  /** Kills the server (SIGKILL: as abrupt as a crash) and waits for it to exit. Keeps the port for `restart`. */
  async kill(): Promise<void> {
    const child = this.child;
    if (child === undefined) return;
    this.child = undefined;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit');
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await exited;
    }
  }

  /** Freezes the server (SIGSTOP): connections stay open, nothing answers. */
  pause(): void {
    this.child?.kill('SIGSTOP');
  }

  resume(): void {
    this.child?.kill('SIGCONT');
  }

  /** Runs `redis-cli` with `args` against the server; resolves its stdout. */
  async cli(...args: string[]): Promise<string> {
    const base = ['-h', '127.0.0.1', '-p', String(this.port)];
    const env = { ...process.env };
    if (this.password !== undefined) env['REDISCLI_AUTH'] = this.password;
    return new Promise((resolve, reject) => {
      execFile('redis-cli', [...base, ...args], { env, timeout: 5000 }, (err, stdout) => (err === null ? resolve(stdout) : reject(err)));
    });
  }

  /** `calls` of command `name` in INFO commandstats (e.g. `evalsha`); 0 when never called. */
  async commandCalls(name: string): Promise<number> {
    const info = await this.cli('INFO', 'commandstats');
    const m = new RegExp(`^cmdstat_${name}:calls=(\\d+)`, 'm').exec(info);
    return m === null ? 0 : Number(m[1]);
  }

  /** Stops the server for good and removes its directory. */
  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
