// Listener client certificates (`tls.client_auth`, SPEC "TLS" 6), end to end on a real worker
// (the standalone worker: the supervisor plays no part in a handshake). Two listeners: `required`
// and `optional`, each with a CA for client certificates. Three clients: none, a certificate from
// another CA, a certificate from the configured CA; on HTTP/1.1 and HTTP/2 (the TLS bootstrap
// ingress) and HTTP/3 (QUIC). A backend records every request, so "refused" means the handshake
// failed and nothing reached it; "accepted" means the request was answered by that backend.
import t from 'tap';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { Http3ClientSession } from '@edge-proxy/http3';
import { makeCa, makeLeaf } from '../scripts/lib/certs.ts';
import { listeningLine } from './support/serve.ts';

const root = path.resolve(import.meta.dirname, '..');
const dir = mkdtempSync(path.join(tmpdir(), 'edge-mtls-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
const ca = makeCa(dir);
const clientCa = makeCa(dir, 'client-ca', '/CN=edge-proxy test client CA');
const otherCa = makeCa(dir, 'other-ca', '/CN=another CA');
const server = makeLeaf(dir, 'server', ca, { sans: ['localhost', '127.0.0.1'] });
const read = (f: string): string => readFileSync(f, 'utf8');
const good = makeLeaf(dir, 'good-client', clientCa, { usage: 'client', sans: [], subject: '/CN=good client' });
// Same subject, another issuer: only the chain tells them apart.
const foreign = makeLeaf(dir, 'foreign-client', otherCa, { usage: 'client', sans: [], subject: '/CN=good client' });
type Client = 'none' | 'foreign' | 'good';
const CLIENTS: Record<Client, { cert: string; key: string } | undefined> = {
  none: undefined,
  foreign: { cert: read(foreign.cert), key: read(foreign.key) },
  good: { cert: read(good.cert), key: read(good.key) },
};

// --- backend: records what reached it ---------------------------------------------------------
const seen: string[] = [];
const backend = http.createServer((req, res) => {
  seen.push(req.url ?? '');
  res.writeHead(200, { 'content-type': 'text/plain' }).end(`backend saw ${req.url}`);
});
backend.listen(0, '127.0.0.1');
await once(backend, 'listening');
t.teardown(() => new Promise<void>((r) => {
  backend.closeAllConnections();
  backend.close(() => r());
}));

// --- the worker ---------------------------------------------------------------------------------
const configFile = path.join(dir, 'config.yaml');
writeFileSync(
  configFile,
  `
listeners:
  - name: required
    address: 127.0.0.1
    port: 9889
    tls: { cert: ${server.cert}, key: ${server.key}, client_auth: { mode: required, ca_file: ${clientCa.cert} } }
  - name: optional
    address: 127.0.0.1
    port: 9890
    tls: { cert: ${server.cert}, key: ${server.key}, client_auth: { mode: optional, ca_file: ${clientCa.cert} } }
upstream:
  app:
    route: { path_prefix: / }
    backends: [{ id: app, address: "127.0.0.1:${(backend.address() as AddressInfo).port}" }]
`,
);
const worker: ChildProcess = spawn(process.execPath, [path.join(root, 'packages/dataplane/src/worker/standalone.ts'), '-c', configFile, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
t.teardown(() => {
  if (worker.exitCode === null) worker.kill('SIGKILL');
});
const ready = JSON.parse((await listeningLine(worker)).toString().split('\n')[0] ?? '{}') as { listeners: { name: string; udp: number; tcp: number }[] };
const portOf = (name: string): { tcp: number; udp: number } => {
  const l = ready.listeners.find((x) => x.name === name);
  if (l === undefined) throw new Error(`no listener ${name} in ${JSON.stringify(ready)}`);
  return l;
};

// --- clients: each answers `<status> <body>` or `refused` ----------------------------------------
const caPem = read(ca.cert);

/** HTTP/1.1 over a fresh TLS connection. */
function h1(port: number, client: Client, url: string): Promise<string> {
  return new Promise((resolve) => {
    const c = CLIENTS[client];
    // agent: false, a fresh connection: a reused TLS session would skip the handshake under test.
    const req = https.request({ host: '127.0.0.1', port, path: url, servername: 'localhost', agent: false, ca: caPem, ALPNProtocols: ['http/1.1'], ...(c === undefined ? {} : { cert: c.cert, key: c.key }) } as https.RequestOptions, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve(`${res.statusCode} ${body}`));
    });
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
    req.on('error', (err: Error) => resolve(err.message === 'timeout' ? 'timeout' : 'refused'));
    req.end();
  });
}

/** HTTP/2 over a fresh TLS connection. */
function h2(port: number, client: Client, url: string): Promise<string> {
  return new Promise((resolve) => {
    const c = CLIENTS[client];
    const session = http2.connect(`https://localhost:${port}`, { host: '127.0.0.1', ca: caPem, servername: 'localhost', ...(c === undefined ? {} : { cert: c.cert, key: c.key }) } as http2.SecureClientSessionOptions);
    const timer = setTimeout(() => finish('timeout'), 10_000);
    let settled = false;
    const finish = (r: string): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.destroy();
      resolve(r);
    };
    session.on('error', () => finish('refused'));
    session.on('close', () => finish('refused'));
    const req = session.request({ ':path': url }, { endStream: true });
    let status = 0;
    let body = '';
    req.setEncoding('utf8');
    req.on('response', (h) => (status = Number(h[':status'])));
    req.on('data', (d: string) => (body += d));
    // A stream ended without a response head: the connection was closed under it.
    req.on('end', () => finish(status === 0 ? 'refused' : `${status} ${body}`));
    req.on('error', () => finish('refused'));
  });
}

/** HTTP/3 over a fresh QUIC connection. */
async function h3(port: number, client: Client, url: string): Promise<string> {
  const c = CLIENTS[client];
  let session: Http3ClientSession | undefined;
  try {
    session = await Http3ClientSession.connect({ host: '127.0.0.1', port, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 10_000, ...(c === undefined ? {} : { cert: c.cert, key: c.key }) });
    const res = await session.fetch({ path: url, timeoutMs: 10_000 });
    return `${res.status} ${res.body.toString('utf8')}`;
  } catch {
    return 'refused';
  } finally {
    await session?.close(true).catch(() => {});
  }
}

const PROTOCOLS = { 'HTTP/1.1': { fn: h1, transport: 'tcp' }, 'HTTP/2': { fn: h2, transport: 'tcp' }, 'HTTP/3': { fn: h3, transport: 'udp' } } as const;

/** Expected answer per listener, client and protocol: accepted requests reach the backend. */
const EXPECTED: Record<'required' | 'optional', Record<Client, Record<keyof typeof PROTOCOLS, 'accepted' | 'refused'>>> = {
  required: {
    none: { 'HTTP/1.1': 'refused', 'HTTP/2': 'refused', 'HTTP/3': 'refused' },
    foreign: { 'HTTP/1.1': 'refused', 'HTTP/2': 'refused', 'HTTP/3': 'refused' },
    good: { 'HTTP/1.1': 'accepted', 'HTTP/2': 'accepted', 'HTTP/3': 'accepted' },
  },
  optional: {
    none: { 'HTTP/1.1': 'accepted', 'HTTP/2': 'accepted', 'HTTP/3': 'accepted' },
    foreign: { 'HTTP/1.1': 'refused', 'HTTP/2': 'refused', 'HTTP/3': 'accepted' },
    good: { 'HTTP/1.1': 'accepted', 'HTTP/2': 'accepted', 'HTTP/3': 'accepted' },
  },
};

for (const listener of ['required', 'optional'] as const) {
  for (const [proto, { fn, transport }] of Object.entries(PROTOCOLS) as [keyof typeof PROTOCOLS, (typeof PROTOCOLS)[keyof typeof PROTOCOLS]][]) {
    t.test(`client_auth ${listener}, ${proto}: no certificate, another CA's, the configured CA's`, async (t) => {
      const start = seen.length;
      const accepted: string[] = [];
      for (const client of ['none', 'foreign', 'good'] as const) {
        const url = `/${listener}/${proto.replace('/', '')}/${client}`;
        const before = seen.length;
        const got = await fn(portOf(listener)[transport], client, url);
        const want = EXPECTED[listener][client][proto];
        if (want === 'accepted') {
          accepted.push(url);
          t.equal(got, `200 backend saw ${url}`, `${client}: answered by the backend`);
          t.same(seen.slice(before), [url], `${client}: the backend saw the request once`);
        } else {
          t.equal(got, 'refused', `${client}: the handshake fails, no HTTP answer`);
          t.same(seen.slice(before), [], `${client}: nothing reached the backend`);
        }
      }
      // The accepted `good` request came last through the same worker: a refused client's request
      // forwarded late (after its connection was closed) would be recorded by now.
      t.same(seen.slice(start), accepted, 'the backend saw exactly the accepted requests');
    });
  }
}

t.test('HTTP/3: a session ticket from the optional listener does not resume on the required one without a certificate', async (t) => {
  // Every listener of a worker shares the ticket key: a ticket won without a certificate must not
  // stand in for one elsewhere.
  const first = await Http3ClientSession.connect({ host: '127.0.0.1', port: portOf('optional').udp, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 10_000 });
  t.equal((await first.fetch({ path: '/ticket/first', timeoutMs: 10_000 })).status, 200);
  let ticket = first.ticket();
  for (let i = 0; i < 50 && ticket === undefined; i++) {
    await first.fetch({ path: '/ticket/wait', timeoutMs: 10_000 });
    ticket = first.ticket();
  }
  await first.close(true);
  t.ok(ticket, 'the optional listener issued a ticket');
  if (ticket === undefined) return;
  const before = seen.length;
  let got: string;
  try {
    const s = await Http3ClientSession.connect({ host: '127.0.0.1', port: portOf('required').udp, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 10_000, sessionTicket: ticket });
    try {
      got = String((await s.fetch({ path: '/ticket/resumed', timeoutMs: 10_000 })).status);
    } finally {
      await s.close(true).catch(() => {});
    }
  } catch {
    got = 'refused';
  }
  t.equal(got, 'refused', 'the handshake fails');
  // The same ticket still resumes where it was issued (the per-listener key is no key per connection).
  const again = await Http3ClientSession.connect({ host: '127.0.0.1', port: portOf('optional').udp, serverName: 'localhost', ca: caPem, handshakeTimeoutMs: 10_000, sessionTicket: ticket });
  t.equal(again.info.resumed, true, 'resumed on the listener that issued it');
  t.equal((await again.fetch({ path: '/ticket/again', timeoutMs: 10_000 })).status, 200);
  await again.close(true);
  t.equal(await h3(portOf('required').udp, 'good', '/ticket/fence'), '200 backend saw /ticket/fence');
  t.same(seen.slice(before), ['/ticket/again', '/ticket/fence'], 'the resumed request on its own listener and the fence, nothing from the refused resumption');
});
