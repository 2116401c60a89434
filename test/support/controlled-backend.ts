// A backend whose behaviour the test switches at runtime, per path prefix: answer at once, answer
// after N ms, answer a given status, reset the connection (at once, after part of the request
// body, or once it is read), answer with the SHA-256 of the body it read, send part of a response
// then reset or wait, or hold the request until the test releases it. It records every arrival (path,
// `x-seq` header, Host) in order, every request body it read to the end (length and SHA-256), and
// counts the requests it is serving at once, so overload and retry tests can see from the
// backend's side what the proxy let through: FIFO admission, in-flight limits, retried and hedged
// attempts, replayed bodies, upstream requests abandoned by the proxy. HTTP/1.1 Upgrade requests
// are accepted (101, then an echo tunnel) and recorded as well.
import http from 'node:http';
import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import { listenTracked } from './backends.ts';
import { until } from './until.ts';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** What the backend does with a request. */
export type Behaviour =
  /** 200 at once; body `<name> <path>`. */
  | { readonly kind: 'ok' }
  /** 200 after `ms`. */
  | { readonly kind: 'slow'; readonly ms: number }
  /** `status` at once; body `<name> status <status>`. */
  | { readonly kind: 'status'; readonly status: number }
  /** The connection is reset (RST) without a byte of answer. */
  | { readonly kind: 'reset' }
  /** The request body is read to its end, then the connection is reset without a byte of answer. */
  | { readonly kind: 'reset-after-body' }
  /** The connection is reset once `bytes` of the request body were read (the rest is never read). */
  | { readonly kind: 'reset-after-bytes'; readonly bytes: number }
  /** 200 once the request body is read to its end; body: the SHA-256 (hex) of those bytes, header `x-body-bytes` their number. */
  | { readonly kind: 'echo-sha256' }
  /**
   * 200 with `content-length: contentLength` (chunked when undefined) and `content-type` (default
   * application/octet-stream), then `send` bytes of body (fewer than `contentLength`; each byte
   * the first letter of the backend's name), then the connection is reset.
   */
  | { readonly kind: 'partial-then-reset'; readonly contentLength: number | undefined; readonly send: number; readonly contentType?: string }
  /** As `partial-then-reset`, but then held: `release()` sends the rest of the body, `resetHeld()` resets the connection. */
  | { readonly kind: 'partial-then-hold'; readonly contentLength: number; readonly send: number }
  /** Nothing until `release()`; then 200, body `<name> <path> released`. */
  | { readonly kind: 'hold' };

/** One request as the backend received it. */
export interface Arrival {
  readonly path: string;
  readonly method: string;
  /** The `x-seq` header (tests number their requests with it); '' when absent. */
  readonly seq: string;
  readonly host: string;
  readonly upgrade: boolean;
  readonly headers: http.IncomingHttpHeaders;
  /** performance.now() at arrival: the test's backends share its clock, so arrivals on two of them can be ordered. */
  readonly at: number;
}

/** A request body the backend read to its end. */
export interface BodyRead {
  readonly path: string;
  readonly method: string;
  readonly seq: string;
  readonly bytes: number;
  /** SHA-256 of the bytes, hex. */
  readonly sha256: string;
}

/** SHA-256 of `data`, hex (what `echo-sha256` answers and `BodyRead.sha256` holds). */
export function sha256(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** An HTTP/1.1 backend on 127.0.0.1 whose behaviour per path prefix the test switches; see the file comment. */
export class ControlledBackend {
  /** The backend's port on 127.0.0.1. */
  port = 0;
  /** Every request received, in arrival order. */
  readonly arrivals: Arrival[] = [];
  /** Every request body read to its end (bodiless requests included, 0 bytes), in the order they ended. */
  readonly bodies: BodyRead[] = [];
  /** Requests being served now (arrived, response not yet finished or abandoned). */
  inflight = 0;
  /** The most requests it served at once. */
  maxInflight = 0;
  /** Requests whose connection closed before the answer was complete (the proxy gave up on them). */
  abandoned = 0;
  private readonly rules = new Map<string, Behaviour>([['/', { kind: 'ok' }]]);
  private readonly holds: Array<{ readonly answer: () => void; readonly reset: () => void }> = [];
  private readonly sockets = new Set<Socket>();
  private server: http.Server | undefined;
  private readonly changed = new EventEmitter();

  /** Names the backend in its answers (`x-backend` header, body). */
  readonly name: string;

  constructor(name: string) {
    this.name = name;
    this.changed.setMaxListeners(0);
  }

  /** Behaviour for paths under `prefix` (the longest matching prefix wins; `/` is the default). */
  set(behaviour: Behaviour, prefix = '/'): this {
    this.rules.set(prefix, behaviour);
    return this;
  }

  /** Requests currently held. */
  get held(): number {
    return this.holds.length;
  }

  /** Answers the `n` oldest held requests (all when omitted); how many were released. */
  release(n = this.holds.length): number {
    const now = this.holds.splice(0, n);
    for (const r of now) r.answer();
    return now.length;
  }

  /** Resets the connections of the `n` oldest held requests (all when omitted) without answering them; how many. */
  resetHeld(n = this.holds.length): number {
    const now = this.holds.splice(0, n);
    for (const r of now) r.reset();
    return now.length;
  }

  /** Stops listening and resets every open connection: from now on a connection to its port is refused. */
  stop(): Promise<void> {
    for (const s of this.sockets) s.resetAndDestroy();
    return new Promise((resolve) => (this.server === undefined ? resolve() : this.server.close(() => resolve())));
  }

  /** The `x-seq` of every arrival, in order. */
  seqs(): string[] {
    return this.arrivals.map((a) => a.seq);
  }

  /** The arrivals whose path starts with `prefix`. */
  arrivalsUnder(prefix: string): Arrival[] {
    return this.arrivals.filter((a) => a.path.startsWith(prefix));
  }

  /** Resolves once `pred()` holds (checked on every arrival and answer); rejects after `timeoutMs`. */
  until(pred: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    return until(this.changed, 'change', pred, () => `backend ${this.name}: not ${what} within ${timeoutMs} ms (inflight ${this.inflight}, held ${this.held}, arrivals ${this.arrivals.length}: ${this.arrivals.slice(-4).map((a) => a.path).join(' ')}, abandoned ${this.abandoned})`, timeoutMs);
  }

  /** Starts listening on 127.0.0.1 port 0; closed (open connections destroyed) at teardown. */
  async start(t: Teardown): Promise<this> {
    const server = http.createServer((req, res) => this.handle(req, res));
    server.on('upgrade', (req: http.IncomingMessage, socket: Socket) => this.upgrade(req, socket));
    // Held requests must not be cut by Node's own timeouts while a test waits.
    server.requestTimeout = 0;
    server.headersTimeout = 0;
    server.keepAliveTimeout = 60_000;
    server.on('connection', (c: Socket) => {
      this.sockets.add(c);
      c.on('close', () => this.sockets.delete(c));
    });
    this.server = server;
    this.port = await listenTracked(t, server);
    // Whatever is still held when the test ends is answered, so no client waits on it.
    t.teardown(() => this.release());
    return this;
  }

  private behaviour(path: string): Behaviour {
    let best = '';
    for (const prefix of this.rules.keys()) if (path.startsWith(prefix) && prefix.length > best.length) best = prefix;
    return this.rules.get(best) ?? { kind: 'ok' };
  }

  private record(req: http.IncomingMessage, upgrade: boolean): void {
    this.arrivals.push({ path: req.url ?? '', method: req.method ?? '', seq: String(req.headers['x-seq'] ?? ''), host: req.headers.host ?? '', upgrade, headers: req.headers, at: performance.now() });
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const path = req.url ?? '';
    this.record(req, false);
    this.inflight++;
    this.maxInflight = Math.max(this.maxInflight, this.inflight);
    res.on('close', () => {
      this.inflight--;
      if (!res.writableFinished) this.abandoned++;
      this.changed.emit('change');
    });
    // The body is read (and hashed) whatever the behaviour; behaviours that answer after it
    // listen to 'end' after this listener, so the record is there before they act.
    const hash = createHash('sha256');
    let bytes = 0;
    req.on('data', (c: Buffer) => {
      hash.update(c);
      bytes += c.length;
    });
    req.on('end', () => {
      this.bodies.push({ path, method: req.method ?? '', seq: String(req.headers['x-seq'] ?? ''), bytes, sha256: hash.digest('hex') });
      this.changed.emit('change');
    });
    this.act(path, req, res);
    // After acting: a waiter for "n held" sees this request held.
    this.changed.emit('change');
  }

  private act(path: string, req: http.IncomingMessage, res: http.ServerResponse): void {
    const ok = (suffix = ''): void => {
      if (!res.destroyed) res.writeHead(200, { 'content-type': 'text/plain', 'x-backend': this.name }).end(`${this.name} ${path}${suffix}`);
    };
    const b = this.behaviour(path);
    switch (b.kind) {
      case 'ok':
        return ok();
      case 'slow': {
        const timer = setTimeout(ok, b.ms);
        res.on('close', () => clearTimeout(timer));
        return;
      }
      case 'status':
        res.writeHead(b.status, { 'content-type': 'text/plain', 'x-backend': this.name }).end(`${this.name} status ${b.status}`);
        return;
      case 'reset':
        req.socket.resetAndDestroy();
        return;
      case 'reset-after-body':
        req.on('end', () => req.socket.resetAndDestroy());
        return;
      case 'reset-after-bytes': {
        let read = 0;
        const onData = (c: Buffer): void => {
          read += c.length;
          if (read < b.bytes) return;
          req.off('data', onData);
          req.socket.resetAndDestroy();
        };
        req.on('data', onData);
        return;
      }
      case 'echo-sha256':
        req.on('end', () => {
          const read = this.bodies.at(-1) as BodyRead;
          if (!res.destroyed) res.writeHead(200, { 'content-type': 'text/plain', 'x-backend': this.name, 'x-body-bytes': String(read.bytes) }).end(read.sha256);
        });
        return;
      case 'partial-then-reset': {
        res.writeHead(200, { 'content-type': b.contentType ?? 'application/octet-stream', ...(b.contentLength === undefined ? {} : { 'content-length': String(b.contentLength) }), 'x-backend': this.name });
        // Reset once the partial body is handed to the kernel, so the proxy reads it before the RST.
        res.write(Buffer.alloc(b.send, this.name.charCodeAt(0)), () => req.socket.resetAndDestroy());
        return;
      }
      case 'partial-then-hold':
      case 'hold': {
        const fill = this.name.charCodeAt(0);
        if (b.kind === 'partial-then-hold') {
          res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(b.contentLength), 'x-backend': this.name });
          res.write(Buffer.alloc(b.send, fill));
        }
        const release = b.kind === 'hold' ? (): void => ok(' released') : (): void => void res.end(Buffer.alloc(b.contentLength - b.send, fill));
        const held = { answer: release, reset: () => req.socket.resetAndDestroy() };
        this.holds.push(held);
        // A request the proxy abandons is no longer held. This listener runs after the one that
        // counted it abandoned: tell waiters again, now that `held` is right too.
        res.on('close', () => {
          const i = this.holds.indexOf(held);
          if (i < 0) return;
          this.holds.splice(i, 1);
          this.changed.emit('change');
        });
        return;
      }
    }
  }

  private upgrade(req: http.IncomingMessage, socket: Socket): void {
    this.record(req, true);
    this.changed.emit('change');
    socket.on('error', () => socket.destroy());
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nx-backend: ${this.name}\r\n\r\nhello from ${this.name}`);
    socket.on('data', (d: Buffer) => socket.write(d));
    socket.on('end', () => socket.end());
  }
}

/** A started ControlledBackend named `name` (default behaviour: 200 at once). */
export function controlledBackend(t: Teardown, name: string): Promise<ControlledBackend> {
  return new ControlledBackend(name).start(t);
}
