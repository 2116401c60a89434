// Is a listener's port free of every other program (issue 38 finding 11)? The workers bind their
// listeners with SO_REUSEPORT, so that the kernel spreads connections over them; but any process
// of the same user binding with SO_REUSEPORT joins that group, and a second `serve` on the same
// port started without error and took a share of the traffic. Before the workers bind a port this
// service does not hold yet (at start; an activation that adds a listener), the supervisor binds
// it itself WITHOUT SO_REUSEPORT and closes it at once: Linux refuses that bind while anything is
// bound there (a reuseport group included), and lets it through otherwise. The workers' own
// rebinding (re-forks, rolling restarts) never goes through here: their group holds the port.
import dgram from 'node:dgram';
import net from 'node:net';
import type { NormalizedListener } from '@edge-proxy/config';

/** Where a listener binds: TCP for the TLS bootstrap ingress, UDP for QUIC, on the same port. */
export interface ListenerEndpoint {
  readonly name: string;
  readonly address: string;
  readonly port: number;
}

/** A port another program holds: which listener, which protocol, the errno. */
export interface TakenPort {
  readonly endpoint: ListenerEndpoint;
  readonly protocol: 'TCP' | 'UDP';
  readonly errno: string;
}

function probeTcp(address: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    // No reusePort: a bind beside a reuseport group fails (EADDRINUSE) instead of joining it.
    server.listen({ host: address, port, exclusive: true }, () => server.close(() => resolve()));
  });
}

function probeUdp(address: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket({ type: net.isIPv6(address) ? 'udp6' : 'udp4' });
    socket.once('error', (err) => {
      socket.close();
      reject(err);
    });
    socket.bind({ address, port, exclusive: true }, () => socket.close(() => resolve()));
  });
}

/**
 * The first endpoint whose TCP or UDP port another program holds (EADDRINUSE), else undefined.
 * Any other failure (EACCES for a privileged port, EADDRNOTAVAIL) is left to the workers' bind,
 * which reports it as before. Port 0 (any port) is never taken.
 */
export async function firstTakenPort(endpoints: readonly ListenerEndpoint[]): Promise<TakenPort | undefined> {
  for (const endpoint of endpoints) {
    if (endpoint.port === 0) continue;
    for (const [protocol, probe] of [['TCP', probeTcp], ['UDP', probeUdp]] as const) {
      try {
        await probe(endpoint.address, endpoint.port);
      } catch (err) {
        const errno = (err as NodeJS.ErrnoException).code;
        if (errno === 'EADDRINUSE') return { endpoint, protocol, errno };
      }
    }
  }
  return undefined;
}

/** The endpoints of `next` that `current` does not bind (all of them when nothing is bound yet). */
export function addedEndpoints(next: readonly NormalizedListener[], current: readonly NormalizedListener[] | undefined): ListenerEndpoint[] {
  const held = new Set((current ?? []).map((l) => `${l.address}|${l.port}`));
  return next.filter((l) => !held.has(`${l.address}|${l.port}`)).map((l) => ({ name: l.name, address: l.address, port: l.port }));
}

/** The one line of a taken port (its head as the workers' bind error says it, serve-listeners.ts). */
export function takenPortMessage(t: TakenPort): string {
  return `listener ${t.endpoint.name} (${t.endpoint.address}:${t.endpoint.port}) could not be bound: ${t.errno}: its ${t.protocol} port is already bound by another process (another edge-proxy serve, or another program)`;
}
