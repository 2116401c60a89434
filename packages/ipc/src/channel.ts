// A typed request/reply channel over a process IPC pipe (child_process / cluster `send`). Requests
// carry an id; the other side answers with `reply` messages; a request not answered in time
// rejects with a coded error. A closed channel rejects everything pending at once.

/** What the channel needs from a process handle (a ChildProcess, a cluster Worker, or `process`). */
export interface IpcEndpoint {
  /**
   * Node's `send`: with a callback, a closed channel is reported to it rather than emitted as an
   * `error` event (which, unhandled, would take the sending process down).
   */
  send(message: unknown, sendHandle?: undefined, callback?: (error: Error | null) => void): boolean;
  on(event: 'message', listener: (message: unknown) => void): unknown;
  off(event: 'message', listener: (message: unknown) => void): unknown;
}

/** A failed or timed-out request, with a stable code. */
export class IpcError extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = 'IpcError';
    this.code = code;
  }
}

/** `Omit` applied to each member of a union (plain `Omit` collapses a union to its common keys). */
export type OmitId<T> = T extends unknown ? Omit<T, 'id'> : never;

interface Pending {
  resolve(value: unknown): void;
  reject(err: IpcError): void;
  timer: NodeJS.Timeout;
}

export class RequestChannel<Req extends { id: number }> {
  private readonly endpoint: IpcEndpoint;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closed = false;
  private readonly onMessage = (m: unknown): void => {
    if (m === null || typeof m !== 'object' || (m as { type?: unknown }).type !== 'reply') return;
    const r = m as { id: number; ok: boolean; value?: unknown; code?: string; message?: string };
    const p = this.pending.get(r.id);
    if (p === undefined) return; // a late reply to a request that already timed out
    this.pending.delete(r.id);
    clearTimeout(p.timer);
    if (r.ok) p.resolve(r.value);
    else p.reject(new IpcError(r.code ?? 'EDGE_IPC_REMOTE', r.message ?? 'the worker refused the request'));
  };

  constructor(endpoint: IpcEndpoint) {
    this.endpoint = endpoint;
    endpoint.on('message', this.onMessage);
  }

  /** Sends a request (its `id` is assigned here) and waits for the reply, at most `timeoutMs`. */
  request<T = unknown>(message: OmitId<Req>, timeoutMs: number): Promise<T> {
    if (this.closed) return Promise.reject(new IpcError('EDGE_IPC_CLOSED', 'the worker is gone'));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new IpcError('EDGE_IPC_TIMEOUT', `no reply to ${(message as { type?: string }).type ?? 'request'} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer });
      const failed = (err: unknown): void => {
        if (!this.pending.has(id)) return;
        clearTimeout(timer);
        this.pending.delete(id);
        reject(new IpcError('EDGE_IPC_CLOSED', err instanceof Error ? err.message : 'send failed'));
      };
      try {
        // A worker that just died (its exit not yet seen) has a closed channel: the callback
        // fails this request at once.
        this.endpoint.send({ ...message, id }, undefined, (err) => {
          if (err !== null && err !== undefined) failed(err);
        });
      } catch (err) {
        failed(err);
      }
    });
  }

  /** The process went away: every pending request fails now. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.endpoint.off('message', this.onMessage);
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new IpcError('EDGE_IPC_CLOSED', 'the worker exited'));
      this.pending.delete(id);
    }
  }

  get inflight(): number {
    return this.pending.size;
  }
}

/** The worker side: answers requests with a handler; an exception becomes a coded refusal. */
export function serveRequests(endpoint: IpcEndpoint, handle: (message: { type: string; id: number }) => Promise<unknown>, accept: (m: unknown) => boolean): () => void {
  const listener = (m: unknown): void => {
    if (!accept(m) || typeof (m as { id?: unknown }).id !== 'number') return;
    const msg = m as { type: string; id: number };
    // A reply to a supervisor that has gone away is dropped (the callback keeps it from being an
    // unhandled `error` event).
    handle(msg).then(
      (value) => endpoint.send({ type: 'reply', id: msg.id, ok: true, ...(value === undefined ? {} : { value }) }, undefined, dropSendError),
      (err: unknown) =>
        endpoint.send(
          {
            type: 'reply',
            id: msg.id,
            ok: false,
            code: typeof (err as { code?: unknown })?.code === 'string' ? (err as { code: string }).code : 'EDGE_WORKER_ERROR',
            message: err instanceof Error ? err.message : String(err),
          },
          undefined,
          dropSendError,
        ),
    );
  };
  endpoint.on('message', listener);
  return () => endpoint.off('message', listener);
}

/** For messages whose loss the closing of the channel already tells (the peer is gone). */
export function dropSendError(): void {}
