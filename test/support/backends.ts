// The backend most end-to-end tests need: an HTTP/1.1 server on 127.0.0.1 (port 0) that answers
// every request with one fixed body, so the body names the backend (and through it the
// generation) that served. Closed in the test's teardown.
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';

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
