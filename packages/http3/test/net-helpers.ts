// Helpers for tests with real UDP sockets on loopback: certificates in a temp dir, servers and
// clients torn down with the test, waiting for sessions to close, child processes that are
// always killed, and reading the UDP port a child process bound (for tools without --port 0
// output).

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Test } from 'tap';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';
import { toolPath } from '../../../scripts/system-tools.ts';
import { Http3ClientSession, Http3Server } from '../src/index.ts';
import type { ClientConnectOptions, Http3ServerOptions } from '../src/index.ts';

/** Certificate material for one test: a CA and a leaf for localhost, 127.0.0.1 and ::1. */
export interface TestPki {
  dir: string;
  caPem: string;
  certPem: string;
  keyPem: string;
  certFile: string;
  keyFile: string;
}

/** A temp dir removed when the test ends. */
export function tempDir(t: Test, prefix = 'h3-test-'): string {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Makes a CA and a server leaf certificate in a temp dir. */
export function makePki(t: Test): TestPki {
  const dir = tempDir(t);
  const ca = makeCa(dir);
  const leaf = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1', '::1'] });
  return {
    dir,
    caPem: readFileSync(ca.cert, 'utf8'),
    certPem: readFileSync(leaf.cert, 'utf8'),
    keyPem: readFileSync(leaf.key, 'utf8'),
    certFile: leaf.cert,
    keyFile: leaf.key,
  };
}

/** Starts a server on 127.0.0.1 port 0; destroyed at teardown. */
export async function startServer(t: Test, pki: TestPki, options: Partial<Http3ServerOptions> = {}): Promise<{ server: Http3Server; port: number }> {
  const server = new Http3Server({ key: pki.keyPem, cert: pki.certPem, ...options });
  const { port } = await server.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => server.destroy());
  return { server, port };
}

/** Connects a client that trusts the test CA; destroyed at teardown. */
export async function connect(t: Test, pki: TestPki, port: number, options: Partial<ClientConnectOptions> = {}): Promise<Http3ClientSession> {
  const client = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: pki.caPem, localHost: '127.0.0.1', ...options });
  t.teardown(() => client.close(true));
  return client;
}

/** Resolves once the server holds no session (each session emits 'close' when released). */
export async function sessionsClosed(server: Http3Server): Promise<void> {
  await Promise.all([...server.liveSessions].map((s) => (s.closed ? undefined : new Promise((resolve) => s.once('close', resolve)))));
}

/** Asserts the server holds no sessions, streams or timers (library counts included). */
export async function assertNothingHeld(t: Test, server: Http3Server): Promise<void> {
  await sessionsClosed(server);
  const s = server.stats();
  t.same(
    { sessions: s.sessions, requestStreams: s.requestStreams, uniStreams: s.uniStreams, timers: s.timers, quicConnections: s.quicConnections, quicStreams: s.quicStreams },
    { sessions: 0, requestStreams: 0, uniStreams: 0, timers: 0, quicConnections: 0, quicStreams: 0 },
    'server holds no sessions, streams, connections or timers',
  );
}

/** QUIC streams an open connection keeps: three unidirectional streams each way (control, QPACK encoder and decoder). */
export const CONTROL_STREAMS = 6;

/**
 * Resolves with the library's stream count once it is at most `limit`, or after 2 s with the
 * count then (the caller asserts): the library destroys a stream a turn or two after both of its
 * directions closed, an event it does not expose.
 */
export async function quicStreamsSettled(server: Http3Server, limit: number): Promise<number> {
  const deadline = Date.now() + 2000;
  while (server.stats().quicStreams > limit && Date.now() < deadline) await new Promise((r) => setImmediate(r));
  return server.stats().quicStreams;
}

/** Full path of a system tool, or fails the test naming the Debian package. */
export function requireTool(t: Test, command: string, debianPackage: string): string {
  const p = toolPath(command);
  if (p === undefined) t.fail(`${command} is missing: install the Debian package ${debianPackage}`);
  return p ?? command;
}

/** A child process killed at teardown; output collected. */
export interface Child {
  proc: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Resolves with the exit code (or signal name). */
  exited: Promise<number | string>;
}

/** Spawns `cmd`, killing it (SIGKILL) at teardown if still running. */
export function spawnChild(t: Test, cmd: string, args: string[], options: { cwd?: string } = {}): Child {
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options });
  let out = '';
  let err = '';
  proc.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exited = new Promise<number | string>((resolve) => {
    proc.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown'));
    proc.on('error', () => resolve('spawn-error'));
  });
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await exited;
    }
  });
  return { proc, stdout: () => out, stderr: () => err, exited };
}

/** Resolves with the first stdout line of `child` that parses as JSON and matches `pred`. */
export function jsonLine<T>(child: Child, pred: (v: T) => boolean): Promise<T> {
  return new Promise((resolve, reject) => {
    let buffer = '';
    const onData = (d: Buffer): void => {
      buffer += d.toString();
      let nl: number;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        try {
          const v = JSON.parse(line) as T;
          if (pred(v)) {
            child.proc.stdout?.off('data', onData);
            resolve(v);
            return;
          }
        } catch {
          // not JSON: keep reading
        }
      }
    };
    child.proc.stdout?.on('data', onData);
    void child.exited.then((code) => reject(new Error(`process exited (${code}) before the line: ${child.stderr().slice(-2000)}`)));
  });
}

/**
 * The UDP ports `pid` has bound, from /proc: its socket inodes matched against /proc/net/udp{,6}.
 * For tools that accept port 0 but do not print the port they got.
 */
export function udpPortsOf(pid: number): number[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m?.[1] !== undefined) inodes.add(m[1]);
    } catch {
      // the fd closed meanwhile
    }
  }
  const ports: number[] = [];
  for (const table of ['/proc/net/udp', '/proc/net/udp6']) {
    let text = '';
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      const local = cols[1];
      const inode = cols[9];
      if (local !== undefined && inode !== undefined && inodes.has(inode)) ports.push(parseInt(local.split(':')[1] ?? '0', 16));
    }
  }
  return ports;
}

/**
 * Waits until `pid` has bound a UDP port. The tool reports nothing when it binds, so this polls
 * /proc every 20 ms, at most `tries` times.
 */
export async function waitForUdpPort(pid: number, tries = 250): Promise<number> {
  for (let i = 0; i < tries; i++) {
    const [port] = udpPortsOf(pid);
    if (port !== undefined && port !== 0) return port;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`process ${pid} bound no UDP port`);
}

/** The pinned Node (the system one cannot run our TypeScript). */
export const NODE = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../../node_modules/.bin/node');
