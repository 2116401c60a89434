// Helpers for end-to-end tests that kill or stop real worker processes of `edge-proxy serve`:
// requests on fresh connections (so the kernel spreads them over every worker's SO_REUSEPORT
// socket), the runtime snapshot's worker list, and a bounded wait for /ready.
import https from 'node:https';
import { api } from './serve.ts';

export interface WorkerFacts {
  readonly index: number;
  readonly pid: number;
  readonly generation: number;
  readonly state: string;
  readonly incarnation: number;
  readonly last_heard_ms_ago: number;
}

/** The snapshot's `workers` block: the list, and exits (by reason) and re-forks since start. */
export interface WorkersBlock {
  readonly list: WorkerFacts[];
  readonly exits: Readonly<Record<string, number>>;
  readonly reforks: number;
}

export interface Proxy {
  readonly lport: number;
  readonly cport: number;
  readonly ca: Buffer;
  readonly token: string;
}

/** One GET on a new TLS connection; resolves with the body, or `error: ...` (timeout included). */
export function getFresh(p: Proxy, timeoutMs = 3000): Promise<string> {
  return new Promise((resolve) => {
    const req = https.get({ host: '127.0.0.1', port: p.lport, path: '/', ca: p.ca, servername: 'localhost', agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve(res.statusCode === 200 ? body : `status ${res.statusCode}: ${body.slice(0, 60)}`));
      res.on('error', (err) => resolve(`error: ${err.message}`));
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('timeout')));
    req.on('error', (err) => resolve(`error: ${err.message}`));
  });
}

/** `n` requests, one after another, each on its own connection; the bodies. */
export async function getMany(p: Proxy, n: number, timeoutMs = 3000): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(await getFresh(p, timeoutMs));
  return out;
}

/** Counts of each distinct body. */
export function tally(bodies: readonly string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const b of bodies) out[b] = (out[b] ?? 0) + 1;
  return out;
}

export async function snapshot(p: Proxy): Promise<Record<string, unknown>> {
  return (await api(p.cport, p.ca, 'GET', '/admin/runtime', { token: p.token })).body;
}

export async function workersBlock(p: Proxy): Promise<WorkersBlock> {
  return (await snapshot(p))['workers'] as WorkersBlock;
}

export async function workers(p: Proxy): Promise<WorkerFacts[]> {
  return (await workersBlock(p)).list;
}

/** Polls /ready (bounded: `tries` × 200 ms) until it answers `want`; the last status seen. */
export async function waitReady(p: Proxy, want = 200, tries = 150): Promise<number> {
  let status = 0;
  for (let i = 0; i < tries; i++) {
    status = (await api(p.cport, p.ca, 'GET', '/ready')).status;
    if (status === want) return status;
    await new Promise((r) => setTimeout(r, 200)); // the state changes in other processes: poll, bounded
  }
  return status;
}

/** Whether process `pid` still exists (signal 0 probes without sending anything). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
