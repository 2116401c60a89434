// The UDP datagrams one server port sends and receives on loopback during a load, counted from a
// tcpdump capture (`bench:proxy --datagrams`). A QUIC server's CPU per request depends on how many
// packets it builds, encrypts and hands to the kernel per request, and that depends on its stack:
// how many STREAM frames it packs into one packet, how often it acknowledges. Counting them for
// ours and caddy in the same rounds says whether a gap is per packet or per request.
//
// tcpdump runs pinned to the client's core and writes the capture to a file in the benchmark's
// temp dir; the file is read here once the round is over. To know that tcpdump has written every
// datagram of the round before it is stopped, a sentinel socket sends one datagram to itself
// (its port is in the capture filter, the server never sees it): packets reach the capture in the
// order they crossed the interface, so once the sentinel is in the file, so is the round.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import { once } from 'node:events';
import { readFileSync, watch } from 'node:fs';

/** Datagrams and their UDP payload bytes in one direction. */
export interface DatagramFlow {
  readonly datagrams: number;
  readonly bytes: number;
}

/** What a server port sent and received, and what the capture lost. */
export interface DatagramCounts {
  readonly sent: DatagramFlow;
  readonly received: DatagramFlow;
  /** Packets the kernel dropped before tcpdump read them: the counts above are short by up to this. */
  readonly dropped: number;
}

/** One UDP datagram of a capture: its ports and its payload length. */
export interface CapturedDatagram {
  readonly from: number;
  readonly to: number;
  readonly length: number;
}

const LINKTYPE_ETHERNET = 1;
const ETHERTYPE_IPV4 = 0x0800;
const ETHERTYPE_IPV6 = 0x86dd;
const IPPROTO_UDP = 17;

/**
 * The UDP datagrams of a pcap file of Ethernet frames (what tcpdump writes for `-i lo`), in
 * order. A record cut short (the file still being written, or a snapshot too small for the UDP
 * header) ends the list or is skipped; anything but IPv4/IPv6 + UDP is skipped.
 */
export function pcapDatagrams(file: Buffer): CapturedDatagram[] {
  if (file.length < 24) return [];
  const magic = file.readUInt32LE(0);
  // Microsecond or nanosecond timestamps, written in either byte order.
  const le = magic === 0xa1b2c3d4 || magic === 0xa1b23c4d;
  if (!le && magic !== 0xd4c3b2a1 && magic !== 0x4d3cb2a1) throw new Error(`not a pcap file (magic 0x${magic.toString(16)})`);
  const u32 = (at: number): number => (le ? file.readUInt32LE(at) : file.readUInt32BE(at));
  const linkType = u32(20);
  if (linkType !== LINKTYPE_ETHERNET) throw new Error(`pcap link type ${linkType}, not Ethernet (1)`);
  const out: CapturedDatagram[] = [];
  for (let at = 24; at + 16 <= file.length; ) {
    const captured = u32(at + 8);
    const start = at + 16;
    at = start + captured;
    if (at > file.length) break;
    const frame = file.subarray(start, at);
    if (frame.length < 14) continue;
    const etherType = frame.readUInt16BE(12);
    let udp: number;
    if (etherType === ETHERTYPE_IPV4 && frame.length >= 34 && frame[23] === IPPROTO_UDP) udp = 14 + ((frame[14] as number) & 0x0f) * 4;
    else if (etherType === ETHERTYPE_IPV6 && frame.length >= 54 && frame[20] === IPPROTO_UDP) udp = 14 + 40;
    else continue;
    if (frame.length < udp + 8) continue;
    out.push({ from: frame.readUInt16BE(udp), to: frame.readUInt16BE(udp + 2), length: frame.readUInt16BE(udp + 4) - 8 });
  }
  return out;
}

/** Counts the datagrams whose source port (sent) or destination port (received) is `port`. */
export function datagramCounts(datagrams: readonly CapturedDatagram[], port: number, dropped = 0): DatagramCounts {
  let sentN = 0;
  let sentBytes = 0;
  let recvN = 0;
  let recvBytes = 0;
  for (const d of datagrams) {
    if (d.from === port) {
      sentN++;
      sentBytes += d.length;
    } else if (d.to === port) {
      recvN++;
      recvBytes += d.length;
    }
  }
  return { sent: { datagrams: sentN, bytes: sentBytes }, received: { datagrams: recvN, bytes: recvBytes }, dropped };
}

/** How long tcpdump may take to start listening, and to write the sentinel once stopping, ms. */
const START_TIMEOUT_MS = 10_000;
const DRAIN_TIMEOUT_MS = 10_000;

/** One tcpdump process capturing a UDP port on the loopback interface into a file. */
export class DatagramCapture {
  private readonly proc: ChildProcess;
  private readonly closed: Promise<string>;
  private readonly sentinel: dgram.Socket;
  private readonly port: number;
  private readonly file: string;

  private constructor(proc: ChildProcess, closed: Promise<string>, sentinel: dgram.Socket, port: number, file: string) {
    this.proc = proc;
    this.closed = closed;
    this.sentinel = sentinel;
    this.port = port;
    this.file = file;
  }

  /**
   * Starts `tcpdump` on `core` and resolves once it listens (it says so on stderr), so that the
   * load that follows is captured from its first datagram. Rejects with tcpdump's own words when
   * it cannot capture (no such interface, not permitted, a file it cannot write).
   */
  static async start(tcpdump: string, core: number, port: number, file: string): Promise<DatagramCapture> {
    const sentinel = dgram.createSocket('udp4');
    sentinel.bind(0, '127.0.0.1');
    await once(sentinel, 'listening');
    const sentinelPort = sentinel.address().port;
    // --immediate-mode: each packet goes to tcpdump as it arrives, not in blocks of the kernel's
    // capture ring; -U: each is written to the file at once; -s 64: headers are enough.
    const filter = `udp port ${port} or udp port ${sentinelPort}`;
    const proc = spawn('taskset', ['-c', String(core), tcpdump, '-i', 'lo', '--immediate-mode', '-U', '-nn', '-s', '64', '-w', file, filter], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    const closed = new Promise<string>((resolve) => {
      proc.on('close', () => resolve(stderr));
      proc.on('error', (err) => {
        stderr += `${tcpdump}: ${err.message}\n`;
      });
    });
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          proc.kill('SIGKILL');
          reject(new Error(`tcpdump did not start listening within ${START_TIMEOUT_MS} ms: ${stderr.trim().slice(-300)}`));
        }, START_TIMEOUT_MS);
        proc.stderr?.on('data', (d: Buffer) => {
          stderr += d.toString();
          if (/listening on/.test(stderr)) {
            clearTimeout(timer);
            resolve();
          }
        });
        void closed.then((text) => {
          clearTimeout(timer);
          reject(new Error(`tcpdump exited before listening: ${text.trim().slice(-300)}`));
        });
      });
    } catch (err) {
      sentinel.close();
      throw err;
    }
    return new DatagramCapture(proc, closed, sentinel, port, file);
  }

  /**
   * Sends the sentinel, waits until tcpdump has written it (so every datagram before it is in the
   * file), stops tcpdump (SIGINT: it reports its drops) and counts the port's datagrams.
   */
  async stop(): Promise<DatagramCounts> {
    const sentinelPort = this.sentinel.address().port;
    // The file exists: tcpdump opened it before it said it was listening, and `watch` needs it.
    const written = (): CapturedDatagram[] | undefined => {
      const all = pcapDatagrams(readFileSync(this.file));
      return all.some((d) => d.from === sentinelPort && d.to === sentinelPort) ? all : undefined;
    };
    let datagrams: CapturedDatagram[] | undefined;
    try {
      const watcher = watch(this.file);
      try {
        const drained = new Promise<CapturedDatagram[]>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`tcpdump did not write the sentinel datagram within ${DRAIN_TIMEOUT_MS} ms`)), DRAIN_TIMEOUT_MS);
          const look = (): void => {
            const all = written();
            if (all === undefined) return;
            clearTimeout(timer);
            resolve(all);
          };
          watcher.on('change', look);
          this.sentinel.send(Buffer.from('end of round'), sentinelPort, '127.0.0.1');
          look();
        });
        datagrams = await drained;
      } finally {
        watcher.close();
      }
    } finally {
      this.proc.kill('SIGINT');
      this.sentinel.close();
    }
    const stderr = await this.closed;
    const dropped = Number(/(\d+) packets? dropped by kernel/.exec(stderr)?.[1] ?? 0);
    return datagramCounts(datagrams, this.port, dropped);
  }
}
