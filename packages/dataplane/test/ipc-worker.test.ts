// IpcWorker (worker/ipc-worker.ts) driven in-process over an in-memory endpoint pair: the
// supervisor side is the real RequestChannel, the worker side the real serveRequests, so requests
// and replies cross the same contract as over a process pipe (structured clone on delivery).
// Checks the two-phase handling (prepare / commit / abort), reload-certs and the live heartbeat
// interval against real listeners and node:http backends. Ports: backends 0, listener freePort.
import t from 'tap';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { X509Certificate, randomBytes } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { loadConfigText } from '@edge-proxy/config';
import { RequestChannel } from '@edge-proxy/ipc';
import type { FromWorker, GenerationBundle, IpcEndpoint, ToWorker } from '@edge-proxy/ipc';
import { IpcWorker } from '../src/worker/ipc-worker.ts';
import { makeCa, makeLeaf } from '../../../scripts/lib/certs.ts';
import { freePort } from '../../../scripts/lib/free-port.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'edge-ipc-worker-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const certA = makeLeaf(dir, 'leaf-a', ca, { sans: ['localhost', '127.0.0.1'] });
const certB = makeLeaf(dir, 'leaf-b', ca, { sans: ['localhost', '127.0.0.1'] });
const caPem = readFileSync(ca.cert);
const fpA = new X509Certificate(readFileSync(certA.cert)).fingerprint256;
const fpB = new X509Certificate(readFileSync(certB.cert)).fingerprint256;

async function backend(body: string): Promise<number> {
  const server = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/plain' }).end(body));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  }));
  return (server.address() as AddressInfo).port;
}
const portA = await backend('gen-a');
const portB = await backend('gen-b');
const lport = await freePort();

interface BundleOpts {
  readonly backendPort: number;
  readonly cert?: typeof certA;
  readonly heartbeatMs?: number;
  readonly extraUpstream?: string;
  /** A second listener (the same certificate) on this port: an added listener. */
  readonly addedPort?: number;
}
async function bundle(generation: number, o: BundleOpts): Promise<GenerationBundle> {
  const c = o.cert ?? certA;
  const r = await loadConfigText(
    `
${
  o.addedPort === undefined
    ? `listen: { address: 127.0.0.1, port: ${lport}, tls: { cert: ${c.cert}, key: ${c.key} } }`
    : `listeners:
  - { address: 127.0.0.1, port: ${lport}, tls: { cert: ${c.cert}, key: ${c.key} } }
  - { address: 127.0.0.1, port: ${o.addedPort}, tls: { cert: ${c.cert}, key: ${c.key} } }`
}
performance: { worker_heartbeat_ms: ${o.heartbeatMs ?? 60000} }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: a, address: "127.0.0.1:${o.backendPort}" }]
${o.extraUpstream ?? ''}`,
    dir,
  );
  if (!r.ok) throw new Error(JSON.stringify(r.issues));
  return { generation, resolved: r.value };
}

/** Two in-memory endpoints: what one sends, the other receives (a structured clone, asynchronously). */
class MemEndpoint extends EventEmitter implements IpcEndpoint {
  peer: MemEndpoint | undefined;
  send(message: unknown, _handle?: undefined, callback?: (error: Error | null) => void): boolean {
    const copy = structuredClone(message);
    setImmediate(() => {
      this.peer?.emit('message', copy);
      callback?.(null);
    });
    return true;
  }
}
const sup = new MemEndpoint();
const wrk = new MemEndpoint();
sup.peer = wrk;
wrk.peer = sup;
/** Everything the worker sent, in order. */
const fromWorker: FromWorker[] = [];
sup.on('message', (m: unknown) => fromWorker.push(m as FromWorker));
// The supervisor's token ledger, with room for everything: connections are admitted from it.
sup.on('message', (m: unknown) => {
  const x = m as FromWorker;
  if (x.type === 'tokens' && x.asks.length > 0) sup.send({ type: 'token-grants', grants: x.asks.map((a) => ({ budget: a.budget, key: a.key, granted: Math.max(a.want, a.waiting), waitMs: 0, block: 1 })) });
});
// The supervisor's lease ledger (controlplane limits/lease-service.ts), with room for everything:
// requests are admitted from in-flight slots it leases, so every ask is answered in full at once.
sup.on('message', (m: unknown) => {
  const x = m as FromWorker;
  if (x.type !== 'lease') return;
  const grants = x.asks.filter((a) => a.asks).map((a) => ({ key: a.key, add: a.need + a.extra, revoke: 0, contended: false, reply: true, exhausted: false, block: Math.max(1, a.extra), limit: 1_000_000, nodeHeld: a.used }));
  if (grants.length > 0) sup.send({ type: 'lease', grants });
});
function nextFromWorker<T extends FromWorker['type']>(type: T, timeoutMs = 15_000): Promise<Extract<FromWorker, { type: T }>> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      sup.off('message', on);
      reject(new Error(`no ${type} message within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (m: unknown): void => {
      if ((m as FromWorker).type !== type) return;
      clearTimeout(timer);
      sup.off('message', on);
      resolve(m as Extract<FromWorker, { type: T }>);
    };
    sup.on('message', on);
  });
}

const channel = new RequestChannel<Extract<ToWorker, { id: number }>>(sup);
const worker = new IpcWorker({ endpoint: wrk, heartbeatMs: 60_000 });
t.teardown(async () => {
  channel.close();
  await worker.close();
});
const ready = nextFromWorker('ready');
worker.start();
t.equal((await ready).pid, process.pid, 'the worker announces itself with ready');
sup.send({ type: 'init', keys: { cryptoKey: randomBytes(32), ticketKey: randomBytes(48) }, workerIndex: 0 });

const TIMEOUT = 15_000;
const prepare = (b: GenerationBundle): Promise<unknown> => channel.request({ type: 'prepare', bundle: b }, TIMEOUT);
const commit = (generation: number): Promise<unknown> => channel.request({ type: 'commit', generation }, TIMEOUT);
const abort = (generation: number): Promise<unknown> => channel.request({ type: 'abort', generation }, TIMEOUT);

let tcpPort = 0;
function get(port = tcpPort): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port, path: '/', servername: 'localhost', ca: caPem, agent: false, timeout: TIMEOUT }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve(body));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
  });
}
function presented(): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: tcpPort, servername: 'localhost', ca: caPem, ALPNProtocols: ['http/1.1'] }, () => {
      const fp = s.getPeerCertificate().fingerprint256;
      s.end();
      resolve(fp);
    });
    s.on('error', reject);
  });
}

t.test('first prepare + commit binds the listeners, announces them and serves the generation', async (t) => {
  await prepare(await bundle(1, { backendPort: portA }));
  const listening = nextFromWorker('listening');
  await commit(1);
  const l = await listening;
  t.equal(l.generation, 1);
  t.equal(l.listeners.length, 1);
  const first = l.listeners[0];
  if (first === undefined) throw new Error('no listener');
  t.equal(first.tcp, lport, 'the TCP port of the configured listener');
  t.equal(first.udp, lport, 'the UDP port of the configured listener');
  tcpPort = first.tcp;
  t.equal(await get(), 'gen-a');
  t.equal(await presented(), fpA, 'the listener presents the certificate of generation 1');
});

t.test('a prepared generation does not serve until its commit', async (t) => {
  await prepare(await bundle(2, { backendPort: portB }));
  t.equal(await get(), 'gen-a', 'still generation 1 after prepare');
  await commit(2);
  t.equal(await get(), 'gen-b', 'generation 2 after commit');
  await t.rejects(commit(2), { code: 'EDGE_NOT_PREPARED' }, 'a committed generation is no longer pending');
  t.equal(fromWorker.filter((m) => m.type === 'listening').length, 1, 'listeners are bound once, not again on later commits');
});

t.test('commit of a generation that is not prepared is refused', async (t) => {
  await t.rejects(commit(3), { code: 'EDGE_NOT_PREPARED', message: 'generation 3 is not prepared' }, 'nothing pending');
  await prepare(await bundle(3, { backendPort: portA }));
  await t.rejects(commit(4), { code: 'EDGE_NOT_PREPARED' }, 'another generation is pending');
  t.equal(await get(), 'gen-b', 'traffic unchanged');
  await abort(3);
  await t.rejects(commit(3), { code: 'EDGE_NOT_PREPARED' }, 'commit after abort of that generation');
  t.equal(await get(), 'gen-b', 'traffic unchanged after the refused commits');
  await t.rejects(commit(2), { code: 'EDGE_NOT_PREPARED' }, 'the active generation is not pending again');
});

t.test('abort of another generation keeps the pending one; abort of the pending one drops it', async (t) => {
  await prepare(await bundle(5, { backendPort: portA }));
  t.equal(await abort(4), undefined, 'abort of an unknown generation succeeds');
  await commit(5);
  t.equal(await get(), 'gen-a', 'the pending generation survived the foreign abort and committed');
  await prepare(await bundle(6, { backendPort: portB }));
  await abort(6);
  await t.rejects(commit(6), { code: 'EDGE_NOT_PREPARED' });
  t.equal(await get(), 'gen-a');
});

t.test('a prepare that cannot provision is refused with the generation named; the active one serves on', async (t) => {
  // A valid client certificate pair whose key material is then swapped for another key: it passed
  // validation (the supervisor resolved it), but the TLS library refuses the pair at provision.
  const certPem = readFileSync(certA.cert, 'utf8');
  const keyPem = readFileSync(certA.key, 'utf8');
  const valid = await bundle(7, {
    backendPort: portB,
    extraUpstream: `
  secure:
    route: { path_prefix: /secure }
    backends: [{ id: s, address: "https://127.0.0.1:${portB}" }]
    tls: { client_certificate: ${JSON.stringify(certPem)}, client_key: ${JSON.stringify(keyPem)} }`,
  });
  const secrets = Object.fromEntries(
    Object.entries(valid.resolved.material.secrets).map(([k, v]) => [k, v.value === keyPem ? { ...v, value: readFileSync(certB.key, 'utf8') } : v]),
  );
  t.not(JSON.stringify(secrets), JSON.stringify(valid.resolved.material.secrets), 'the key was swapped');
  const bad: GenerationBundle = { generation: 7, resolved: { ...valid.resolved, material: { ...valid.resolved.material, secrets } } };
  await t.rejects(prepare(bad), { code: 'EDGE_PREPARE_FAILED', message: /^generation 7 failed to prepare: upstream secure: TLS material cannot be used/ });
  await t.rejects(commit(7), { code: 'EDGE_NOT_PREPARED' }, 'the failed generation is not pending');
  t.equal(await get(), 'gen-a', 'the active generation keeps serving');
  // A failed prepare does not replace what was pending before it.
  await prepare(await bundle(8, { backendPort: portB }));
  await t.rejects(prepare(bad), { code: 'EDGE_PREPARE_FAILED' });
  await commit(8);
  t.equal(await get(), 'gen-b', 'the earlier pending generation survives a failed prepare');
});

t.test('a commit carrying another listener certificate, and reload-certs, change the presented certificate', async (t) => {
  t.equal(await presented(), fpA);
  const withB = await bundle(9, { backendPort: portA, cert: certB });
  await prepare(withB);
  t.equal(await presented(), fpA, 'prepare alone changes nothing');
  await commit(9);
  t.equal(await presented(), fpB, 'new connections get the certificate of the committed generation');
  t.equal(await get(), 'gen-a');
  const withA = await bundle(10, { backendPort: portA, cert: certA });
  await channel.request({ type: 'reload-certs', listeners: withA.resolved.material.listeners }, TIMEOUT);
  t.equal(await presented(), fpA, 'reload-certs swaps the certificate');
  await channel.request({ type: 'reload-certs', listeners: {} }, TIMEOUT);
  t.equal(await presented(), fpA, 'reload-certs without material for the listener keeps it');
});

t.test('the committed generation sets the heartbeat interval', async (t) => {
  // Constructed with 60 s, and every generation so far said 60 s: no heartbeat yet.
  t.equal(fromWorker.filter((m) => m.type === 'heartbeat').length, 0, 'no heartbeat at the constructor interval yet');
  await prepare(await bundle(11, { backendPort: portA, heartbeatMs: 100 }));
  await commit(11);
  const times: number[] = [];
  const stats: number[] = [];
  const windows: Extract<FromWorker, { type: 'heartbeat' }>['stats'][] = [];
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('fewer than 4 heartbeats within 15 s')), 15_000);
    const on = (m: unknown): void => {
      if ((m as FromWorker).type !== 'heartbeat') return;
      times.push(performance.now());
      stats.push((m as Extract<FromWorker, { type: 'heartbeat' }>).stats.generation);
      windows.push((m as Extract<FromWorker, { type: 'heartbeat' }>).stats);
      if (times.length === 4) {
        clearTimeout(timer);
        sup.off('message', on);
        resolve();
      }
    };
    sup.on('message', on);
  });
  const gaps = times.slice(1).map((x, i) => x - (times[i] as number));
  t.ok(gaps.every((g) => g < 5_000), `heartbeats follow the 100 ms interval, not 60 s (gaps ${gaps.map((g) => g.toFixed(0)).join(', ')} ms)`);
  t.ok(gaps.every((g) => g >= 50), 'and not faster than it');
  t.same(stats, [11, 11, 11, 11], 'each heartbeat reports the active generation');
  // Until the request path provides an OverloadSource: the view the configuration gives (adaptive
  // admission on by default, max_limit defaulting to global_inflight_limit), and the breaker of
  // each backend of the active generation from the worker's registry.
  t.same(windows.at(-1)?.admission, { adaptiveEnabled: true, adaptiveLimit: 4096, minLimit: 64, maxLimit: 4096, inflight: 0, queued: 0, queuedByRoute: {}, brownoutActive: false }, 'the heartbeat carries the admission view');
  t.same(windows.at(-1)?.breakers, [{ upstream: 'app', backend: 'a', state: 'closed', failures: 0, openUntilUnixMs: null }], 'and the breaker of each backend');
  const json = (await channel.request({ type: 'metrics' }, TIMEOUT)) as { name: string; values: { value: number; labels: Record<string, string> }[] }[];
  const values = (name: string): unknown => json.find((m) => m.name === name)?.values.map((v) => [v.labels, v.value]);
  t.equal(values('svc_circuit_breaker_state'), undefined, "svc_circuit_breaker_state is not a worker's: the supervisor serves the node's one state per backend");
  t.equal(values('svc_adaptive_admission_limit'), undefined, "svc_adaptive_admission_limit is not a worker's: the supervisor serves the node's one limit");
  t.equal(values('svc_brownout_active'), undefined, "svc_brownout_active is not a worker's: the supervisor serves the node's one state");
  t.same(values('svc_inflight_requests'), [[{}, 0]], 'svc_inflight_requests');
  t.same(values('svc_route_queue_depth'), [], 'svc_route_queue_depth: no route has waiting requests');
});

t.test('an added listener: a port taken before commit fails the commit with nothing changed, and the retried commit binds it', async (t) => {
  const added = await freePort();
  await prepare(await bundle(12, { backendPort: portB, addedPort: added }));
  // Another program takes the port after the prepare-time check (without SO_REUSEPORT).
  const squatter = net.createServer((s) => s.destroy());
  squatter.listen(added, '127.0.0.1');
  await once(squatter, 'listening');
  await t.rejects(commit(12), { code: 'EDGE_LISTENER_BIND_FAILED', message: new RegExp(`127\\.0\\.0\\.1:${added}`) }, 'the commit is refused, coded');
  t.equal(await get(), 'gen-a', 'the worker still serves the active generation on its listener');
  await new Promise<void>((resolve) => squatter.close(() => resolve()));
  const listening = nextFromWorker('listening');
  await commit(12);
  t.same((await listening).listeners.map((l) => l.tcp), [lport, added], 'the retried commit binds the added listener and announces both');
  t.equal(await get(), 'gen-b', 'and swaps the generation');
  t.equal(await get(added), 'gen-b', 'the added listener serves it');
});

t.test('an added listener whose port is taken at prepare is refused there, coded; the generation is not pending', async (t) => {
  const added = await freePort();
  const squatter = net.createServer((s) => s.destroy());
  squatter.listen(added, '127.0.0.1');
  await once(squatter, 'listening');
  t.teardown(() => new Promise<void>((resolve) => squatter.close(() => resolve())));
  await t.rejects(prepare(await bundle(13, { backendPort: portA, addedPort: added })), { code: 'EDGE_LISTENER_BIND_FAILED', message: /^generation 13 failed to prepare: listener .* could not be bound: EADDRINUSE/ });
  await t.rejects(commit(13), { code: 'EDGE_NOT_PREPARED' });
  t.equal(await get(), 'gen-b', 'the active generation serves on');
});
