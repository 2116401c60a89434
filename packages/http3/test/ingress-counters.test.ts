// The datagram counters of the server's UDP socket (our patch to the QUIC library): each kind of
// datagram a hostile or confused peer sends is counted under its own cause, the ingress queue
// drops and counts what is over its bound, and the counts survive close.
import { createSocket } from 'node:dgram';
import type { Socket } from 'node:dgram';
import t from 'tap';
import type { Test } from 'tap';
import type { Http3Server, IngressCounts } from '../src/index.ts';
import { connect, makePki, startServer } from './net-helpers.ts';

const pki = makePki(t);

/** A QUIC long-header packet (RFC 9000 §17.2) of `total` bytes; type 0 is Initial, 1 is 0-RTT. */
function longHeader(type: number, version: number, total = 1200): Buffer {
  const v = Buffer.alloc(4);
  v.writeUInt32BE(version >>> 0);
  const dcid = Buffer.alloc(8, 0xd1);
  const scid = Buffer.alloc(8, 0x5c);
  const head = [Buffer.from([0xc0 | (type << 4)]), v, Buffer.from([dcid.length]), dcid, Buffer.from([scid.length]), scid];
  if (type === 0) head.push(Buffer.from([0])); // no token
  const fixed = Buffer.concat(head).length + 2; // + a two-byte Length field
  const rest = total - fixed;
  return Buffer.concat([...head, Buffer.from([0x40 | (rest >> 8), rest & 0xff]), Buffer.alloc(rest, 0)]);
}

/** A short-header (1-RTT) packet for a connection the server does not know. */
const shortHeader = (): Buffer => Buffer.concat([Buffer.from([0x40]), Buffer.alloc(20, 0xab), Buffer.alloc(40, 0)]);

async function rawSocket(t: Test): Promise<{ sock: Socket; send: (b: Buffer, port: number) => Promise<void>; received: Buffer[] }> {
  const sock = createSocket('udp4');
  t.teardown(() => sock.close());
  await new Promise<void>((r) => sock.bind(0, '127.0.0.1', r));
  const received: Buffer[] = [];
  sock.on('message', (m) => received.push(m));
  const send = (b: Buffer, port: number): Promise<void> => new Promise((resolve) => sock.send(b, port, '127.0.0.1', () => resolve()));
  return { sock, send, received };
}

/**
 * The library counts on receipt and emits nothing for a dropped datagram, so this polls the
 * server's counters until `done` holds (bounded: fails after `withinMs`).
 */
async function until(t: Test, server: Http3Server, done: (c: IngressCounts) => boolean, withinMs = 5000): Promise<IngressCounts> {
  const deadline = Date.now() + withinMs;
  let c = server.ingressCounts();
  while (!done(c) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 10));
    c = server.ingressCounts();
  }
  if (!done(c)) t.fail(`counters did not reach the expected state: ${JSON.stringify(c)}`);
  return c;
}

t.test('each malformed or unroutable datagram is counted under its cause', async (t) => {
  const { server, port } = await startServer(t, pki);
  const { send, received } = await rawSocket(t);
  for (let i = 0; i < 3; i++) await send(Buffer.from([0x00]), port); // too short for a header
  for (let i = 0; i < 4; i++) await send(shortHeader(), port);
  for (let i = 0; i < 2; i++) await send(longHeader(1, 1, 200), port); // 0-RTT before any Initial
  for (let i = 0; i < 5; i++) await send(longHeader(0, 0x0a0a0a0a), port); // a version we do not speak
  const c = await until(t, server, (x) => x.packets >= 14 && x.versionNegotiations >= 5);
  t.same(
    { packets: c.packets, badHeader: c.badHeader, unroutable: c.unroutable, versionNegotiations: c.versionNegotiations, drainingDrops: c.drainingDrops, queueDrops: c.queueDrops },
    { packets: 14, badHeader: 3, unroutable: 6, versionNegotiations: 5, drainingDrops: 0, queueDrops: 0 },
  );
  // Every unsupported version was answered with Version Negotiation (version field 0, RFC 9000 §17.2.1).
  const deadline = Date.now() + 5000;
  while (received.length < 5 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  t.same(received.map((d) => d.readUInt32BE(1)), [0, 0, 0, 0, 0], 'five Version Negotiation packets came back');
  t.equal((await until(t, server, (x) => x.queueBytes === 0)).queueBytes, 0, 'nothing left in the ingress queue');
});

t.test('a real connection is counted, and the queue empties after it', async (t) => {
  const { server, port } = await startServer(t, pki);
  server.on('request', (_req, res) => res.end('ok'));
  const client = await connect(t, pki, port);
  t.equal((await client.fetch({})).body.toString(), 'ok');
  const c = server.ingressCounts();
  t.ok(c.packets >= 3, `handshake and request datagrams counted (${c.packets})`);
  t.same({ badHeader: c.badHeader, unroutable: c.unroutable, queueDrops: c.queueDrops }, { badHeader: 0, unroutable: 0, queueDrops: 0 });
  t.equal((await until(t, server, (x) => x.queueBytes === 0)).queueBytes, 0);
});

t.test('over the queue bound, datagrams are dropped and counted with their bytes', async (t) => {
  const { server, port } = await startServer(t, pki, { ingressQueueLimitBytes: 0 });
  const { send } = await rawSocket(t);
  for (let i = 0; i < 7; i++) await send(longHeader(0, 1), port);
  const c = await until(t, server, (x) => x.packets >= 7);
  t.same({ packets: c.packets, queueDrops: c.queueDrops, queueDropBytes: c.queueDropBytes, queueBytes: c.queueBytes }, { packets: 7, queueDrops: 7, queueDropBytes: 7 * 1200, queueBytes: 0 });
  await t.rejects(connect(t, pki, port, { handshakeTimeoutMs: 500 }), 'nothing gets through a zero bound');
});

t.test('while draining, datagrams for new connections are dropped and counted; counts outlive close', async (t) => {
  const { server, port } = await startServer(t, pki);
  let release: () => void = () => {};
  const held = new Promise<void>((r) => (release = r));
  server.on('request', (_req, res) => void held.then(() => res.end('late')));
  const client = await connect(t, pki, port);
  const pending = client.fetch({});
  await until(t, server, () => server.stats().requestStreams === 1);
  const closing = server.close(10_000);
  const { send } = await rawSocket(t);
  await send(longHeader(0, 1), port);
  await send(longHeader(0, 1), port);
  const c = await until(t, server, (x) => x.drainingDrops >= 2);
  t.equal(c.drainingDrops, 2, 'two Initials refused while draining');
  release();
  t.equal((await pending).body.toString(), 'late', 'the request in progress completed');
  await closing;
  const after = server.ingressCounts();
  t.equal(after.drainingDrops, 2, 'readable after close');
  t.ok(after.packets >= c.packets, 'monotonic across close');
  t.equal(after.queueBytes, 0);
});
