// The prepare-time check of a listener an activation adds: can this worker bind its address and
// port (TCP and UDP, with SO_REUSEPORT as the ingresses bind them)? A port held by another program
// (or by a process of another user) fails here, in prepare, so the activation is aborted
// everywhere before anything changes; the sockets are closed at once and bound for real at commit.
import dgram from 'node:dgram';
import net from 'node:net';
import type { ListenOptions } from 'node:net';
import type { NormalizedListener } from '@edge-proxy/config';
import { bindError } from './serve-listeners.ts';

function probeTcp(address: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen({ host: address, port, reusePort: true, exclusive: true } as ListenOptions, () => server.close(() => resolve()));
  });
}

function probeUdp(address: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket({ type: net.isIPv6(address) ? 'udp6' : 'udp4', reusePort: true });
    socket.once('error', (err) => {
      socket.close();
      reject(err);
    });
    socket.bind({ address, port, exclusive: true }, () => socket.close(() => resolve()));
  });
}

/** Rejects with EDGE_LISTENER_BIND_FAILED when `listener`'s port cannot be bound on TCP or UDP. */
export async function probeBind(listener: NormalizedListener): Promise<void> {
  try {
    await probeTcp(listener.address, listener.port);
    await probeUdp(listener.address, listener.port);
  } catch (err) {
    throw bindError(listener, err);
  }
}
