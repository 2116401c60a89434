// Hostile input: random and malformed datagrams, truncated and oversized frames, QPACK bombs,
// stream floods, abrupt resets, random bytes on request streams. The server must survive,
// answer with the right codes, and afterwards hold no streams, connections or timers.
import { createSocket } from 'node:dgram';
import { once } from 'node:events';
import t from 'tap';
import type { Test } from 'tap';
import { QpackEncoder, encodeDataFrameHeader, encodeFrameHeader, encodeHeadersFrame, encodeVarint, errorCodeFromWire } from '../src/index.ts';
import { ByteWriter } from '../src/byte-writer.ts';
import { writeInsertWithLiteralName, writeSetCapacity } from '../src/qpack/encoder-instructions.ts';
import type { Header, Http3ClientSession, Http3Server } from '../src/index.ts';
import { assertNothingHeld, connect, makePki, startServer } from './net-helpers.ts';

const pki = makePki(t);
const REQUEST: Header[] = [
  [':method', 'GET'],
  [':scheme', 'https'],
  [':authority', 'localhost'],
  [':path', '/'],
];
const head = (lines: Header[]): Buffer => Buffer.from(encodeHeadersFrame(new QpackEncoder().encodeFieldSection(0, lines)));

/** The server, and the paths of the requests its handler saw, in order (the server-side record). */
async function serve(t: Test, options = {}): Promise<{ server: Http3Server; port: number; seen: string[] }> {
  const { server, port } = await startServer(t, pki, { handshakeTimeoutMs: 1000, ...options });
  const seen: string[] = [];
  server.on('request', (req, res) => {
    seen.push(req.url);
    req.resume();
    if (req.url.startsWith('/big')) {
      res.end(Buffer.alloc(1 << 20));
      return;
    }
    req.on('end', () => res.end('alive'));
  });
  return { server, port, seen };
}

async function stillServes(t: Test, port: number): Promise<void> {
  const client = await connect(t, pki, port);
  t.equal((await client.fetch({})).body.toString(), 'alive', 'a new client is served');
  await client.close();
}

/**
 * Connections that never complete a handshake are not sessions and emit nothing we can await;
 * the library drops them at the handshake timeout. Polls the server's counters, bounded.
 */
async function quiet(server: Http3Server, withinMs = 5000): Promise<void> {
  await eventually(() => server.stats().quicConnections === 0, withinMs);
}

/** Polls `cond` (every 20 ms) until it holds or `withinMs` has passed; whether it holds. */
async function eventually(cond: () => boolean, withinMs: number): Promise<boolean> {
  const deadline = Date.now() + withinMs;
  while (!cond() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  return cond();
}

// Deterministic bytes so a failure can be replayed.
function prng(seed: number): (n: number) => Buffer {
  let s = seed >>> 0;
  return (n) => {
    const out = Buffer.alloc(n);
    for (let i = 0; i < n; i++) {
      s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
      out[i] = s >>> 24;
    }
    return out;
  };
}

function longHeader(rand: (n: number) => Buffer, type: number, version: number, token: Buffer | undefined, payloadLen: number): Buffer {
  const dcid = rand(1 + ((rand(1)[0] as number) % 20));
  const scid = rand((rand(1)[0] as number) % 21);
  const v = Buffer.alloc(4);
  v.writeUInt32BE(version >>> 0);
  const parts = [Buffer.from([0xc0 | (type << 4) | ((rand(1)[0] as number) & 0x0f)]), v, Buffer.from([dcid.length]), dcid, Buffer.from([scid.length]), scid];
  if (type === 0) parts.push(Buffer.from(encodeVarint(token?.length ?? 0)), token ?? Buffer.alloc(0));
  parts.push(Buffer.from(encodeVarint(payloadLen)), rand(payloadLen));
  return Buffer.concat(parts);
}

/**
 * Whether the server answers `d` with Version Negotiation, as the library decides it: a long
 * header whose connection IDs (and an Initial's token) fit in the datagram, in a version other
 * than 1 (0 is a Version Negotiation packet itself), with the Initial or 0-RTT type bits; of any
 * size. (RFC 9000 §5.2.2 wants other types answered too, and datagrams under 1200 bytes dropped:
 * reported, not fixed here.)
 */
function answeredWithVersionNegotiation(d: Buffer): boolean {
  if (d.length < 7 || ((d[0] as number) & 0x80) === 0) return false;
  const version = d.readUInt32BE(1);
  if (version === 0 || version === 1 || (((d[0] as number) & 0x30) >> 4) > 1) return false;
  const dcid = d[5] as number;
  if (d.length < 7 + dcid) return false;
  const end = 7 + dcid + (d[6 + dcid] as number);
  if (d.length < end) return false;
  if (((d[0] as number) & 0x30) !== 0) return true;
  // An Initial's token (varint length, then bytes) must fit too.
  if (d.length <= end) return false;
  const size = 1 << ((d[end] as number) >> 6);
  if (d.length < end + size) return false;
  let tokenLength = (d[end] as number) & 0x3f;
  for (let i = 1; i < size; i++) tokenLength = tokenLength * 256 + (d[end + i] as number);
  return d.length >= end + size + tokenLength;
}

for (const retry of [true, false]) {
  t.test(`random and malformed datagrams (retry ${retry ? 'on' : 'off'})`, async (t) => {
    const { server, port } = await serve(t, { retry });
    const sock = createSocket('udp4');
    t.teardown(() => sock.close());
    await new Promise<void>((r) => sock.bind(0, '127.0.0.1', r));
    const rand = prng(retry ? 1 : 2);
    const send = (b: Buffer): Promise<void> => new Promise((resolve) => sock.send(b, port, '127.0.0.1', () => resolve()));
    const before = server.ingressCounts();
    let unknownVersion = 0;
    for (let i = 0; i < 600; i++) {
      const kind = i % 6;
      const r = rand(1)[0] as number;
      let d: Buffer;
      if (kind === 0) d = rand(1 + (r % 200) * 7); // random bytes
      else if (kind === 1) d = longHeader(rand, 0, 1, undefined, 1200); // Initial without token, garbage payload
      else if (kind === 2) d = longHeader(rand, 0, 1, rand(1 + (r % 80)), 1200); // Initial with a forged token
      else if (kind === 3) d = longHeader(rand, 1, 1, undefined, 100 + r); // 0-RTT for an unknown connection
      else if (kind === 4) d = longHeader(rand, r & 3, (rand(4).readUInt32BE(0) | 0x0a0a0a0a) >>> 0, undefined, 1200); // unknown version
      else d = Buffer.concat([Buffer.from([0x40 | (r & 0x3f)]), rand(20), rand(r)]); // short header, unknown connection
      // Truncate a third of them anywhere.
      if (i % 3 === 2) d = d.subarray(0, (rand(2).readUInt16BE(0) % Math.max(1, d.length)) + 1);
      if (answeredWithVersionNegotiation(d)) unknownVersion++;
      await send(d);
      // Paced: a burst of 600 overflows the kernel's receive buffer before the server (in this
      // process) reads it, and most datagrams never reach it (measured: ~130 of 600 unpaced).
      // Every 20, wait until the server has counted them (bounded; the assertion below judges).
      if (i % 20 === 19) {
        const until = Date.now() + 5000;
        while (server.ingressCounts().packets - before.packets < i + 1 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
      }
    }
    // What the server counted, not what the loop sent: every datagram received, and each one in an
    // unknown version answered with Version Negotiation. The library counts on receipt and emits
    // nothing: poll, bounded.
    const deadline = Date.now() + 10_000;
    let c = server.ingressCounts();
    while ((c.packets - before.packets < 600 || c.versionNegotiations - before.versionNegotiations < unknownVersion) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
      c = server.ingressCounts();
    }
    t.same({ packets: c.packets - before.packets, versionNegotiations: c.versionNegotiations - before.versionNegotiations, queueDrops: c.queueDrops - before.queueDrops }, { packets: 600, versionNegotiations: unknownVersion, queueDrops: 0 }, `the server received all 600 datagrams and answered the ${unknownVersion} in an unknown version`);
    await stillServes(t, port);
    await quiet(server);
    await assertNothingHeld(t, server);
  });
}

// A client that sends its first flight and no more (a half-open handshake): the server drops the
// connection at handshakeTimeoutMs, not before, through the library's start timeout (whose error
// the patched @matrixai/contexts builds only when the timer fires); the client gives up at its own
// handshake timeout through the same code.
t.test('a handshake that stops after the first flight is dropped at the handshake timeout', async (t) => {
  const { server, port } = await serve(t, { retry: false });
  const relay = createSocket('udp4');
  const toServer = createSocket('udp4');
  t.teardown(() => {
    relay.close();
    toServer.close();
  });
  await Promise.all([new Promise<void>((r) => relay.bind(0, '127.0.0.1', r)), new Promise<void>((r) => toServer.bind(0, '127.0.0.1', r))]);
  // The server answers toServer, which drops everything; of the client's datagrams only the first goes on.
  let forwardedAt: number | undefined;
  relay.on('message', (d) => {
    if (forwardedAt !== undefined) return;
    forwardedAt = Date.now();
    toServer.send(d, port, '127.0.0.1');
  });
  const failedBefore = server.ingressCounts().connectionCreateFailed;
  const client = connect(t, pki, relay.address().port, { handshakeTimeoutMs: 500 });
  await t.rejects(client, 'the client gives up at its own handshake timeout');
  // quicConnections counts the library's map entries: a connection is there under each of its IDs.
  t.ok(forwardedAt !== undefined && (await eventually(() => server.stats().quicConnections > 0, 5000)), 'the server holds the half-open connection');
  // The start timeout aborts the handshake at 1000 ms; the connection then closes and drains (three
  // probe timeouts, about 3 s here) before its start fails and it leaves the map. Without the
  // timeout it would stay until the 30-s idle timeout.
  const failed = (): number => server.ingressCounts().connectionCreateFailed - failedBefore;
  await eventually(() => failed() > 0, 8000);
  const failedAfter = Date.now() - (forwardedAt ?? 0);
  t.equal(failed(), 1, 'its start timed out: one failed connection counted');
  t.ok(failedAfter >= 950 && failedAfter < 8000, `after the 1000-ms handshake timeout and the close's draining (${failedAfter} ms)`);
  t.ok(await eventually(() => server.stats().quicConnections === 0, 5000), 'and the server holds it no more');
  await stillServes(t, port);
  await assertNothingHeld(t, server);
});

t.test('oversized and truncated frames', async (t) => {
  const { server, port } = await serve(t);
  const client = await connect(t, pki, port);
  // A HEADERS frame announcing 1 GiB: refused before buffering, answered 431 (RFC 9114 §4.2.2).
  let raw = await client.openRawStream('bidi');
  await raw.write(Buffer.from(encodeFrameHeader(0x01, 1 << 30)));
  await raw.end();
  let r = await raw.readAll();
  t.match(r.data.toString('latin1'), /431/, 'oversized HEADERS: 431');
  // A DATA frame announcing 2^62-1 bytes: beyond what we can count, the request is refused.
  raw = await client.openRawStream('bidi');
  await raw.write(Buffer.concat([head([...REQUEST]), Buffer.from([0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), Buffer.from('abc')]));
  r = await raw.readAll();
  // The limit trips while the chunk holding HEADERS is parsed, so the answer is 431 (or a
  // reset with H3_EXCESSIVE_LOAD when HEADERS came in an earlier chunk).
  t.ok(r.resetCode === 0x107 || /431/.test(r.data.toString('latin1')), 'DATA length above 2^53: refused with 431 / H3_EXCESSIVE_LOAD');
  // A DATA frame announcing 2^53-1 bytes, then FIN: the frame is truncated.
  raw = await client.openRawStream('bidi');
  await raw.write(Buffer.concat([head([...REQUEST]), Buffer.from(encodeDataFrameHeader(2 ** 53 - 1)), Buffer.from('abc')]));
  await raw.end();
  const closed = once(client, 'close');
  r = await raw.readAll();
  const [info] = (await closed) as [{ code: number }];
  t.equal(info.code, 0x106, 'a frame cut short by FIN is H3_FRAME_ERROR (RFC 9114 §7.1)');
  // An oversized control frame: the connection's control stream may not buffer it.
  const c2 = await connect(t, pki, port, { manualControlStreams: true });
  const closed2 = once(c2, 'close');
  const ctl = await c2.openRawStream('uni');
  await ctl.write(Buffer.concat([Buffer.from([0x00]), Buffer.from(encodeFrameHeader(0x04, 1 << 20))])).catch(() => {});
  const [info2] = (await closed2) as [{ code: number }];
  t.equal(info2.code, 0x107, 'oversized SETTINGS: H3_EXCESSIVE_LOAD');
  await stillServes(t, port);
  await assertNothingHeld(t, server);
});

t.test('QPACK bombs', async (t) => {
  const { server, port } = await serve(t, { maxFieldSectionSize: 65536, qpackMaxTableCapacity: 4096, qpackBlockedStreams: 4 });
  // 1. Decompression bomb: one 3 KB table entry referenced 100 times is ~300 KB decoded.
  {
    const client = await connect(t, pki, port, { manualControlStreams: true });
    const enc = new QpackEncoder({ dynamicTable: true, insertOnFirstUse: true });
    enc.setPeerSettings({ qpackMaxTableCapacity: 4096, qpackBlockedStreams: 4 });
    const raw = await client.openRawStream('bidi');
    const lines: Header[] = [...REQUEST, ...Array.from({ length: 100 }, (): Header => ['x-bomb', 'A'.repeat(3000)])];
    const section = enc.encodeFieldSection(raw.id, lines);
    t.ok(section.length < 2000, `the encoded section is small (${section.length} bytes)`);
    const encoderStream = await client.openRawStream('uni');
    await encoderStream.write(Buffer.concat([Buffer.from([0x02]), Buffer.from(enc.pendingEncoderStreamBytes())]));
    await raw.write(Buffer.from(encodeHeadersFrame(section)));
    await raw.end();
    const r = await raw.readAll();
    t.match(r.data.toString('latin1'), /431/, 'decoded size over the limit: 431, not 300 KB of memory per request');
    await client.close(true);
  }
  // 2. More blocked streams than advertised (RFC 9204 §2.1.2): QPACK_DECOMPRESSION_FAILED.
  {
    const client = await connect(t, pki, port, { manualControlStreams: true });
    const closed = once(client, 'close');
    for (let i = 0; i < 5; i++) {
      const raw = await client.openRawStream('bidi');
      // Required Insert Count 1 (encoded 2 with MaxEntries 128), nothing ever inserted.
      await raw.write(Buffer.from(encodeHeadersFrame(Buffer.from([0x02, 0x00, 0x80])))).catch(() => {});
    }
    const [info] = (await closed) as [{ code: number }];
    t.equal(info.code, 0x200, 'the fifth blocked stream closes the connection');
  }
  // 3. Table churn: 5,000 inserts through a 4 KiB table (each evicts an older one), then a
  // normal request on the same connection.
  {
    const client = await connect(t, pki, port, { manualControlStreams: true });
    const w = new ByteWriter();
    writeSetCapacity(w, 4096);
    for (let i = 0; i < 5000; i++) writeInsertWithLiteralName(w, Buffer.from(`x-${i}`), Buffer.from(`v${i}`), 'never');
    const encoderStream = await client.openRawStream('uni');
    await encoderStream.write(Buffer.concat([Buffer.from([0x02]), Buffer.from(w.finish())]));
    const raw = await client.openRawStream('bidi');
    await raw.write(head(REQUEST));
    await raw.end();
    const r = await raw.readAll();
    t.match(r.data.toString('latin1'), /alive/, 'the connection still answers after the churn');
    await client.close(true);
  }
  // 4. A string literal claiming a 1 GiB length.
  {
    const client = await connect(t, pki, port);
    const raw = await client.openRawStream('bidi');
    const literal = Buffer.concat([Buffer.from([0x00, 0x00, 0x27]), Buffer.from([0xff, 0xff, 0xff, 0xff, 0x03]), Buffer.from('x')]);
    await raw.write(Buffer.from(encodeHeadersFrame(literal)));
    await raw.end();
    const closed = once(client, 'close');
    const r = await Promise.race([raw.readAll(), closed.then(() => null)]);
    t.ok(r === null || /431/.test(r.data.toString('latin1')) || r.resetCode !== undefined, 'refused without allocating');
    await client.close(true);
  }
  await stillServes(t, port);
  await assertNothingHeld(t, server);
});

t.test('stream floods', async (t) => {
  const { server, port, seen } = await serve(t, { maxConcurrentStreams: 50 });
  // 1. Every allowed stream opened with half a request, then the client vanishes.
  {
    const client = await connect(t, pki, port);
    const h = head(REQUEST);
    for (let i = 0; i < 50; i++) await (await client.openRawStream('bidi')).write(h.subarray(0, 3));
    await client.close(true);
    t.same(seen, [], 'half a HEADERS frame is no request: the handler saw none');
  }
  // 2. Rapid reset: 300 requests each cancelled as soon as it is sent.
  {
    const client = await connect(t, pki, port);
    for (let i = 0; i < 300; i++) {
      const raw = await client.openRawStream('bidi');
      await raw.write(head(REQUEST));
      raw.reset(0x10c);
      if (i % 25 === 24) await raw.readAll();
    }
    t.equal((await client.fetch({ path: '/after-resets' })).body.toString(), 'alive', 'the connection survives rapid resets');
    await client.close();
    t.equal(seen.at(-1), '/after-resets', 'and the request after them reached the handler');
    t.same(seen.filter((p) => p !== '/' && p !== '/after-resets'), [], 'the handler saw only the reset requests and that one');
  }
  // 3. Ten connections with 40 requests each, dropped mid-flight.
  {
    const clients = await Promise.all(Array.from({ length: 10 }, () => connect(t, pki, port)));
    const pending = clients.flatMap((c) => Array.from({ length: 40 }, (_, i) => c.fetch({ path: `/big/${i}` }).then((r) => `${r.status} ${r.body.length}`, () => 'aborted')));
    await Promise.all(clients.map((c) => c.close(true)));
    const results = await Promise.all(pending);
    // A request either completed whole (200, 1 MiB) or was cut by the client's close: never a
    // truncated body reported as complete, nor another status.
    t.same(results.filter((r) => r !== 'aborted' && r !== `200 ${1 << 20}`), [], `each of the 400 requests completed whole or was aborted`);
    const completed = results.filter((r) => r !== 'aborted').length;
    t.ok(seen.filter((p) => p.startsWith('/big/')).length >= completed, `every completed request was handled by the server (${completed} completed)`);
  }
  await stillServes(t, port);
  await assertNothingHeld(t, server);
});

t.test('abrupt resets during responses', async (t) => {
  const { server, port } = await serve(t);
  const closes: boolean[] = [];
  server.on('request', (_req, res) => res.on('close', () => closes.push(res.writableFinished)));
  const client: Http3ClientSession = await connect(t, pki, port);
  // STOP_SENDING on a 1 MiB response in progress.
  const res = await client.request({ path: '/big/stop' });
  const first = once(res.body, 'data');
  await first;
  res.body.destroy();
  t.equal((await client.fetch({})).body.toString(), 'alive');
  await client.close();
  await assertNothingHeld(t, server);
  // Both responses closed on the server: the stopped one unfinished, the other finished.
  t.same([...closes].sort(), [false, true], 'each response emitted close once: the stopped one unfinished');
});

t.test('random bytes on request streams', async (t) => {
  const { server, port } = await serve(t);
  const rand = prng(42);
  const outcomes = { reset: 0, fin: 0, connectionClosed: 0 };
  // What the server sent back, checked on every stream: a FIN carries a response (it starts with a
  // HEADERS frame), a reset carries a registered HTTP/3 or QPACK error code.
  const wrong: string[] = [];
  let client = await connect(t, pki, port);
  for (let i = 0; i < 120; i++) {
    if (client.draining) client = await connect(t, pki, port);
    const raw = await client.openRawStream('bidi');
    // Half start with a valid HEADERS frame, so the body path is fuzzed too.
    const prefix = i % 2 === 0 ? head(REQUEST) : Buffer.alloc(0);
    await raw.write(Buffer.concat([prefix, rand(1 + ((rand(1)[0] as number) % 300))])).catch(() => {});
    await raw.end();
    const r = await raw.readAll();
    if (r.resetCode !== undefined) {
      outcomes.reset++;
      if (errorCodeFromWire(r.resetCode) === undefined) wrong.push(`#${i} reset with unregistered code 0x${r.resetCode.toString(16)}`);
    } else if (r.fin) {
      outcomes.fin++;
      if (r.data[0] !== 0x01) wrong.push(`#${i} FIN without a HEADERS frame first (${r.data.subarray(0, 8).toString('hex')})`);
    } else outcomes.connectionClosed++;
  }
  t.same(wrong, [], `every stream got a response or a registered error: ${JSON.stringify(outcomes)}`);
  t.ok(outcomes.reset + outcomes.fin > 0, 'the server answered streams rather than only closing connections');
  await client.close(true);
  await stillServes(t, port);
  await assertNothingHeld(t, server);
});
