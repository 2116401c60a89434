// A port free on both TCP and UDP on 127.0.0.1, for tests where several processes must bind the
// same port with SO_REUSEPORT (port 0 would give each its own). The port is drawn at random from
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default):
// ports in that range are handed out all the time to other tests' port-0 listeners and client
// sockets, so a port found free there could be taken again before the test binds it (seen in CI
// as EADDRINUSE in a worker). Below it only other callers of this function pick ports.
//
// Those callers run side by side: tap runs two test files at once (.taprc `jobs`), and a port
// found free is not reserved until the service that will use it binds it, a second or so later.
// CI once saw `listen EADDRINUSE` when the other file drew the same port in that gap. So each of
// tap's parallel slots (TAP_JOB_ID, 0 to jobs-1) draws only from its own residue class modulo
// SLOTS, and one process does not hand out a port it handed out recently: two files running at
// once never draw the same port (test/free-port.test.ts).
import dgram from 'node:dgram';
import net from 'node:net';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';

const FLOOR = 20_000;

/** The first port of the ephemeral range (the ceiling of the ports drawn here). */
function ephemeralStart(): number {
  try {
    const first = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    if (Number.isInteger(first) && first > FLOOR + 1000) return first;
  } catch {
    // not Linux: the IANA dynamic range starts at 49152
  }
  return 32_768;
}

async function bindsBoth(port: number): Promise<boolean> {
  const server = net.createServer();
  const tcp = await new Promise<boolean>((resolve) => {
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => resolve(true));
  });
  if (!tcp) return false;
  const udp = dgram.createSocket('udp4');
  const ok = await new Promise<boolean>((resolve) => {
    udp.once('error', () => resolve(false));
    udp.bind(port, '127.0.0.1', () => resolve(true));
  });
  udp.close();
  server.close();
  await once(server, 'close');
  return ok;
}

/** Residue classes of the range: at least the number of test files tap runs at once. */
const SLOTS = 8;

/** This process's class: its tap job's slot, or the last class outside tap (scripts, benchmarks). */
function slot(): number {
  const job = Number(process.env['TAP_JOB_ID']);
  return Number.isInteger(job) && job >= 0 ? job % (SLOTS - 1) : SLOTS - 1;
}

/**
 * The ports this process handed out last, oldest first: none of them again (two services started
 * at once in one test). A quarter of the class is remembered; a port drawn longer ago than that is
 * bound by its service or closed, which the bind check sees.
 */
const handedOut = new Set<number>();

export async function freePort(): Promise<number> {
  const ceiling = ephemeralStart();
  const mine = slot();
  const choices = Math.floor((ceiling - FLOOR - mine) / SLOTS);
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = FLOOR + mine + SLOTS * Math.floor(Math.random() * choices);
    if (handedOut.has(port)) continue;
    if (await bindsBoth(port)) {
      handedOut.add(port);
      if (handedOut.size > choices / 4) handedOut.delete(handedOut.values().next().value as number);
      return port;
    }
  }
  throw new Error('no port free on both TCP and UDP');
}
