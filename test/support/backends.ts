// The backend most end-to-end tests need: an HTTP/1.1 server on 127.0.0.1 (port 0) that answers
// every request with one fixed body, so the body names the backend (and through it the
// generation) that served. Closed in the test's teardown.
import http from 'node:http';
import { once } from 'node:events';
import type net from 'node:net';
import type { AddressInfo, Socket } from 'node:net';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** Starts a backend answering `answer`; its port. */
export async function namedBackend(t: Teardown, answer: string): Promise<number> {
  const s = http.createServer((_req, res) => res.end(answer));
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  t.teardown(() => new Promise<void>((r) => s.close(() => r())));
  return (s.address() as AddressInfo).port;
}

/**
 * Listens on 127.0.0.1 port 0 and, at teardown, destroys the connections still open before closing
 * (a proxy keeps upstream connections alive: `close()` alone would wait for them); the port.
 */
export async function listenTracked(t: Teardown, s: net.Server): Promise<number> {
  const sockets = new Set<Socket>();
  s.on('connection', (c: Socket) => {
    sockets.add(c);
    c.on('close', () => sockets.delete(c));
  });
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  t.teardown(
    () =>
      new Promise<void>((r) => {
        for (const c of sockets) c.destroy();
        s.close(() => r());
      }),
  );
  return (s.address() as AddressInfo).port;
}
