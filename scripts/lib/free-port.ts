// A port free on both TCP and UDP on 127.0.0.1, for tests where several processes must bind the
// same port with SO_REUSEPORT (port 0 would give each its own). The port is drawn at random from
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default):
// ports in that range are handed out all the time to other tests' port-0 listeners and client
// sockets, so a port found free there could be taken again before the test binds it (seen in CI
// as EADDRINUSE in a worker). Below it only other callers of this function pick ports.
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

export async function freePort(): Promise<number> {
  const ceiling = ephemeralStart();
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = FLOOR + Math.floor(Math.random() * (ceiling - FLOOR));
    if (await bindsBoth(port)) return port;
  }
  throw new Error('no port free on both TCP and UDP');
}
