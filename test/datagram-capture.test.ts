// bench:proxy --datagrams (scripts/lib/datagram-capture.ts): the datagrams a server port sent and
// received, counted from a real tcpdump capture of real UDP traffic on loopback. The count is what
// says whether an HTTP/3 server builds one packet per response or packs several, so it must count
// each direction of that port alone, and every datagram.
import t from 'tap';
import dgram from 'node:dgram';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { DatagramCapture, datagramCounts, pcapDatagrams } from '../scripts/lib/datagram-capture.ts';
import { toolPath } from '../scripts/system-tools.ts';

/** A pcap file (microsecond timestamps, little-endian, Ethernet) of these frames. */
function pcap(frames: readonly Buffer[], magic = 0xa1b2c3d4): Buffer {
  const head = Buffer.alloc(24);
  head.writeUInt32LE(magic, 0);
  head.writeUInt16LE(2, 4);
  head.writeUInt16LE(4, 6);
  head.writeUInt32LE(64, 16);
  head.writeUInt32LE(1, 20);
  return Buffer.concat([head, ...frames.flatMap((f) => {
    const rec = Buffer.alloc(16);
    rec.writeUInt32LE(f.length, 8);
    rec.writeUInt32LE(f.length, 12);
    return [rec, f];
  })]);
}

/** An Ethernet frame of an IPv4 (or IPv6) packet of `proto` with a UDP-shaped header: ports and length. */
function frame(from: number, to: number, payload: number, o: { v6?: boolean; proto?: number } = {}): Buffer {
  const ip = o.v6 === true ? Buffer.alloc(40) : Buffer.alloc(20);
  if (o.v6 === true) {
    ip[0] = 0x60;
    ip[6] = o.proto ?? 17;
  } else {
    ip[0] = 0x45;
    ip[9] = o.proto ?? 17;
  }
  const eth = Buffer.alloc(14);
  eth.writeUInt16BE(o.v6 === true ? 0x86dd : 0x0800, 12);
  const udp = Buffer.alloc(8);
  udp.writeUInt16BE(from, 0);
  udp.writeUInt16BE(to, 2);
  udp.writeUInt16BE(payload + 8, 4);
  return Buffer.concat([eth, ip, udp]);
}

t.test('a pcap file: the port as source is sent, as destination received; other packets are not counted', async (t) => {
  const file = pcap([
    frame(4433, 52914, 107),
    frame(4433, 52914, 1200),
    frame(52914, 4433, 44),
    frame(4433, 40000, 50, { v6: true }),
    frame(4433, 52914, 500, { proto: 6 }), // TCP: not a datagram
    frame(5000, 44330, 999),
    frame(44330, 5000, 999),
  ]);
  t.same(datagramCounts(pcapDatagrams(file), 4433, 2), { sent: { datagrams: 3, bytes: 1357 }, received: { datagrams: 1, bytes: 44 }, dropped: 2 });
  t.same(datagramCounts(pcapDatagrams(file), 52914), { sent: { datagrams: 1, bytes: 44 }, received: { datagrams: 2, bytes: 1307 }, dropped: 0 });
  // A file still being written: the record cut short is not read.
  t.equal(pcapDatagrams(file.subarray(0, file.length - 3)).length, 5, 'the last record, cut short, is left out (6 datagrams and a TCP segment)');
  t.same(pcapDatagrams(Buffer.alloc(10)), [], 'no header yet: nothing');
  t.throws(() => pcapDatagrams(Buffer.alloc(24)), /not a pcap file/);
});

const asRoot = process.getuid?.() === 0 ? {} : { skip: 'capturing packets needs root (CAP_NET_RAW)' };
const tcpdump = toolPath('tcpdump');
const TCPDUMP_MISSING = 'tcpdump is missing: install the Debian package tcpdump (scripts/system-tools.ts)';

t.test('a capture counts every datagram of one port, each way, and none of another', asRoot, async (t) => {
  if (tcpdump === undefined) {
    t.fail(TCPDUMP_MISSING);
    return;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'datagram-capture-'));
  const server = dgram.createSocket('udp4');
  const client = dgram.createSocket('udp4');
  const other = dgram.createSocket('udp4');
  t.teardown(() => {
    for (const s of [server, client, other]) s.close();
    rmSync(dir, { recursive: true, force: true });
  });
  for (const s of [server, client, other]) {
    s.bind(0, '127.0.0.1');
    await once(s, 'listening');
  }
  const serverPort = server.address().port;
  const clientPort = client.address().port;
  const capture = await DatagramCapture.start(tcpdump, 0, serverPort, path.join(dir, 'c.pcap'));

  // 5 requests of 40 bytes in, 30 answers of 100 bytes out; the other socket's datagrams to the
  // client must not count. Each datagram is awaited where it lands, so none is still in flight.
  const clientGot = new Promise<void>((resolve) => {
    let n = 0;
    client.on('message', () => {
      if (++n === 31) resolve();
    });
  });
  const serverGot = new Promise<void>((resolve) => {
    let n = 0;
    server.on('message', () => {
      if (++n === 5) resolve();
    });
  });
  for (let i = 0; i < 5; i++) client.send(Buffer.alloc(40, 1), serverPort, '127.0.0.1');
  await serverGot;
  for (let i = 0; i < 30; i++) server.send(Buffer.alloc(100, 2), clientPort, '127.0.0.1');
  other.send(Buffer.alloc(77, 3), clientPort, '127.0.0.1');
  await clientGot;

  const counts = await capture.stop();
  t.equal(counts.dropped, 0, 'the capture dropped nothing');
  t.same(counts.sent, { datagrams: 30, bytes: 3000 }, 'the 30 answers, 100 bytes each');
  t.same(counts.received, { datagrams: 5, bytes: 200 }, 'the 5 requests, 40 bytes each');
});

t.test('a capture that cannot start says why', asRoot, async (t) => {
  if (tcpdump === undefined) {
    t.fail(TCPDUMP_MISSING);
    return;
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'datagram-capture-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // A file in a directory that does not exist: tcpdump cannot open it and exits.
  await t.rejects(DatagramCapture.start(tcpdump, 0, 4433, path.join(dir, 'missing', 'c.pcap')), /tcpdump exited before listening: .*missing/);
});
