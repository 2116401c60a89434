// HTTP/3 benchmark: our echo server against Debian's caddy (when installed) and against a bare
// @matrixai/quic server that answers with pre-encoded HTTP/3 bytes (the library's floor), all
// driven by the same independent client, ngtcp2's `gtlsclient`, in the same run.
//
//   npm run bench:h3 [-- --requests 3000 --runs 3 --seconds 3 --profile]
//
// Phases per server:
// - one connection, many streams: `gtlsclient -n N` (it keeps as many streams open as the server
//   allows, 100 here); req/s over the run and per-request latency from its frame log;
// - a new connection per request: 4 gtlsclient processes in a loop, one request each (full
//   handshake with Retry); latency is the client's own time from start to the response's FIN.
// Server CPU per request comes from /proc/<pid>/stat (utime + stime) around each phase.
// With --profile, our server runs once more under --cpu-prof and its self time is split into
// our code, the QUIC library (and its helper packages), Node internals and GC.

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeLeaf } from '../lib/certs.ts';
import { toolPath } from '../system-tools.ts';
import { streamLatencies } from '../lib/gtlsclient-log.ts';
import { udpPortsOf } from '../../packages/http3/test/net-helpers.ts';
import { scriptArgs } from '../lib/bench-args.ts';

const { values } = scriptArgs({
  options: {
    requests: { type: 'string', default: '3000' },
    runs: { type: 'string', default: '3' },
    seconds: { type: 'string', default: '3' },
    profile: { type: 'boolean', default: false },
    'serve-raw': { type: 'boolean', default: false },
    cert: { type: 'string' },
    key: { type: 'string' },
  },
  strict: true,
});

if (values['serve-raw']) {
  await serveRaw(values.cert as string, values.key as string);
} else {
  await main();
}

interface Target {
  name: string;
  proc: ChildProcess;
  port: number;
  path: string;
}

interface Phase {
  target: string;
  phase: string;
  requests: number;
  reqPerSec: number;
  p50: number;
  p99: number;
  serverCpuUsPerReq: number;
}

async function main(): Promise<void> {
  const gtlsclient = toolPath('gtlsclient');
  if (gtlsclient === undefined) throw new Error('gtlsclient is missing: install the Debian package ngtcp2-client');
  const dir = mkdtempSync(path.join(tmpdir(), 'bench-h3-'));
  const children: ChildProcess[] = [];
  const cleanup = (): void => {
    for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanup);
  try {
    const leaf = makeLeaf(dir, 'bench', undefined, { sans: ['localhost', '127.0.0.1'] });
    const node = process.execPath;
    const here = path.dirname(new URL(import.meta.url).pathname);
    const echo = path.resolve(here, '../../packages/http3/examples/echo-server.ts');
    const targets: Target[] = [];
    const ours = await startJsonServer(node, [echo, '--port', '0', '--host', '127.0.0.1', '--cert', leaf.cert, '--key', leaf.key], children);
    targets.push({ name: 'edge-proxy http3 (echo server)', proc: ours.proc, port: ours.port, path: '/bytes/2' });
    const raw = await startJsonServer(node, [path.join(here, 'h3.ts'), '--serve-raw', '--cert', leaf.cert, '--key', leaf.key], children);
    targets.push({ name: '@matrixai/quic bare (pre-encoded reply)', proc: raw.proc, port: raw.port, path: '/' });
    const caddy = toolPath('caddy');
    if (caddy !== undefined) {
      const c = await startCaddy(caddy, dir, leaf.cert, leaf.key, children);
      targets.push({ name: 'caddy (Debian, HTTP/3)', proc: c.proc, port: c.port, path: '/' });
    } else {
      console.log('caddy not installed (Debian package caddy): skipped');
    }
    const requests = Number(values.requests);
    const results: Phase[] = [];
    for (const target of targets) {
      await manyStreams(gtlsclient, target, 200); // warm-up
      for (let run = 0; run < Number(values.runs); run++) results.push(await manyStreams(gtlsclient, target, requests));
      results.push(await connectionPerRequest(gtlsclient, target, Number(values.seconds) * 1000));
    }
    printTable(results);
    if (values.profile) await profileOurs(node, echo, leaf, gtlsclient, requests, dir, children);
  } finally {
    cleanup();
  }
}

async function startJsonServer(node: string, args: string[], children: ChildProcess[]): Promise<{ proc: ChildProcess; port: number }> {
  const proc = spawn(node, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(proc);
  const port = await new Promise<number>((resolve, reject) => {
    let buf = '';
    proc.stdout?.on('data', (d: Buffer) => {
      buf += d.toString();
      const m = /"port":(\d+)/.exec(buf);
      if (m?.[1] !== undefined) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
  return { proc, port };
}

async function startCaddy(caddy: string, dir: string, cert: string, key: string, children: ChildProcess[]): Promise<{ proc: ChildProcess; port: number }> {
  const home = path.join(dir, 'caddy');
  const file = path.join(dir, 'Caddyfile');
  writeFileSync(file, `{\n\tadmin off\n\tauto_https off\n\tservers {\n\t\tprotocols h3\n\t}\n}\nhttps://localhost:0 {\n\ttls ${cert} ${key}\n\trespond "xx" 200\n}\n`);
  const env = { ...process.env, HOME: home, XDG_DATA_HOME: home, XDG_CONFIG_HOME: home };
  const proc = spawn(caddy, ['run', '--config', file, '--adapter', 'caddyfile'], { stdio: ['ignore', 'ignore', 'pipe'], env });
  children.push(proc);
  // caddy prints no port for :0; it reports "server running" on stderr, then we read /proc.
  await new Promise<void>((resolve, reject) => {
    let buf = '';
    proc.stderr?.on('data', (d: Buffer) => {
      buf += d.toString();
      if (buf.includes('server running')) resolve();
    });
    proc.on('exit', (code) => reject(new Error(`caddy exited with ${code}: ${buf.slice(-500)}`)));
  });
  const [port] = udpPortsOf(proc.pid as number);
  if (port === undefined) throw new Error('caddy bound no UDP port');
  return { proc, port };
}

function cpuMicros(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1e6) / 100; // USER_HZ is 100 on Linux
}

function runClient(gtlsclient: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    const p = spawn(gtlsclient, ['--no-quic-dump', '--no-http-dump', '--exit-on-all-streams-close', '--timeout=20s', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const parts: Buffer[] = [];
    p.stdout.on('data', (d: Buffer) => parts.push(d));
    p.stderr.on('data', (d: Buffer) => parts.push(d));
    p.on('exit', () => resolve(Buffer.concat(parts).toString()));
  });
}

function percentile(sorted: number[], p: number): number {
  return sorted.length === 0 ? NaN : (sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))] as number);
}

async function manyStreams(gtlsclient: string, target: Target, n: number): Promise<Phase> {
  const before = cpuMicros(target.proc.pid as number);
  const log = await runClient(gtlsclient, ['-n', String(n), '127.0.0.1', String(target.port), `https://localhost:${target.port}${target.path}`]);
  const cpu = cpuMicros(target.proc.pid as number) - before;
  const { latencies, first, last } = streamLatencies(log);
  latencies.sort((a, b) => a - b);
  const done = latencies.length;
  if (done < n) console.log(`${target.name}: only ${done} of ${n} requests completed`);
  return {
    target: target.name,
    phase: 'one connection, 100 streams in flight',
    requests: done,
    reqPerSec: done / (Math.max(1, last - first) / 1000),
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    serverCpuUsPerReq: cpu / Math.max(1, done),
  };
}

async function connectionPerRequest(gtlsclient: string, target: Target, ms: number): Promise<Phase> {
  const before = cpuMicros(target.proc.pid as number);
  const latencies: number[] = [];
  const start = performance.now();
  const deadline = start + ms;
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      while (performance.now() < deadline) {
        const log = await runClient(gtlsclient, ['127.0.0.1', String(target.port), `https://localhost:${target.port}${target.path}`]);
        // The client's clock starts with the connection: the FIN's timestamp is the full latency.
        const m = /^I(\d+) \S+ frm rx \d+ 1RTT STREAM\(0x[0-9a-f]+\) id=0x0 fin=1/m.exec(log);
        if (m?.[1] !== undefined) latencies.push(Number(m[1]));
      }
    }),
  );
  const elapsed = (performance.now() - start) / 1000;
  const cpu = cpuMicros(target.proc.pid as number) - before;
  latencies.sort((a, b) => a - b);
  return {
    target: target.name,
    phase: 'new connection per request (4 clients)',
    requests: latencies.length,
    reqPerSec: latencies.length / elapsed,
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    serverCpuUsPerReq: cpu / Math.max(1, latencies.length),
  };
}

function printTable(results: Phase[]): void {
  console.log('\n| server | phase | requests | req/s | p50 ms | p99 ms | server CPU µs/req |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of results) {
    console.log(`| ${r.target} | ${r.phase} | ${r.requests} | ${Math.round(r.reqPerSec)} | ${r.p50} | ${r.p99} | ${Math.round(r.serverCpuUsPerReq)} |`);
  }
}

async function profileOurs(node: string, echo: string, leaf: { cert: string; key: string }, gtlsclient: string, n: number, dir: string, children: ChildProcess[]): Promise<void> {
  const profDir = path.join(dir, 'prof');
  const s = await startJsonServer(node, ['--cpu-prof', `--cpu-prof-dir=${profDir}`, echo, '--port', '0', '--host', '127.0.0.1', '--cert', leaf.cert, '--key', leaf.key], children);
  const target = { name: 'profiled', proc: s.proc, port: s.port, path: '/bytes/2' };
  await manyStreams(gtlsclient, target, 200);
  for (let i = 0; i < 2; i++) await manyStreams(gtlsclient, target, n);
  await new Promise<void>((resolve) => {
    s.proc.on('exit', () => resolve());
    s.proc.kill('SIGTERM');
  });
  const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
  if (file === undefined) return;
  const prof = JSON.parse(readFileSync(path.join(profDir, file), 'utf8')) as { nodes: Array<{ id: number; callFrame: { url: string; functionName: string } }>; samples: number[]; timeDeltas: number[] };
  const byNode = new Map<number, number>();
  prof.samples.forEach((id, i) => byNode.set(id, (byNode.get(id) ?? 0) + (prof.timeDeltas[i] ?? 0)));
  const buckets = new Map<string, number>();
  let total = 0;
  for (const n of prof.nodes) {
    const t = byNode.get(n.id) ?? 0;
    const { url, functionName } = n.callFrame;
    let bucket = 'other JavaScript';
    if (functionName === '(idle)') continue;
    if (functionName === '(garbage collector)') bucket = 'garbage collection';
    else if (url.includes('/packages/http3/')) bucket = 'ours (packages/http3)';
    else if (url.includes('@matrixai/quic')) bucket = '@matrixai/quic';
    else if (url.includes('/node_modules/@matrixai/') || url.includes('ts-custom-error')) bucket = '@matrixai helpers (events, locks, timers, errors)';
    else if (url.startsWith('node:')) bucket = 'Node internals (dgram, events, streams, timers)';
    else if (url === '' && functionName !== '(program)') bucket = 'native (quiche, crypto, syscalls)';
    else if (functionName === '(program)') bucket = 'native (quiche, crypto, syscalls)';
    buckets.set(bucket, (buckets.get(bucket) ?? 0) + t);
    total += t;
  }
  console.log('\nCPU profile of our server (busy time, self time by owner):');
  console.log('| owner | share |');
  console.log('|---|---|');
  for (const [k, v] of [...buckets.entries()].sort((a, b) => b[1] - a[1])) console.log(`| ${k} | ${((v / total) * 100).toFixed(1)} % |`);
}

// The library's floor: accept HTTP/3 connections with @matrixai/quic directly, open the control
// stream with SETTINGS, drain the peer's unidirectional streams, and answer every request stream
// with the same pre-encoded bytes once its FIN arrives. No frame parsing, no QPACK decoding.
async function serveRaw(cert: string, key: string): Promise<void> {
  const { QUICServer, events } = await import('@matrixai/quic');
  const { QpackEncoder, encodeHeadersFrame, encodeDataFrame, encodeSettingsFrame } = await import('../../packages/http3/src/index.ts');
  const { serverCrypto, transportLogger, reasonToCode, codeToReason } = await import('../../packages/http3/src/quic-adapter.ts');
  const { randomBytes } = await import('node:crypto');
  const reply = Buffer.concat([
    encodeHeadersFrame(new QpackEncoder().encodeFieldSection(0, [[':status', '200'], ['content-type', 'text/plain'], ['content-length', '2']])),
    encodeDataFrame(Buffer.from('xx')),
  ]);
  const server = new QUICServer({
    crypto: serverCrypto(randomBytes(32)),
    config: { key: readFileSync(key, 'utf8'), cert: readFileSync(cert, 'utf8'), verifyPeer: false, applicationProtos: ['h3'], maxIdleTimeout: 30000, initialMaxStreamsBidi: 100, initialMaxStreamsUni: 8, readableChunkSize: 16384 },
    reasonToCode,
    codeToReason,
    minIdleTimeout: 10000,
    logger: transportLogger('raw'),
  });
  server.addEventListener(events.EventQUICServerConnection.name, (evt: Event) => {
    const conn = (evt as InstanceType<typeof events.EventQUICServerConnection>).detail;
    try {
      const control = conn.newStream('uni').writable.getWriter();
      control.write(Buffer.concat([Buffer.from([0x00]), encodeSettingsFrame({})])).catch(() => {});
    } catch {
      return;
    }
    conn.addEventListener(events.EventQUICConnectionStream.name, (e: Event) => {
      const stream = (e as InstanceType<typeof events.EventQUICConnectionStream>).detail;
      void (async () => {
        try {
          const reader = stream.readable.getReader();
          while (!(await reader.read()).done);
          if (stream.type === 'bidi') {
            const w = stream.writable.getWriter();
            await w.write(reply);
            await w.close();
          }
        } catch {
          // reset by the client: nothing to do
        }
      })();
    });
  });
  await server.start({ host: '127.0.0.1', port: 0 });
  console.log(JSON.stringify({ event: 'listening', port: server.port }));
  process.on('SIGTERM', () => void server.stop({ force: true }).then(() => process.exit(0)));
}

