// Observing a drain from outside: a request held in flight across a shutdown (its backend answers
// the head at once and the rest when the test releases it), and a bounded wait until the listener
// refuses new TCP connections.
import https from 'node:https';
import net from 'node:net';

export interface HeldRequest {
  /** The first body chunk, once the response has started. */
  readonly started: Promise<string>;
  /** Status and whole body, once the response has ended; rejects if the connection breaks first. */
  readonly done: Promise<{ status: number; body: string }>;
}

/** GET https://localhost:<port><path> on its own connection (`connection: close`). */
export function heldRequest(port: number, ca: Buffer, path = '/hold'): HeldRequest {
  let started: (s: string) => void = () => undefined;
  const first = new Promise<string>((resolve) => (started = resolve));
  const done = new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port, path, ca, servername: 'localhost', agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        if (body === '') started(c);
        body += c;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
      res.on('aborted', () => reject(new Error(`response aborted after ${JSON.stringify(body)}`)));
    });
    req.setTimeout(60_000, () => req.destroy(new Error('held request: no progress in 60 s')));
    req.on('error', reject);
  });
  // A request that fails before its first chunk fails `started` too instead of leaving it pending.
  return { started: Promise.race([first, done.then((r) => r.body)]), done };
}

/**
 * Connects to 127.0.0.1:<port> until a connection is refused (every accepted one is closed again),
 * polling every 100 ms for at most `timeoutMs`; the error code, or 'still accepting'. A reset
 * counts as accepted: the kernel took the connection into a listening socket that was still open
 * and reset it as the socket closed, so the listener had not stopped accepting yet.
 */
export async function refusedWithin(port: number, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const code = await new Promise<string | undefined>((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port }, () => {
        s.destroy();
        resolve(undefined);
      });
      s.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    });
    if (code !== undefined && code !== 'ECONNRESET') return code;
    await new Promise((r) => setTimeout(r, 100)); // the listener closes in another process: poll, bounded
  }
  return 'still accepting';
}
