// Bounded connection lifetime for the supervisor's servers (control API, metrics endpoint): every
// accepted socket is destroyed `lifetimeMs` after it opened (SPEC `connection_timeout_ms`), and
// the set of open sockets lets `close()` end them at once.
import type { Server } from 'node:net';
import type { Socket } from 'node:net';

/** Tracks the sockets of `server` and bounds their lifetime; returns the live set. */
export function trackConnections(server: Server, lifetimeMs: number): Set<Socket> {
  const sockets = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    const timer = setTimeout(() => socket.destroy(), lifetimeMs);
    timer.unref();
    socket.once('close', () => {
      clearTimeout(timer);
      sockets.delete(socket);
    });
  });
  return sockets;
}
