// A stand-in for systemd's notification socket: a unix datagram socket of the test's own, passed to
// `edge-proxy serve` as NOTIFY_SOCKET (what systemd does for `Type=notify`). Every datagram is kept
// with its arrival time, parsed into KEY=value fields as systemd reads them.
import { DgramSocket } from 'node-unix-socket';

export interface Notification {
  /** Arrival, ms since the epoch. */
  readonly at: number;
  readonly text: string;
  readonly fields: Readonly<Record<string, string>>;
}

export interface NotifyReceiver {
  /** The value for NOTIFY_SOCKET (`@name` for an abstract socket). */
  readonly address: string;
  readonly received: Notification[];
  /** Resolves with the first notification (past or future) after index `from` matching `predicate`; rejects after `timeoutMs`. */
  next(predicate: (n: Notification) => boolean, timeoutMs?: number, from?: number): Promise<Notification>;
  close(): void;
}

export function parseNotification(text: string): Record<string, string> {
  const fields: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const eq = line.indexOf('=');
    if (eq > 0) fields[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return fields;
}

/** Binds `path` (a filesystem path, or `@name` for an abstract socket). */
export function notifyReceiver(path: string): NotifyReceiver {
  const sock = new DgramSocket();
  sock.bind(path.startsWith('@') ? `\0${path.slice(1)}` : path);
  const received: Notification[] = [];
  const waiters = new Set<() => void>();
  sock.on('data', (buf: Buffer) => {
    const text = buf.toString('utf8');
    received.push({ at: Date.now(), text, fields: parseNotification(text) });
    for (const w of [...waiters]) w();
  });
  return {
    address: path,
    received,
    next(predicate, timeoutMs = 20_000, from = 0) {
      return new Promise((resolve, reject) => {
        const check = (): boolean => {
          const found = received.slice(from).find(predicate);
          if (found === undefined) return false;
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(found);
          return true;
        };
        const waiter = (): void => void check();
        const timer = setTimeout(() => {
          waiters.delete(waiter);
          reject(new Error(`no matching notification within ${timeoutMs} ms; received: ${JSON.stringify(received.map((n) => n.text))}`));
        }, timeoutMs);
        waiters.add(waiter);
        check();
      });
    },
    close: () => sock.close(),
  };
}
