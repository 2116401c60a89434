// 0-RTT replays over HTTP/3 (issue 38, Deliver 8): a real `edge-proxy serve` (one worker,
// `allow_0rtt: true`), a real backend, ngtcp2's gtlsclient resuming a session with
// `--session-file`/`--tp-file` and sending a POST in 0-RTT early data, through a UDP relay of this
// file that records every datagram the client sends. The recorded first flight (Initial with the
// ClientHello, the 0-RTT packets carrying the POST) is then replayed to the proxy: from the same
// address and port once the client is gone, and from new ports, as an on-path attacker would.
//
// What holds today, pinned here: the QUIC stack accepts the early data (the client never resends
// the POST in 1-RTT), but no request is processed before the handshake completes (the ingress
// hands a connection to HTTP/3 once established: `svc_early_data_accepted` stays 0, no
// `Early-Data: 1` goes upstream). A replay cannot complete a handshake (it lacks the client's key
// share secret, RFC 8446 §8 / RFC 9001 §9.2), so it never gets a request to the backend: the
// backend sees the POST exactly once. (RFC 8470 §3: a server that waits for the handshake before
// processing early data is not exposed to its replay; 425 applies to requests processed early.)
import t from 'tap';
import { execFile } from 'node:child_process';
import { createSocket } from 'node:dgram';
import type { Socket } from 'node:dgram';
import { once } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { controlledBackend } from './support/controlled-backend.ts';
import { serviceFiles } from './support/service-config.ts';
import { metric, request, startProxy } from './support/overload.ts';
import { toolPath } from '../scripts/system-tools.ts';
import type { StartedProxy } from './support/overload.ts';

const gtlsclient = toolPath('gtlsclient');
const files = serviceFiles(t, 'edge-0rtt-');
const be = await controlledBackend(t, 'app');

function start(name: string, allow0rtt: boolean): Promise<StartedProxy> {
  return startProxy(t, files, name, {
    performance: 'global_inflight_limit: 100',
    upstream: `{ app: { route: { path_prefix: / }, backends: [{ id: app-1, address: "127.0.0.1:${be.port}" }] } }`,
    resilience: `{ adaptive_admission: { enabled: false }, brownout: { enabled: false }, circuit_breaker: { enabled: false }, protocol: { allow_0rtt: ${allow0rtt} } }`,
  });
}

/** A UDP relay on 127.0.0.1 between a client and the proxy's QUIC port, recording what the client sends. */
interface Relay {
  readonly port: number;
  /** Datagrams from the client, in order. */
  readonly fromClient: Buffer[];
  /** The socket that talks to the proxy (the client's address as the proxy sees it). */
  readonly upstream: Socket;
  /** Datagrams the proxy sent to `upstream`. */
  fromProxy: number;
  close(): void;
}

async function relay(target: number): Promise<Relay> {
  const down = createSocket('udp4');
  const up = createSocket('udp4');
  down.bind(0, '127.0.0.1');
  up.bind(0, '127.0.0.1');
  await Promise.all([once(down, 'listening'), once(up, 'listening')]);
  let client: { address: string; port: number } | undefined;
  const r: Relay = {
    port: down.address().port,
    fromClient: [],
    upstream: up,
    fromProxy: 0,
    close() {
      down.close();
      up.close();
    },
  };
  down.on('message', (msg, rinfo) => {
    client = { address: rinfo.address, port: rinfo.port };
    r.fromClient.push(Buffer.from(msg));
    up.send(msg, target, '127.0.0.1');
  });
  up.on('message', (msg) => {
    r.fromProxy++;
    if (client !== undefined) down.send(msg, client.port, client.address);
  });
  t.teardown(() => {
    try {
      r.close();
    } catch {
      // closed already
    }
  });
  return r;
}

/** gtlsclient with its debug output (frame log), resuming from `dir`'s session and transport parameters files. */
function gtls(dir: string, port: number, proxyPort: number, target: string, o: { readonly method?: string; readonly data?: string } = {}): Promise<{ code: number; out: string }> {
  const args = [
    '--no-quic-dump',
    '--no-http-dump',
    `--download=${dir}`,
    '--exit-on-all-streams-close',
    '--timeout=5s',
    `--session-file=${path.join(dir, 'session')}`,
    `--tp-file=${path.join(dir, 'tp')}`,
    ...(o.method === undefined ? [] : ['-m', o.method]),
    ...(o.data === undefined ? [] : ['-d', o.data]),
    '127.0.0.1',
    String(port),
    `https://localhost:${proxyPort}${target}`,
  ];
  return new Promise((resolve) => {
    execFile(gtlsclient ?? 'gtlsclient', args, { encoding: 'utf8', timeout: 20_000, maxBuffer: 64 << 20 }, (e, stdout, stderr) => resolve({ code: e === null ? 0 : Number((e as { code?: unknown }).code ?? -1), out: stdout + stderr }));
  });
}

/** Packet types in which the client sent STREAM data of request stream 0 (`0RTT`, `1RTT`). */
function requestStreamPackets(out: string): string[] {
  return [...out.matchAll(/frm tx \d+ (0RTT|1RTT|Short) STREAM\(0x0[8-f]\) id=0x0 /g)].map((m) => (m[1] === 'Short' ? '1RTT' : (m[1] as string)));
}

/** Resolves once the relay has had no datagram from the proxy for `quietMs` (the proxy stopped answering the replay), or after `maxMs`. */
async function quiet(r: Relay, quietMs: number, maxMs: number): Promise<void> {
  const end = Date.now() + maxMs;
  let seen = -1;
  while (Date.now() < end && seen !== r.fromProxy) {
    seen = r.fromProxy;
    await new Promise((resolve) => setTimeout(resolve, quietMs));
  }
}

t.test('a 0-RTT POST is processed once, after the handshake; its first flight replayed 6 times (same port after the client left, and new ports) reaches the backend 0 times', async (t) => {
  if (gtlsclient === undefined) return void t.fail('gtlsclient missing: install the Debian package ngtcp2-client');
  const p = await start('zero-rtt', true);
  const dir = files.dir;
  const data = path.join(dir, 'post-body');
  writeFileSync(data, 'transfer=100&to=mallory');
  // A first connection gets the session ticket and transport parameters.
  const first = await gtls(dir, p.lport, p.lport, '/ticket');
  t.equal(first.code, 0, 'the first connection ends cleanly');
  t.match(first.out, /QUIC handshake has completed/);
  const r = await relay(p.lport);
  const second = await gtls(dir, r.port, p.lport, '/transfer', { method: 'POST', data });
  t.equal(second.code, 0, 'the resumed connection ends cleanly');
  const sent = requestStreamPackets(second.out);
  t.ok(sent.includes('0RTT'), `the client sent the POST in 0-RTT packets (${sent.join(', ')})`);
  t.notOk(sent.includes('1RTT'), 'and never again in 1-RTT: the proxy accepted the early data');
  const posts = (): number => be.arrivals.filter((a) => a.method === 'POST' && a.path === '/transfer').length;
  t.equal(posts(), 1, 'the backend received the POST once');
  const arrival = be.arrivals.find((a) => a.path === '/transfer');
  t.equal(arrival?.headers['early-data'], undefined, 'without Early-Data: 1 (RFC 8470 §5.1): it was not processed as early data');
  t.equal(await metric(p, 'svc_early_data_accepted'), 0, 'svc_early_data_accepted 0: no request is processed before the handshake completes');
  t.equal(await metric(p, 'svc_early_data_rejected'), 0, 'svc_early_data_rejected 0');
  const requestsBefore = await metric(p, 'svc_requests_total');

  // The attacker replays the client's whole flight: from the client's own address and port (the relay's
  // upstream socket) now that the client is gone, and from three new ports.
  const flight = r.fromClient.slice();
  t.ok(flight.length >= 2, `${flight.length} client datagrams recorded`);
  const answeredBefore = r.fromProxy;
  for (let i = 0; i < 3; i++) for (const d of flight) r.upstream.send(d, p.lport, '127.0.0.1');
  await quiet(r, 300, 5000);
  t.ok(r.fromProxy > answeredBefore, `the proxy answered the replays from the same port (${r.fromProxy - answeredBefore} datagrams): they reached the QUIC stack`);
  for (let i = 0; i < 3; i++) {
    const other = await relay(p.lport);
    for (const d of flight) other.upstream.send(d, p.lport, '127.0.0.1');
    await quiet(other, 300, 5000);
  }
  // A request after the replays, awaited: whatever the replays could have started has had its turn.
  t.equal((await request(p, 'h3', { path: '/after-replay' })).status, 200);
  t.equal(posts(), 1, 'after 6 replays the backend has still received the POST once');
  t.equal(await metric(p, 'svc_requests_total'), requestsBefore + 1, 'svc_requests_total moved by the marker request only: no replayed request reached the request path');
});

t.test('allow_0rtt false: the early data is refused, the client resends the POST in 1-RTT, processed once', async (t) => {
  if (gtlsclient === undefined) return void t.fail('gtlsclient missing: install the Debian package ngtcp2-client');
  const p = await start('no-zero-rtt', false);
  const dir = path.join(files.dir, 'off');
  mkdirSync(dir, { recursive: true });
  const data = path.join(dir, 'post-body');
  writeFileSync(data, 'x=1');
  t.equal((await gtls(dir, p.lport, p.lport, '/ticket-off')).code, 0);
  const second = await gtls(dir, p.lport, p.lport, '/transfer-off', { method: 'POST', data });
  t.equal(second.code, 0);
  const sent = requestStreamPackets(second.out);
  t.ok(sent.includes('1RTT'), `the POST went in 1-RTT (${sent.join(', ')})`);
  t.equal(be.arrivals.filter((a) => a.path === '/transfer-off').length, 1, 'processed once');
});
